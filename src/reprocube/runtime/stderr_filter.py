"""Dropping known lines from what a block of code writes to file descriptor 2, C and C++ libraries included.

Within the block, fd 2 feeds a small filter process that drops the whole lines matching the patterns and
passes every other line on as soon as it is complete (a last line without its newline at the end): a
warning, or the last words of a library that crashes, still reach the user. A filter thread could not
promise that: an import holds the GIL while a library loads and logs, and a full pipe would then never
drain. The filter ignores the signals that stop or preempt reprocube (they are the parent's to handle: a
SIGTERM sent to a SLURM step's every process must not leave the parent writing into a closed pipe) and
ends when its input does (the block's end, or the parent's death). It is waited for, so what it passed on
comes before anything written after the block."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys

_FILTER = """
import re, signal, sys
for name in ("SIGINT", "SIGTERM", "SIGHUP", "SIGUSR1", "SIGUSR2", "SIGQUIT"):
    signal.signal(getattr(signal, name), signal.SIG_IGN)
drop = re.compile(rb"|".join(p.encode() for p in sys.argv[1:]))
out = sys.stdout.buffer
for line in sys.stdin.buffer:
    if not drop.fullmatch(line):
        out.write(line)
        out.flush()
"""
WAIT_S = 10  # for the filter to pass on the rest; a process that kept a copy of fd 2 keeps it alive longer


@contextlib.contextmanager
def lines_dropped(patterns: tuple[str, ...]):
    """Each pattern matches one whole line, its newline included. Without a stderr or a Python to filter
    with, the block runs unfiltered."""
    if sys.__stderr__ is None or not sys.executable:  # started without fd 2 (2>&-): another file may be fd 2
        yield
        return
    _flush()
    try:
        saved = os.dup(2)
    except OSError:
        yield
        return
    try:
        command = [sys.executable, "-I", "-S", "-c", _FILTER, *patterns]
        filter_process = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=saved)
    except OSError:
        os.close(saved)
        yield
        return
    try:
        os.dup2(filter_process.stdin.fileno(), 2)
        yield
    finally:
        try:
            _flush()
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            filter_process.stdin.close()  # the filter's end of input: it writes what is left and exits
            with contextlib.suppress(subprocess.TimeoutExpired):
                filter_process.wait(timeout=WAIT_S)


def _flush() -> None:
    """What Python buffered for stderr (its wrapper's and the stream's), before fd 2 changes."""
    for stream in (sys.stderr, sys.__stderr__):
        with contextlib.suppress(OSError, AttributeError, ValueError):  # a stream gone or closed: nothing to keep
            stream.flush()
