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

import json
import os
import shutil
import subprocess
import time
from pathlib import Path

from omegaconf import OmegaConf

from reprocube.commands.children import child_args, last_error_line, python_module_command, reprocube_command, run_child
from reprocube.commands.invocation import Invocation
from reprocube.commands.study_results import collect, members, study_paths, summary_lines, write_study
from reprocube.errors import EXIT_OK, EXIT_TRAINING, ConfigError, ReprocubeError
from reprocube.files import write_file_atomic
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
        check_slurm()  # before anything is written
    _claim(study_dir, request)
    plan = members(cfg.study.runs, cfg.seed)
    out(
        f"study: {len(plan)} runs of {cfg.framework.name} ({cfg.study.runs} with seed {cfg.seed}, {cfg.study.runs} with seeds "
        f"{plan[cfg.study.runs].seed}..{plan[-1].seed}) through Hydra multirun, launcher {cfg.study.launcher}, in {study_dir}"
    )
    launcher_error = _launch(study_dir, cfg, request, out)
    if launcher_error and cfg.study.launcher == "slurm":
        # submitit stops waiting at the first failed job: let the study's other jobs finish first.
        wait_for_slurm_jobs(study_dir, timeout_s=cfg.study.slurm.timeout_min * 60 + 120, out=out)
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
    write_file_atomic(path, json.dumps(request, indent=2).encode())


def check_slurm() -> None:
    """Fail in one line, before anything is submitted, when no SLURM controller answers."""
    for command in ("sbatch", "sinfo"):
        if shutil.which(command) is None:
            raise ReprocubeError(f"study.launcher=slurm: {command} not found on PATH (is this a SLURM login node?)")
    try:
        done = subprocess.run(
            ["sinfo", "-h", "-o", "%P"], capture_output=True, text=True, timeout=SLURM_CHECK_TIMEOUT_S
        )
    except subprocess.TimeoutExpired:
        raise ReprocubeError(
            f"study.launcher=slurm: SLURM is not reachable (sinfo gave no answer in {SLURM_CHECK_TIMEOUT_S} s)"
        ) from None
    if done.returncode != 0:
        lines = done.stderr.strip().splitlines() or [f"exit {done.returncode}"]
        raise ReprocubeError(f"study.launcher=slurm: SLURM is not reachable: {lines[-1]}")


def wait_for_slurm_jobs(study_dir: Path, timeout_s: float, out=print, poll_s: float = 3.0) -> None:
    """Until no job of this study (submitit's folders are named after the job ids) is in the queue."""
    job_ids = sorted(
        {entry.name.split("_")[0] for entry in (study_dir / "slurm").iterdir() if entry.name.split("_")[0].isdigit()}
    )
    if not job_ids:
        return
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        queued = subprocess.run(["squeue", "-h", "-o", "%i", "-j", ",".join(job_ids)], capture_output=True, text=True)
        if queued.returncode == 0 and not queued.stdout.strip():
            return
        out(f"study: waiting for the study's other SLURM jobs ({len(queued.stdout.split())} queued or running)")
        time.sleep(poll_s)
    out(
        f"study: gave up waiting for SLURM jobs {', '.join(job_ids)} after {timeout_s:.0f} s; run the study again to collect them"
    )


def _launch(study_dir: Path, cfg, request: dict, out) -> str | None:
    """Hydra multirun over the members, in a child process; its output goes to the terminal and to
    logs/launcher.log. Returns the launcher's error, if it failed (the runs' results are still read)."""
    config_dir = study_dir / "hydra" / "config"
    config_dir.mkdir(parents=True, exist_ok=True)
    write_file_atomic(config_dir / "study.yaml", OmegaConf.to_yaml(_job_config(study_dir, cfg, request)).encode())
    command = python_module_command("reprocube.commands.study_job", "--config-path", str(config_dir), "--config-name", "study",
                                    "--multirun", f"study.member=range(0,{2 * cfg.study.runs})")  # fmt: skip
    log_path = study_dir / "logs" / "launcher.log"
    status = run_child(command, log_path, echo=lambda line: out(f"  {line}"))
    if status != 0:
        return f"the Hydra launcher exited {status}; see {log_path}"
    return None


def _job_config(study_dir: Path, cfg, request: dict) -> dict:
    """The Hydra app's config: what each job needs, and the launcher's settings."""
    slurm = cfg.study.slurm
    launcher = "basic"
    hydra: dict = {
        "sweep": {"dir": str(study_dir / "hydra" / "sweep"), "subdir": "${study.member}"},
        "job": {"chdir": False},
    }
    if cfg.study.launcher == "slurm":
        launcher = "submitit_slurm"
        hydra["launcher"] = {
            "submitit_folder": str(study_dir / "slurm" / "%j"),
            "name": f"reprocube-study-{cfg.framework.name}",
            "timeout_min": slurm.timeout_min,
            "cpus_per_task": slurm.cpus_per_task,
            "gpus_per_node": slurm.gpus_per_node,
            "tasks_per_node": 1,
            "nodes": 1,
            "mem_gb": slurm.mem_gb,
            "partition": slurm.partition,
            "additional_parameters": OmegaConf.to_container(slurm.additional_parameters)
            if slurm.additional_parameters
            else {},
        }
    return {
        "defaults": [{"override hydra/launcher": launcher}, "_self_"],
        "study": {
            "dir": str(study_dir),
            "runs": cfg.study.runs,
            "seed": cfg.seed,
            "member": None,
            "train_args": request["train_args"],
            "cwd": request["cwd"],
        },  # fmt: skip
        "hydra": hydra,
    }


# ---- one run (called by reprocube.commands.study_job in the launcher's job) ----------------------------------------


def run_member(study_dir: Path, runs: int, seed: int, index: int, train_args: list[str], cwd: str) -> dict:
    """Train one member with `reprocube train` in a fresh process and record its result. Never raises
    for a failed run: the failure is recorded, so that the other runs go on and are reported."""
    member = members(runs, seed)[index]
    paths = study_paths(study_dir)
    log_path = paths["logs"] / f"{member.run_name}.log"
    command = reprocube_command("train", *train_args, f"seed={member.seed}", f"output_dir={paths['runs']}",
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
    write_file_atomic(paths["results"] / f"{member.run_name}.json", json.dumps(record, indent=2).encode())
    return record


def _final_epoch(run_dir: Path) -> dict | None:
    path = run_dir / "metrics.jsonl"
    epochs = read_epoch_records(path) if path.exists() else []
    return epochs[-1] if epochs else None
