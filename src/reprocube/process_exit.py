"""The end of a `reprocube` process, without Python freeing every module's objects one by one.

When a command has returned, its work is done: its files are written and renamed, its children have
ended. Python would still tear down every imported module before the process ends, object by object:
about 0.9 s after `import tensorflow` (1.0-1.3 s after a training run), 0.45 s after torch, 0.16 s after
jax on this project's CPU (`benchmarks/process_exit.py`). That changes nothing outside the process; the system frees the memory
at once. So the program runs everything of Python's own exit that can have an effect outside the process,
in Python's order, and then ends with os._exit:

1. threads that are not daemons are waited for, and `threading`'s exit hooks run (concurrent.futures
   ends its workers there);
2. the atexit handlers run (logging's flush, multiprocessing's children, tempfile's clean-ups);
3. stdout and stderr are flushed, Python's and C's: if stdout cannot be (a closed pipe), the status is
   120 (EXIT_OUTPUT_LOST) where it was 0, as Python's.

Only the program's entry points (`python -m reprocube`, the `reprocube` script) end this way:
`cli.main` itself returns, so a test or a caller in the same process keeps running.
"""

from __future__ import annotations

import atexit
import ctypes
import os
import sys
import threading
from typing import NoReturn

from reprocube.errors import EXIT_OUTPUT_LOST

STDOUT_FLUSH_FAILED = EXIT_OUTPUT_LOST  # what Python itself exits with when it cannot flush stdout at exit


def exit_process(status: int) -> NoReturn:
    # Both are the functions Python's own exit calls (Py_FinalizeEx); neither has a public name.
    threading._shutdown()  # type: ignore[attr-defined]
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            if stream is not None:
                stream.flush()
        except (OSError, ValueError):  # a closed pipe, or a stream the command closed
            if stream is sys.stdout:
                status = status or STDOUT_FLUSH_FAILED
    ctypes.CDLL(None).fflush(None)  # C libraries' buffered output (oneDNN's verbose log is printf's)
    os._exit(status)
