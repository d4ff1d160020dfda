"""The one child launcher: its log file, the rule that names what a failed child said, and that its children
die with their parent (SIGKILL or SIGTERM to the parent, through run_child, start_child and `reprocube reproduce`)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from reprocube.orchestration.children import last_error_line, run_child

from conftest import reprocube, slow_steps_pythonpath


def test_a_child_runs_into_its_log_after_a_command_line(tmp_path):
    log = tmp_path / "logs" / "child.log"
    echoed = []
    status = run_child([sys.executable, "-c", "print('out'); import sys; sys.exit(3)"], log, echo=echoed.append)
    assert status == 3 and echoed == ["out"]
    first, second = log.read_text().splitlines()
    assert first.startswith("$ ") and sys.executable in first and second == "out"


def test_the_error_line_is_the_last_attempts_own_line_else_its_traceback(tmp_path):
    log = tmp_path / "child.log"
    log.write_text(
        "$ try 1\nreprocube: error: an old failure\n$ try 2\nI0000 tf start-up\nTraceback (most recent call last):\nValueError: the new one\n"
    )
    assert last_error_line(log) == "ValueError: the new one"
    log.write_text("$ try 1\nI0000 start-up line\nreprocube: error: bad config\nI0000 a later line\n")
    assert last_error_line(log) == "reprocube: error: bad config"
    log.write_text("$ try 1\n")
    assert last_error_line(log) == "no output"
    assert last_error_line(tmp_path / "absent.log").startswith("no log at")


# ---- children die with their parent -------------------------------------------------------------------------

linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")

# A child that writes its pid and sleeps; a parent that starts it the way reprocube's commands do.
SLEEPER = "import os, sys, time; open(sys.argv[1], 'w').write(str(os.getpid())); time.sleep(300)"
PARENT = """\
import sys, time
from pathlib import Path
from reprocube.orchestration.children import run_child, start_child
how, pid_file, log = sys.argv[1:]
command = [sys.executable, "-c", SLEEPER, pid_file]
if how == "run":
    run_child(command, Path(log))
elif how == "run-echo":
    run_child(command, Path(log), echo=print)
else:  # verify's way: start, then poll
    child = start_child(command, Path(log))
    while child.poll() is None:
        time.sleep(0.1)
""".replace("SLEEPER", repr(SLEEPER))


def alive(pid: int) -> bool:
    """Running, not a zombie: an orphan's new parent (PID 1 in a container) may never reap it."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    return "\nState:\tZ" not in status


def wait_until(condition, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def processes_naming(text: str) -> list[int]:
    """The live processes whose command line contains `text`."""
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and entry.name != str(os.getpid()):
            try:
                cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            if text in cmdline and alive(int(entry.name)):
                pids.append(int(entry.name))
    return pids


def kill_all(pids) -> None:
    for pid in pids:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)


@linux_only
@pytest.mark.parametrize("signum", [signal.SIGKILL, signal.SIGTERM], ids=["SIGKILL", "SIGTERM"])
@pytest.mark.parametrize("how", ["run", "run-echo", "start"])
def test_a_child_dies_with_its_parent(tmp_path, how, signum):
    pid_file = tmp_path / "child.pid"
    parent = subprocess.Popen([sys.executable, "-c", PARENT, how, str(pid_file), str(tmp_path / "child.log")])
    child = None
    try:
        assert wait_until(lambda: pid_file.exists() and pid_file.read_text().strip().isdigit(), 60), "no child"
        child = int(pid_file.read_text())
        assert alive(child)
        parent.send_signal(signum)
        assert parent.wait(timeout=10) == -signum  # nothing in the parent swallows SIGTERM
        assert wait_until(lambda: not alive(child), 5), f"child {child} outlived its parent ({how}, {signum.name})"
    finally:
        parent.kill()
        parent.wait()
        kill_all([child] if child else [])


@pytest.fixture(scope="module")
def tiny_receipt(generated, tmp_path_factory) -> Path:
    """A finished two-epoch PyTorch run on the generated dataset: the run directory holding receipt.json."""
    root = tmp_path_factory.mktemp("a")
    reprocube("train", "framework=pytorch", *generated.overrides(), "epochs=2", "log.every_steps=5",
              "trace.every_steps=5", f"output_dir={root}", "run_name=a", cwd=root)  # fmt: skip
    return root / "a"


@linux_only
@pytest.mark.parametrize("signum", [signal.SIGKILL, signal.SIGTERM], ids=["SIGKILL", "SIGTERM"])
def test_reproduce_stopped_mid_run_leaves_no_training_behind(generated, tiny_receipt, tmp_path, signum):
    # B's steps are slowed (a start-up hook), so that it trains for a while after the stop.
    env = {**os.environ, "PYTHONHASHSEED": "0"}
    env["PYTHONPATH"] = slow_steps_pythonpath(tmp_path, 0.5, os.environ.get("PYTHONPATH", ""))
    out = tmp_path / "out"
    command = [sys.executable, "-m", "reprocube", "reproduce", str(tiny_receipt), "--out", str(out),
               f"data_dir={generated.data_dir}"]  # fmt: skip
    parent = subprocess.Popen(command, cwd=tmp_path, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        # B is training: its first step records are written.
        metrics = out / "runs" / "b" / "metrics.jsonl"
        started = wait_until(
            lambda: (metrics.is_file() and metrics.stat().st_size > 0) or parent.poll() is not None, 240
        )
        assert started and parent.poll() is None, f"B did not start training (reproduce exited {parent.returncode})"
        children = processes_naming(str(out))
        assert children, "no training child seen"
        parent.send_signal(signum)
        assert parent.wait(timeout=10) == -signum
        assert wait_until(lambda: not processes_naming(str(out)), 5), f"still running: {processes_naming(str(out))}"
    finally:
        parent.kill()
        parent.wait()
        kill_all(processes_naming(str(out)))


# --- the watchdog: a child that makes no progress is reported, and ended when asked --------------------------
def test_a_silent_child_is_reported_then_ended(tmp_path):
    import time

    from reprocube.orchestration.children import StalledChild, run_watched

    stalls = []
    started = time.monotonic()
    command = [sys.executable, "-c", "import time; print('started', flush=True); time.sleep(120)"]
    with pytest.raises(StalledChild, match="made no progress for [23] s and was ended"):
        run_watched(command, tmp_path / "child.log", [tmp_path / "metrics.jsonl"], stalls.append,
                    warn_after_s=60, stop_after_s=2.0, poll_s=0.1)  # fmt: skip
    assert stalls and 1.0 <= stalls[0] < 2.0, "reported (at half the stop time) before it was ended"
    assert time.monotonic() - started < 30, "ended, not waited for"


def test_a_child_that_makes_progress_is_never_reported(tmp_path):
    from reprocube.orchestration.children import run_watched

    progress = tmp_path / "metrics.jsonl"
    stalls = []
    # Silent on stdout, but a progress file grows every 0.3 s for 3 s.
    script = f"import time\nfor i in range(10):\n    open({str(progress)!r}, 'a').write('x\\n'); time.sleep(0.3)\n"
    status = run_watched([sys.executable, "-c", script], tmp_path / "child.log", [progress], stalls.append,
                         warn_after_s=1.0, stop_after_s=2.0, poll_s=0.1)  # fmt: skip
    assert status == 0 and not stalls
