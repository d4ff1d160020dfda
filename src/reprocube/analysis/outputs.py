"""Two sets of a training script's outputs (files and directories in two work directories, or two paths
given to `reprocube diff`), compared: bytes first; where the bytes differ, the tensors by name in the
formats researchers save (safetensors, `.pt`/`.pth` zips read by reprocube's own restricted unpickler
without importing torch or running any pickle's code (formats.torch_pickle), `.npz` and `.npy` without
pickles, Keras `.h5`, Orbax checkpoint directories), and JSON, CSV and text line by
line; the first differing tensor, key or line named, with the ULP statistics of reprocube.analysis.tensors.
An Orbax checkpoint (a directory holding Orbax's `_METADATA`: a JSON object with its tree_metadata) is
one output compared by its tensors: its array files hold random names; every other file in it that Orbax
did not write (a history.json saved beside the weights) is compared as any file, and Orbax's
`_CHECKPOINT_METADATA` is compared as JSON without its times (its metrics and custom_metadata are the
script's). A directory holding a `_METADATA` of another kind is walked as any other; one that Orbax
cannot read is compared file by file.

Every file is someone else's: read through reprocube.untrusted (a regular file, at most MAX_OUTPUT_BYTES,
a symbolic link never followed but compared by its target's text), parsed by a library told not to run
code, and a file that cannot be parsed is a difference named as such, never a traceback."""

from __future__ import annotations

import csv
import fnmatch
import hashlib
import io
import os
import posixpath
import stat
from pathlib import Path

import numpy as np
import yaml

from reprocube.analysis.tensors import tensor_differences
from reprocube.errors import CheckpointError, ConfigError
from reprocube.formats.checkpoint_formats import SUFFIXES, by_name
from reprocube.formats.output_files import (
    MAX_OUTPUT_BYTES,
    ORBAX_TIMES,
    ORBAX_TIMESTAMP,
    files_below,
    load_orbax,
    walk_outputs,
)
from reprocube.formats.tensor_readers import (
    KERAS_VOLATILE,
    read_keras,
)
from reprocube.formats.torch_pickle import torch_structure
from reprocube.results.wording import difference_size
from reprocube.terminal import one_line
from reprocube.untrusted import compose_yaml, parse_json, read_bytes

TENSOR_SUFFIXES = SUFFIXES  # the tensor formats of formats.checkpoint_formats
TEXT_SUFFIXES = (".json", ".jsonl", ".csv", ".txt", ".log", ".tsv", ".yaml", ".yml")


def parse_ignore(ignore: list[str]) -> tuple[list[str], list[tuple[str, str]]]:
    """--ignore values as (file globs, [(file glob, field)]): `GLOB` leaves files out; `GLOB:KEY` (a
    dotted key path of a JSON, JSON-lines or YAML file) or `GLOB:COLUMN` (a CSV or TSV header's column)
    leaves one field out of the files it matches."""
    globs, fields = [], []
    for pattern in ignore:
        if ":" not in pattern:
            globs.append(pattern)
            continue
        glob, field = pattern.split(":", 1)
        if not glob or not field:
            raise ConfigError(f"--ignore {one_line(pattern)}: give GLOB or FILE:KEY (a field inside FILE)")
        fields.append((glob, field))
    return globs, fields


def _ignored(name: str, globs: list[str]) -> bool:
    return any(fnmatch.fnmatch(name, glob) for glob in globs)


def under_output(name: str, output: str) -> bool:
    """Whether `name` (relative to the work directory) is the declared output or lies under it."""
    declared = posixpath.normpath(output)
    return declared == "." or name == declared or name.startswith(declared.rstrip("/") + "/")


def collect(root: Path, outputs: list[str], ignore: list[str]) -> dict[str, Path]:
    """The declared outputs under `root` (files, and every file under a directory), by path relative to
    `root`, without those an --ignore GLOB matches (a FILE:KEY ignore leaves the file in); symbolic links
    and special files are listed, never entered or read."""
    globs, _ = parse_ignore(ignore)
    return {name: path for name, path in walk_outputs(root, outputs).items() if not _ignored(name, globs)}


def compare_outputs(a_root: Path, b_root: Path, outputs: list[str], ignore: list[str], explain: bool = True) -> dict:
    """Every declared output of run B against run A's: {"identical", "files": [...], "first": the first
    differing file's entry or None, "missing": declared outputs neither run wrote (whatever --ignore
    says), "not_compared": files neither run's side of could be read (FIFOs on both sides, too large),
    "ignored": files an --ignore GLOB left out, "all_ignored": True when --ignore left out everything the
    runs wrote (nothing was compared: the caller must refuse it)}. A file's entry holds "ignored_fields"
    where a FILE:KEY ignore (or a Keras archive's date_saved) was left out of its comparison.
    explain=False: bytes only (where differing is all that is asked: no framework is imported to name a
    tensor), except where fields are ignored."""
    globs, fields = parse_ignore(ignore)
    raw_a, raw_b = walk_outputs(a_root, outputs), walk_outputs(b_root, outputs)
    written = {*raw_a, *raw_b}
    missing = [o for o in outputs if not any(under_output(n, o) for n in written)]
    ignored = sorted(n for n in written if _ignored(n, globs))
    a = {n: p for n, p in raw_a.items() if n not in ignored}
    b = {n: p for n, p in raw_b.items() if n not in ignored}
    files = []
    for name in sorted(set(a) | set(b)):
        if name not in a or name not in b:
            side, path = ("A", a[name]) if name in a else ("B", b[name])
            files.append({"path": name, "same": False, "detail": f"only in {side} ({_kind(path)})"})
            continue
        keys = [key for glob, key in fields if fnmatch.fnmatch(name, glob)]
        if posixpath.basename(name) == ORBAX_TIMESTAMP:  # Orbax's step metadata: its times are not compared
            keys += [key for key in ORBAX_TIMES if key not in keys]
        files.append({"path": name, **compare_files(a[name], b[name], explain, keys)})
    # Neither side readable (FIFOs in both runs, both too large): neither the same nor different, and the
    # caller names it as not checked.
    compared = [f for f in files if f.get("compared", True)]
    first = next((f for f in compared if not f["same"]), None)
    return {
        "identical": bool(compared) and first is None and not missing,
        "files": files,
        "first": first,
        "missing": missing,
        "not_compared": [f["path"] for f in files if not f.get("compared", True)],
        "ignored": ignored,
        "all_ignored": bool(ignored) and not files,
    }


_SPECIAL = ("a FIFO", "a socket", "a device")


def _kind(path: Path) -> str:
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return "nothing"
    if stat.S_ISLNK(mode):
        return "a symbolic link"
    if stat.S_ISREG(mode):
        return "a regular file"
    if stat.S_ISDIR(mode):
        return "a directory"
    return "a FIFO" if stat.S_ISFIFO(mode) else "a socket" if stat.S_ISSOCK(mode) else "a device"


def compare_files(a: Path, b: Path, explain: bool = True, ignore_fields: list[str] = ()) -> dict:
    """{"same", "sha256_a", "sha256_b", "detail"}: bytes first, then the format's content. A regular file
    against anything else (a FIFO, a directory, a link, nothing) differs; only where neither side can be
    read (special files on both sides, both too large) is it {"compared": False}. `ignore_fields`: keys
    or columns left out of a JSON, YAML or CSV file's comparison (recorded as "ignored_fields")."""
    kind_a, kind_b = _kind(a), _kind(b)
    if kind_a != kind_b:
        if kind_a in _SPECIAL and kind_b in _SPECIAL:
            return {"same": False, "compared": False, "detail": f"not compared: {kind_a} in A, {kind_b} in B"}
        return {"same": False, "detail": f"{kind_a} in A, {kind_b} in B"}
    if kind_a == "a symbolic link":  # never followed: what it points to may be one file for every run
        ta, tb = _link(a), _link(b)
        if ta != tb:
            return {"same": False, "detail": f"links: {ta!r} vs {tb!r}"}
        return {"same": False, "compared": False, "detail": f"not compared: a symbolic link in both runs (to {ta!r})"}
    if kind_a == "a regular file" and _same_file(a, b):
        return {
            "same": False,
            "compared": False,
            "detail": "not compared: one file in both runs (a hard link): neither run's own result is there",
        }
    if kind_a == "a directory":
        return _orbax_difference(a, b)
    if kind_a in _SPECIAL:
        return {"same": False, "compared": False, "detail": f"not compared: {kind_a} in both runs"}
    data, errors = [], []
    for side, path in (("A", a), ("B", b)):
        try:
            data.append(read_bytes(path, MAX_OUTPUT_BYTES, CheckpointError))
        except CheckpointError as exc:
            data.append(None)
            errors.append(f"{side}: {exc}")
    data_a, data_b = data
    if errors:
        sizes = [os.lstat(path).st_size for path in (a, b)]
        if len(errors) == 1 and sizes[0] != sizes[1]:  # one side read, the sizes differ: the bytes differ
            return {"same": False, "detail": f"the bytes differ ({sizes[0]} vs {sizes[1]} bytes); {errors[0]}"}
        return {"same": False, "compared": False, "detail": f"not compared: {'; '.join(errors)}"}
    digests = {"sha256_a": hashlib.sha256(data_a).hexdigest(), "sha256_b": hashlib.sha256(data_b).hexdigest()}
    if data_a == data_b:
        return {"same": True, **digests, "detail": None}
    if not explain and not ignore_fields and not a.name.endswith(".keras"):
        return {"same": False, **digests, "detail": f"the bytes differ ({len(data_a)} vs {len(data_b)} bytes)"}
    return {"same": False, **digests, **content_difference(a.name, data_a, data_b, list(ignore_fields))}


def _orbax_difference(a: Path, b: Path) -> dict:
    """Two Orbax checkpoints, tensor by tensor (their bytes are never equal). Where Orbax cannot read
    either side, the two directories file by file (_files_difference): identical files are the same,
    anything else a difference that names the first differing file and why Orbax could not read it."""
    trees, errors, missing = [], [], True
    for side, path in (("A", a), ("B", b)):
        try:
            trees.append(load_orbax(path))
        except Exception as exc:  # Orbax and TensorStore meeting someone else's files
            errors.append(f"{side}: {type(exc).__name__}: {one_line(str(exc))[:200]}")
            missing = missing and isinstance(exc, ImportError)
    if errors:
        why = f"could not be read as an Orbax checkpoint ({'; '.join(errors)})"
        files = _files_difference(a, b, why)
        if missing and not files["same"]:  # JAX or Orbax not installed here: the tensors are unknown
            return {"same": False, "compared": False, "detail": f"not compared: {why}; its files differ"}
        return files
    ta, tb = trees
    rows = [row for row in tensor_differences(ta, tb) if not row["identical"]]
    if not rows:
        return {"same": True, "detail": None, "tensors": len(ta)}
    first = rows[0]
    return {
        "same": False,
        "tensor": first,
        "detail": f"tensor {first['tensor']}: {difference_size(first)} "
        f"({len(rows)} of {len(set(ta) | set(tb))} tensors differ)",
    }


def beside_tensors(a: Path, b: Path) -> list[dict]:
    """Two Orbax checkpoints' files that Orbax did not write (a history.json saved beside the weights:
    walk_outputs lists them), each compared as compare_outputs compares it (Orbax's step metadata without
    its times), named by its path below the checkpoint; a file on one side only is a difference."""
    beside = [
        {name.partition("/")[2]: path for name, path in walk_outputs(root.parent, [root.name]).items() if "/" in name}
        for root in (a, b)
    ]
    entries = []
    for name in sorted(set(beside[0]) | set(beside[1])):
        if name not in beside[0] or name not in beside[1]:
            side, path = ("A", beside[0][name]) if name in beside[0] else ("B", beside[1][name])
            entries.append({"path": name, "same": False, "detail": f"only in {side} ({_kind(path)})"})
            continue
        times = list(ORBAX_TIMES) if posixpath.basename(name) == ORBAX_TIMESTAMP else []  # its save times
        entries.append({"path": name, **compare_files(beside[0][name], beside[1][name], ignore_fields=times)})
    return entries


def _files_difference(a: Path, b: Path, why: str) -> dict:
    """Two directories by the files below them (compare_files each; Orbax's _CHECKPOINT_METADATA without its
    times): the same only where every one is."""
    listed = [files_below(root) for root in (a, b)]
    entries = []
    for name in sorted(set(listed[0]) | set(listed[1])):
        if name not in listed[0] or name not in listed[1]:
            side, path = ("A", listed[0][name]) if name in listed[0] else ("B", listed[1][name])
            entries.append({"path": name, "same": False, "detail": f"only in {side} ({_kind(path)})"})
        else:
            times = list(ORBAX_TIMES) if posixpath.basename(name) == ORBAX_TIMESTAMP else []
            entries.append({"path": name, **compare_files(listed[0][name], listed[1][name], ignore_fields=times)})
    differing = [e for e in entries if not e["same"] and e.get("compared", True)]
    unread = [e for e in entries if not e.get("compared", True)]
    counted = f"{len(entries) - len(unread)} of {len(entries)} files compared"
    if differing:
        first = differing[0]
        return {
            "same": False,
            "detail": f"{why}; file by file, {len(differing)} of {len(entries)} differ, the first "
            f"{one_line(first['path'])}: {first['detail']}",
            "first_file": first,
        }
    if unread:  # neither side of these could be read (FIFOs in both, too large): not checked
        return {
            "same": False,
            "compared": False,
            "detail": f"not compared: {why}; {counted}, all identical; "
            f"{one_line(unread[0]['path'])}: {unread[0]['detail']}",
        }
    return {"same": True, "detail": f"{why}; file by file, all {len(entries)} identical", "files": len(entries)}


def _same_file(a: Path, b: Path) -> bool:
    try:
        one, other = os.lstat(a), os.lstat(b)
    except OSError:
        return False
    return (one.st_dev, one.st_ino) == (other.st_dev, other.st_ino)


def _link(path: Path) -> str | None:
    return os.readlink(path) if path.is_symlink() else None


def content_difference(name: str, a: bytes, b: bytes, ignore_fields: list[str] = ()) -> dict:
    """Where two different files of one name differ, by their format: the first tensor (with its ULP
    statistics), JSON key or line; "detail" says it in words. "same": True where the only differences lie
    in `ignore_fields` (or a Keras archive's date_saved), which "ignored_fields" lists. A file that cannot
    be read as its format is a difference that says so, never an exception."""
    suffix = next((s for s in (*TENSOR_SUFFIXES, *TEXT_SUFFIXES) if name.endswith(s)), None)
    if name == ORBAX_TIMESTAMP or name.endswith("/" + ORBAX_TIMESTAMP):
        suffix = ".json"  # Orbax's step metadata: JSON without the suffix
    try:
        if ignore_fields:
            return _fields_difference(suffix, a, b, list(ignore_fields), one_line(name))
        if suffix == ".keras" and a.startswith(b"PK") and b.startswith(b"PK"):
            return _keras_difference(a, b, one_line(name))
        if suffix in TENSOR_SUFFIXES:
            ta, tb = load_tensors(suffix, a, f"{name} (A)"), load_tensors(suffix, b, f"{name} (B)")
            found = _tensors_difference(ta, tb)
            if found["tensor"] is None and suffix in (".pt", ".pth"):
                return _torch_layout(a, b, name)
            return found
        if suffix == ".json":
            return _first_key(parse_json(a, "A", CheckpointError), parse_json(b, "B", CheckpointError))
        if suffix in TEXT_SUFFIXES:
            return _first_line(a, b)
    except Exception as exc:  # a reader meeting someone else's file: a difference, named
        return {"detail": f"the bytes differ; the file could not be read as {suffix}: {one_line(str(exc))[:200]}"}
    return {"detail": f"the bytes differ ({len(a)} vs {len(b)} bytes; a format this comparison does not read)"}


def _tensors_difference(ta: dict, tb: dict) -> dict:
    rows = [row for row in tensor_differences(ta, tb) if not row["identical"]]
    if not rows:
        return {"detail": "the bytes differ, every tensor is identical (metadata or layout)", "tensor": None}
    first = rows[0]
    return {
        "tensor": first,
        "detail": f"tensor {first['tensor']}: {difference_size(first)} "
        f"({len(rows)} of {len(set(ta) | set(tb))} tensors differ)",
    }


def _torch_layout(a: bytes, b: bytes, name: str) -> dict:
    """Two torch.save files whose every tensor and value read the same: a layout difference only where
    everything torch would load is the same too, types, keys and nesting included (torch_structure)."""
    if torch_structure(a, f"{name} (A)") == torch_structure(b, f"{name} (B)"):
        return {
            "detail": "the bytes differ, everything torch would load is identical, every type and key too (a "
            "layout difference: pickle's memo or the archive's order)",
            "tensor": None,
            "layout": True,
        }
    return {
        "detail": "the bytes differ, every tensor is identical, but what torch would load is not (a value's "
        "type, a key's type, the nesting, a set, a Parameter, or how tensors share storage)",
        "tensor": None,
    }


def _keras_difference(a: bytes, b: bytes, name: str) -> dict:
    """Two Keras 3 archives by their weights, config.json and metadata.json (without date_saved, which
    changes with every save), and any other member by its bytes."""
    pa, pb = read_keras(a, f"{name} (A)"), read_keras(b, f"{name} (B)")
    ignored = {"ignored_fields": [f"metadata.json:{key}" for key in KERAS_VOLATILE]}
    weights = _tensors_difference(pa["weights"], pb["weights"])
    if weights["tensor"] is not None:
        return {"same": False, **weights, **ignored}
    for part in ("config", "metadata"):
        if repr(pa[part]) != repr(pb[part]):
            key = _first_key(pa[part], pb[part])
            return {
                "same": False,
                "detail": f"{part}.json: {key['detail']}",
                "key": f"{part}.json:{key['key']}",
                **ignored,
            }
    for member in sorted(set(pa["other"]) | set(pb["other"])):
        if pa["other"].get(member) != pb["other"].get(member):
            return {"same": False, "detail": f"the archive's {one_line(member)} differs", **ignored}
    return {
        "same": True,
        "detail": f"identical weights and config; only {', '.join(ignored['ignored_fields'])} differs (ignored)",
        "tensor": None,
        **ignored,
    }


MAX_FIELD_FILE_BYTES = 256 << 20  # a JSON, YAML or CSV file read whole to leave a field out


def _fields_difference(suffix: str | None, a: bytes, b: bytes, keys: list[str], name: str) -> dict:
    """Two text files compared with `keys` left out: JSON, JSON lines and YAML by a dotted key path, CSV
    and TSV by a header column; "ignored_fields" records the keys, and which of them neither file held.
    What else must be equal:
    - JSON and JSON lines: every other value as parsed (strictly: duplicate keys refused), exactly (repr:
      types, float bits and key order); so layout, number spellings of one float (5e-1, 0.50) and string
      escapes are not compared, nor blank lines between JSON lines;
    - YAML: every other key and value as written (read_yaml_as_written: each scalar's text with its tag
      and quotes, in order; duplicate keys refused), since YAML 1.1 reads different texts as one value
      (yes and true, 0x10 and 16); only comments and layout are not compared;
    - CSV and TSV: every other cell as parsed, row by row; so quoting and line endings (CRLF) are not."""
    if suffix not in (".json", ".jsonl", ".yaml", ".yml", ".csv", ".tsv"):
        raise CheckpointError(f"{name}: FILE:KEY ignores apply to JSON, YAML and CSV files only")
    if max(len(a), len(b)) > MAX_FIELD_FILE_BYTES:
        raise CheckpointError(f"{name}: larger than the {MAX_FIELD_FILE_BYTES} bytes read to leave a field out")
    found: set[str] = set()
    if suffix in (".yaml", ".yml"):
        va, vb = (_yaml_without(x, keys, found, f"{name} ({s})") for x, s in ((a, "A"), (b, "B")))
        absent = [k for k in keys if k not in found]
        recorded = {"ignored_fields": keys, **({"ignored_absent": absent} if absent else {})}
        if va == vb:
            return {"same": True, "detail": f"identical but for the ignored {', '.join(keys)}", **recorded}
        return {"same": False, **_first_written(va, vb), **recorded}
    if suffix in (".csv", ".tsv"):
        va, vb = (_rows_without(x, keys, found, suffix, f"{name} ({s})") for x, s in ((a, "A"), (b, "B")))
    else:
        va, vb = (_values_without(x, keys, found, suffix, f"{name} ({s})") for x, s in ((a, "A"), (b, "B")))
    absent = [k for k in keys if k not in found]
    recorded = {"ignored_fields": keys, **({"ignored_absent": absent} if absent else {})}
    if repr(va) == repr(vb):
        return {"same": True, "detail": f"identical but for the ignored {', '.join(keys)}", **recorded}
    if suffix in (".csv", ".tsv"):
        for number, (x, y) in enumerate(zip(va, vb, strict=False), start=1):
            if x != y:
                return {
                    "same": False,
                    "detail": f"row {number}: {str(x)[:80]} vs {str(y)[:80]}",
                    "line": number,
                    **recorded,
                }
        return {"same": False, "detail": f"{len(va)} vs {len(vb)} rows", "line": min(len(va), len(vb)) + 1, **recorded}
    return {"same": False, **_first_key(va, vb), **recorded}


def _values_without(data: bytes, keys: list[str], found: set[str], suffix: str, where: str):
    if suffix == ".json":
        values = [parse_json(data, where, CheckpointError)]
    elif suffix == ".jsonl":
        lines = [line for line in data.split(b"\n") if line.strip()]
        values = [parse_json(line, f"{where}:{i}", CheckpointError) for i, line in enumerate(lines, start=1)]
    else:
        raise AssertionError(suffix)
    for value in values:
        for key in keys:
            if _drop(value, key.split(".")):
                found.add(key)
    return values if suffix == ".jsonl" else values[0]


def _yaml_without(data: bytes, keys: list[str], found: set[str], where: str):
    value = read_yaml_as_written(data, where)
    for key in keys:
        if _drop_written(value, key.split(".")):
            found.add(key)
    return value


def read_yaml_as_written(data: bytes, where: str):
    """A YAML document as written, for comparing: a scalar as its text in the file (its tag, quotes and
    spelling: `yes`, `true` and `"true"` all differ); a sequence as ("seq", tag, [items]); a mapping as
    ("map", tag, [[name, key as written, value], ...]) in the file's order, `name` the key's string
    (None for a key that is not a string) for naming and leaving it out. The document is read as
    parse_yaml reads it first (duplicate keys, aliases, deep nesting refused)."""
    node, text = compose_yaml(data, where, CheckpointError)

    def written(node):
        if isinstance(node, yaml.ScalarNode):
            return text[node.start_mark.index : node.end_mark.index]
        if isinstance(node, yaml.SequenceNode):
            return ("seq", node.tag, [written(item) for item in node.value])
        pairs = []
        for key, value in node.value:
            named = isinstance(key, yaml.ScalarNode) and key.tag == "tag:yaml.org,2002:str"
            pairs.append([key.value if named else None, written(key), written(value)])
        return ("map", node.tag, pairs)

    return None if node is None else written(node)


def _drop_written(value, parts: list[str]) -> bool:
    """_drop for read_yaml_as_written's values: the pair of the mapping key named by the dotted path
    removed, a sequence item replaced by "<ignored>"; whether it was there."""
    for number, part in enumerate(parts):
        if not isinstance(value, tuple):
            return False
        items = value[2]
        if value[0] == "map":
            place = next((i for i, pair in enumerate(items) if pair[0] == part), None)
        else:
            place = int(part) if part.isdigit() and int(part) < len(items) else None
        if place is None:
            return False
        if number == len(parts) - 1:
            if value[0] == "map":
                del items[place]
            else:
                items[place] = "<ignored>"
            return True
        value = items[place][2] if value[0] == "map" else items[place]
    return False


def _first_written(a, b, path: str = "") -> dict:
    """Where two of read_yaml_as_written's values first differ, named by key path."""
    where = path or "<top>"
    if not (isinstance(a, tuple) and isinstance(b, tuple) and a[:2] == b[:2]):
        return {
            "detail": f"first differing value at {where}: {_written_text(a)} vs {_written_text(b)} (as written)",
            "key": path,
        }
    for index, (x, y) in enumerate(zip(a[2], b[2], strict=False)):
        if a[0] == "seq":
            if x != y:
                return _first_written(x, y, f"{path}.{index}" if path else str(index))
            continue
        if x[1] != y[1]:
            return {
                "detail": f"{where}: key {index + 1} is {_written_text(x[1])} vs {_written_text(y[1])}",
                "key": path,
            }
        if x[2] != y[2]:
            name = x[0] if x[0] is not None else _written_text(x[1])
            return _first_written(x[2], y[2], f"{path}.{name}" if path else name)
    unit = "items" if a[0] == "seq" else "keys"
    return {"detail": f"{where}: {len(a[2])} vs {len(b[2])} {unit}", "key": path}


def _written_text(value) -> str:
    if isinstance(value, str):
        return one_line(value)[:60]
    return {"seq": "a sequence", "map": "a mapping"}.get(value[0], "?") if isinstance(value, tuple) else "nothing"


def _drop(value, parts: list[str]) -> bool:
    """Remove the dotted key path from `value` (a list index by its digits: replaced, so that the items
    after it keep their places); whether it was there."""
    for part in parts[:-1]:
        if isinstance(value, dict) and part in value:
            value = value[part]
        elif isinstance(value, list) and part.isdigit() and int(part) < len(value):
            value = value[int(part)]
        else:
            return False
    last = parts[-1]
    if isinstance(value, dict) and last in value:
        del value[last]
        return True
    if isinstance(value, list) and last.isdigit() and int(last) < len(value):
        value[int(last)] = "<ignored>"
        return True
    return False


def _rows_without(data: bytes, columns: list[str], found: set[str], suffix: str, where: str) -> list[list[str]]:
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise CheckpointError(f"{where} is not UTF-8 text") from None
    try:
        rows = list(csv.reader(io.StringIO(text, newline=""), delimiter="\t" if suffix == ".tsv" else ","))
    except csv.Error as exc:
        raise CheckpointError(f"{where}: not CSV ({exc})") from None
    header = rows[0] if rows else []
    dropped = {i for i, column in enumerate(header) if column in columns}
    found.update(header[i] for i in dropped)
    return [[cell for i, cell in enumerate(row) if i not in dropped] for row in rows]


def load_tensors(suffix: str, data: bytes, where: str = "the file") -> dict[str, np.ndarray]:
    """name -> array of a tensor file, by the handler its suffix names (formats.checkpoint_formats): nothing
    in the file is run, every size it declares checked before anything is allocated."""
    handler = by_name(suffix)
    if handler is None:
        raise CheckpointError(f"{where}: {suffix} is no tensor format read here")
    return handler.read(data, where)


def _first_key(a, b, path: str = "") -> dict:
    if type(a) is not type(b) or not isinstance(a, dict | list):
        return {"detail": f"first differing value at {path or '<top>'}: {str(a)[:60]} vs {str(b)[:60]}", "key": path}
    keys = sorted(set(a) | set(b)) if isinstance(a, dict) else range(max(len(a), len(b)))
    for key in keys:
        inner = f"{path}.{key}" if path else str(key)
        if isinstance(a, dict) and (key not in a or key not in b):
            return {"detail": f"key {inner} only in {'A' if key in a else 'B'}", "key": inner}
        if isinstance(a, list) and (key >= len(a) or key >= len(b)):
            return {"detail": f"{path or '<top>'}: {len(a)} vs {len(b)} items", "key": inner}
        if a[key] != b[key]:
            return _first_key(a[key], b[key], inner)
    return {"detail": "the bytes differ, the values are equal (formatting)", "key": None}


def _first_line(a: bytes, b: bytes) -> dict:
    la, lb = a.decode("utf-8", "replace").splitlines(), b.decode("utf-8", "replace").splitlines()
    for number, (x, y) in enumerate(zip(la, lb, strict=False), start=1):
        if x != y:
            return {"detail": f"line {number}: {x[:80]!r} vs {y[:80]!r}", "line": number}
    return {"detail": f"{len(la)} vs {len(lb)} lines", "line": min(len(la), len(lb)) + 1}
