"""Linux process facts, read in one place: a process's /proc/<pid>/stat fields (its state, parent and process
group) and the C library's prctl (None where there is none: not Linux, no libc symbol). The standard
library only: check's process guard, a script run by `python -I -S`, loads this file by its path."""

from __future__ import annotations

import ctypes
import sys
from dataclasses import dataclass


@dataclass(frozen=True)
class ProcStat:
    state: bytes  # b"R", b"S", ... b"Z" (a zombie)
    parent: int
    group: int


def proc_stat(pid: int | str) -> ProcStat | None:
    """/proc/<pid>/stat's state, parent and process group; None where the process is gone or /proc cannot
    tell (the command name, in parentheses, may hold anything: the fields are read after its last ')')."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            fields = stat.read().rsplit(b")", 1)[1].split()
        return ProcStat(fields[0], int(fields[1]), int(fields[2]))
    except (OSError, IndexError, ValueError):
        return None


def load_prctl(use_errno: bool = False):
    """libc's prctl, or None (not Linux, or no such symbol)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL(None, use_errno=use_errno).prctl
    except (OSError, AttributeError):
        return None
