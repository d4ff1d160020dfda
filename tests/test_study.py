"""`reprocube study` on this machine (Hydra's basic launcher), its refusals, and hpc/preemptible.sh's
signal handling outside SLURM. The SLURM side is tests/test_slurm.py."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from helpers import epoch_digests, error_lines, reprocube, slow_steps_pythonpath, wait_for_global_step

pytestmark = pytest.mark.process  # every test here starts a process: not in make test-quick

REPO = Path(__file__).resolve().parents[1]
PREEMPTIBLE = REPO / "hpc" / "preemptible.sh"
SMALL = ["epochs=1", "threads=1", "data.train_limit=320", "data.test_limit=100"]


def test_study_same_seed_runs_agree_bit_for_bit_and_different_seeds_do_not(generated, tmp_path):
    study = tmp_path / "study"
    done = reprocube(
        "study", "framework=pytorch", "runs=2", *SMALL, *generated.overrides(), f"study.dir={study}", cwd=tmp_path
    )
    result = json.loads((study / "study.json").read_text())
    same, different = result["groups"]["same_seed"], result["groups"]["different_seeds"]
    assert (same["runs"], different["runs"], result["failures"]) == (2, 2, [])
    assert (
        same["distinct_weights_digests"] == 1
        and same["test_accuracy"]["std"] == 0.0
        and same["test_loss"]["std"] == 0.0
    )
    assert different["distinct_weights_digests"] == 2
    assert result["nondeterminism_std_ratio"] == 0.0 or different["test_accuracy"]["std"] == 0.0
    assert sorted(r["seed"] for r in result["runs"]) == [0, 0, 1, 2]
    # Each run is a plain reprocube run: the same-seed digest is that of `reprocube train seed=0`.
    reprocube(
        "train",
        "framework=pytorch",
        "seed=0",
        *SMALL,
        *generated.overrides(),
        f"output_dir={tmp_path}/plain",
        "run_name=p",
        cwd=tmp_path,
    )
    plain = epoch_digests(tmp_path / "plain" / "p")["epoch-0001"]
    assert {r["weights_digest"] for r in result["runs"] if r["group"] == "same_seed"} == {plain}
    assert "[HYDRA] Launching 4 jobs locally" in done.stdout  # through Hydra multirun
    assert (study / "study.png").read_bytes().startswith(b"\x89PNG")
    assert "| same_seed | 2 |" in (study / "study.md").read_text()

    # The report shows the study's box plot and statistics.
    reprocube("report", str(study), "--out", str(tmp_path / "report"), cwd=tmp_path)
    page = (tmp_path / "report" / "report.html").read_text()
    assert "Variance study" in page and "study-1.png" in page and "<td>same_seed</td><td>2</td>" in page


def test_a_failed_run_is_listed_and_the_others_are_kept(generated, tmp_path):
    study = tmp_path / "study"
    args = ["study", "framework=pytorch", "runs=2", *SMALL, *generated.overrides(), f"study.dir={study}"]
    reprocube(*args, cwd=tmp_path)
    first = json.loads((study / "study.json").read_text())
    # Break one run: its directory becomes a file, and its recorded result goes.
    broken = study / "runs" / "different-seed-01"
    subprocess.run(["rm", "-rf", str(broken)], check=True)
    broken.write_text("not a run directory\n")
    (study / "results" / "different-seed-01.json").unlink()

    again = reprocube(*args, cwd=tmp_path, check=False)
    assert again.returncode == 5, again.stderr
    result = json.loads((study / "study.json").read_text())
    assert [f["member"] for f in result["failures"]] == [3]
    failure = result["failures"][0]
    assert failure["log"] == str(study / "logs" / "different-seed-01.log") and Path(failure["log"]).exists()
    assert "reprocube train exited" in failure["error"]
    assert "FAILED run 3 (different_seeds, seed 2)" in again.stdout and failure["log"] in again.stdout
    # The three other runs were finished already: kept, not retrained, reported with the same digests.
    kept = {r["member"]: r["weights_digest"] for r in result["runs"]}
    assert kept == {r["member"]: r["weights_digest"] for r in first["runs"] if r["member"] != 3}
    assert "nothing to do" in (study / "logs" / "same-seed-00.log").read_text()
    assert (
        result["groups"]["different_seeds"]["runs"] == 1
        and result["groups"]["different_seeds"]["test_accuracy"]["std"] is None
    )


@pytest.mark.parametrize(
    "args, message",
    [
        (["runs=1"], "reprocube: error: study.runs must be an integer >= 2, got 1"),
        (["study.launcher=cloud"], "reprocube: error: study.launcher must be local or slurm, got 'cloud'"),
        (["study.slurm.timeout_min=0"], "reprocube: error: study.slurm.timeout_min must be an integer >= 1, got 0"),
    ],
)
def test_study_refuses_bad_settings_in_one_line(tmp_path, args, message):
    done = reprocube("study", *args, f"study.dir={tmp_path}/s", cwd=tmp_path, check=False)
    assert done.returncode == 2
    assert error_lines(done) == [message]
    assert not (tmp_path / "s").exists()


def test_study_refuses_a_directory_holding_another_study(generated, tmp_path):
    study = tmp_path / "study"
    study.mkdir()
    (study / "study-request.json").write_text(json.dumps({"framework": "jax", "runs": 2, "seed": 0, "train_args": []}))
    done = reprocube("study", "framework=pytorch", "runs=2", f"study.dir={study}", cwd=tmp_path, check=False)
    assert done.returncode == 2
    assert error_lines(done) == [
        f"reprocube: error: study.dir={study} holds another study (its framework, train_args differ); "
        "choose another study.dir"
    ]
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "notes.txt").write_text("mine\n")
    done = reprocube("study", f"study.dir={tmp_path}/other", cwd=tmp_path, check=False)
    assert error_lines(done) == [
        f"reprocube: error: study.dir={tmp_path}/other exists and is not a study; choose another study.dir"
    ]
    assert (tmp_path / "other" / "notes.txt").read_text() == "mine\n"


def test_slurm_launcher_without_a_reachable_slurm_fails_in_one_line(tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    env_path = f"{bin_dir}:/usr/local/bin:/usr/bin:/bin"
    python_bin = str(Path(sys.executable).parent)
    env = {**os.environ, "PATH": f"{python_bin}:{env_path}"}
    command = [sys.executable, "-m", "reprocube", "study", "study.launcher=slurm", f"study.dir={tmp_path}/s"]
    if not any(Path(d, "sbatch").exists() for d in env_path.split(":")):
        done = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True)
        assert error_lines(done) == [
            "reprocube: error: study.launcher=slurm: sbatch not found on PATH (is this a SLURM login node?)"
        ]
    # sbatch and sinfo present, but no controller answers (sinfo's own message is named).
    for name, body in (
        ("sbatch", "exit 1"),
        ("sinfo", 'echo "sinfo: error: Unable to contact slurm controller (connect failure)" >&2; exit 1'),
    ):
        (bin_dir / name).write_text(f"#!/bin/sh\n{body}\n")
        (bin_dir / name).chmod(0o755)
    done = subprocess.run(
        command, cwd=tmp_path, env={**env, "PATH": f"{bin_dir}:{python_bin}:{env_path}"}, capture_output=True, text=True
    )
    assert done.returncode == 1
    assert error_lines(done) == [
        "reprocube: error: study.launcher=slurm: SLURM is not reachable: "
        "sinfo: error: Unable to contact slurm controller (connect failure)"
    ]
    assert not (tmp_path / "s").exists()


# ---- hpc/preemptible.sh outside SLURM: the signal reaches reprocube, which checkpoints --------------------------


def test_preemptible_forwards_the_warning_signal_and_reprocube_checkpoints(generated, tmp_path):
    """USR1 to the batch shell (what `--signal=B:USR1@N` does) -> reprocube checkpoints mid-epoch and
    exits 75; without SLURM_JOB_ID nothing is requeued. Run again, resume=auto finishes the run with the
    uninterrupted run's digest."""
    run = [
        "framework=pytorch",
        "epochs=3",
        "threads=1",
        *generated.overrides(),
        f"output_dir={tmp_path}/runs",
        "run_name=r",
        "log.progress=false",
    ]
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    env.update(REPROCUBE=f"{sys.executable} -m reprocube", PYTHONHASHSEED="0")
    # Slow every step down, so that the signal lands mid-run: a hook module run at start-up.
    slow_env = {**env, "PYTHONPATH": slow_steps_pythonpath(tmp_path, 0.05, env.get("PYTHONPATH", ""))}
    shell = subprocess.Popen(
        ["bash", str(PREEMPTIBLE), "train", "resume=auto", *run, "log.every_steps=1", "checkpoint.every_epochs=1"],
        cwd=tmp_path,
        env=slow_env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    checkpoints = tmp_path / "runs" / "r" / "checkpoints"
    # Signalled once a step of epoch 2 is logged (steps 22-42, ~1 s at 0.05 s a step): signalled as soon as
    # epoch-0001 existed, the run was once still finishing epoch 1 and stopped there (no step checkpoint).
    wait_for_global_step(tmp_path / "runs" / "r" / "metrics.jsonl", 23, shell)
    shell.send_signal(signal.SIGUSR1)
    output, _ = shell.communicate(timeout=120)
    assert shell.returncode == 75, output
    assert (
        "reprocube-slurm: received SIGUSR1" in output and "stopped by SIGUSR1" in output and "requeueing" not in output
    )
    assert [p.name for p in sorted(checkpoints.glob("step-*"))], "no mid-epoch checkpoint"

    resumed = subprocess.run(
        ["bash", str(PREEMPTIBLE), "train", "resume=auto", *run], cwd=tmp_path, env=env, capture_output=True, text=True
    )
    assert resumed.returncode == 0, resumed.stderr
    reprocube("train", *run[:-3], f"output_dir={tmp_path}/plain", "run_name=p", cwd=tmp_path)
    assert epoch_digests(tmp_path / "runs" / "r")["epoch-0003"] == epoch_digests(tmp_path / "plain" / "p")["epoch-0003"]


def test_report_refuses_a_broken_study_result_in_one_line(tmp_path):
    study = tmp_path / "study"
    study.mkdir()
    (study / "study.json").write_text("[]")
    done = reprocube("report", str(study), "--out", str(tmp_path / "report"), cwd=tmp_path, check=False)
    assert done.returncode == 4
    assert error_lines(done) == [f"reprocube: error: {study / 'study.json'} is not a JSON object"]
    assert not (tmp_path / "report").exists()


def test_a_warning_during_start_up_is_not_lost_and_does_not_kill_reprocube(generated, tmp_path):
    """SLURM's warning can come seconds after a job starts, while Python is still importing: the
    signal must neither kill reprocube (it starts with USR1 ignored) nor be lost (the script repeats it
    every 5 s until reprocube, now handling it, checkpoints and exits 75)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    env.update(REPROCUBE=f"{sys.executable} -m reprocube", PYTHONHASHSEED="0")
    args = [
        "train",
        "resume=auto",
        "framework=pytorch",
        "epochs=200",
        "threads=1",
        *generated.overrides(),
        f"output_dir={tmp_path}/runs",
        "run_name=early",
    ]
    shell = subprocess.Popen(
        ["bash", str(PREEMPTIBLE), *args],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    time.sleep(
        0.1
    )  # the batch shell has its traps; Python is still starting (measured: killed at 0.15 s without the ignore)
    shell.send_signal(signal.SIGUSR1)
    output, _ = shell.communicate(timeout=120)
    assert shell.returncode == 75, output
    assert "stopped by SIGUSR1" in output
    checkpoints = [p.name for p in sorted((tmp_path / "runs" / "early" / "checkpoints").iterdir())]
    assert checkpoints and checkpoints[-1] != "epoch-0200", checkpoints  # stopped early, with a checkpoint
