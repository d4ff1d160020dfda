"""Small file-system helpers shared by the downloader, checkpoints and run directories:
hashing, and writes that are never visible half-done (temp file or directory, fsync, rename)."""

from __future__ import annotations

import hashlib
import os
import tempfile
from pathlib import Path

CHUNK = 1 << 20


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def make_temp_file(directory: Path, final_name: str) -> tuple[int, Path]:
    """A temp file beside its final name (so the rename is atomic), with normal permissions."""
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=f".{final_name}.", suffix=".partial")
    os.fchmod(fd, 0o666 & ~_umask())  # mkstemp makes 0600; the final file should follow the umask
    return fd, Path(tmp)


def write_file_atomic(path: Path, data: bytes) -> None:
    """Write `data` to `path` so that readers see the old file or the whole new one, never a part."""
    path = Path(path)
    fd, tmp = make_temp_file(path.parent, path.name)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)
