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
code, and a file that cannot be parsed is a difference named as such, never a traceback.

Here the sets of outputs and the files' kinds and bytes; a file's content by its format in
reprocube.analysis.output_content, JSON, YAML and CSV values (and the fields left out) in
reprocube.analysis.output_fields."""

from __future__ import annotations

import fnmatch
import hashlib
import os
import posixpath
import stat
from pathlib import Path

from reprocube.analysis.output_content import content_difference
from reprocube.analysis.tensors import tensor_differences
from reprocube.errors import CheckpointError, ConfigError
from reprocube.formats.output_files import (
    MAX_OUTPUT_BYTES,
    ORBAX_TIMES,
    ORBAX_TIMESTAMP,
    files_below,
    load_orbax_tree,
    walk_outputs,
)
from reprocube.results.wording import first_difference
from reprocube.terminal import one_line
from reprocube.untrusted import read_bytes


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
    trees, structures, errors, missing = [], [], [], True
    for side, path in (("A", a), ("B", b)):
        try:
            tree, structure = load_orbax_tree(path)
            trees.append(tree)
            structures.append(structure)
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
    if not rows and structures[0] != structures[1]:  # the same leaves in another tree: restored otherwise
        return {
            "same": False,
            "detail": f"every tensor is identical, the tree is not (its containers, keys or leaf types): "
            f"{one_line(structures[0])[:120]} vs {one_line(structures[1])[:120]}",
        }
    if not rows:
        return {"same": True, "detail": None, "tensors": len(ta)}
    first, detail = first_difference(rows, ta, tb)
    return {
        "same": False,
        "tensor": first,
        "detail": detail,
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
