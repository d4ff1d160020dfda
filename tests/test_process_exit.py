"""reprocube.process_exit ends the process without Python's teardown of its modules, but only after
everything of Python's own exit that reaches outside the process: threads that are not daemons finish,
atexit handlers and concurrent.futures' workers run, Python's and C's buffered stdout is written, and the
status is the command's (120 where stdout cannot be written, as Python's). Each case runs in a fresh
process."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

from reprocube.errors import EXIT_CHECKPOINT


def run_code(code: str, **kwargs) -> subprocess.CompletedProcess:
    # Without PYTHONUNBUFFERED (the suite sets it), Python's and C's stdout only buffer, as in a user's pipe
    env = {name: value for name, value in os.environ.items() if name != "PYTHONUNBUFFERED"}
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=env, timeout=120, **kwargs)


def test_what_reaches_outside_the_process_is_done_before_it_ends(tmp_path):
    done = run_code(
        f"""
        import atexit, ctypes, threading, time
        from concurrent.futures import ThreadPoolExecutor
        from pathlib import Path
        from reprocube.process_exit import exit_process

        out = Path({str(tmp_path)!r})
        def late_write():
            time.sleep(0.5)
            (out / "thread").write_text("done")
        threading.Thread(target=late_write).start()
        pool = ThreadPoolExecutor(1)  # never shut down: its worker must still end, not hang the exit
        pool.submit(lambda: (time.sleep(0.3), (out / "future").write_text("done")))
        atexit.register(lambda: (out / "atexit").write_text("done"))
        print("from Python, buffered", end=" ")
        ctypes.CDLL(None).printf(b"from C, buffered")
        exit_process(5)
        """,
        capture_output=True,
    )
    assert done.returncode == 5, done.stderr
    assert done.stdout == b"from Python, buffered from C, buffered"
    assert done.stderr == b""
    assert {p.name: p.read_text() for p in tmp_path.iterdir()} == {"thread": "done", "future": "done", "atexit": "done"}


def test_stdout_that_cannot_be_written_gives_pythons_status():
    read_end, write_end = os.pipe()
    os.close(read_end)  # nobody reads: the flush at exit fails with EPIPE
    try:
        done = run_code(
            """
            from reprocube.process_exit import exit_process
            print("lost")
            exit_process(0)
            """,
            stdout=write_end,
            stderr=subprocess.PIPE,
        )
    finally:
        os.close(write_end)
    assert done.returncode == 120, done.stderr
    assert done.stderr == b""


def test_the_program_ends_with_its_commands_status_and_message(tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "reprocube", "compare", str(tmp_path / "absent-a"), str(tmp_path / "absent-b")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == EXIT_CHECKPOINT, done.stderr
    [line] = done.stderr.splitlines()
    assert line.startswith("reprocube: error:") and "absent-a" in line
