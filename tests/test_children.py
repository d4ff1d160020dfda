"""The one child launcher: its log file, the rule that names what a failed child said, and that its children
die with their parent (SIGKILL or SIGTERM to the parent, through run_child, start_child and `reprocube reproduce`)."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from reprocube.orchestration.children import last_error_line, run_child

from helpers import reprocube, slow_steps_pythonpath, wait_until


@pytest.mark.process
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
        "$ try 1\nreprocube: error: an old failure\n$ try 2\nI0000 tf start-up\n"
        "Traceback (most recent call last):\nValueError: the new one\n"
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


@pytest.mark.process
@linux_only
@pytest.mark.parametrize("signum", [signal.SIGKILL, signal.SIGTERM], ids=["SIGKILL", "SIGTERM"])
@pytest.mark.parametrize("how", ["run", "run-echo", "start"])
def test_a_child_dies_with_its_parent(tmp_path, how, signum):
    pid_file = tmp_path / "child.pid"
    parent = subprocess.Popen([sys.executable, "-c", PARENT, how, str(pid_file), str(tmp_path / "child.log")])
    child = None
    try:
        wait_until(lambda: pid_file.exists() and pid_file.read_text().strip().isdigit(), timeout=60, what="the child")
        child = int(pid_file.read_text())
        assert alive(child)
        parent.send_signal(signum)
        assert parent.wait(timeout=10) == -signum  # nothing in the parent swallows SIGTERM
        wait_until(
            lambda: not alive(child), timeout=5, what=f"child {child} to die with its parent ({how}, {signum.name})"
        )
    finally:
        parent.kill()
        parent.wait()
        kill_all([child] if child else [])


@pytest.fixture(scope="module")
def tiny_receipt(generated, tmp_path_factory) -> Path:
    """A finished two-epoch PyTorch run on the generated dataset: the run directory holding receipt.json."""
    root = tmp_path_factory.mktemp("a")
    reprocube(
        "train",
        "framework=pytorch",
        *generated.overrides(),
        "epochs=2",
        "log.every_steps=5",
        "trace.every_steps=5",
        f"output_dir={root}",
        "run_name=a",
        cwd=root,
    )
    return root / "a"


@pytest.mark.process
@linux_only
@pytest.mark.parametrize("signum", [signal.SIGKILL, signal.SIGTERM], ids=["SIGKILL", "SIGTERM"])
def test_reproduce_stopped_mid_run_leaves_no_training_behind(generated, tiny_receipt, tmp_path, signum):
    # B's steps are slowed (a start-up hook), so that it trains for a while after the stop.
    env = {**os.environ, "PYTHONHASHSEED": "0"}
    env["PYTHONPATH"] = slow_steps_pythonpath(tmp_path, 0.5, os.environ.get("PYTHONPATH", ""))
    out = tmp_path / "out"
    command = [
        sys.executable,
        "-m",
        "reprocube",
        "reproduce",
        str(tiny_receipt),
        "--out",
        str(out),
        f"data_dir={generated.data_dir}",
    ]
    parent = subprocess.Popen(command, cwd=tmp_path, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        # B is training: its first step records are written.
        metrics = out / "runs" / "b" / "metrics.jsonl"
        wait_until(
            lambda: metrics.is_file() and metrics.stat().st_size > 0, timeout=240, what="B to train", process=parent
        )
        children = processes_naming(str(out))
        assert children, "no training child seen"
        parent.send_signal(signum)
        assert parent.wait(timeout=10) == -signum
        wait_until(
            lambda: not processes_naming(str(out)),
            timeout=5,
            what="every training child to end",
            detail=lambda: f"; still running: {processes_naming(str(out))}",
        )
    finally:
        parent.kill()
        parent.wait()
        kill_all(processes_naming(str(out)))


# --- the watchdog: a child that makes no progress is reported, and ended when asked --------------------------
@pytest.mark.process
def test_a_silent_child_is_reported_then_ended(tmp_path):
    import time

    from reprocube.orchestration.children import StalledChild, Watchdog, run_watched

    stalls = []
    started = time.monotonic()
    command = [sys.executable, "-c", "import time; print('started', flush=True); time.sleep(120)"]
    watchdog = Watchdog(warn_after_s=60, stop_after_s=2.0, setting="watchdog.stop_minutes=...")
    with pytest.raises(
        StalledChild, match=r"made no progress for \d+ s, stuck before logging any step, and was ended"
    ) as ended:
        run_watched(
            command, tmp_path / "child.log", [tmp_path / "metrics.jsonl"], stalls.append, watchdog=watchdog, poll_s=0.1
        )
    # In order, whatever the machine's load: reported (from half the stop time), then ended (from the stop time).
    ended_after = int(re.search(r"for (\d+) s", str(ended.value)).group(1))
    assert stalls and 1.0 <= stalls[0] <= ended_after and ended_after >= 2, (stalls, ended_after)
    assert time.monotonic() - started < 100, "ended by the watchdog, not waited for (the child sleeps 120 s)"


@pytest.mark.process
def test_a_stalled_child_is_ended_naming_the_last_step_it_logged(tmp_path):
    from reprocube.orchestration.children import StalledChild, Watchdog, run_watched

    progress = tmp_path / "metrics.jsonl"
    # Logs steps 1..7 (the last line half written), then hangs.
    script = (
        "import json, time\n"
        f"with open({str(progress)!r}, 'a') as f:\n"
        "    for step in range(1, 8):\n"
        "        f.write(json.dumps({'kind': 'step', 'global_step': step, 'loss': 1.0}) + '\\n')\n"
        '    f.write(\'{"kind": "step", "glo\')\n'
        "time.sleep(120)\n"
    )
    with pytest.raises(StalledChild) as ended:
        run_watched(
            [sys.executable, "-c", script],
            tmp_path / "child.log",
            [progress],
            lambda s: None,
            watchdog=Watchdog(stop_after_s=2.0, setting="watchdog.stop_minutes=0.03"),
            poll_s=0.1,
        )
    assert "stuck after global step 7 (the last it logged), and was ended (watchdog.stop_minutes=0.03)" in str(
        ended.value
    )


@pytest.mark.process
def test_a_child_that_makes_progress_is_never_reported(tmp_path):
    from reprocube.orchestration.children import Watchdog, run_watched

    progress = tmp_path / "metrics.jsonl"
    stalls = []
    # Silent on stdout, but a progress file grows every 0.3 s for 3 s.
    script = f"import time\nfor i in range(10):\n    open({str(progress)!r}, 'a').write('x\\n'); time.sleep(0.3)\n"
    status = run_watched(
        [sys.executable, "-c", script],
        tmp_path / "child.log",
        [progress],
        stalls.append,
        watchdog=Watchdog(warn_after_s=1.0, stop_after_s=2.0),
        poll_s=0.1,
    )
    assert status == 0 and not stalls


# Ended after 15 s without progress: 6 s ended a child still starting on a loaded CI machine (no step logged yet).
STALL = ["watchdog.stop_minutes=0.25", "log.every_steps=1", "epochs=1", "threads=1"]


@pytest.mark.process
def test_verify_ends_a_stalled_check_naming_its_step_and_fails(generated, tmp_path):
    """verify's reference hangs after its first group of steps: after watchdog.stop_minutes it is ended,
    in one line naming the last step it logged; the checks that need it are not run; verify fails."""
    hanging = slow_steps_pythonpath(tmp_path, 120, os.environ.get("PYTHONPATH", ""), after_groups=1)
    started = time.monotonic()
    proc = reprocube(
        "verify",
        "framework=pytorch",
        *generated.overrides(),
        *STALL,
        "verify.mid_epoch=false",
        cwd=tmp_path,
        check=False,
        env_extra={"PYTHONPATH": hanging},
        timeout=300,
    )
    assert proc.returncode == 6, proc.stdout + proc.stderr
    assert time.monotonic() - started < 120, "ended by the watchdog, not waited for (the reference hangs 120 s)"
    [failed] = [line for line in proc.stdout.splitlines() if "FAILED reference" in line]
    # The seconds it measured: at least the stop time, more where the parent's poll was late (CI once: 16 s).
    assert re.search(r"made no progress for (1[5-9]|[2-9]\d) s, stuck after global step \d+ ", failed), failed
    assert "(the last it logged), and was ended (watchdog.stop_minutes=0.25)" in failed, failed


@pytest.mark.process
def test_study_records_a_stalled_run_as_failed_and_finishes_the_others(generated, tmp_path):
    study = tmp_path / "study"
    hanging = slow_steps_pythonpath(
        tmp_path, 120, os.environ.get("PYTHONPATH", ""), after_groups=1, only_with_arg="run_name=same-seed-00"
    )
    proc = reprocube(
        "study",
        "framework=pytorch",
        "runs=2",
        *generated.overrides(),
        *STALL,
        "data.train_limit=320",
        f"study.dir={study}",
        cwd=tmp_path,
        check=False,
        env_extra={"PYTHONPATH": hanging},
        timeout=600,
    )
    assert proc.returncode == 5, proc.stdout + proc.stderr
    import json

    result = json.loads((study / "study.json").read_text())
    [failure] = result["failures"]
    assert failure["member"] == 0 and "stuck after global step " in failure["error"], failure
    assert "and was ended (watchdog.stop_minutes=0.25)" in failure["error"]
    assert sorted(r["member"] for r in result["runs"]) == [1, 2, 3]


def test_watch_child_ticks_watchdog_progress_stop_and_time_limit_in_that_order(monkeypatch):
    from reprocube.orchestration import children
    from reprocube.orchestration.children import ENDED, STOPPED, TIMED_OUT, ProgressReport, watch_child

    now = [0.0]
    monkeypatch.setattr(children.time, "sleep", lambda s: now.__setitem__(0, now[0] + s))
    said, ticks = [], []

    def watch(**kwargs):
        now[0] = 0.0
        progress = ProgressReport(said.append, 3.0, lambda: now[0], since=0.0)

        def tick() -> None:
            ticks.append(now[0])

        return watch_child(lambda: now[0] < 10, 1.0, 0.0, lambda: now[0], progress, on_tick=tick, **kwargs)

    assert watch() == children.Watched(ENDED, 9.0) and said == [3.0, 6.0, 9.0] and ticks == list(range(10))
    said.clear()
    assert watch(stop_now=lambda s: s >= 3) == children.Watched(STOPPED, 3.0) and said == [3.0]  # reported first
    assert watch(stop_now=lambda s: False, timeout_s=5) == children.Watched(TIMED_OUT, 5.0)
