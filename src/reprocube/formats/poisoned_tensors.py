"""A checkpoint's floating-point tensors set to NaN, in a copy check made: what `reprocube check`'s poisoned
restart is given (reprocube.orchestration.check_session). A restart that uses the weights it reads ends in
NaN; one that writes the uninterrupted run's outputs bit for bit from them never used them.

Written: NumPy `.npy` and `.npz` (each member as it was stored or deflated), safetensors, and `torch.save`
zip files (the storages its restricted unpickler reads as floating point: tensors; NumPy arrays pickled
inline are left). Integers, booleans and bytes (steps, RNG states, seeds) are left as they are, so a
restart still finds where it was and what it drew. Every file is first read as tensor_readers reads it
(sizes checked before anything is allocated); other files are left untouched."""

from __future__ import annotations

import io
import os
import zipfile
from pathlib import Path

import numpy as np

from reprocube.errors import CheckpointError
from reprocube.formats.tensor_readers import (
    MAX_DECODED_BYTES,
    Budget,
    read_npy,
    read_safetensors,
    torch_storage_dtypes,
    zip_members,
)
from reprocube.untrusted import read_bytes

NPY_MAGIC = b"\x93NUMPY"


def poison(path: Path) -> int | None:
    """Set every floating-point tensor of the file at `path` (a regular file check placed) to NaN, by a
    new file renamed over it. The number of tensors set; None where the file is in no format written here
    (left as it is). CheckpointError where it claims a format and cannot be read; OSError where it cannot
    be written."""
    data = read_bytes(path, MAX_DECODED_BYTES, CheckpointError)
    where = str(path)
    if data.startswith(NPY_MAGIC):
        blob, count = _npy(data, where)
    elif data.startswith(b"PK"):
        members = zip_members(data, where, Budget(where))
        if any(name.endswith("/data.pkl") for name in members):
            blob, count = _torch(data, members, where)
        elif members and all(name.endswith(".npy") for name in members):
            blob, count = _npz(data, members, where)
        else:
            return None
    elif _looks_like_safetensors(data):
        blob, count = _safetensors(data, where)
    else:
        return None
    if count:
        _replace(path, blob)
    return count


def _nan_bytes(dtype: np.dtype, count: int) -> bytes | None:
    """`count` NaNs of `dtype` as bytes; None where the dtype holds no NaN (integers, booleans)."""
    if dtype.kind not in "fcV":  # V: bfloat16 and float8 (ml_dtypes)
        return None
    try:
        one = np.full(1, np.nan, dtype=dtype)
        if not np.isnan(one.astype(np.complex128)).all():
            return None
    except (ValueError, TypeError):
        return None
    return one.tobytes() * count


def _npy(data: bytes, where: str) -> tuple[bytes, int]:
    array = read_npy(data, where)
    nan = _nan_bytes(array.dtype, array.size)
    if nan is None or array.size == 0:
        return data, 0
    return data[: len(data) - array.nbytes] + nan, 1


def _npz(data: bytes, members: dict[str, bytes], where: str) -> tuple[bytes, int]:
    rewritten, count = {}, 0
    for name, blob in members.items():
        rewritten[name], set_here = _npy(blob, f"{where}: {name}")
        count += set_here
    return _rezip(data, rewritten), count


def _torch(data: bytes, members: dict[str, bytes], where: str) -> tuple[bytes, int]:
    rewritten, count = dict(members), 0
    for name, dtype in torch_storage_dtypes(data, where).items():
        blob = members[name]
        nan = _nan_bytes(dtype, len(blob) // dtype.itemsize)
        if nan is not None and blob and len(blob) % dtype.itemsize == 0:
            rewritten[name], count = nan, count + 1
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


def _looks_like_safetensors(data: bytes) -> bool:
    return len(data) > 9 and data[8:9] == b"{" and int.from_bytes(data[:8], "little") <= len(data) - 8


def _safetensors(data: bytes, where: str) -> tuple[bytes, int]:
    tensors = read_safetensors(data, where)  # every offset checked against the file
    blob, count = bytearray(data), 0
    base = np.frombuffer(data, dtype=np.uint8)
    for array in tensors.values():
        nan = _nan_bytes(array.dtype, array.size)
        if nan is None or array.size == 0:
            continue
        start = array.__array_interface__["data"][0] - base.__array_interface__["data"][0]
        blob[start : start + len(nan)] = nan
        count += 1
    return bytes(blob), count


def _replace(path: Path, blob: bytes) -> None:
    """The new bytes in a file made new beside `path` (O_EXCL, never through a link), renamed over it."""
    temp = path.with_name(f".{path.name}.nan")
    fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    try:
        with os.fdopen(fd, "wb") as file:
            file.write(blob)
        os.replace(temp, path)
    except BaseException:
        temp.unlink(missing_ok=True)
        raise
