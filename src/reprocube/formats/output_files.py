"""The files a run's declared outputs are (a file, every file under a directory, an Orbax checkpoint as one
output), listed without following a link, and an Orbax (PyTree) checkpoint read into arrays: below the
comparison engine (reprocube.analysis.outputs), so that a script receipt's writer (reprocube.formats.script_receipt)
lists and digests outputs as the engine compares them without importing it."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from reprocube.errors import CheckpointError
from reprocube.formats.tensor_readers import Budget, element_count
from reprocube.terminal import one_line
from reprocube.untrusted import MAX_JSON_BYTES, parse_json, read_bytes

MAX_OUTPUT_BYTES = 2 << 30  # a checkpoint of a model that trains in minutes is far smaller
MAX_FILES = 100_000
ORBAX_TREE = "_METADATA"  # the file that makes a directory an Orbax (PyTree) checkpoint
# Orbax's step metadata (JSON): its metrics and custom_metadata are compared, its times are not.
ORBAX_TIMESTAMP = "_CHECKPOINT_METADATA"
ORBAX_TIMES = ("init_timestamp_nsecs", "commit_timestamp_nsecs", "performance_metrics")
# What Orbax itself writes in a checkpoint directory (read as its tensors, or a marker holding the
# directory's own path): never compared file by file. Any other file there is the script's, compared.
ORBAX_OWN_FILES = frozenset({ORBAX_TREE, "_sharding", "manifest.ocdbt", "commit_success.txt"})
ORBAX_OWN_DIRS = ("d", "ocdbt.process_", "array_metadatas", "descriptor")


def is_orbax(path: Path) -> bool:
    """A directory that is an Orbax (PyTree) checkpoint, compared by its tensors as one output: it holds a
    `_METADATA` that is a regular file, a JSON object with Orbax's tree_metadata (any other `_METADATA`,
    a script's own, leaves the directory's files compared one by one)."""
    if not (path.is_dir() and not path.is_symlink()):
        return False
    try:
        metadata = parse_json(read_bytes(path / ORBAX_TREE, MAX_JSON_BYTES, CheckpointError), "", CheckpointError)
    except CheckpointError:
        return False
    return isinstance(metadata, dict) and "tree_metadata" in metadata


def walk_outputs(root: Path, outputs: list[str], top_as_files: bool = False) -> dict[str, Path]:
    """Everything under the declared outputs that exists, by path relative to `root`: regular files,
    links (never entered), FIFOs and other special files, Orbax checkpoint directories (one entry, and
    every file in them that Orbax did not write: ORBAX_OWN_FILES; with top_as_files, a declared directory
    itself never is)."""
    found: dict[str, Path] = {}
    for output in outputs:
        start = root / output
        through = link_above(root, output)
        if through is not None:  # under a linked directory: listed as that link, never read through it
            found[relative_name(through, root, output)] = through
            continue
        if not os.path.lexists(start):
            continue  # missing: compare_outputs names it
        if start.is_symlink() or not start.is_dir():
            found[relative_name(start, root, output)] = start
            continue
        for directory, dirs, files in os.walk(start, followlinks=False):
            whole = not (top_as_files and Path(directory) == start)
            own: frozenset[str] = frozenset()
            if whole and ORBAX_TREE in files and is_orbax(Path(directory)):  # one output, by its tensors
                found[relative_name(Path(directory), root, output)] = Path(directory)
                dirs[:] = [d for d in dirs if not d.startswith(ORBAX_OWN_DIRS) or (Path(directory) / d).is_symlink()]
                own = ORBAX_OWN_FILES
            for name in sorted(files) + [d for d in dirs if (Path(directory) / d).is_symlink()]:
                path = Path(directory) / name
                if name not in own:
                    found[path.relative_to(root).as_posix()] = path
            if len(found) > MAX_FILES:
                raise CheckpointError(f"{start}: more than {MAX_FILES} files: declare fewer outputs")
    return found


def link_above(root: Path, output: str) -> Path | None:
    """The first directory on the way from root to an output that is a symbolic link (the output would
    be read through it: another run's, or a scratch folder's file), or None."""
    path = root
    for part in Path(output).parts[:-1]:
        path = path / part
        if path.is_symlink():
            return path
    return None


def relative_name(path: Path, root: Path, output: str) -> str:
    try:
        return path.relative_to(root).as_posix()
    except ValueError:
        return output


def files_below(directory: Path) -> dict[str, Path]:
    """Every file below a directory (as walk_outputs lists them, the directory itself never one Orbax output), by
    path relative to it."""
    return walk_outputs(directory, ["."], top_as_files=True)


def load_orbax(path: Path) -> dict[str, np.ndarray]:
    """name -> array of an Orbax PyTree checkpoint (load_orbax_tree's arrays)."""
    return load_orbax_tree(path)[0]


def load_orbax_tree(path: Path) -> tuple[dict[str, np.ndarray], str]:
    """name -> array of an Orbax PyTree checkpoint, and its tree's structure in words (its containers and
    keys, as JAX's tree definition writes them, and each leaf's type): {"a": {"b": x}} and {"a.b": x} give one
    name and another structure. Regular files and directories only (a link or a FIFO inside is refused
    before Orbax opens anything), at most MAX_OUTPUT_BYTES in all; Orbax reads its arrays through
    TensorStore and its metadata as JSON (no pickle)."""
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

    checkpointer = ocp.StandardCheckpointer()
    # The shapes its array metadata declares, checked against the budget before Orbax allocates them.
    metadata = checkpointer.metadata(path.absolute())
    budget = Budget(str(path))
    for keys, leaf in jax.tree_util.tree_flatten_with_path(getattr(metadata, "item_metadata", metadata))[0]:
        name = one_line(jax.tree_util.keystr(keys, simple=True, separator="."))
        shape, dtype = getattr(leaf, "shape", None), getattr(leaf, "dtype", None)
        if shape is None or dtype is None:
            continue  # a scalar or a value without array metadata
        budget.charge(element_count(tuple(shape), f"{path}: {name}") * np.dtype(dtype).itemsize, name)
    tree = checkpointer.restore(path.absolute())
    flat, definition = jax.tree_util.tree_flatten_with_path(tree)
    arrays = {jax.tree_util.keystr(keys, simple=True, separator="."): np.asarray(leaf) for keys, leaf in flat}
    structure = f"{definition}; leaves: {', '.join(type(leaf).__name__ for _, leaf in flat)}"
    return arrays, structure
