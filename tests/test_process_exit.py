"""reprocube.runtime.process_exit ends the process without Python's teardown of its modules, but only after
everything of Python's own exit that reaches outside the process: threads that are not daemons finish,
atexit handlers and concurrent.futures' workers run, Python's and C's buffered stdout is written, and the
status is the command's (120 where stdout cannot be written, as Python's). Its atexit handler, armed first
by the program's entry points, must run after every other. Each case runs in a fresh process."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from reprocube.errors import EXIT_CHECKPOINT

pytestmark = pytest.mark.process  # every test here starts a process: not in make test-quick


def run_code(code: str, tmp_path: Path, **kwargs) -> subprocess.CompletedProcess:
    # Without PYTHONUNBUFFERED (the suite sets it), Python's and C's stdout only buffer, as in a user's pipe
    program = tmp_path / "program.py"
    program.write_text(textwrap.dedent(code))
    env = {name: value for name, value in os.environ.items() if name != "PYTHONUNBUFFERED"}
    return subprocess.run([sys.executable, str(program)], env=env, timeout=120, **kwargs)


@pytest.mark.parametrize("armed", [True, False])
def test_what_reaches_outside_the_process_is_done_before_it_ends(tmp_path, armed):
    (tmp_path / "program").mkdir()
    out = tmp_path / "out"
    out.mkdir()
    done = run_code(
        f"""
        from reprocube.runtime.process_exit import arm, exit_process
        if {armed}:
            arm()  # first: every handler registered after it runs before it
        import atexit, ctypes, threading, time
        from concurrent.futures import ThreadPoolExecutor
        from pathlib import Path

        out = Path({str(out)!r})
        class Teardown:  # freed only by Python's teardown of the modules
            def __del__(self, open=open, path=str(out / "teardown")):
                open(path, "w").write("done")
        kept = Teardown()
        def late_write():
            time.sleep(0.5)
            (out / "thread").write_text("done")
        threading.Thread(target=late_write).start()
        pool = ThreadPoolExecutor(1)  # never shut down: its worker must still end, not hang the exit
        pool.submit(lambda: (time.sleep(0.3), (out / "future").write_text("done")))
        def at_exit():
            (out / "atexit").write_text("done")
            # Buffered after Python's exit has begun (it flushed both stdouts before the atexit handlers)
            print("from Python, buffered")
            ctypes.CDLL(None).printf(b"from C, buffered\\n")
        atexit.register(at_exit)
        exit_process(5)
        """,
        tmp_path / "program",
        capture_output=True,
    )
    assert done.returncode == 5, done.stderr
    # Both written (in either order: unarmed, Python's exit writes them)
    assert sorted(done.stdout.splitlines()) == [b"from C, buffered", b"from Python, buffered"]
    assert done.stderr == b""
    written = {p.name: p.read_text() for p in out.iterdir()}
    # Not armed (a caller of cli.main, a test): exit_process is sys.exit, and Python tears the modules down
    teardown = {} if armed else {"teardown": "done"}
    assert written == {"thread": "done", "future": "done", "atexit": "done", **teardown}


def test_stdout_that_cannot_be_written_gives_pythons_status(tmp_path):
    read_end, write_end = os.pipe()
    os.close(read_end)  # nobody reads: the flush at exit fails with EPIPE
    try:
        done = run_code(
            """
            from reprocube.runtime.process_exit import arm, exit_process
            arm()
            print("lost")
            exit_process(0)
            """,
            tmp_path,
            stdout=write_end,
            stderr=subprocess.PIPE,
        )
    finally:
        os.close(write_end)
    assert done.returncode == 120, done.stderr
    assert done.stderr == b""


# Started before the program (Python imports sitecustomize at start-up): each atexit handler, when it runs,
# and the modules' teardown, if it comes, write their name in the log.
WATCH = """
import atexit, functools

LOG = {log!r}

def _logged(name, open=open):
    with open(LOG, "a") as log:
        log.write(name + "\\n")

_register = atexit.register

def register(func, *args, **kwargs):
    name = f"{{getattr(func, '__module__', '?')}}.{{getattr(func, '__qualname__', func)}}"
    _logged("registered " + name)
    def run(*args, **kwargs):
        _logged(name)
        return func(*args, **kwargs)
    _register(run, *args, **kwargs)
    return func

atexit.register = register

class _Teardown:  # freed only by Python's teardown of the modules
    def __del__(self, logged=_logged):
        logged("teardown")

_kept = _Teardown()
"""


@pytest.mark.parametrize("entry", ["python -m reprocube", "reprocube script"])
def test_the_program_ends_last_with_its_commands_status_and_message(tmp_path, entry):
    if entry == "reprocube script":
        script = Path(sys.executable).parent / "reprocube"  # pyproject.toml's [project.scripts], installed
        assert script.is_file(), "the reprocube script is not installed beside this Python"
        command = [str(script)]
    else:
        command = [sys.executable, "-m", "reprocube"]
    watch = tmp_path / "watch"
    watch.mkdir()
    log = tmp_path / "atexit.log"
    (watch / "sitecustomize.py").write_text(WATCH.format(log=str(log)))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(watch), *filter(None, [os.environ.get("PYTHONPATH")])])}
    done = subprocess.run(
        [*command, "compare", str(tmp_path / "absent-a"), str(tmp_path / "absent-b")],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert done.returncode == EXIT_CHECKPOINT, done.stderr
    [line] = done.stderr.splitlines()
    assert line.startswith("reprocube: error:") and "absent-a" in line
    logged = log.read_text().splitlines()
    registered = [line.removeprefix("registered ") for line in logged if line.startswith("registered ")]
    ran = [line for line in logged if not line.startswith("registered ")]
    assert registered[:1] == ["reprocube.runtime.process_exit._end"], (
        f"{entry}: not armed first (the script: installed before pyproject.toml named reprocube.__main__:run? "
        f"pip install -e . again): {registered}"
    )
    # logging's flush (registered on logging's import, by the command's modules) ran, before the end
    assert "logging.shutdown" in ran, ran
    assert ran[-1] == "reprocube.runtime.process_exit._end", (
        f"{entry}: reprocube.runtime.process_exit's handler must run last (armed before anything registers one), "
        f"and end the process before Python's teardown: {ran}"
    )
