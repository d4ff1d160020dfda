"""The end of a `reprocube` process, without Python freeing every module's objects one by one.

When a command has returned, its work is done: its files are written and renamed, its children have
ended. Python would still tear down every imported module before the process ends, object by object:
about 0.9 s after `import tensorflow` (1.0-1.3 s after a training run), 0.45 s after torch, 0.16 s after
jax on this project's CPU (`benchmarks/process_exit.py`). That changes nothing outside the process; the
system frees the memory at once. So the program leaves through Python's own exit, which does everything
that can have an effect outside the process, in Python's order, and ends the process with os._exit before
the teardown:

1. `exit_process(status)` stores the command's status and raises SystemExit (sys.exit): Python's exit
   waits for the threads that are not daemons and runs `threading`'s exit hooks (concurrent.futures
   ends its workers there);
2. the atexit handlers run, the last registered first (logging's flush, multiprocessing's children,
   tempfile's clean-ups);
3. the last of them is this module's, registered by `arm()` before any other: it flushes stdout and
   stderr, Python's and C's, and ends with os._exit(the stored status); if stdout cannot be flushed (a
   closed pipe), the status is 120 (EXIT_OUTPUT_LOST) where it was 0, as Python's.

Only the program's entry points (`python -m reprocube` and the `reprocube` script, both
`reprocube.__main__.run`) call `arm()`, as their first act: `cli.main` itself returns, so a test or a
caller in the same process keeps running, and without `arm()` exit_process is sys.exit. A process that
ends otherwise (an exception Python reports) stored no status and ends as Python ends it.
"""

from __future__ import annotations

import atexit
import ctypes
import os
import sys
from typing import NoReturn

from reprocube.errors import EXIT_OUTPUT_LOST

STDOUT_FLUSH_FAILED = EXIT_OUTPUT_LOST  # what Python itself exits with when it cannot flush stdout at exit

_status: int | None = None  # exit_process's, for the last atexit handler


def arm() -> None:
    """Make the process end with `_end`: call it before anything registers an atexit handler (before
    importing anything that might), so that `_end` runs after every other."""
    atexit.register(_end)


def exit_process(status: int) -> NoReturn:
    global _status
    _status = status
    sys.exit(status)


def _end() -> None:
    if _status is None:  # not ended by exit_process: Python's own end
        return
    status = _status
    for stream in (sys.stdout, sys.stderr):
        try:
            if stream is not None:
                stream.flush()
        except (OSError, ValueError):  # a closed pipe, or a stream the command closed
            if stream is sys.stdout:
                status = status or STDOUT_FLUSH_FAILED
    ctypes.CDLL(None).fflush(None)  # C libraries' buffered output (oneDNN's verbose log is printf's)
    os._exit(status)
