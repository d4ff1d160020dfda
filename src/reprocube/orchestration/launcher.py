"""Jobs launched through Hydra multirun: Hydra's basic launcher here, or hydra-submitit-launcher's SLURM
launcher, one job per member (a SLURM array). `reprocube study` runs its members this way and `reprocube
verify verify.launcher=slurm` its checks; both describe the launcher with the same `*.slurm` settings."""

from __future__ import annotations

import shutil
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

from omegaconf import OmegaConf

from reprocube.errors import ReprocubeError
from reprocube.files import write_file_atomic
from reprocube.orchestration.children import python_module_command, run_child

SLURM_CHECK_TIMEOUT_S = 30


def hydra_settings(work_dir: Path, member_key: str, launcher: str, slurm, job_name: str) -> dict:
    """The `defaults` and `hydra` parts of a Hydra app's config: where Hydra keeps its sweep, and (for
    launcher=slurm) submitit's folder and the job's resources from `slurm` (a study.slurm-shaped node)."""
    hydra: dict = {
        "sweep": {"dir": str(work_dir / "hydra" / "sweep"), "subdir": "${" + member_key + "}"},
        "job": {"chdir": False},
    }
    if launcher == "slurm":
        hydra["launcher"] = {
            "submitit_folder": str(slurm_folder(work_dir) / "%j"),
            "name": job_name,
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
        "defaults": [{"override hydra/launcher": "submitit_slurm" if launcher == "slurm" else "basic"}, "_self_"],
        "hydra": hydra,
    }


def slurm_folder(work_dir: Path) -> Path:
    return work_dir / "slurm"


def launch_multirun(
    app_module: str,
    name: str,
    work_dir: Path,
    config: dict,
    member_key: str,
    count: int,
    log: Path,
    echo: Callable[[str], None],
) -> str | None:
    """Run `app_module` (a Hydra app) with `config` (written to WORK_DIR/hydra/config/NAME.yaml) over
    members 0..count-1 in a child process, its output echoed and appended to `log`. Returns the
    launcher's error, if it failed (the jobs' own results are still read)."""
    config_dir = work_dir / "hydra" / "config"
    config_dir.mkdir(parents=True, exist_ok=True)
    write_file_atomic(config_dir / f"{name}.yaml", OmegaConf.to_yaml(config).encode())
    command = python_module_command(
        app_module,
        "--config-path",
        str(config_dir),
        "--config-name",
        name,
        "--multirun",
        f"{member_key}=range(0,{count})",
    )
    status = run_child(command, log, echo=echo)
    return f"the Hydra launcher exited {status}; see {log}" if status != 0 else None


def check_slurm(what: str) -> None:
    """Fail in one line, before anything is submitted, when no SLURM controller answers."""
    for command in ("sbatch", "sinfo"):
        if shutil.which(command) is None:
            raise ReprocubeError(f"{what}=slurm: {command} not found on PATH (is this a SLURM login node?)")
    try:
        done = subprocess.run(
            ["sinfo", "-h", "-o", "%P"], capture_output=True, text=True, timeout=SLURM_CHECK_TIMEOUT_S
        )
    except subprocess.TimeoutExpired:
        raise ReprocubeError(
            f"{what}=slurm: SLURM is not reachable (sinfo gave no answer in {SLURM_CHECK_TIMEOUT_S} s)"
        ) from None
    if done.returncode != 0:
        lines = done.stderr.strip().splitlines() or [f"exit {done.returncode}"]
        raise ReprocubeError(f"{what}=slurm: SLURM is not reachable: {lines[-1]}")


def wait_for_slurm_jobs(work_dir: Path, timeout_s: float, out=print, poll_s: float = 3.0) -> None:
    """Until no job launched from `work_dir` (submitit's folders are named after the job ids) is queued:
    submitit stops waiting at the first failed job, and the others' results are still wanted."""
    folder = slurm_folder(work_dir)
    entries = folder.iterdir() if folder.is_dir() else []
    job_ids = sorted({entry.name.split("_")[0] for entry in entries if entry.name.split("_")[0].isdigit()})
    if not job_ids:
        return
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        queued = subprocess.run(["squeue", "-h", "-o", "%i", "-j", ",".join(job_ids)], capture_output=True, text=True)
        if queued.returncode == 0 and not queued.stdout.strip():
            return
        out(f"waiting for the other SLURM jobs ({len(queued.stdout.split())} queued or running)")
        time.sleep(poll_s)
    out(f"gave up waiting for SLURM jobs {', '.join(job_ids)} after {timeout_s:.0f} s")
