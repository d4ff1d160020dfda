"""Dropping known lines from what a block of code writes to file descriptor 2, C and C++ libraries included.

Within the block, fd 2 feeds a small filter process that drops the whole lines matching the patterns and
passes every other byte on as it comes: a warning, or the last words of a library that crashes, still
reach the user. A filter thread could not promise that: an import holds the GIL while a library loads and
logs, and a full pipe would then never drain. The filter ignores Ctrl-C (it is the parent's to report),
ends when its input does (the block's end, or the parent's death) and is waited for, so what it passed on
comes before anything written after the block."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys

_FILTER = """
import re, signal, sys
signal.signal(signal.SIGINT, signal.SIG_IGN)
drop = re.compile(rb"|".join(p.encode() for p in sys.argv[1:]))
out = sys.stdout.buffer
for line in sys.stdin.buffer:
    if not drop.fullmatch(line):
        out.write(line)
        out.flush()
"""


@contextlib.contextmanager
def lines_dropped(patterns: tuple[str, ...]):
    """Each pattern matches one whole line, its newline included. Without a stderr or a Python to filter
    with, the block runs unfiltered."""
    sys.stderr.flush()
    filter_process, saved = _start_filter(patterns)
    if filter_process is None:
        yield
        return
    os.dup2(filter_process.stdin.fileno(), 2)
    try:
        yield
    finally:
        sys.stderr.flush()
        os.dup2(saved, 2)
        os.close(saved)
        filter_process.stdin.close()  # the filter's end of input: it writes what is left and exits
        filter_process.wait()


def _start_filter(patterns: tuple[str, ...]) -> tuple[subprocess.Popen | None, int | None]:
    """The filter, writing to a duplicate of fd 2 (returned: fd 2's way back)."""
    if not sys.executable:
        return None, None
    try:
        saved = os.dup(2)
    except OSError:  # no stderr
        return None, None
    try:
        command = [sys.executable, "-I", "-S", "-c", _FILTER, *patterns]
        return subprocess.Popen(command, stdin=subprocess.PIPE, stdout=saved), saved
    except OSError:
        os.close(saved)
        return None, None
