"""Regression tests for the fourth adversarial round against `reprocube check`: each finding's script
(tests/check/scripts/, NumPy only) checked by a real `reprocube check`.

- F4: a command that replaced check's own directories (logs, probe, home, tmp) with symbolic links to a
  directory outside --out, or planted a link where check makes one (receipt, work/stopped, --out itself),
  made check write outside --out or stop with a traceback: never; the verdict is command-failed (exit 10),
  naming the directory, and nothing is written through the link.
- F6: after a stop's signal, a command that ignored it ran 60 s past --timeout: the watchdog bounds the wait,
  and the log says when the signal went and when the attempt ended.
- F3: a run that removed clean-1's outputs after the clean runs ended (the resumed run), or while they ran
  (clean-2 beside it), made check blame resume or a typo in --output: state-leaked.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from helpers import reprocube

pytestmark = pytest.mark.process  # every test here starts a process: not in make test-quick

SCRIPTS = Path(__file__).parent / "scripts"
EXIT = {
    "resume-exact": 0,
    "resume-differs": 6,
    "not-resumed": 9,
    "not-proven": 11,
    "state-leaked": 12,
    "command-failed": 10,
}


def check(tmp_path: Path, script: str, *options: str, env_extra=None, seed_env: bool = True):
    """`reprocube check --out out --copy train.py --output final.npz --seed-env SEED OPTIONS -- python
    train.py` (without --seed-env where seed_env is False): (the process, check.json's content or None
    where there is none)."""
    (tmp_path / "train.py").write_text((SCRIPTS / script).read_text())
    seed = ["--seed-env", "SEED"] if seed_env else []
    command = ["check", "--out", "out", "--copy", "train.py", "--output", "final.npz", *seed, *options]
    proc = reprocube(*command, "--", sys.executable, "train.py", cwd=tmp_path, check=False, env_extra=env_extra)
    assert "Traceback" not in proc.stderr and "error:" not in proc.stderr, proc.stderr
    path = tmp_path / "out" / "check.json"
    result = json.loads(path.read_text()) if path.is_file() and not (tmp_path / "out").is_symlink() else None
    if result is not None:
        assert EXIT[result["verdict"]] == proc.returncode, (result["verdict"], proc.returncode, proc.stdout)
    return proc, result


def victim(tmp_path: Path) -> Path:
    place = tmp_path / "victim"
    for name in ("logs", "probe", "home", "tmp", "receipt", "work"):
        (place / name).mkdir(parents=True)
    return place


def untouched(place: Path) -> list[str]:
    """What check (or a run it started) left in the victim's directories: nothing, if it never wrote there."""
    return sorted(str(p.relative_to(place)) for p in place.rglob("*") if p.parent != place)


def said(result: dict) -> str:
    return f"{result['verdict']}: {result['summary']}"


def test_f4_directories_replaced_by_links_are_never_written_through(tmp_path):
    place = victim(tmp_path)
    proc, result = check(tmp_path, "plant_dirs.py", env_extra={"VICTIM": str(place), "PLANT": "dirs"})
    assert result is not None and result["verdict"] == "command-failed", proc.stdout
    assert "replaced check's directory" in result["summary"] and "symbolic link" in result["summary"], said(result)
    assert untouched(place) == [], untouched(place)
    assert proc.returncode == 10


@pytest.mark.parametrize("plant", ["receipt", "stopped"])
def test_f4_a_link_planted_where_check_makes_a_directory_is_command_failed(tmp_path, plant):
    place = victim(tmp_path)
    proc, result = check(tmp_path, "plant_dirs.py", env_extra={"VICTIM": str(place), "PLANT": plant})
    assert result is not None and result["verdict"] == "command-failed", (proc.stdout, proc.stderr)
    assert plant in result["summary"] and "nothing is written through it" in result["summary"], said(result)
    assert untouched(place) == [], untouched(place)
    assert proc.returncode == 10


def test_f4_out_itself_replaced_is_command_failed_and_nothing_is_written(tmp_path):
    place = victim(tmp_path)
    proc, result = check(tmp_path, "plant_dirs.py", env_extra={"VICTIM": str(place), "PLANT": "out"})
    assert proc.returncode == 10, (proc.stdout, proc.stderr)
    assert result is None  # out is the link: nothing written through it
    assert "verdict: command-failed" in proc.stdout and "replaced check's directory" in proc.stdout, proc.stdout
    assert untouched(place) == [] and not (place / "check.json").exists(), untouched(place)


def test_f6_the_wait_after_a_stops_signal_is_bounded_by_the_timeout(tmp_path):
    began = time.monotonic()
    proc, result = check(tmp_path, "hang_on_term.py", "--timeout", "4", "--at-line", "saved 2", "--stops", "1")
    took = time.monotonic() - began
    assert result is not None and result["verdict"] == "command-failed", (proc.stdout, proc.stderr)
    assert took < 30, took
    stopped = next(run for run in result["runs"] if run["name"] == "stopped")
    assert stopped["attempts"][0]["seconds"] < 15, stopped  # 4 s, then the watchdog's SIGTERM, SIGKILL after 5 s
    log = (tmp_path / "out" / "logs" / "stopped.log").read_text()
    line = next(x for x in log.splitlines() if x.startswith("[reprocube check: SIGTERM"))
    assert "sent at 0." in line or "sent at 1." in line, line
    assert "the attempt ended at 4.0" in line and "(by the watchdog;" in line, line


def test_f3_a_resumed_run_that_removes_clean_1s_outputs_is_state_leaked(tmp_path):
    proc, result = check(
        tmp_path, "remove_others.py", "--at-line", "saved 16", "--stops", "1", env_extra={"REMOVER": "resumed"}
    )
    assert result is not None and result["verdict"] == "state-leaked", said(result)
    assert "clean-1's outputs changed after it ended" in result["summary"], said(result)
    assert "final.npz was removed" in result["summary"], said(result)


def test_f3_clean_2_removing_clean_1s_outputs_is_no_typo_in_output(tmp_path):
    proc, result = check(tmp_path, "remove_others.py", "--jobs", "2", env_extra={"REMOVER": "clean-2"})
    assert result is not None and result["verdict"] == "state-leaked", said(result)
    assert "typo" not in result["summary"] and "removed or replaced by another process" in result["summary"], said(
        result
    )


# --- round 4, the lead's findings: a restart that discards its state, an update made as the script stopped


def truth_run(cwd: Path, script: str, stop_at: str | None = None, env_extra=None, args=()) -> int:
    """The script run in cwd without reprocube (SEED=0), SIGTERMed (its process group) at the first output
    line holding stop_at if given; its exit status."""
    import os
    import signal
    import subprocess

    env = {**os.environ, "SEED": "0", "PYTHONUNBUFFERED": "1", **(env_extra or {})}
    env.pop("REPROCUBE_PROBE", None)
    child = subprocess.Popen(
        [sys.executable, str(SCRIPTS / script), *args],
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    for line in child.stdout:
        if stop_at is not None and stop_at in line:
            os.killpg(child.pid, signal.SIGTERM)
            stop_at = None
    return child.wait(60)


def final_digest(cwd: Path) -> str:
    import hashlib

    with np_load(cwd / "final.npz") as arrays:
        return hashlib.sha256(b"".join(arrays[k].tobytes() for k in sorted(arrays.files))).hexdigest()


def np_load(path: Path):
    import numpy as np

    return np.load(path)


def assert_state_never_used(tmp_path: Path, stop_at: str, env_extra=None) -> None:
    """discards_state.py's truth, without reprocube: stopped at `stop_at` and rerun with its checkpoint's
    weights poisoned (each moved by one: finite, so a restart that checks them takes them), it ends as an
    uninterrupted run does: the restart never uses the weights it reads."""
    import hashlib

    import numpy as np

    clean, stopped = tmp_path / "truth-clean", tmp_path / "truth-stopped"
    clean.mkdir(), stopped.mkdir()
    assert truth_run(clean, "discards_state.py", env_extra=env_extra) == 0
    truth_run(stopped, "discards_state.py", stop_at=stop_at, env_extra=env_extra)
    [checkpoint_path] = stopped.glob("**/ckpt.npz")
    with np.load(checkpoint_path) as checkpoint:
        poisoned = {k: checkpoint[k] for k in checkpoint.files}
    np.savez(checkpoint_path, **{**poisoned, "w": poisoned["w"] + 1})
    if (stopped / "ckpt.sha256").exists():  # the checksum made again, as a script's own save would
        (stopped / "ckpt.sha256").write_text(hashlib.sha256(checkpoint_path.read_bytes()).hexdigest())
    assert truth_run(stopped, "discards_state.py", env_extra=env_extra) == 0
    assert final_digest(stopped) == final_digest(clean)


def test_a_restart_that_reads_its_checkpoint_and_trains_again_from_scratch_never_passes(tmp_path):
    """Truth without reprocube: uninterrupted and stopped-and-rerun end the same, and so does a rerun whose
    checkpoint was poisoned (NaN weights): the restart never uses the state it reads. Its probe and its
    reads looked like a resume. With a start-up of 1.5 s (a framework's import) its restarts take no longer
    than a resumed run would, so only the moved-weights restart (given its state, weights moved) tells: not-proven;
    it makes the swapped restart redundant, which does not run."""
    assert_state_never_used(tmp_path, "epoch 2 saved")
    proc, result = check(tmp_path, "discards_state.py", env_extra={"START_S": "1.5"})
    assert result is not None and result["verdict"] == "not-proven", said(result)
    assert "so it never used those weights" in result["summary"], said(result)
    assert [r["name"] for r in result["runs"]][-2:] == ["stopped", "moved-2"]


@pytest.mark.parametrize(
    "variant",
    [
        {"SEED_FROM_CHECKPOINT": "1"},  # F2: the swapped restart replays the control's seed: other outputs
        {"HASHED_RUN_DIR": "1"},  # F6: the control's checkpoint lands on no file of the run's: no swap
        {"RESTORE_FROM_STEP": "40"},  # F15': the control's copy (step 40) is restored; the stops' are not
        # round 8: a float hyper-parameter read back (moving it changed the replay: G1), a log appended to
        # (not given to the restart, it differed: G2), a guard against non-finite weights (NaN made the
        # restart fail: G4)
        {"SEED_FROM_CHECKPOINT": "1", "LR_FROM_CHECKPOINT": "1"},
        {"SEED_FROM_CHECKPOINT": "1", "METRICS_LOG": "1"},
        {"SEED_FROM_CHECKPOINT": "1", "ASSERT_FINITE": "1"},
        # a checksum beside the checkpoint (G8: the restart refused the moved weights; made again now), a
        # probed bias kept at zero and a 0.0 hyper-parameter read back (G11: every zero tensor had the bias's
        # fingerprint, 0, and was moved as a weight)
        {"SEED_FROM_CHECKPOINT": "1", "CHECKSUM": "1"},
        {"SEED_FROM_CHECKPOINT": "1", "ZERO_HYPER": "1"},
        # float32 weights saved as float64 (G14: not found by their fingerprints), a layer frozen at the stops
        # and trained later (G15: its frozen value was taken for a trained weight)
        {"SEED_FROM_CHECKPOINT": "1", "LR_FROM_CHECKPOINT": "1", "WEIGHTS_F64": "1"},
        {"SEED_FROM_CHECKPOINT": "1", "UNFREEZE": "1"},
    ],
    ids=[
        "seed",
        "hashed-run-dir",
        "restores-late-only",
        "lr-read-back",
        "appended-log",
        "finite-guard",
        "checksum",
        "zero",
        "float64",
        "unfrozen-later",
    ],
)
def test_a_restart_that_never_uses_the_weights_it_reads_is_caught_by_moved_weights(tmp_path, variant):
    """Round 7's F2, F6 and F15', round 8's G1, G2, G4, G8, G11, G14 and G15: each passed (some with a caveat only). Truth
    without reprocube: the script stopped at epoch 2 and rerun with its checkpoint's weights moved ends as an
    uninterrupted run does. check's moved-weights restart does the same to a copy of the stopped run's state at
    its last stop (the weights alone, found by the fingerprints the probe records) and sees the uninterrupted
    run's outputs: not-proven."""
    env = {"START_S": "1.5", **variant}
    assert_state_never_used(tmp_path, "epoch 2 saved", env_extra=env)
    log = ("--output", "metrics.csv") if "METRICS_LOG" in variant else ()
    proc, result = check(tmp_path, "discards_state.py", "--at-line", "saved", "--stops", "2", *log, env_extra=env)
    assert result is not None and result["verdict"] != "resume-exact", said(result)
    assert result["verdict"] == "not-proven", said(result)
    assert result["stage"] == "moved-weights" and "so it never used those weights" in result["summary"], said(result)


SLOW_STEPS = {"START_S": "0.3", "STEP_S": "0.1"}  # 2.4 s of updates before the stop at epoch 3


def test_without_a_control_a_restart_that_trains_again_unrecorded_is_told_by_its_first_updates_time(tmp_path):
    """The same script with no --seed-env (no control, no swapped restart). Truth as above: a poisoned
    checkpoint changes nothing. Its restart's first update (step 25) comes as late as the uninterrupted run
    reached step 25, where a resumed run's would come about when its first one did: the stop is not
    effective, and the verdict is no pass."""
    assert_state_never_used(tmp_path, "epoch 3 saved")
    options = ("--at-line", "epoch 3 saved", "--stops", "1")
    proc, result = check(tmp_path, "discards_state.py", *options, env_extra=SLOW_STEPS, seed_env=False)
    assert result is not None and result["verdict"] != "resume-exact", said(result)
    [stop] = result["stop_evidence"]
    assert stop["effective"] is False and "without recording them" in stop["how"], stop


def test_without_a_control_a_restart_that_resumes_is_not_taken_for_one_that_trains_again(tmp_path):
    """The control of the test above: the script resuming correctly (RESTORE=1), the same timings. Truth:
    stopped at epoch 3 and rerun, it ends as the uninterrupted run does. Its restart's first update comes
    about when a fresh run's first does: resume-exact."""
    env = {**SLOW_STEPS, "RESTORE": "1"}
    clean, stopped = tmp_path / "truth-clean", tmp_path / "truth-stopped"
    clean.mkdir(), stopped.mkdir()
    assert truth_run(clean, "discards_state.py", env_extra=env) == 0
    truth_run(stopped, "discards_state.py", stop_at="epoch 3 saved", env_extra=env)
    assert truth_run(stopped, "discards_state.py", env_extra=env) == 0
    assert final_digest(stopped) == final_digest(clean)

    options = ("--at-line", "epoch 3 saved", "--stops", "1")
    proc, result = check(tmp_path, "discards_state.py", *options, env_extra=env, seed_env=False)
    assert result is not None and result["verdict"] == "resume-exact", said(result)
    [stop] = result["stop_evidence"]
    assert stop["effective"] is True, stop
    # The moved-weights restart (in a slot of its own: no control) used its moved weights: its first loss, at step
    # 25, is not the uninterrupted run's, and it was ended there rather than run to its end.
    assert "its weights moved, used them (another loss at its first update (step 25)" in result["summary"], said(result)
    [poisoned] = [run for run in result["runs"] if run["name"] == "moved-1"]
    assert len(poisoned["attempts"]) == 1 and poisoned["attempts"][0]["stop"].startswith("SIGTERM once")
    assert not poisoned["attempts"][0]["stopped_early"]


def test_a_restart_that_exports_a_finished_checkpoint_and_retrains_otherwise_never_passes(tmp_path):
    """Round 6's a11e (its PyTorch twin a12 the same). Truth without reprocube: stopped at epoch 2 and rerun
    with the checkpoint's weights poisoned (NaN), it ends as the uninterrupted run does: the restart never
    uses them. Its updates past the checkpoint are few (0.08 s an epoch): neither timing rule can tell. The
    swapped restart, once given the control's finished state, exported it and trained nothing (a pass with
    a caveat); given the control's state at its stop, it trains the rest from weights it never loaded and
    writes the uninterrupted run's model bit for bit: it did not continue, and the check does not pass."""
    import numpy as np

    clean, stopped = tmp_path / "truth-clean", tmp_path / "truth-stopped"
    clean.mkdir(), stopped.mkdir()
    assert truth_run(clean, "export_when_complete.py") == 0
    truth_run(stopped, "export_when_complete.py", stop_at="epoch 2 saved")
    with np.load(stopped / "ckpt.npz") as checkpoint:
        poisoned = {k: checkpoint[k] for k in checkpoint.files}
    np.savez(stopped / "ckpt.npz", **{**poisoned, "w": np.full_like(poisoned["w"], np.nan)})
    assert truth_run(stopped, "export_when_complete.py") == 0
    assert final_digest(stopped) == final_digest(clean)

    proc, result = check(tmp_path, "export_when_complete.py", "--at-line", "saved", "--stops", "2")  # at steps 8, 16
    assert result is not None, proc.stdout
    # The swapped restart gets the control's state at its stop (step 8 of seed 1), trains the rest with the
    # weights it never loaded and writes the uninterrupted run's model: it did not continue.
    assert result["verdict"] != "resume-exact", said(result)
    assert result["stage"] in ("swap", "moved-weights"), said(result)


def test_a_state_directory_moved_out_of_the_work_directory_is_state_from_elsewhere(tmp_path):
    """Round 6's a8b. Truth without reprocube: stopped at epoch 2 and rerun it ends as the uninterrupted run
    does, and with the checkpoint outside poisoned (NaN) it does not: it resumes from that state, outside
    its directories. check named those saves work/ckpts/... (its watch followed the moved directory) and
    passed it resume-exact; the moved directory's watches are now dropped."""
    import hashlib
    import os

    import numpy as np

    outside = {"OUTSIDE": str(tmp_path / "outside")}
    runs = {name: tmp_path / f"truth-{name}" for name in ("clean", "stopped", "poisoned")}
    for place in runs.values():
        place.mkdir()
    assert truth_run(runs["clean"], "moves_state_out.py", env_extra=outside) == 0
    for name in ("stopped", "poisoned"):
        truth_run(runs[name], "moves_state_out.py", stop_at="epoch 2 saved", env_extra=outside)
    hashed = hashlib.sha256(os.path.realpath(runs["poisoned"]).encode()).hexdigest()[:12]
    saved = tmp_path / "outside" / hashed / "ckpt.npz"  # the poisoned run's, as the script names it
    with np.load(saved) as checkpoint:
        state = {k: checkpoint[k] for k in checkpoint.files}
    np.savez(saved, **{**state, "w": np.full_like(state["w"], np.nan)})
    for name in ("stopped", "poisoned"):
        assert truth_run(runs[name], "moves_state_out.py", env_extra=outside) == 0
    assert final_digest(runs["stopped"]) == final_digest(runs["clean"])
    assert final_digest(runs["poisoned"]) != final_digest(runs["clean"])  # the state outside is what it used

    options = ("--at-line", "epoch 2 saved", "--stops", "1")
    proc, result = check(tmp_path, "moves_state_out.py", *options, env_extra=outside)
    assert result is not None and result["verdict"] != "resume-exact", said(result)


def test_a_correct_resume_whose_checkpoint_path_holds_the_seed_passes(tmp_path):
    """Truth: stopped and rerun, it ends as the uninterrupted run does. Its weights are saved as text, so no
    moved-weights restart can run (said) and the swapped restart is what tells: it finds the control's
    runs/seed1/ckpt.npz under runs/seed0/ (the uninterrupted run's name) and continues from it, so it does
    not make the check not-proven: resume-exact."""
    env = {"WEIGHTS_AS_TEXT": "1"}
    clean, stopped = tmp_path / "truth-clean", tmp_path / "truth-stopped"
    clean.mkdir(), stopped.mkdir()
    assert truth_run(clean, "seed_in_names.py", env_extra=env) == 0
    truth_run(stopped, "seed_in_names.py", stop_at="saved 16", env_extra=env)
    assert truth_run(stopped, "seed_in_names.py", env_extra=env) == 0
    assert final_digest(stopped) == final_digest(clean)

    proc, result = check(tmp_path, "seed_in_names.py", env_extra=env)
    assert result is not None and result["verdict"] == "resume-exact", said(result)
    assert any("has a fingerprint the probe recorded" in line for line in result["not_checked"]), said(result)
    assert (tmp_path / "out" / "work" / "swapped" / "runs" / "seed0" / "ckpt.npz").is_file()
    assert result["comparisons"]["swap"]["identical"] is False  # it continued from the control's state


def test_an_update_the_script_made_as_it_stopped_is_resume_not_non_determinism(tmp_path):
    """Truth: two uninterrupted runs agree; SIGTERMed at a micro-batch and rerun, it differs (its partial
    update). The differing update is in the stopped attempt's trace, recorded after the signal: check
    blamed non-determinism before any stop; now resume-differs, naming the update made after the signal."""
    first, second, stopped = tmp_path / "truth-1", tmp_path / "truth-2", tmp_path / "truth-stopped"
    for place in (first, second, stopped):
        place.mkdir()
    assert truth_run(first, "partial_update_on_signal.py") == 0
    assert truth_run(second, "partial_update_on_signal.py") == 0
    assert final_digest(first) == final_digest(second)
    truth_run(stopped, "partial_update_on_signal.py", stop_at="micro 2 of step 7")
    assert truth_run(stopped, "partial_update_on_signal.py") == 0
    assert final_digest(stopped) != final_digest(first)

    proc, result = check(tmp_path, "partial_update_on_signal.py", "--at-line", "micro 2 of step (7|19)$")
    assert result is not None and result["verdict"] == "resume-differs", said(result)
    assert "recorded after stop 1's signal" in result["summary"], said(result)


def test_a_checkpoint_hard_linked_into_place_is_a_save_the_restart_read(tmp_path):
    """Round 6's b3. Truth without reprocube: stopped after step 32's save and rerun, it ends as the
    uninterrupted run does, and with ckpt.npz's weights poisoned (NaN, through the link) it does not: the
    restart continues from the linked file. check saw no write of ckpt.npz (a link(2) closes nothing) and
    said each restart read none of the files saved before its stop (not-resumed); now resume-exact."""
    import numpy as np

    runs = {name: tmp_path / f"truth-{name}" for name in ("clean", "stopped", "poisoned")}
    for place in runs.values():
        place.mkdir()
    assert truth_run(runs["clean"], "hard_linked_save.py") == 0
    for name in ("stopped", "poisoned"):
        truth_run(runs[name], "hard_linked_save.py", stop_at="step 32 saved")
    with np.load(runs["poisoned"] / "ckpt.npz") as checkpoint:
        state = {k: checkpoint[k] for k in checkpoint.files}
    (runs["poisoned"] / "ckpt.npz").unlink()
    np.savez(runs["poisoned"] / "ckpt.npz", **{**state, "w": np.full_like(state["w"], np.nan)})
    for name in ("stopped", "poisoned"):
        assert truth_run(runs[name], "hard_linked_save.py") == 0
    assert final_digest(runs["stopped"]) == final_digest(runs["clean"])
    assert final_digest(runs["poisoned"]) != final_digest(runs["clean"])

    proc, result = check(tmp_path, "hard_linked_save.py", "--at-line", r"step (32|64) saved", "--stops", "2")
    assert result is not None and result["verdict"] == "resume-exact", said(result)
    assert [stop["effective"] for stop in result["stop_evidence"]] == [True, True], result["stop_evidence"]
    # No handler catches SIGTERM (/proc's SigCgt): nothing could be saved after the signal, whatever the times
    # say of the save the stop line follows (round 7's F17).
    assert "written after the signal" not in result["summary"], said(result)


def test_a_log_kept_open_and_closed_as_the_process_ends_is_no_save_after_the_signal(tmp_path):
    """Round 6's b14. Truth without reprocube: stopped after step 32's save and rerun, it ends as the
    uninterrupted run does. metrics.db (SQLite, kept open) is closed by the kernel as the stopped process
    ends: check took it for the script's own stop path ("from a file written after the signal") though its
    content last changed before the signal (its mtime), and ckpt.npz was saved before it."""
    clean, stopped = tmp_path / "truth-clean", tmp_path / "truth-stopped"
    clean.mkdir(), stopped.mkdir()
    assert truth_run(clean, "sqlite_log.py") == 0
    truth_run(stopped, "sqlite_log.py", stop_at="step 32 saved")
    assert truth_run(stopped, "sqlite_log.py") == 0
    assert final_digest(stopped) == final_digest(clean)

    proc, result = check(tmp_path, "sqlite_log.py", "--at-line", r"step (32|64) saved", "--stops", "2")
    assert result is not None and result["verdict"] == "resume-exact", said(result)
    assert "written after the signal" not in result["summary"], said(result)


def test_a_resume_from_what_only_the_stop_handler_saved_is_named_not_failed(tmp_path):
    """Round 7's F8. Truth without reprocube: SIGTERMed at step 32 (it saves and exits) and rerun, it ends as
    the uninterrupted run does. check: resume-exact, each stop named as resumed from a file written after the
    signal (what it saves as it goes, nothing here, was not tested)."""
    clean, stopped = tmp_path / "truth-clean", tmp_path / "truth-stopped"
    clean.mkdir(), stopped.mkdir()
    assert truth_run(clean, "preempt_only.py") == 0
    truth_run(stopped, "preempt_only.py", stop_at="step 32 done")
    assert (stopped / "preempt.npz").is_file()
    assert truth_run(stopped, "preempt_only.py") == 0
    assert final_digest(stopped) == final_digest(clean)

    proc, result = check(tmp_path, "preempt_only.py", "--at-line", r"step (32|64) done", "--stops", "2")
    assert result is not None and result["verdict"] == "resume-exact", said(result)
    assert result["summary"].count("from a file written after the signal (work/preempt.npz") == 2, said(result)


def test_state_kept_beside_the_work_directory_never_passes(tmp_path):
    """Round 7's F1c. Truth without reprocube: stopped after epoch 2 and rerun it ends as the uninterrupted run
    does, but with the state beside its directory removed (a restart on another machine) it does not: the
    resume rests on that state. check passed it resume-exact; what is written beside the runs' directories
    in --out is now watched: state-leaked, naming the files (removed at the end, still seen)."""
    runs = {name: tmp_path / "truth" / name for name in ("clean", "stopped", "moved")}
    for place in runs.values():
        place.mkdir(parents=True)
    assert truth_run(runs["clean"], "state_beside.py") == 0
    for name in ("stopped", "moved"):
        truth_run(runs[name], "state_beside.py", stop_at="epoch 2 saved")
    (tmp_path / "truth" / ".moved-fast.pkl").unlink()  # what another machine would not have
    for name in ("stopped", "moved"):
        assert truth_run(runs[name], "state_beside.py") == 0
    assert final_digest(runs["stopped"]) == final_digest(runs["clean"])
    assert final_digest(runs["moved"]) != final_digest(runs["clean"])

    proc, result = check(tmp_path, "state_beside.py", "--at-line", "epoch (2|4) saved", "--stops", "2")
    assert result is not None and result["verdict"] == "state-leaked", said(result)
    assert "beside them in --out's work/.clean-1-fast.pkl" in result["summary"], said(result)


def test_state_kept_on_a_ram_disk_is_named_where_the_check_passes(tmp_path):
    """Round 7's F1: the full state in /dev/shm (named after the work directory), beside a checkpoint
    without the generator. Truth without reprocube: stopped at epoch 2 and rerun it ends as the uninterrupted
    run does, with the checkpoint's weights poisoned (NaN) too (they are never used), and not once the RAM
    disk's file is gone (as on another node). Every restart here finds that file, and the poisoned one, in
    another directory, does not: no run on this machine shows the bug. The check may pass, but only naming
    state kept outside the run's directories as not checked."""
    import numpy as np

    shm = tmp_path / "shm"  # the script's /dev/shm, here a directory of the test's own
    shm.mkdir()
    env = {"SHM_DIR": str(shm)}
    digests = {}
    for case in ("clean", "stopped", "poisoned", "elsewhere"):
        cwd = tmp_path / f"truth-{case}"
        cwd.mkdir()
        if case != "clean":
            truth_run(cwd, "state_beside.py", stop_at="epoch 2 saved", env_extra=env)
        if case == "poisoned":
            with np.load(cwd / "ckpt.npz") as checkpoint:
                kept = {k: checkpoint[k] for k in checkpoint.files}
            np.savez(cwd / "ckpt.npz", **{**kept, "w": np.full_like(kept["w"], np.nan)})
        if case == "elsewhere":
            for left in shm.iterdir():
                left.unlink()
        assert truth_run(cwd, "state_beside.py", env_extra=env) == 0
        digests[case] = final_digest(cwd)
    assert digests["stopped"] == digests["poisoned"] == digests["clean"] != digests["elsewhere"]

    proc, result = check(tmp_path, "state_beside.py", "--at-line", "saved", "--stops", "2", env_extra=env)
    assert result is not None, proc.stdout
    if result["verdict"] == "resume-exact":
        assert any("state kept outside the run's directories" in line for line in result["not_checked"]), said(result)
        # The moved-weights restart, in another directory, found no RAM-disk state and used its moved weights: true
        # of it, and why state outside the directories is named.
        assert (
            "weights moved, used them (stop 1: another loss at its first update than the stopped run"
            in result["summary"]
        ), said(result)


@pytest.mark.parametrize("checksum", ["1", "keyed"])
def test_a_correct_restart_that_checks_its_checkpoint_is_not_called_unproven(tmp_path, checksum):
    """Round 8's G3: a correct script that keeps a sha256 beside its checkpoint and starts fresh where the
    checkpoint fails it. Truth without reprocube: stopped at epoch 2 and rerun it ends as the uninterrupted
    run does, and with its weights moved (the checksum made again where anyone can) it does not: it uses
    them. A plain sha256 is made again for the moved-weights restart, which then uses its moved weights: a pass.
    A keyed one cannot be: the moved-weights restart begins again at step 1 (the probe), which tells nothing, and
    is named, not taken for a restart that never used its weights."""
    import hashlib

    import numpy as np

    env = {"START_S": "1.5", "RESTORE": "1", "CHECKSUM": checksum}
    key = b"secret" if checksum == "keyed" else b""
    clean, stopped, moved = (tmp_path / f"truth-{case}" for case in ("clean", "stopped", "moved"))
    for directory in (clean, stopped, moved):
        directory.mkdir()
    assert truth_run(clean, "discards_state.py", env_extra=env) == 0
    for directory in (stopped, moved):
        truth_run(directory, "discards_state.py", stop_at="epoch 2 saved", env_extra=env)
    with np.load(moved / "ckpt.npz") as checkpoint:
        kept = {k: checkpoint[k] for k in checkpoint.files}
    np.savez(moved / "ckpt.npz", **{**kept, "w": kept["w"] + np.float32(1)})
    (moved / "ckpt.sha256").write_text(hashlib.sha256(key + (moved / "ckpt.npz").read_bytes()).hexdigest())
    for directory in (stopped, moved):
        assert truth_run(directory, "discards_state.py", env_extra=env) == 0
    assert final_digest(stopped) == final_digest(clean) != final_digest(moved)

    proc, result = check(tmp_path, "discards_state.py", "--at-line", "saved", "--stops", "2", env_extra=env)
    assert result is not None and result["verdict"] == "resume-exact", said(result)
    if checksum == "1":
        assert "used them (stop 1: another loss at its first update (step 9)" in result["summary"], said(result)
        assert "stop 2: another loss at its first update (step 17)" in result["summary"], said(result)
    else:
        assert any("it began again at step 1" in line for line in result["not_checked"]), result["not_checked"]


def test_a_restart_that_uses_only_later_checkpoints_is_caught_at_the_earlier_stop(tmp_path):
    """Round 8's G9: a restart restores its weights only from a checkpoint of step 16 or later; from the first
    (step 8) it trains again unrecorded. Truth without reprocube: stopped after epoch 1 and rerun with the
    checkpoint's weights moved, it ends as the uninterrupted run does (never used). Only the last stop's state
    was poisoned, and its restart used its weights: a pass. Every stop's is now, and the first's is caught."""
    env = {"START_S": "1.5", "RESTORE_FROM_STEP": "16"}
    assert_state_never_used(tmp_path, "epoch 1 saved", env_extra=env)
    proc, result = check(tmp_path, "discards_state.py", "--at-line", "saved", "--stops", "2", env_extra=env)
    assert result is not None and result["verdict"] == "not-proven", said(result)
    assert result["stage"] == "moved-weights" and "after stop 1, its weights moved" in result["summary"], said(result)


def test_a_restart_that_writes_where_its_checkpoint_says_is_never_blamed_on_the_resume(tmp_path):
    """Round 9's H1: a correct script whose run directory is made absolute and kept in its checkpoint (as
    args saved in a checkpoint are); a restart writes where the checkpoint says. Truth without reprocube:
    stopped at epoch 2 and rerun in its directory, it ends as the uninterrupted run does. A moved-weights restart,
    given a copy of the stopped run's state, wrote its moved weights into the stopped run's directory after
    that run ended, and check blamed the resume (resume-differs). The stopped run's outputs are now recorded
    when it ends and checked before they are compared: the check is void, naming why."""
    env = {"RESTORE": "1", "ABSOLUTE_RUN_DIR": "1", "NO_PROBE": "1", "START_S": "0.3"}
    clean, stopped = tmp_path / "truth-clean", tmp_path / "truth-stopped"
    clean.mkdir(), stopped.mkdir()
    assert truth_run(clean, "discards_state.py", env_extra=env) == 0
    truth_run(stopped, "discards_state.py", stop_at="epoch 2 saved", env_extra=env)
    assert truth_run(stopped, "discards_state.py", env_extra=env) == 0
    digest = [final_digest(d / "runs" / "exp") for d in (clean, stopped)]
    assert digest[0] == digest[1]

    (tmp_path / "train.py").write_text((SCRIPTS / "discards_state.py").read_text())
    command = ["check", "--out", "out", "--copy", "train.py", "--output", "runs/exp/final.npz", "--seed-env", "SEED"]
    options = ["--at-line", "epoch 2 saved", "--stops", "1"]
    proc = reprocube(*command, *options, "--", sys.executable, "train.py", cwd=tmp_path, check=False, env_extra=env)
    assert "Traceback" not in proc.stderr, proc.stderr
    result = json.loads((tmp_path / "out" / "check.json").read_text())
    assert result["verdict"] != "resume-differs", said(result)
    assert result["verdict"] == "resume-exact" or "changed after it ended" in result["summary"], said(result)


def test_a_restart_that_tells_its_own_directory_apart_is_never_said_to_use_its_weights(tmp_path):
    """Round 8's G18: its own run's checkpoint (a run id from its work directory) sends a restart to train
    again from step 1 unrecorded (its weights never used); another directory's starts a new run from the
    weights at step 1. Truth without reprocube: stopped at epoch 2 and rerun with the weights moved in place,
    it ends as the uninterrupted run does. A moved-weights restart, in another directory, took the other path:
    its first update was step 1 where the stopped run's restart made step 17. That tells nothing: no pass
    says the restarts used their weights, and the plain replay line stays."""
    env = {"START_S": "1.5", "SEED_FROM_CHECKPOINT": "1", "RUN_ID": "1"}
    assert_state_never_used(tmp_path, "epoch 2 saved", env_extra=env)
    proc, result = check(tmp_path, "discards_state.py", "--at-line", "saved", "--stops", "2", env_extra=env)
    assert result is not None, proc.stdout
    assert "used them" not in result["summary"], said(result)
    if result["verdict"] == "resume-exact":
        assert any("took another path" in line for line in result["not_checked"]), result["not_checked"]
        assert any(
            line.startswith("whether the restarts used the weights they read, rather") for line in result["not_checked"]
        )


def test_a_replay_labelled_off_by_one_is_never_said_to_use_its_weights(tmp_path):
    """Round 10: the moved-weights restart's first loss was set against the uninterrupted run's update of
    the same label; with the script's labels off that is another update, and a replay passed with "weights
    moved, used them". Truth, without reprocube: the state after a stop with its weights moved, rerun,
    writes the uninterrupted run's final.npz bit for bit."""
    import hashlib
    import os
    import shutil
    import subprocess

    script = (SCRIPTS / "replays_with_labels_off.py").read_text()
    env = {**os.environ, "SEED": "0"}
    env.pop("REPROCUBE_PROBE", None)
    whole, moved = tmp_path / "truth" / "whole", tmp_path / "truth" / "moved"
    for directory in (whole, moved):
        directory.mkdir(parents=True)
        (directory / "train.py").write_text(script)
    subprocess.run([sys.executable, "train.py"], cwd=whole, env=env, check=True, capture_output=True)
    proc = subprocess.Popen([sys.executable, "train.py"], cwd=moved, env=env, stdout=subprocess.PIPE, text=True)
    for line in proc.stdout:
        if "step 4 saved" in line:
            proc.kill()
            break
    proc.wait()
    with np.load(moved / "ckpt.npz") as checkpoint:
        state = {k: checkpoint[k] for k in checkpoint.files}
    np.savez(moved / "ckpt.npz", **{**state, "w": state["w"] + 1})
    subprocess.run([sys.executable, "train.py"], cwd=moved, env=env, check=True, capture_output=True)
    digest = [hashlib.sha256((d / "final.npz").read_bytes()).hexdigest() for d in (whole, moved)]
    assert digest[0] == digest[1]  # the truth: it never uses the weights it reads
    shutil.rmtree(tmp_path / "truth")
    proc, result = check(tmp_path, "replays_with_labels_off.py")
    assert result["verdict"] != "resume-exact" and "used them" not in result["summary"], said(result)


def test_a_replay_whose_checkpoint_folder_is_named_by_a_hash_is_caught_by_the_swap(tmp_path):
    """Round 10: the swapped restart paired the control's files with the uninterrupted run's by their names;
    a folder named by a hash of the seed paired nothing, nothing was placed, and a replay (in a pickle, which
    no moved-weights restart moves) passed. Now the state files are paired by the order each run wrote
    them. Truth, without reprocube: another seed's checkpoint under this run's name changes nothing."""
    import hashlib
    import os
    import shutil
    import subprocess

    script = (SCRIPTS / "hashed_folder_replay.py").read_text()
    whole, given = tmp_path / "truth" / "whole", tmp_path / "truth" / "given"
    for directory in (whole, given):
        directory.mkdir(parents=True)
        (directory / "train.py").write_text(script)
    env = {k: v for k, v in os.environ.items() if k != "REPROCUBE_PROBE"}
    subprocess.run([sys.executable, "train.py"], cwd=whole, env={**env, "SEED": "0"}, check=True, capture_output=True)
    subprocess.run([sys.executable, "train.py"], cwd=given, env={**env, "SEED": "1"}, check=True, capture_output=True)
    (given / "final.npz").unlink()
    ours = hashlib.sha1(b"seed=0").hexdigest()[:8]
    (given / "runs" / hashlib.sha1(b"seed=1").hexdigest()[:8]).rename(given / "runs" / ours)
    subprocess.run([sys.executable, "train.py"], cwd=given, env={**env, "SEED": "0"}, check=True, capture_output=True)
    digests = [hashlib.sha256((d / "final.npz").read_bytes()).hexdigest() for d in (whole, given)]
    assert digests[0] == digests[1]  # the truth: it never continues from the state it reads
    shutil.rmtree(tmp_path / "truth")
    proc, result = check(tmp_path, "hashed_folder_replay.py")
    assert result["verdict"] == "not-proven" and result["rule"] == "swapped_restart_ignored_state", said(result)
