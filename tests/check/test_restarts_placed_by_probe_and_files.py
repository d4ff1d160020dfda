"""Regression tests for the third adversarial round against `reprocube check` (2026-11-27): each finding's
script (tests/check/scripts/verbatim/, the adversary's own reproduction, NumPy only) checked by a real `reprocube
check`. The truth of each is what the script can do (no load code: it cannot resume; a typo in the
checkpoint's name: it never loads it; exact weights, step and generator saved and restored: it resumes),
measured by the adversary with sha256 of uninterrupted and stopped-and-rerun outputs, and where cheap here
too; the verdict must not say more than that truth.

- F1: a probe called every 4th step (not on rank 0) placed a restart that began again "at step 3": not-resumed.
- F2: only the SIGTERM handler's emergency save resumes exactly: the verdict says the checkpoints saved as
  it goes were not tested.
- F3: links the command planted in check's logs/ were written through: never.
- F4: a restart that began again without recording the steps it redid (a logger skipping logged steps)
  passed on the probe's word alone: never resume-exact, it read none of the files saved before the stop.
- F6: a checkpoint at an absolute path shared with the control run: state-leaked, never resume-differs.
- F7: a per-step log appended to made the real checkpoint no state (default stops before any save): a
  correct script is resume-exact.
- F10: a probe at a logging interval made clean-2 "begin where another run ended": not state-leaked.
- F12: lines printed without flush came after the work was done: the stops land while the script runs, and
  the emergency save's bug is found.
- F13: a probe throttled by the clock recorded other steps in each run: not "not-deterministic".
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import reprocube

pytestmark = pytest.mark.process  # every test here starts a process: not in make test-quick

SCRIPTS = Path(__file__).parent / "scripts" / "verbatim"
EXIT = {
    "resume-exact": 0,
    "resume-differs": 6,
    "not-resumed": 9,
    "state-leaked": 12,
    "not-deterministic": 8,
    "command-failed": 10,
}


def check(tmp_path: Path, script: str, *options: str, args: tuple[str, ...] = (), env_extra=None):
    """`reprocube check --copy train.py --output final.npz --seed-env SEED OPTIONS -- python train.py ARGS`."""
    (tmp_path / "train.py").write_text((SCRIPTS / script).read_text())
    command = ["check", "--out", "out", "--copy", "train.py", "--output", "final.npz", "--seed-env", "SEED", *options]
    proc = reprocube(
        *command, "--", sys.executable, "train.py", *args, cwd=tmp_path, check=False, timeout=300, env_extra=env_extra
    )
    result = json.loads((tmp_path / "out" / "check.json").read_text())
    assert EXIT[result["verdict"]] == proc.returncode, (result["verdict"], proc.returncode)
    return result


def said(result: dict) -> str:
    return f"{result['verdict']}: {result['summary']}"


def test_f1_a_sparse_probe_on_another_rank_never_makes_a_restart_that_began_again_resumed(tmp_path):
    result = check(tmp_path, "a1.py", env_extra={"LOCAL_RANK": "1"})
    assert result["verdict"] == "not-resumed" and "began again" in result["summary"], said(result)


def test_f2_a_resume_from_the_emergency_save_only_says_what_was_not_tested(tmp_path):
    result = check(tmp_path, "a2.py", "--at-line", "saved")
    if result["verdict"] == "resume-exact":
        assert "written after the signal" in result["summary"] and "--signal KILL" in result["summary"], said(result)
    else:  # a stop that came before the handler's save: never resume-exact without the caveat
        assert result["verdict"] in ("resume-differs", "not-resumed"), said(result)


def test_f3_a_link_planted_in_checks_logs_is_never_written_through(tmp_path):
    victim = tmp_path / "victim.txt"
    victim.write_text("untouched\n")
    (tmp_path / "train.py").write_text((SCRIPTS / "a3.py").read_text())
    proc = reprocube(
        *("check", "--out", "out", "--copy", "train.py", "--output", "final.npz", "--seed-env", "SEED"),
        *("--jobs", "1", "--at", "0.3", "--stops", "1", "--", sys.executable, "train.py"),
        cwd=tmp_path,
        check=False,
        timeout=300,
        env_extra={"VICTIM": str(victim)},
    )
    assert victim.read_text() == "untouched\n", proc.stdout
    for name in ("control", "stopped"):
        log = tmp_path / "out" / "logs" / f"{name}.log"
        assert not log.is_symlink() and "symbolic link (planted by the command?)" in log.read_text()


def test_f4_a_restart_that_read_no_saved_file_is_not_resumed_whatever_its_first_update(tmp_path):
    result = check(tmp_path, "a4.py", "--output", "metrics.jsonl", "--at-line", "saved")
    assert result["verdict"] == "not-resumed", said(result)
    assert "read none of the 1 file saved before the stop" in result["summary"], said(result)


def test_f6_a_checkpoint_another_run_writes_is_state_leaked_not_a_resume_bug(tmp_path):
    scratch = tmp_path / "scratch"
    result = check(tmp_path, "a6.py", "--at-line", "saved", args=("--ckpt-dir", str(scratch)))
    if result["verdict"] == "command-failed":  # the control removed the shared checkpoint as the restart read it
        return
    assert result["verdict"] == "state-leaked", said(result)
    assert "resumed from state elsewhere" in result["summary"], said(result)


def _truth(tmp_path: Path, script: str) -> tuple[str, str]:
    """sha256 of final.npz uninterrupted, and stopped by SIGTERM 0.05 s after "epoch 1 saved" and rerun
    (without reprocube)."""
    digests = []
    for name, stop in (("clean", False), ("stopped", True)):
        work = tmp_path / "truth" / name
        work.mkdir(parents=True)
        (work / "train.py").write_text((SCRIPTS / script).read_text())
        env = {**os.environ, "SEED": "0", "PYTHONUNBUFFERED": "1"}
        env.pop("REPROCUBE_PROBE", None)
        if stop:
            child = subprocess.Popen([sys.executable, "train.py"], cwd=work, env=env, stdout=subprocess.PIPE, text=True)
            for line in child.stdout:
                if "epoch 1 saved" in line:
                    child.terminate()
                    break
            child.wait(60)
        subprocess.run([sys.executable, "train.py"], cwd=work, env=env, check=True, capture_output=True, timeout=120)
        digests.append(hashlib.sha256((work / "final.npz").read_bytes()).hexdigest())
    return digests[0], digests[1]


def test_f7_a_log_appended_at_every_step_leaves_the_checkpoint_the_state(tmp_path):
    clean, stopped = _truth(tmp_path, "a7.py")
    assert clean == stopped  # the truth: it resumes exactly
    result = check(tmp_path, "a7.py", "--output", "metrics.csv")
    assert result["verdict"] == "resume-exact", said(result)
    assert "at these moments only" in result["summary"]  # the default stops: drawn moments


def test_f10_a_probe_at_a_logging_interval_is_not_state_leaked(tmp_path):
    result = check(tmp_path, "a11.py")
    assert result["verdict"] == "resume-exact", said(result)


def test_f12_an_at_line_stop_comes_while_the_script_is_at_that_line(tmp_path):
    """Its lines without flush (PYTHONUNBUFFERED unset, as in a user's shell): check sets it for the runs, so
    the stops land mid-run and the emergency save's lost generator is found."""
    result = check(tmp_path, "a16.py", "--at-line", "done", env_extra={"PYTHONUNBUFFERED": None})
    assert result["verdict"] in ("resume-differs", "not-resumed"), said(result)


def test_f13_a_probe_throttled_by_the_clock_is_not_non_determinism(tmp_path):
    """Which steps each run records depends on the clock: where they differ, the updates only one recorded
    are named as not checked (the runs may also happen to record the same ones)."""
    result = check(tmp_path, "a17.py")
    assert result["verdict"] == "resume-exact", said(result)
    repeat = (result["probe"] or {}).get("repeat") or [None]
    assert repeat[0] is None  # no difference among the updates both recorded
