"""Small file-system helpers shared by the downloader, checkpoints and run directories: hashing, and
writes that are never visible half-done (temp file or directory, fsync, rename) and never go through a
symbolic link. Reading untrusted files is reprocube.untrusted's."""

from __future__ import annotations

import errno
import hashlib
import json
import math
import os
import re
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path

from reprocube.errors import ConfigError

CHUNK = 1 << 20


def names_regular_file(arg: str) -> bool:
    """Whether a command-line argument names a regular file (links not followed); one that is no path at
    all (a `python -c` program longer than a file name may be, a NUL) is not."""
    try:
        return Path(arg).is_file() and not Path(arg).is_symlink()
    except (OSError, ValueError):
        return False


def sha256_file(path: Path) -> str:
    """A file's sha256, links followed (a file reprocube wrote or a run's own): sha256_regular for one
    someone else could have replaced."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def sha256_regular(path: Path) -> str | None:
    """A regular file's sha256, opened without following a link or waiting on a FIFO and read CHUNK bytes
    at a time; None for anything else (missing, a link, a directory, a FIFO, a device: its bytes are not a
    file's to compare)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return None
    if not stat.S_ISREG(os.fstat(fd).st_mode):  # before fdopen, which refuses a directory
        os.close(fd)
        return None
    with os.fdopen(fd, "rb") as stream:
        digest = hashlib.sha256()
        while chunk := stream.read(CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def walk_below(root: Path, limit: int | None = None) -> Iterator[tuple[str, bool, bool]]:
    """Every entry below root as (relative name `dir/file`, is a directory, is a regular file): walked with a
    stack (a tree of any depth), links never followed; an unreadable directory or one gone meanwhile is
    skipped; at most `limit` entries."""
    stack, seen = ([""] if root.is_dir() else []), 0
    while stack:
        relative = stack.pop()
        try:
            with os.scandir(root / relative if relative else root) as entries:
                listed = [(e.name, e.is_dir(follow_symlinks=False), e.is_file(follow_symlinks=False)) for e in entries]
        except OSError:
            continue  # gone meanwhile, or unreadable
        for name, is_dir, is_file in listed:
            seen += 1
            if limit is not None and seen > limit:
                return
            path = f"{relative}/{name}" if relative else name
            yield path, is_dir, is_file
            if is_dir:
                stack.append(path)


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def current_umask() -> int:
    """This process's umask (read by setting it and back: there is no other way)."""
    mask = os.umask(0)
    os.umask(mask)
    return mask


def entry_size(path: Path, missing: int = 0) -> int:
    """The size of the entry at path, a link's own (never followed); `missing` where there is none."""
    try:
        return os.lstat(path).st_size
    except OSError:
        return missing


def make_temp_file(directory: Path, final_name: str) -> tuple[int, Path]:
    """A temp file beside its final name (so the rename is atomic), with normal permissions."""
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=f".{final_name}.", suffix=".partial")
    os.fchmod(fd, 0o666 & ~current_umask())  # mkstemp makes 0600; the final file should follow the umask
    return fd, Path(tmp)


def write_file_atomic(path: Path, data: bytes) -> None:
    """Write `data` to `path` so that readers see the old file or the whole new one, never a part. The
    rename replaces a symbolic link at `path` itself, never what it points to. An error names `path`."""
    path = Path(path)
    try:
        fd, tmp = make_temp_file(path.parent, path.name)
    except OSError as exc:
        raise OSError(exc.errno, exc.strerror, str(path)) from None
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise OSError(exc.errno, exc.strerror, str(path)) from None
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)


def json_text(value, indent: int | None = 1, sort_keys: bool = False, compact: bool = False) -> str:
    """The one way reprocube turns a value into JSON: strict (no NaN or Infinity, which no strict reader,
    ours included, accepts), so that every file we write is a file we can read back. A non-finite float
    or a value JSON cannot hold is a bug of ours: it raises ValueError/TypeError naming it."""
    _refuse_non_finite(value, "$")
    separators = (",", ":") if compact else None
    return json.dumps(value, indent=indent, sort_keys=sort_keys, allow_nan=False, separators=separators)


def _refuse_non_finite(value, where: str) -> None:
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError(f"{where} is {value}, which JSON cannot hold")
    if isinstance(value, dict):
        for key, item in value.items():
            _refuse_non_finite(item, f"{where}.{key}")
    elif isinstance(value, (list, tuple)):
        for i, item in enumerate(value):
            _refuse_non_finite(item, f"{where}[{i}]")


def write_json_atomic(
    path: Path, value, indent: int | None = 1, sort_keys: bool = False, compact: bool = False
) -> None:
    """write_file_atomic of json_text(value), ending in a newline."""
    write_file_atomic(path, (json_text(value, indent, sort_keys, compact) + "\n").encode())


def append_line(path: Path, line: str) -> None:
    """Append one line (a log or metrics record) without following a symbolic link at `path`."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o666)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise OSError(exc.errno, "is a symbolic link; reprocube does not write through links", str(path)) from None
        raise
    with os.fdopen(fd, "a") as f:
        f.write(line + "\n")
        f.flush()


def safe_name(text: str, limit: int = 64) -> str:
    """A directory name made from a string someone else chose (a receipt's run_name): letters, digits,
    `_` and `-` (each run of anything else becomes one `_`), at most `limit` characters, never empty. So
    `..`, `/`, a NUL or an escape sequence in the string can neither leave the current directory nor show."""
    name = re.sub(r"[^A-Za-z0-9_-]+", "_", text).strip("_")[:limit]
    return name or "unnamed"


def portable_path(path) -> str:
    """A path as a committed result may record it: relative to the current directory when under it, else
    only its last component (an absolute path names the machine it ran on, not the result)."""
    path = Path(path)
    try:
        return Path(path).resolve().relative_to(Path.cwd().resolve()).as_posix()
    except ValueError:
        return f".../{path.name}"


def claim_new_or_empty(out: Path, command: str) -> None:
    """--out for `command`'s evidence: a new or empty directory, made here; never a link, a file, or a
    directory holding something (ConfigError, exit 2)."""
    if out.is_symlink() or (out.exists() and not out.is_dir()):
        raise ConfigError(f"--out {out} exists and is not a directory")
    if out.is_dir() and any(out.iterdir()):
        raise ConfigError(f"--out {out} is not empty (an earlier {command}?); remove it or choose another --out")
    out.mkdir(parents=True, exist_ok=True)


def refuse_inside_checkpoints(out: Path) -> None:
    """A report's output directory may be anywhere but inside a run's checkpoints/: a checkpoint holds
    exactly the files its manifest lists, and one more would make it unreadable."""
    resolved = Path(out).resolve()
    for directory in (resolved, *resolved.parents):
        a_checkpoint = directory.parent.name == "checkpoints" and (directory / "manifest.json").is_file()
        if a_checkpoint or (directory.name == "checkpoints" and (directory.parent / "config.yaml").is_file()):
            raise ConfigError(f"--out {out} is inside a run's checkpoints/ ({directory}); write reports elsewhere")
