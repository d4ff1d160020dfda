"""`reprocube study`: how much of the run-to-run variance comes from non-determinism.

After Morin & Willetts (arXiv:2001.11396): N runs with one seed and N runs with different seeds. With a
fixed seed, only non-determinism can spread the results. They measured, for a TensorFlow ResNet on a
GPU, a test-accuracy std of 0.020 with a fixed seed against 0.027 with different seeds (a ratio of
~74%). Here, with deterministic kernels, the same-seed group should end in one weights_digest.

The runs go through Hydra multirun (reprocube.commands.study_job), one job per run: Hydra's basic launcher on
this machine, or the submitit launcher on SLURM. Each run is a plain `reprocube train` in
STUDY/runs/, with its output in STUDY/logs/ and its result in STUDY/results/. The study can be run
again to finish what a failed or interrupted attempt left: finished runs are kept, and interrupted
ones continue (resume=auto). This module drives the study; reprocube.commands.study_results collects
and reports it."""

from __future__ import annotations

import os
from pathlib import Path

from reprocube.commands.children import child_args, last_error_line, reprocube_command, run_child
from reprocube.commands.invocation import Invocation
from reprocube.commands.launcher import check_slurm, hydra_settings, launch_multirun, wait_for_slurm_jobs
from reprocube.commands.study_results import collect, members, study_paths, summary_lines, write_study
from reprocube.config import override
from reprocube.errors import EXIT_OK, EXIT_TRAINING, ConfigError
from reprocube.files import write_json_atomic
from reprocube.metrics import read_epoch_records
from reprocube.untrusted import read_json

# Overrides the study sets for each run; the user's own values for them are not passed on.
PLACE_KEYS = ("seed=", "output_dir=", "run_name=", "resume=", "study.", "log.progress=")
REQUEST = "study-request.json"
SLURM_CHECK_TIMEOUT_S = 30


# ---- the driver ------------------------------------------------------------------------------------------


def run(invocation: Invocation) -> int:
    result = run_study(invocation.cfg, invocation.overrides, invocation.config_files)
    return EXIT_OK if not result["failures"] and not result.get("launcher_error") else EXIT_TRAINING


def run_study(cfg, overrides: list[str], config_files: list[str], out=print) -> dict:
    study_dir = Path(cfg.study.dir).resolve()
    train_args = child_args(overrides, config_files, PLACE_KEYS)
    request = {
        "framework": cfg.framework.name,
        "runs": cfg.study.runs,
        "seed": cfg.seed,
        "train_args": train_args,
        "cwd": os.getcwd(),
    }
    if cfg.study.launcher == "slurm":
        check_slurm("study.launcher")  # before anything is written
    _claim(study_dir, request)
    plan = members(cfg.study.runs, cfg.seed)
    out(
        f"study: {len(plan)} runs of {cfg.framework.name} ({cfg.study.runs} with seed {cfg.seed}, {cfg.study.runs} with seeds "
        f"{plan[cfg.study.runs].seed}..{plan[-1].seed}) through Hydra multirun, launcher {cfg.study.launcher}, in {study_dir}"
    )
    launcher_error = _launch(study_dir, cfg, request, out)
    if launcher_error and cfg.study.launcher == "slurm":
        # submitit stops waiting at the first failed job: let the study's other jobs finish first.
        wait_for_slurm_jobs(
            study_dir, timeout_s=cfg.study.slurm.timeout_min * 60 + 120, out=lambda line: out(f"study: {line}")
        )
    result = collect(study_dir, cfg.study.runs, cfg.seed, launcher=cfg.study.launcher)
    result["request"] = request
    if launcher_error:
        result["launcher_error"] = launcher_error
    write_study(result, study_dir)
    for line in summary_lines(result):
        out(line)
    out(f"written: {study_dir / 'study.json'}, {study_dir / 'study.md'}, {study_dir / 'study.png'}")
    return result


def _claim(study_dir: Path, request: dict) -> None:
    """A study directory holds one study: running the same one again finishes it; another is refused."""
    path = study_dir / REQUEST
    if path.exists():
        earlier = read_json(path, ConfigError)
        if not isinstance(earlier, dict):
            raise ConfigError(f"study.dir={study_dir}: {REQUEST} is not a study request; choose another study.dir")
        differing = sorted(k for k in request if k != "cwd" and earlier.get(k) != request[k])
        if differing:
            raise ConfigError(
                f"study.dir={study_dir} holds another study (its {', '.join(differing)} differ); choose another study.dir"
            )
    elif study_dir.exists() and any(study_dir.iterdir()):
        raise ConfigError(f"study.dir={study_dir} exists and is not a study; choose another study.dir")
    for directory in study_paths(study_dir).values():
        directory.mkdir(parents=True, exist_ok=True)
    write_json_atomic(path, request, indent=2)


def _launch(study_dir: Path, cfg, request: dict, out) -> str | None:
    """Hydra multirun over the members, in a child process; its output goes to the terminal and to
    logs/launcher.log. Returns the launcher's error, if it failed (the runs' results are still read)."""
    settings = hydra_settings(study_dir, "study.member", cfg.study.launcher, cfg.study.slurm,
                              f"reprocube-study-{cfg.framework.name}")  # fmt: skip
    config = {
        **settings,
        "study": {
            "dir": str(study_dir),
            "runs": cfg.study.runs,
            "seed": cfg.seed,
            "member": None,
            "train_args": request["train_args"],
            "cwd": request["cwd"],
        },
    }
    return launch_multirun("reprocube.commands.study_job", "study", study_dir, config, "study.member", 2 * cfg.study.runs,
                           study_dir / "logs" / "launcher.log", echo=lambda line: out(f"  {line}"))  # fmt: skip


# ---- one run (called by reprocube.commands.study_job in the launcher's job) ----------------------------------------


def run_member(study_dir: Path, runs: int, seed: int, index: int, train_args: list[str], cwd: str) -> dict:
    """Train one member with `reprocube train` in a fresh process and record its result. Never raises
    for a failed run: the failure is recorded, so that the other runs go on and are reported."""
    member = members(runs, seed)[index]
    paths = study_paths(study_dir)
    log_path = paths["logs"] / f"{member.run_name}.log"
    command = reprocube_command("train", *train_args, f"seed={member.seed}", override("output_dir", str(paths["runs"])),
                                f"run_name={member.run_name}", "resume=auto", "log.progress=false")  # fmt: skip
    status = run_child(command, log_path, cwd=cwd)
    record = {"member": member.index, "group": member.group, "seed": member.seed, "run": str(paths["runs"] / member.run_name),
              "log": str(log_path), "exit_code": status, "slurm_job_id": os.environ.get("SLURM_JOB_ID")}  # fmt: skip
    if status == 0:
        final = _final_epoch(paths["runs"] / member.run_name)
        if final is None:
            record.update(status="failed", error="the run finished without an epoch record in metrics.jsonl")
        else:
            record.update(
                status="ok",
                **{k: final[k] for k in ("epoch", "test_accuracy", "test_loss", "train_loss", "weights_digest")},
            )
    else:
        record.update(status="failed", error=f"reprocube train exited {status}: {last_error_line(log_path)}")
    write_json_atomic(paths["results"] / f"{member.run_name}.json", record, indent=2)
    return record


def _final_epoch(run_dir: Path) -> dict | None:
    path = run_dir / "metrics.jsonl"
    epochs = read_epoch_records(path) if path.exists() else []
    return epochs[-1] if epochs else None
