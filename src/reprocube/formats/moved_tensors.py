"""A checkpoint's floating-point tensors moved, in a copy check made: what `reprocube check`'s moved-weights
restart is given (reprocube.check.moved_weights), each format's mover named in formats.checkpoint_formats'
table, which dispatches to it (move_by_one). Every value becomes itself plus one: finite, so a
script that refuses non-finite weights (an assert, a divergence guard) still takes them, and far enough
that a restart that uses them computes another loss; one that writes the uninterrupted run's outputs bit
for bit from them never used them.

Written: NumPy `.npy` and `.npz` (each member as it was stored or deflated), safetensors, and `torch.save`
zip files (the storages its restricted unpickler reads as floating point: tensors; NumPy arrays pickled
inline are left). Integers, booleans and bytes (steps, RNG states, seeds) are left as they are, so a
restart still finds where it was and what it drew. Every file is first read as tensor_readers reads it
(sizes checked before anything is allocated); other files are left untouched."""

from __future__ import annotations

import hashlib
import io
import os
import zipfile
from collections.abc import Callable
from pathlib import Path

import numpy as np

from reprocube.errors import CheckpointError
from reprocube.formats.tensor_readers import (
    MAX_DECODED_BYTES,
    Budget,
    read_npy,
    read_safetensors,
    zip_members,
)
from reprocube.formats.torch_pickle import torch_storage_dtypes
from reprocube.untrusted import read_bytes

Chosen = Callable[[np.ndarray], bool]  # which floating-point tensors to move (None: all)


def _moved(array: np.ndarray, chosen: Chosen) -> bytes | None:
    """The array's values plus one, as its dtype's bytes in its memory order; None where it holds no
    floating-point values (integers, booleans, text: steps, seeds, RNG states), none at all, or is not
    chosen."""
    if array.dtype.kind not in "fcV" or array.size == 0 or not chosen(array):  # V: bfloat16, float8
        return None
    wide = np.complex128 if array.dtype.kind == "c" else np.float64
    try:
        moved = (array.astype(wide) + 1).astype(array.dtype)
    except (ValueError, TypeError):
        return None
    return moved.tobytes(order="F" if array.flags.f_contiguous and not array.flags.c_contiguous else "C")


def move_npy(data: bytes, where: str, chosen: Chosen) -> tuple[bytes, int]:
    array = read_npy(data, where)
    moved = _moved(array, chosen)
    if moved is None:
        return data, 0
    return data[: len(data) - array.nbytes] + moved, 1


def move_npz(data: bytes, where: str, chosen: Chosen) -> tuple[bytes, int]:
    members = zip_members(data, where, Budget(where))
    rewritten, count = {}, 0
    for name, blob in members.items():
        try:
            rewritten[name], set_here = move_npy(blob, f"{where}: {name}", chosen)
        except CheckpointError:  # a member not read (a pickled object: an RNG state's dict) is kept as it was
            rewritten[name], set_here = blob, 0
        count += set_here
    return _rezip(data, rewritten), count


def move_torch(data: bytes, where: str, chosen: Chosen) -> tuple[bytes, int]:
    members = zip_members(data, where, Budget(where))
    rewritten, count = dict(members), 0
    for name, dtype in torch_storage_dtypes(data, where).items():
        blob = members[name]
        storage = np.frombuffer(blob, dtype=dtype) if len(blob) % dtype.itemsize == 0 else None
        moved = _moved(storage, chosen) if storage is not None else None
        if moved is not None:
            rewritten[name], count = moved, count + 1
    return _rezip(data, rewritten), count


def _rezip(original: bytes, members: dict[str, bytes]) -> bytes:
    """The archive again, member by member in its order, each stored or deflated as it was."""
    out = io.BytesIO()
    with zipfile.ZipFile(io.BytesIO(original)) as source, zipfile.ZipFile(out, "w") as target:
        for info in source.infolist():
            if info.is_dir():
                continue
            copy = zipfile.ZipInfo(info.filename, date_time=info.date_time)
            copy.compress_type = info.compress_type
            target.writestr(copy, members[info.filename])
    return out.getvalue()


def move_safetensors(data: bytes, where: str, chosen: Chosen) -> tuple[bytes, int]:
    tensors = read_safetensors(data, where)  # every offset checked against the file
    blob, count = bytearray(data), 0
    base = np.frombuffer(data, dtype=np.uint8)
    for array in tensors.values():
        moved = _moved(array, chosen)
        if moved is None:
            continue
        start = array.__array_interface__["data"][0] - base.__array_interface__["data"][0]
        blob[start : start + len(moved)] = moved
        count += 1
    return bytes(blob), count


def replace_file(path: Path, blob: bytes) -> None:
    """The new bytes in a file made new beside `path` (O_EXCL, never through a link), renamed over it."""
    temp = path.with_name(f".{path.name}.moved")
    times = path.lstat()
    fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    try:
        with os.fdopen(fd, "wb") as file:
            file.write(blob)
        os.utime(temp, ns=(times.st_atime_ns, times.st_mtime_ns), follow_symlinks=False)  # its age kept (round 9's H6b)
        os.replace(temp, path)
    except BaseException:
        temp.unlink(missing_ok=True)
        raise


SEAL_ALGORITHMS = ("sha256", "sha1", "md5")  # what a checksum kept beside a checkpoint is made with
MAX_SEAL_BYTES = 64 << 10  # a sidecar or manifest that may hold a checksum: small


def file_digests(path: Path) -> list[bytes]:
    """The file's hex digests (SEAL_ALGORITHMS' order, lower case), [] where it cannot be read."""
    try:
        data = read_bytes(path, MAX_DECODED_BYTES, CheckpointError)
    except (CheckpointError, OSError):
        return []
    return [hashlib.new(name, data).hexdigest().encode() for name in SEAL_ALGORITHMS]


def reseal(path: Path, digests: dict[bytes, bytes]) -> bool:
    """Where the small file at `path` holds one of `digests`' old hex digests (either case), the new one in
    its place (a new file renamed over it); whether it changed. Bytes are compared, never interpreted."""
    try:
        data = read_bytes(path, MAX_SEAL_BYTES, CheckpointError)
    except (CheckpointError, OSError):
        return False
    new = data
    for old, moved in digests.items():
        new = new.replace(old, moved).replace(old.upper(), moved.upper())
    if new == data:
        return False
    replace_file(path, new)
    return True
