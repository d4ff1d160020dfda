"""Nothing outlives `reprocube check`, and nothing stalls it (issue 53 item 6): each attempt runs under a
guard (reprocube.check.process_guard) that is the subreaper of everything the command starts and
ends it all when the attempt ends or check dies; check never runs the --at-line pattern itself nor holds a
line; --copy inputs are checked before any run. Every test runs real processes and real signals, with
tiny scripts (no training): a double-forked setsid daemon, a SIGKILL of check, a backtracking pattern,
200 MB without a newline, a daemon printing after the script exits, links, --out inside a --copy, and
trees 1100 levels deep."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from helpers import error_lines, reprocube, wait_until

pytestmark = [
    pytest.mark.process,
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="a subreaper and /proc are Linux's"),
]

# The script under check: it may start a daemon (double fork, setsid), quiet or printing on the pipe it
# inherited; it marks that it ran (a file in MARKS), writes its output and prints `saved`.
SCRIPT = """\
import os, signal, sys, time
token, mode, marks = sys.argv[1], sys.argv[2], sys.argv[3]
if mode in ("quiet", "printing", "sleeping", "killguard"):
    if os.fork() == 0:
        os.setsid()
        if os.fork() == 0:
            if mode != "printing":
                null = os.open(os.devnull, os.O_RDWR)
                for fd in (0, 1, 2):
                    os.dup2(null, fd)
            code = "import time\\nwhile True:\\n    print('tick', flush=True)\\n    time.sleep(0.02)"
            os.execv(sys.executable, [sys.executable, "-c", code, token])
        os._exit(0)
    os.wait()
if mode == "killguard":
    os.kill(os.getppid(), signal.SIGKILL)  # its guard (a "kill stale launchers" cleanup); it dies with it
open(os.path.join(marks, f"ran-{os.getpid()}"), "w").close()
if mode == "big":
    for _ in range(200):
        sys.stdout.buffer.write(b"x" * (1 << 20))  # 200 MB, no newline
    sys.stdout.flush()
if mode == "backtrack":
    print("a" * 40 + "b", flush=True)  # (a+)+$ tries 2**40 ways on this line
if mode == "deep":
    here = "."
    for _ in range(1100):
        here = os.path.join(here, "d")
        os.mkdir(here)
open("out.txt", "w").write("done\\n")
if mode == "sleeping":
    time.sleep(300)
print("saved", flush=True)
"""


@pytest.fixture
def token():
    """A word in the argv of every process of one test (the script's, its daemon's): what is still
    running is found by it, and whatever a failing test left is killed."""
    word = f"reprocube-guard-test-{uuid.uuid4().hex}"
    yield word
    for pid in running(word):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def running(word: str) -> list[int]:
    pids = []
    for name in os.listdir("/proc"):
        if name.isdigit() and int(name) != os.getpid():
            try:
                if word.encode() in Path(f"/proc/{name}/cmdline").read_bytes():
                    pids.append(int(name))
            except OSError:
                pass
    return pids


def script_command(tmp_path: Path, token: str, mode: str) -> list[str]:
    script, marks = tmp_path / "script.py", tmp_path / "marks"
    script.write_text(SCRIPT)
    marks.mkdir(exist_ok=True)
    return [sys.executable, str(script), token, mode, str(marks)]


def ran(tmp_path: Path) -> int:
    return len(list((tmp_path / "marks").glob("ran-*")))


def check(tmp_path: Path, command: list[str], *options: str, timeout: float = 120):
    return reprocube(
        "check",
        "--out",
        "out",
        "--output",
        "out.txt",
        *options,
        "--",
        *command,
        cwd=tmp_path,
        check=False,
        timeout=timeout,
    )


def no_traceback(proc: subprocess.CompletedProcess) -> None:
    assert "Traceback" not in proc.stdout + proc.stderr, proc.stdout + proc.stderr


# ---- nothing outlives check ---------------------------------------------------------------------------


def test_a_double_forked_setsid_daemon_is_gone_when_check_returns(tmp_path, token):
    proc = check(tmp_path, script_command(tmp_path, token, "quiet"), "--at-line", "saved", "--stops", "1")
    no_traceback(proc)
    assert ran(tmp_path) >= 3  # clean-1, clean-2 and the stopped run each started a daemon
    assert running(token) == []  # before: every daemon outlived check, under PID 1


def test_a_script_that_sigkills_its_guard_leaves_no_daemon_behind(tmp_path, token):
    """The command SIGKILLed its guard: its daemon went to PID 1 and outlived check (30 s and more). Now
    check is the subreaper while a guard lives and sweeps at each attempt's end."""
    proc = check(tmp_path, script_command(tmp_path, token, "killguard"))
    no_traceback(proc)
    assert proc.returncode == 10 and "exited -9" in proc.stdout, proc.stdout + proc.stderr  # command-failed
    assert running(token) == []


def test_the_sweep_after_a_killed_guard_spares_the_other_runs_guard(tmp_path, token):
    """--jobs 2: one attempt's command kills its guard while another run's attempt goes on; the sweep at
    the first attempt's end kills the orphaned daemon and nothing of the other run."""
    from reprocube.check.guarded_command import start_guarded

    env = dict(os.environ)
    with open(tmp_path / "other.log", "w") as other_log, open(tmp_path / "killer.log", "w") as killer_log:
        other = start_guarded([sys.executable, "-c", "import time; time.sleep(60)", token], tmp_path, env, other_log)
        try:
            killer = start_guarded(script_command(tmp_path, token, "killguard"), tmp_path, env, killer_log)
            assert killer.wait(30) == -signal.SIGKILL
            killer.end()
            assert other.poll() is None and other.guard.poll() is None
            assert sorted(running(token)) == sorted([other.pid, other.guard.pid])  # the daemon is gone
        finally:
            other.end()
    assert running(token) == []


def test_a_sigkill_of_check_ends_the_script_and_its_daemon(tmp_path, token):
    command = script_command(tmp_path, token, "sleeping")
    with open(tmp_path / "check.out", "w") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "reprocube", "check", "--out", "out", "--output", "out.txt", "--", *command],
            cwd=tmp_path,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        wait_until(lambda: ran(tmp_path) >= 1, timeout=60, what="the script to start its daemon", process=proc)
        assert len(running(token)) >= 3  # check, a script and its daemon (and a guard)
        proc.kill()
        proc.wait()
        # before: PDEATHSIG ended the script, but its daemon ran on
        wait_until(lambda: running(token) == [], timeout=30, what="the script and its daemon to end")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_a_daemon_printing_after_the_script_exits_gives_no_traceback(tmp_path, token):
    started = time.monotonic()
    proc = check(tmp_path, script_command(tmp_path, token, "printing"), "--at-line", "saved", "--stops", "1")
    no_traceback(proc)  # before: "ValueError: I/O operation on closed file" from the reader, per attempt
    assert proc.returncode in (0, 9, 11, 12), proc.stdout + proc.stderr
    assert running(token) == []
    assert time.monotonic() - started < 30  # before: 5 s more per attempt, waiting for the output's end


# ---- nothing stalls check -----------------------------------------------------------------------------


def test_a_backtracking_at_line_pattern_cannot_stall_the_watchdog(tmp_path, token):
    started = time.monotonic()
    proc = check(
        tmp_path, script_command(tmp_path, token, "backtrack"), "--at-line", "(a+)+$", "--timeout", "2", timeout=90
    )  # before: check's reader held the GIL for hours on that line, its watchdog and Ctrl-C with it
    elapsed = time.monotonic() - started
    no_traceback(proc)
    result = json.loads((tmp_path / "out" / "check.json").read_text())
    assert proc.returncode == 10 and "ended by the watchdog" in result["summary"], result["summary"]
    assert elapsed < 30, elapsed
    assert running(token) == []


def test_200_mb_without_a_newline_is_read_in_bounded_memory(tmp_path, token):
    """check's peak resident size (VmHWM, read at its exit) and its children's (the guards, the script)."""
    command = script_command(tmp_path, token, "big")
    probe = (
        "import resource, sys; from reprocube.cli import main; status = main(sys.argv[1:]); "
        "hwm = next(line for line in open('/proc/self/status') if line.startswith('VmHWM:')); "
        "print('peak_mb', int(hwm.split()[1]) // 1024, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss // 1024);"
        "sys.exit(status)"
    )
    proc = subprocess.run(
        [sys.executable, "-c", probe, "check", "--out", "out", "--output", "out.txt", "--at-line", "saved"]
        + ["--stops", "1", "--", *command],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    no_traceback(proc)
    assert proc.returncode in (0, 9, 11, 12), proc.stdout + proc.stderr  # `saved` ends the 200 MB line
    peak_mb, children_mb = (int(x) for x in proc.stdout.split("peak_mb")[-1].split())
    print(f"check's peak {peak_mb} MB, its children's {children_mb} MB")
    assert peak_mb < 200, peak_mb  # before: 834 MB (the whole line, as bytes and as text)
    assert children_mb < 200, children_mb
    assert (tmp_path / "out" / "logs" / "clean-1.log").stat().st_size > 200 << 20  # all of it logged
    for log in (tmp_path / "out" / "logs").glob("*.log"):
        log.unlink()  # 200 MB each: pytest keeps the last runs' temporary directories


# ---- --copy, checked before any run -------------------------------------------------------------------


@pytest.fixture(scope="module")
def receipt(tmp_path_factory):
    """A script receipt, for reproduce --copy (a check of the plain script: two agreeing clean runs)."""
    where = tmp_path_factory.mktemp("receipt")
    command = script_command(where, "receipt", "plain")
    proc = check(where, command, "--at-line", "saved", "--stops", "1")
    assert (where / "out" / "receipt" / "receipt.json").exists(), proc.stdout + proc.stderr
    return where / "out" / "receipt", command


@pytest.fixture
def deep_cleanup(tmp_path):
    """Whatever the test left under tmp_path removed with a stack: pytest's own cleanup of old temporary
    directories (shutil.rmtree) recurses, and would print a RecursionError on a tree 1100 levels deep."""
    yield
    stack = [(str(tmp_path), False)]
    while stack:
        path, emptied = stack.pop()
        if emptied:
            os.rmdir(path)
            continue
        stack.append((path, True))
        with os.scandir(path) as entries:
            for entry in list(entries):
                if entry.is_dir(follow_symlinks=False):
                    stack.append((entry.path, False))
                else:
                    os.unlink(entry.path)


def deep_tree(top: Path, levels: int) -> Path:
    here = top
    here.mkdir()
    for _ in range(levels):  # os.makedirs recurses: one level at a time
        here = here / "d"
        here.mkdir()
    (here / "leaf.txt").write_text("leaf\n")
    return top


@pytest.mark.parametrize("case", ["link", "holds-out", "deep"])
@pytest.mark.parametrize("command", ["check", "reproduce"])
def test_a_copy_that_cannot_be_copied_is_refused_before_any_run(case, command, tmp_path, token, receipt, deep_cleanup):
    run = script_command(tmp_path, token, "plain")
    data = tmp_path / "data"
    out = "out"
    if case == "link":
        (tmp_path / "real.txt").write_text("x\n")
        (tmp_path / "data").symlink_to(tmp_path / "real.txt")
    elif case == "holds-out":
        data.mkdir()
        (data / "input.txt").write_text("x\n")
        out = "data/out"  # the evidence would be copied into itself: before, a RecursionError
    else:
        deep_tree(data, 1100)  # before: a RecursionError (copytree, os.walk)
    if command == "check":
        args = ["check", "--out", out, "--output", "out.txt", "--copy", "data", "--", *run]
    else:
        args = ["reproduce", str(receipt[0]), "--out", out, "--copy", "data", "--", *run]
    proc = reprocube(*args, cwd=tmp_path, check=False, timeout=120)
    no_traceback(proc)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    (line,) = error_lines(proc)
    assert "--copy data" in line and {"link": "link", "holds-out": "--out", "deep": "deeper than"}[case] in line
    assert ran(tmp_path) == 0  # refused before the command ran (before: both clean runs ran, for a link)
    assert not (tmp_path / out / "work").exists()


def test_a_copy_of_a_tree_within_the_depth_bound_is_copied_whole(tmp_path, token):
    deep_tree(tmp_path / "data", 90)
    proc = check(tmp_path, script_command(tmp_path, token, "plain"), "--copy", "data", "--at-line", "saved")
    no_traceback(proc)
    copied = tmp_path / "out" / "work" / "clean-1" / "data" / Path(*["d"] * 90) / "leaf.txt"
    assert copied.read_text() == "leaf\n"


def test_a_script_that_makes_a_tree_1100_levels_deep_is_walked_without_recursion(tmp_path, token, deep_cleanup):
    proc = check(tmp_path, script_command(tmp_path, token, "deep"), "--at-file", "**/leaf*", "--stops", "1")
    no_traceback(proc)  # before: a RecursionError from listing the work directory (Path.rglob)
    assert proc.returncode in (0, 9, 11, 12), proc.stdout + proc.stderr
