"""The --copy inputs of `reprocube check` and `reprocube reproduce`: refused before anything runs when one
is a link or holds one (a link's bytes are not the input's, and a copy would read through it), holds a
FIFO or a device, holds the --out directory (each run would copy its own evidence into itself without
end), is deeper than MAX_DEPTH levels or holds more than MAX_FILES entries; then copied into a work
directory, links never followed. Every tree is walked with a stack, never by recursion."""

from __future__ import annotations

import os
import shutil
import stat
from pathlib import Path

from reprocube.errors import ConfigError

MAX_DEPTH = 100  # directory levels below a --copy directory
MAX_FILES = 10_000  # entries of one --copy directory (script_receipt lists as many inputs)


def check_copies(copies: list[Path], out: Path | None, option: str = "--copy") -> None:
    """One ConfigError line (exit 2) naming the first --copy that cannot be copied, and why."""
    home = Path(out).resolve() if out is not None else None
    for top in copies:
        top = Path(top)
        try:
            mode = top.lstat().st_mode
        except OSError:
            raise ConfigError(f"{option} {top}: does not exist") from None
        if stat.S_ISLNK(mode):
            raise ConfigError(f"{option} {top}: a symbolic link (give the file or directory it points to)")
        if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
            raise ConfigError(f"{option} {top}: not a regular file or a directory (a FIFO, a socket or a device)")
        if not stat.S_ISDIR(mode):
            continue
        if home is not None and (home == top.resolve() or top.resolve() in home.parents):
            raise ConfigError(
                f"{option} {top}: holds the --out directory {out}, into which it would be copied again and again "
                "(copy the files the command needs, or give --out elsewhere)"
            )
        _walk(top, option)


def _walk(top: Path, option: str) -> None:
    count, stack = 0, [(top, 0)]
    while stack:
        directory, depth = stack.pop()
        if depth > MAX_DEPTH:
            raise ConfigError(f"{option} {top}: deeper than {MAX_DEPTH} directory levels (at {directory})")
        try:
            with os.scandir(directory) as entries:
                listed = list(entries)
        except OSError as exc:
            raise ConfigError(f"{option} {directory}: cannot be read ({exc.strerror or exc})") from None
        for entry in listed:
            count += 1
            if count > MAX_FILES:
                raise ConfigError(f"{option} {top}: more than {MAX_FILES} files")
            if entry.is_symlink():
                raise ConfigError(f"{option} {entry.path}: a symbolic link inside a copied directory (not copied)")
            if entry.is_dir(follow_symlinks=False):
                stack.append((Path(entry.path), depth + 1))
            elif not entry.is_file(follow_symlinks=False):
                raise ConfigError(f"{option} {entry.path}: not a regular file (a FIFO, a socket or a device)")


def copy_inputs(copies: list[Path], work: Path) -> None:
    """Each --copy (checked by check_copies) into `work`, by its name: a tree copied with a stack, a link
    met meanwhile copied as a link (never followed), never written through."""
    for top in copies:
        top = Path(top)
        target = work / top.name
        if not top.is_dir() or top.is_symlink():
            shutil.copy2(top, target, follow_symlinks=False)
            continue
        stack, made = [(top, target)], []
        while stack:
            source, destination = stack.pop()
            os.mkdir(destination)  # new: the work directory is fresh (never an existing link's target)
            with os.scandir(source) as entries:
                listed = list(entries)
            for entry in listed:
                if entry.is_dir(follow_symlinks=False):
                    stack.append((Path(entry.path), destination / entry.name))
                else:
                    shutil.copy2(entry.path, destination / entry.name, follow_symlinks=False)
            made.append((source, destination))
        for source, destination in reversed(made):  # the deepest first: a read-only mode comes last
            shutil.copystat(source, destination, follow_symlinks=False)
