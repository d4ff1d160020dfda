"""Against a real SLURM: slurmctld and slurmd from Debian's slurm-wlm on 127.0.0.1, set up by
scripts/slurm-setup.sh (`make test` and .ci/run run it; REPROCUBE_SLURM_TESTS=1 then turns a missing
SLURM from a skip into a failure). Covered: an sbatch training job that receives SLURM's warning signal
before its time limit, checkpoints mid-epoch, is requeued and resumes to the uninterrupted run's
digest; and the variance study through Hydra's submitit SLURM launcher, one job per run."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from helpers import GeneratedDataset, epoch_digests, make_payloads, manifest, reprocube, wait_until

pytestmark = pytest.mark.process  # every test here starts a process: not in make test-quick

REPO = Path(__file__).resolve().parents[1]
JOB_EPOCHS = 30  # the SLURM job's: enough to outlast the warning on a fast machine (see `dataset`)


def _slurm_missing() -> str | None:
    if shutil.which("sbatch") is None:
        return "sbatch is not installed (scripts/slurm-setup.sh installs slurm-wlm)"
    try:
        done = subprocess.run(["sinfo", "-h", "-o", "%T"], capture_output=True, text=True, timeout=30)
    except subprocess.TimeoutExpired:
        return "sinfo did not answer in 30 s"
    if done.returncode != 0 or not re.search(r"^(idle|mixed|allocated)", done.stdout, re.M):
        return (
            f"no SLURM node is up (SLURM_CONF={os.environ.get('SLURM_CONF')}): "
            f"{done.stderr.strip() or done.stdout.strip()}"
        )
    return None


@pytest.fixture(scope="module")
def slurm():
    missing = _slurm_missing()
    if missing:
        if os.environ.get("REPROCUBE_SLURM_TESTS") == "1":
            pytest.fail(f"REPROCUBE_SLURM_TESTS=1 but {missing}")
        pytest.skip(missing)


@pytest.fixture(scope="module")
def dataset(tmp_path_factory) -> GeneratedDataset:
    """20000 training examples: about 3 s per 1-thread PyTorch epoch here; 30 epochs outlast the warning."""
    data = GeneratedDataset(tmp_path_factory.mktemp("slurm-data"), make_payloads(train=20000, test=500, seed=7))
    data.write_raw()
    return data


def _job(job_id: str) -> dict[str, str]:
    done = subprocess.run(["scontrol", "-o", "show", "job", job_id], capture_output=True, text=True)
    return dict(re.findall(r"(\w+)=(\S*)", done.stdout))


def _wait_for(predicate, timeout: float, what: str, log: Path):
    """wait_until, polling SLURM once a second, with the job's log in the message."""
    job_log = lambda: f"; job log:\n{log.read_text() if log.exists() else '(none)'}"
    return wait_until(predicate, timeout=timeout, what=what, interval=1, detail=job_log)


def _checkpoint_at_warning(log: str, checkpoints: Path) -> str:
    """The checkpoint the warned job wrote: mid-epoch (step-N) when SIGUSR1 came during an epoch's
    steps, epoch-N when it came in the epoch's last group or its evaluation, which end the epoch first."""
    mid_epoch = re.search(r"stopped by SIGUSR1: checkpoint \S+/(step-\d+);", log)
    after_epoch = re.search(r"stopped by SIGUSR1 after epoch (\d+);", log)
    assert mid_epoch or after_epoch, f"no checkpoint at the warning:\n{log}"
    name = mid_epoch.group(1) if mid_epoch else f"epoch-{int(after_epoch.group(1)):04d}"
    assert (checkpoints / name).is_dir(), f"the job said it wrote {name}, which is not there:\n{log}"
    return name


def _epochs_begun(checkpoint_name: str, steps_per_epoch: int) -> int:
    """Epochs trained (fully or in part) at a checkpoint named step-<global step> or epoch-<epochs done>."""
    kind, number = checkpoint_name.split("-")
    return int(number) // steps_per_epoch + 1 if kind == "step" else int(number)


def test_sbatch_training_is_warned_checkpoints_requeues_and_resumes_bit_exactly(slurm, dataset, tmp_path):
    """hpc/train.sbatch with a 1-minute limit and `--signal=B:USR1@45`: SLURM warns the batch shell
    15-45 s in (it checks time limits every 30 s; earlier could hit Python's start-up, before reprocube
    handles the signal), reprocube writes a checkpoint (mid-epoch, or the epoch's own when the warning
    lands in the epoch's last group or its evaluation) and the job is requeued. After the first requeue
    the test raises the limit, so that the rest finishes in one more start instead of an unbounded number
    of warned minutes."""
    run = [
        "framework=pytorch",
        f"epochs={JOB_EPOCHS}",
        # One thread: beside another test's training (make test runs two test files at once), a 2-thread
        # PyTorch process spins on the shared cores and its epochs went from 2 s to 22-54 s.
        "threads=1",
        *dataset.overrides(),
        f"output_dir={tmp_path}/runs",
        "run_name=slurm",
    ]
    log = tmp_path / "job.log"
    env = {
        **os.environ,
        "REPROCUBE": f"{sys.executable} -m reprocube",
        "REPROCUBE_HOME": str(REPO),
        "PYTHONHASHSEED": "0",
    }
    submitted = subprocess.run(
        [
            "sbatch",
            "--parsable",
            "--time=1",
            "--signal=B:USR1@45",
            f"--output={log}",
            f"--chdir={tmp_path}",
            str(REPO / "hpc" / "train.sbatch"),
            *run,
        ],
        capture_output=True,
        text=True,
        env=env,
        check=True,
    )
    job_id = submitted.stdout.strip().split(";")[0]
    started = time.monotonic()
    try:
        _wait_for(lambda: "requeueing job" in (log.read_text() if log.exists() else ""), 180, "the first requeue", log)
        requeued_after = time.monotonic() - started
        subprocess.run(["scontrol", "update", f"JobId={job_id}", "TimeLimit=15"], check=True)
        _wait_for(
            lambda job_id=job_id: _job(job_id).get("JobState") in ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT"),
            420,  # 3 s epochs when idle (about 90 s); beside another test's training up to twice as long
            "the job to end",
            log,
        )
        # The uninterrupted run, natively, after the job: trained beside the restarted job, the two shared 2
        # cores with 2 threads each and the job's epochs went from 6 s to 50-80 s (past the wait above).
        # It trains to the end of the epoch after the one the job was stopped in (the job's 30 epochs are
        # only there to outlast SLURM's warning on a fast machine; its later epochs add nothing to compare).
        stopped_name = _checkpoint_at_warning(log.read_text(), tmp_path / "runs" / "slurm" / "checkpoints")
        steps_per_epoch = manifest(tmp_path / "runs" / "slurm" / "checkpoints" / stopped_name)["steps_per_epoch"]
        compared_epochs = _epochs_begun(stopped_name, steps_per_epoch) + 1
        plain = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "reprocube",
                "train",
                *(o for o in run[:-2] if o != f"epochs={JOB_EPOCHS}"),
                f"epochs={compared_epochs}",
                f"output_dir={tmp_path}/plain",
                "run_name=plain",
                "log.progress=false",
            ],
            cwd=tmp_path,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        plain_output, _ = plain.communicate(timeout=600)
        assert plain.returncode == 0, plain_output[-3000:]
    finally:
        subprocess.run(["scancel", job_id], capture_output=True)
        if "plain" in locals() and plain.poll() is None:
            plain.kill()
    total = time.monotonic() - started
    text = log.read_text()
    job = _job(job_id)
    assert (job["JobState"], job["ExitCode"]) == ("COMPLETED", "0:0"), text
    assert int(job["Restarts"]) >= 1
    assert f"reprocube-slurm: received SIGUSR1 (job {job_id}, restart 0)" in text
    assert f"requeueing job {job_id}" in text and f"job {job_id} restart 1 on" in text
    assert f"resumed from {tmp_path / 'runs' / 'slurm' / 'checkpoints' / stopped_name} at" in text
    assert text.rstrip().endswith("reprocube-slurm: reprocube exited 0")
    print(f"\nSLURM job {job_id}: warned and requeued after {requeued_after:.0f} s, finished after {total:.0f} s")

    # The uninterrupted run (trained natively above): the same digest at every epoch it trained.
    reference = epoch_digests(tmp_path / "plain" / "plain")
    assert len(reference) == compared_epochs
    assert {
        name: digest for name, digest in epoch_digests(tmp_path / "runs" / "slurm").items() if name in reference
    } == reference


def test_study_through_the_submitit_slurm_launcher_one_job_per_run(slurm, dataset, tmp_path):
    study = tmp_path / "study"
    args = [
        "study",
        "framework=pytorch",
        "runs=2",
        "epochs=1",
        "threads=1",
        "data.train_limit=640",
        "data.test_limit=200",
        *dataset.overrides(),
        f"study.dir={study}",
        "study.launcher=slurm",
        "study.slurm.cpus_per_task=1",
        "study.slurm.timeout_min=10",
    ]
    done = reprocube(*args, cwd=tmp_path, timeout=600)
    result = json.loads((study / "study.json").read_text())
    same, different = result["groups"]["same_seed"], result["groups"]["different_seeds"]
    assert result["failures"] == [] and "launcher_error" not in result, done.stdout
    assert (same["runs"], same["distinct_weights_digests"], same["test_accuracy"]["std"], same["test_loss"]["std"]) == (
        2,
        1,
        0.0,
        0.0,
    )
    assert (different["runs"], different["distinct_weights_digests"]) == (2, 2)
    job_ids = [r["slurm_job_id"] for r in result["runs"]]
    assert None not in job_ids and len(set(job_ids)) == 4, job_ids  # each run was its own SLURM job
    assert "submitit" in (study / "hydra" / "config" / "study.yaml").read_text()
    assert any((study / "slurm").iterdir())  # submitit's per-job logs


def test_verify_through_the_submitit_slurm_launcher_one_job_per_check(slurm, dataset, tmp_path):
    """verify.launcher=slurm: the reference as one job, then every link and the control as one array;
    the same verdict and the same bits as the checks run here."""
    common = [
        "verify",
        "framework=pytorch",
        "epochs=2",
        "threads=1",
        "data.train_limit=640",
        "data.test_limit=200",
        *dataset.overrides(),
    ]
    reprocube(
        *common,
        f"output_dir={tmp_path}/slurm",
        "verify.launcher=slurm",
        "verify.slurm.cpus_per_task=1",
        "verify.slurm.timeout_min=10",
        cwd=tmp_path,
        timeout=600,
    )
    reprocube(*common, f"output_dir={tmp_path}/local", cwd=tmp_path, timeout=600)
    results = {
        where: json.loads((tmp_path / where / "verify-pytorch" / "reference" / "verify.json").read_text())
        for where in ("slurm", "local")
    }
    assert results["slurm"]["passed"] and results["slurm"]["launcher"] == "slurm"
    summaries = {where: [(c["name"], c["passed"], c["summary"]) for c in r["checks"]] for where, r in results.items()}
    assert summaries["slurm"] == summaries["local"]
    # Each check ran as its own SLURM job: submitit's folders, one per job, and the recorded job ids.
    checks = tmp_path / "slurm" / "verify-pytorch" / "slurm" / "checks"
    recorded = [json.loads(p.read_text())["slurm_job_id"] for p in sorted((checks / "results").iterdir())]
    assert len(recorded) == 3 and None not in recorded and len(set(recorded)) == 3, recorded
    assert "submitit" in (checks / "hydra" / "config" / "verify.yaml").read_text()
    for run in ("reference", "link-epoch-1", "link-epoch-2"):
        assert epoch_digests(tmp_path / "slurm" / "verify-pytorch" / run) == epoch_digests(
            tmp_path / "local" / "verify-pytorch" / run
        )


def test_a_study_job_killed_on_slurm_is_listed_and_the_others_are_reported(slurm, dataset, tmp_path):
    """Run 1's job dies before it records anything (SIGKILL at start-up, as an OOM kill or a node
    failure would). submitit's launcher then fails; the study still waits for the other jobs, reports
    them, and names the dead job's submitit folder."""
    hook = tmp_path / "hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(
        "import os, signal\n"
        "if os.environ.get('SLURM_ARRAY_TASK_ID') == '1':\n"
        "    os.kill(os.getpid(), signal.SIGKILL)\n"
    )
    study = tmp_path / "study"
    args = [
        sys.executable,
        "-m",
        "reprocube",
        "study",
        "framework=pytorch",
        "runs=2",
        "epochs=1",
        "threads=1",
        "data.train_limit=320",
        "data.test_limit=100",
        *dataset.overrides(),
        f"study.dir={study}",
        "study.launcher=slurm",
        "study.slurm.cpus_per_task=1",
    ]
    env = {**os.environ, "PYTHONPATH": f"{hook}:{os.environ.get('PYTHONPATH', '')}"}
    done = subprocess.run(args, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 5, done.stdout + done.stderr
    result = json.loads((study / "study.json").read_text())
    assert [f["member"] for f in result["failures"]] == [1]
    failure = result["failures"][0]
    assert failure["error"] == "no result recorded (the job did not finish)"
    folder = Path(failure["log"].split(" and ")[1])
    assert folder.parent == study / "slurm" and folder.name.endswith("_1") and folder.is_dir()
    assert sorted(r["member"] for r in result["runs"]) == [0, 2, 3]
    assert result["groups"]["different_seeds"]["distinct_weights_digests"] == 2
    assert "launcher" in result["launcher_error"] and "FAILED run 1 (same_seed, seed 0)" in done.stdout


def test_verify_and_study_batch_scripts_run_to_completion(slurm, tmp_path):
    """hpc/verify.sbatch and hpc/study.sbatch as users submit them (no warning here: the train job's
    test covers that path, which they share)."""
    from helpers import make_payloads

    data = GeneratedDataset(tmp_path / "data", make_payloads(train=650, test=200))
    data.write_raw()
    env = {
        **os.environ,
        "REPROCUBE": f"{sys.executable} -m reprocube",
        "REPROCUBE_HOME": str(REPO),
        "PYTHONHASHSEED": "0",
    }
    common = ["sbatch", "--parsable", "--cpus-per-task=1", "--time=10", f"--chdir={tmp_path}"]
    jobs = {}
    for name, args in (
        ("verify", ["framework=pytorch", "epochs=2", "threads=1"]),
        ("study", ["framework=pytorch", "study.runs=2", "epochs=1", "threads=1", f"study.dir={tmp_path}/study"]),
    ):
        submitted = subprocess.run(
            [
                *common,
                f"--output={tmp_path}/{name}.log",
                str(REPO / "hpc" / f"{name}.sbatch"),
                *args,
                *data.overrides(),
            ],
            capture_output=True,
            text=True,
            env=env,
            check=True,
        )
        jobs[name] = submitted.stdout.strip().split(";")[0]
    try:
        for name, job_id in jobs.items():
            _wait_for(
                lambda job_id=job_id: _job(job_id).get("JobState") in ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT"),
                400,
                f"the {name} job",
                tmp_path / f"{name}.log",
            )
    finally:
        subprocess.run(["scancel", *jobs.values()], capture_output=True)
    for name, job_id in jobs.items():
        assert _job(job_id)["JobState"] == "COMPLETED", (tmp_path / f"{name}.log").read_text()
    verdict = json.loads(
        (
            tmp_path / f"verify-{jobs['verify']}" / "attempt-0" / "verify-pytorch" / "reference" / "verify.json"
        ).read_text()
    )
    assert verdict["passed"] is True
    study = json.loads((tmp_path / "study" / "study.json").read_text())
    assert (
        study["groups"]["same_seed"]["distinct_weights_digests"],
        study["groups"]["different_seeds"]["distinct_weights_digests"],
    ) == (1, 2)
    assert all(r["slurm_job_id"] == jobs["study"] for r in study["runs"])  # all in the one allocation


def test_check_through_slurm_stops_are_real_requeues(slurm, tmp_path):
    """`reprocube check --launcher slurm`: every run is a SLURM job and the stop is `scontrol requeue` (the
    job is ended by SLURM and its batch script started again by SLURM): the NumPy example saving its
    generator resumes exactly, each attempt's probe trace compared; without --save-rng the restart draws
    anew and the first differing update after the requeue is named."""
    example = [sys.executable, str(REPO / "examples" / "numpy_sgd.py"), "--epochs", "4", "--sleep", "0.5"]
    options = [
        "--launcher",
        "slurm",
        "--slurm-option=--cpus-per-task=1",
        "--output",
        "final.npz",
        "--output",
        "metrics.csv",
        "--at-line",
        "saved",
        "--stops",
        "1",
        "--repeat",
        "2",
    ]
    verdicts = {}
    for name, flags in (("fixed", ["--save-rng", "--seed-env", "SEED"]), ("buggy", [])):
        save_rng, seed = flags[:1], flags[1:]
        proc = reprocube(
            "check",
            *options,
            *seed,
            "--out",
            str(tmp_path / name),
            "--",
            *example,
            *save_rng,
            cwd=tmp_path,
            check=False,
            timeout=600,
        )
        result = json.loads((tmp_path / name / "check.json").read_text())
        verdicts[name] = (proc.returncode, result["verdict"])
        jobs = result["launcher"]["jobs"]
        assert result["launcher"]["name"] == "slurm" and len(set(jobs.values())) == len(result["runs"]), result
        stopped = next(r for r in result["runs"] if r["name"] == "stopped")
        # SLURM's SIGTERM ended the first start (the batch script records 128+15), the second ran to its end.
        assert [a["exit"] for a in stopped["attempts"]] == [143, 0], stopped
        log = (tmp_path / name / "logs" / "stopped.log").read_text()
        assert f"JOB {jobs['stopped']} ON" in log and "DUE TO JOB REQUEUE" in log, log  # SLURM's own line
        if name == "fixed":
            assert (
                "stopped 1 time by SLURM requeue" in result["summary"]
                and result["probe"]["resume"]["compared_steps"] == 64
            )
        else:
            first = result["probe"]["resume"]["first_difference"]
            assert first["after_stop"] == 1 and first["step"] > 16, first  # an update after the requeued epoch
    assert verdicts == {"fixed": (0, "resume-exact"), "buggy": (6, "resume-differs")}


def test_sbatch_training_in_the_sif_is_warned_requeued_and_resumes_bit_exactly(slurm, dataset, tmp_path):
    """hpc/train.sbatch with REPROCUBE_SIF (the CPU image's SIF, from tests/test_apptainer.py's Apptainer) as
    the first test of this file runs it natively: SLURM warns the batch shell (USR1) before the 1-minute
    limit, reprocube checkpoints inside the SIF, the job is requeued, resumes inside the SIF and reaches an uninterrupted
    native run's weights. Here, not in test_apptainer.py, so that it never waits for this file's jobs on
    the one 2-CPU node (pytest-xdist runs a file's tests one after another)."""
    from test_apptainer import _not_ready, built_sif

    reason = _not_ready()
    if reason and os.environ.get("REPROCUBE_APPTAINER_TESTS") == "1":
        pytest.fail(f"Apptainer tests required but {reason}")
    if reason:
        pytest.skip(reason)
    sif = built_sif()
    run = ["framework=pytorch", f"epochs={JOB_EPOCHS}", "threads=1", *dataset.overrides()]
    log = tmp_path / "job.log"
    env = {**os.environ, "REPROCUBE_SIF": str(sif), "REPROCUBE_HOME": str(REPO)}
    submitted = subprocess.run(
        [
            "sbatch",
            "--parsable",
            "--time=1",
            "--signal=B:USR1@45",
            f"--output={log}",
            f"--chdir={tmp_path}",
            str(REPO / "hpc" / "train.sbatch"),
            *run,
            f"output_dir={tmp_path}/runs",
            "run_name=slurm",
        ],
        capture_output=True,
        text=True,
        env=env,
        check=True,
    )
    job_id = submitted.stdout.strip().split(";")[0]
    started = time.monotonic()
    checkpoints = tmp_path / "runs" / "slurm" / "checkpoints"
    try:
        _wait_for(lambda: "requeueing job" in (log.read_text() if log.exists() else ""), 180, "the first requeue", log)
        subprocess.run(["scontrol", "update", f"JobId={job_id}", "TimeLimit=15"], check=True)
        stopped = _checkpoint_at_warning(log.read_text(), checkpoints)
        # Compared: up to the end of the epoch after the one the job was stopped in. The job's 30 epochs are
        # there to outlast SLURM's warning; once that epoch is written (checkpoints are renamed into place
        # whole) the rest adds nothing, and the job is cancelled.
        # steps_per_epoch from the checkpoint the warning wrote: a slow SIF start (CI under load) can be warned
        # inside epoch 1, before any epoch-0001 exists (CI on 2026-11-27 failed reading it).
        compared = _epochs_begun(stopped, manifest(checkpoints / stopped)["steps_per_epoch"]) + 1
        _wait_for((checkpoints / f"epoch-{compared:04d}").is_dir, 420, f"the resumed job's epoch {compared}", log)
    finally:
        subprocess.run(["scancel", job_id], capture_output=True)
        _wait_for(lambda: _job(job_id).get("JobState") not in ("RUNNING", "COMPLETING"), 60, "the job to end", log)
    text = log.read_text()
    assert f"reprocube-slurm: received SIGUSR1 (job {job_id}, restart 0)" in text
    assert f"requeueing job {job_id}" in text and f"job {job_id} restart 1 on" in text
    assert text.count(f"singularity exec --nv {sif} reprocube train") == 2  # both starts inside the SIF
    assert f"resumed from {checkpoints / stopped} at" in text
    print(
        f"\nSLURM job {job_id} in the SIF: stopped at {stopped}, epoch {compared} after {time.monotonic() - started:.0f} s"
    )
    # The uninterrupted run, natively, to the end of the epoch after the one the job was stopped in.
    plain = subprocess.run(
        [sys.executable, "-m", "reprocube", "train", run[0], *run[2:], f"epochs={compared}"]
        + [f"output_dir={tmp_path}/plain", "run_name=plain", "log.progress=false"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONHASHSEED": "0"},
        timeout=600,
    )
    assert plain.returncode == 0, plain.stderr[-3000:]
    reference = epoch_digests(tmp_path / "plain" / "plain")
    assert len(reference) == compared
    assert {k: v for k, v in epoch_digests(tmp_path / "runs" / "slurm").items() if k in reference} == reference
