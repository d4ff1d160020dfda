"""One handler per tensor checkpoint format: how a file of it is told (its names, its first bytes or zip
members), read (dotted names -> arrays, every declared size checked before anything is allocated:
formats.tensor_readers, formats.torch_pickle) and, where it can be, moved (a moved-weights restart's copy,
every chosen floating-point value plus one: formats.moved_tensors). Comparing outputs (analysis.outputs)
reads through `by_name`; the weight mover (`move_by_one`) finds a file's handler by its content. A new
format is one row of FORMATS."""

from __future__ import annotations

import io
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from reprocube.errors import CheckpointError
from reprocube.formats.moved_tensors import (
    Chosen,
    move_npy,
    move_npz,
    move_safetensors,
    move_torch,
    replace_file,
)
from reprocube.formats.tensor_readers import (
    MAX_DECODED_BYTES,
    MAX_MEMBERS,
    ZIP_ERRORS,
    read_hdf5,
    read_keras,
    read_npy,
    read_npz,
    read_safetensors,
)
from reprocube.formats.torch_pickle import read_torch
from reprocube.terminal import one_line
from reprocube.untrusted import read_bytes

NPY_MAGIC = b"\x93NUMPY"
HDF5_MAGIC = b"\x89HDF\r\n\x1a\n"


@dataclass(frozen=True)
class TensorFormat:
    name: str
    suffixes: tuple[str, ...]  # the names it is read by, when outputs are compared
    looks_like: Callable[[bytes, list[str]], bool]  # by its bytes and its zip members' names ([]: no zip)
    read: Callable[[bytes, str], dict[str, np.ndarray]]
    move: Callable[[bytes, str, Chosen], tuple[bytes, int]] | None  # None: a restart's copy cannot be moved


def _keras(data: bytes, where: str) -> dict[str, np.ndarray]:
    """A Keras 3 archive by its weights; an HDF5 file named .keras (Keras 2) as HDF5."""
    if data.startswith(b"PK"):
        return {f"weights/{k}": v for k, v in read_keras(data, where)["weights"].items()}
    return read_hdf5(data, where)


def _safetensors_header(data: bytes, _members: list[str]) -> bool:
    return len(data) > 9 and data[8:9] == b"{" and int.from_bytes(data[:8], "little") <= len(data) - 8


FORMATS = (
    TensorFormat(
        "npy", (".npy",), lambda d, _: d.startswith(NPY_MAGIC), lambda d, w: {"array": read_npy(d, w)}, move_npy
    ),
    TensorFormat(
        "torch.save", (".pt", ".pth"), lambda _, m: any(n.endswith("/data.pkl") for n in m), read_torch, move_torch
    ),
    TensorFormat("npz", (".npz",), lambda _, m: bool(m) and all(n.endswith(".npy") for n in m), read_npz, move_npz),
    TensorFormat("safetensors", (".safetensors",), _safetensors_header, read_safetensors, move_safetensors),
    TensorFormat("keras", (".keras",), lambda _, m: "model.weights.h5" in m, _keras, None),
    TensorFormat("hdf5", (".h5",), lambda d, _: d.startswith(HDF5_MAGIC), read_hdf5, None),
)
SUFFIXES = tuple(suffix for handler in FORMATS for suffix in handler.suffixes)


def by_name(name: str) -> TensorFormat | None:
    """The handler a file is read by, from its name's suffix (an output as its script named it)."""
    return next((h for h in FORMATS if any(name.endswith(s) for s in h.suffixes)), None)


def by_content(data: bytes, where: str) -> TensorFormat | None:
    """The handler whose format the bytes are, told by themselves (a checkpoint of any name)."""
    members: list[str] = []
    if data.startswith(b"PK"):
        try:
            with zipfile.ZipFile(io.BytesIO(data)) as archive:
                members = archive.namelist()[: MAX_MEMBERS + 1]
        except ZIP_ERRORS as exc:
            raise CheckpointError(f"{where}: not a zip archive ({one_line(str(exc))[:100]})") from None
    return next((h for h in FORMATS if h.looks_like(data, members)), None)


def move_by_one(path: Path, chosen: Chosen | None = None) -> int | None:
    """Move every floating-point tensor of the file at `path` (a regular file check placed) that `chosen`
    accepts (all, where None) by one, by a new file renamed over it. The number of tensors moved; None
    where the file is in no format that can be moved (left as it is). CheckpointError where it claims a
    format and cannot be read; OSError where it cannot be written."""
    data = read_bytes(path, MAX_DECODED_BYTES, CheckpointError)
    where, chosen = str(path), chosen or (lambda _: True)
    try:
        handler = by_content(data, where)
        if handler is None or handler.move is None:
            return None
        blob, count = handler.move(data, where, chosen)
    except CheckpointError:
        raise
    except Exception as exc:  # a hostile file meeting zipfile or NumPy: one line, never a traceback
        raise CheckpointError(
            f"{where}: cannot be rewritten ({type(exc).__name__}: {one_line(str(exc))[:200]})"
        ) from None
    if count:
        replace_file(path, blob)
    return count
