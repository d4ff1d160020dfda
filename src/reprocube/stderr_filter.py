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
    """Each pattern matches one whole line, its newline included."""
    sys.stderr.flush()
    try:
        saved = os.dup(2)
    except OSError:  # no stderr to keep clean
        yield
        return
    try:
        filter_process = subprocess.Popen(
            [sys.executable, "-I", "-S", "-c", _FILTER, *patterns], stdin=subprocess.PIPE, stdout=saved
        )
    except OSError:
        os.close(saved)
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
