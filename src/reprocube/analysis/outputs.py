"""Two sets of a training script's outputs (files and directories in two work directories, or two paths
given to `reprocube diff`), compared: bytes first; where the bytes differ, the tensors by name in the
formats researchers save (safetensors, `.pt`/`.pth` read with `torch.load(weights_only=True)` only, `.npz`
and `.npy` without pickles, Keras `.h5`, Orbax checkpoint directories), and JSON, CSV and text line by
line; the first differing tensor, key or line named, with the ULP statistics of reprocube.analysis.tensors.
An Orbax checkpoint (a directory holding `_METADATA`) is one output compared by its tensors only: its
bytes hold timestamps and random file names, and Orbax's own `_CHECKPOINT_METADATA` (a timestamp) is not
compared wherever it lies.

Every file is someone else's: read through reprocube.untrusted (a regular file, at most MAX_OUTPUT_BYTES,
a symbolic link never followed but compared by its target's text), parsed by a library told not to run
code, and a file that cannot be parsed is a difference named as such, never a traceback."""

from __future__ import annotations

import fnmatch
import hashlib
import io
import os
from pathlib import Path

import numpy as np

from reprocube.analysis.tensors import tensor_differences
from reprocube.errors import CheckpointError
from reprocube.results.wording import difference_size
from reprocube.untrusted import parse_json, read_bytes

MAX_OUTPUT_BYTES = 2 << 30  # a checkpoint of a model that trains in minutes is far smaller
MAX_FILES = 100_000
TENSOR_SUFFIXES = (".safetensors", ".pt", ".pth", ".npz", ".npy", ".h5", ".keras")
TEXT_SUFFIXES = (".json", ".jsonl", ".csv", ".txt", ".log", ".tsv", ".yaml", ".yml")
ORBAX_TREE = "_METADATA"  # the file that makes a directory an Orbax (PyTree) checkpoint
ORBAX_TIMESTAMP = "_CHECKPOINT_METADATA"


def is_orbax(path: Path) -> bool:
    """A directory that is an Orbax (PyTree) checkpoint: compared by its tensors, as one output."""
    return path.is_dir() and not path.is_symlink() and (path / ORBAX_TREE).is_file()


def collect(root: Path, outputs: list[str], ignore: list[str]) -> dict[str, Path]:
    """The declared outputs under `root` (files, and every file under a directory), by path relative to
    `root`, without those matching an --ignore glob; symbolic links are listed, never entered."""
    found: dict[str, Path] = {}
    for output in outputs:
        start = root / output
        if start.is_symlink() or start.is_file():
            found[output] = start
            continue
        if not start.is_dir():
            continue  # missing: compare_outputs names it
        for directory, dirs, files in os.walk(start, followlinks=False):
            if ORBAX_TREE in files:  # one output, compared by its tensors
                found[Path(directory).relative_to(root).as_posix()] = Path(directory)
                dirs[:] = []
                continue
            for name in sorted(files) + [d for d in dirs if (Path(directory) / d).is_symlink()]:
                path = Path(directory) / name
                if name != ORBAX_TIMESTAMP:
                    found[path.relative_to(root).as_posix()] = path
            if len(found) > MAX_FILES:
                raise CheckpointError(f"{start}: more than {MAX_FILES} files: declare fewer outputs")
    return {name: path for name, path in found.items() if not any(fnmatch.fnmatch(name, g) for g in ignore)}


def compare_outputs(a_root: Path, b_root: Path, outputs: list[str], ignore: list[str], explain: bool = True) -> dict:
    """Every declared output of run B against run A's: {"identical", "files": [...], "first": the first
    differing file's entry or None, "missing": declared outputs neither run wrote, "not_compared": files
    that could not be read}. explain=False: bytes
    only (where differing is all that is asked: no framework is imported to name a tensor)."""
    a, b = collect(a_root, outputs, ignore), collect(b_root, outputs, ignore)
    missing = [o for o in outputs if not any(n == o or n.startswith(o.rstrip("/") + "/") for n in {*a, *b})]
    files = []
    for name in sorted(set(a) | set(b)):
        if name not in a or name not in b:
            files.append({"path": name, "same": False, "detail": f"only in {'A' if name in a else 'B'}"})
            continue
        files.append({"path": name, **compare_files(a[name], b[name], explain)})
    # A file that could not be read (too large, not a regular file) is not compared: it is neither the
    # same nor different, and the caller names it as not checked.
    compared = [f for f in files if f.get("compared", True)]
    first = next((f for f in compared if not f["same"]), None)
    return {
        "identical": bool(compared) and first is None and not missing,
        "files": files,
        "first": first,
        "missing": missing,
        "not_compared": [f["path"] for f in files if not f.get("compared", True)],
    }


def compare_files(a: Path, b: Path, explain: bool = True) -> dict:
    """{"same", "sha256_a", "sha256_b", "detail"}: bytes first, then the format's content."""
    if a.is_symlink() or b.is_symlink():
        ta, tb = _link(a), _link(b)
        return {"same": ta == tb, "detail": None if ta == tb else f"links: {ta!r} vs {tb!r}"}
    if a.is_dir() or b.is_dir():
        if not (a.is_dir() and b.is_dir()):
            return {"same": False, "detail": "an Orbax checkpoint in one run, a file in the other"}
        return _orbax_difference(a, b)
    try:
        data_a, data_b = (
            read_bytes(a, MAX_OUTPUT_BYTES, CheckpointError),
            read_bytes(b, MAX_OUTPUT_BYTES, CheckpointError),
        )
    except CheckpointError as exc:
        return {"same": False, "compared": False, "detail": f"not compared: {exc}"}
    digests = {"sha256_a": hashlib.sha256(data_a).hexdigest(), "sha256_b": hashlib.sha256(data_b).hexdigest()}
    if data_a == data_b:
        return {"same": True, **digests, "detail": None}
    if not explain:
        return {"same": False, **digests, "detail": f"the bytes differ ({len(data_a)} vs {len(data_b)} bytes)"}
    return {"same": False, **digests, **content_difference(a.name, data_a, data_b)}


def _orbax_difference(a: Path, b: Path) -> dict:
    """Two Orbax checkpoints, tensor by tensor (their bytes are never equal)."""
    try:
        ta, tb = load_orbax(a), load_orbax(b)
    except (CheckpointError, ValueError, OSError, KeyError, TypeError, RuntimeError) as exc:
        return {
            "same": False,
            "compared": False,
            "detail": f"not compared: an Orbax checkpoint could not be read: {str(exc)[:200]}",
        }
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


def load_orbax(path: Path) -> dict[str, np.ndarray]:
    """name -> array of an Orbax PyTree checkpoint: regular files and directories only (a link or a FIFO
    inside is refused before Orbax opens anything), at most MAX_OUTPUT_BYTES in all; Orbax reads its
    arrays through TensorStore and its metadata as JSON (no pickle)."""
    total = 0
    for directory, dirs, files in os.walk(path, followlinks=False):
        for name in [*dirs, *files]:
            entry = Path(directory) / name
            if entry.is_symlink() or not (entry.is_dir() or entry.is_file()):
                raise CheckpointError(f"{entry}: not a regular file or directory")
            total += entry.stat().st_size if entry.is_file() else 0
        if total > MAX_OUTPUT_BYTES:
            raise CheckpointError(f"{path}: larger than {MAX_OUTPUT_BYTES} bytes")
    import jax
    import orbax.checkpoint as ocp

    tree = ocp.StandardCheckpointer().restore(path.absolute())
    flat, _ = jax.tree_util.tree_flatten_with_path(tree)
    return {jax.tree_util.keystr(keys, simple=True, separator="."): np.asarray(leaf) for keys, leaf in flat}


def _link(path: Path) -> str | None:
    return os.readlink(path) if path.is_symlink() else None


def content_difference(name: str, a: bytes, b: bytes) -> dict:
    """Where two different files of one name differ, by their format: the first tensor (with its ULP
    statistics), JSON key or line; "detail" says it in words."""
    suffix = next((s for s in (*TENSOR_SUFFIXES, *TEXT_SUFFIXES) if name.endswith(s)), None)
    try:
        if suffix in TENSOR_SUFFIXES:
            ta, tb = load_tensors(suffix, a), load_tensors(suffix, b)
            rows = [row for row in tensor_differences(ta, tb) if not row["identical"]]
            if not rows:
                return {"detail": "the bytes differ, every tensor is identical (metadata or layout)", "tensor": None}
            first = rows[0]
            return {
                "tensor": first,
                "detail": f"tensor {first['tensor']}: {difference_size(first)} "
                f"({len(rows)} of {len(set(ta) | set(tb))} tensors differ)",
            }
        if suffix == ".json":
            return _first_key(parse_json(a, "A", CheckpointError), parse_json(b, "B", CheckpointError))
        if suffix in TEXT_SUFFIXES:
            return _first_line(a, b)
    except (CheckpointError, ValueError, OSError, KeyError, TypeError, RuntimeError) as exc:
        return {"detail": f"the bytes differ; the file could not be read as {suffix}: {str(exc)[:200]}"}
    return {"detail": f"the bytes differ ({len(a)} vs {len(b)} bytes; a format this comparison does not read)"}


def load_tensors(suffix: str, data: bytes) -> dict[str, np.ndarray]:
    """name -> array of a tensor file, through a loader that runs no code from the file."""
    if suffix == ".safetensors":
        from safetensors.numpy import load

        return dict(load(data))
    if suffix == ".npy":
        return {"array": np.load(io.BytesIO(data), allow_pickle=False)}
    if suffix == ".npz":
        with np.load(io.BytesIO(data), allow_pickle=False) as archive:
            return {key: archive[key] for key in archive.files}
    if suffix in (".pt", ".pth"):
        import torch  # only for a PyTorch file

        value = torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)  # never a pickle's code
        return _flatten(value)
    import h5py  # Keras .weights.h5 / .h5 / .keras (an HDF5 file)

    arrays: dict[str, np.ndarray] = {}

    def keep(key: str, item) -> None:  # visititems stops at the first visit that returns a value
        if isinstance(item, h5py.Dataset):
            arrays[key] = np.asarray(item[()])

    with h5py.File(io.BytesIO(data), "r") as file:
        file.visititems(keep)
    return arrays


def _flatten(value, prefix: str = "") -> dict[str, np.ndarray]:
    """A nested state dict (model, optimizer, RNG states) as dotted names -> numpy arrays; numbers too."""
    import torch

    if isinstance(value, torch.Tensor):
        return {prefix or "tensor": value.detach().cpu().contiguous().numpy()}
    if isinstance(value, dict):
        items = value.items()
    elif isinstance(value, list | tuple):
        items = enumerate(value)
    elif isinstance(value, bool | int | float):
        return {prefix or "value": np.asarray(value)}
    else:
        return {prefix or "value": np.frombuffer(repr(value).encode(), np.uint8)}
    flat: dict[str, np.ndarray] = {}
    for key, item in items:
        flat.update(_flatten(item, f"{prefix}.{key}" if prefix else str(key)))
    return flat


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
