"""`reprocube study`: how much of the run-to-run variance comes from non-determinism.

After Morin & Willetts (arXiv:2001.11396): N runs with one seed and N runs with different seeds. With a
fixed seed, only non-determinism can spread the results. They measured, for a TensorFlow ResNet on a
GPU, a test-accuracy std of 0.020 with a fixed seed against 0.027 with different seeds (a ratio of
~74%). Here, with deterministic kernels, the same-seed group should end in one weights_digest.

The runs go through Hydra multirun (reprocube.study_job), one job per run: Hydra's basic launcher on
this machine, or the submitit launcher on SLURM. Each run is a plain `reprocube train` in
STUDY/runs/, with its output in STUDY/logs/ and its result in STUDY/results/. The study can be run
again to finish what a failed or interrupted attempt left: finished runs are kept, and interrupted
ones continue (resume=auto)."""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from omegaconf import OmegaConf

from reprocube.errors import ConfigError, ReprocubeError
from reprocube.files import write_file_atomic

GROUPS = ("same_seed", "different_seeds")
# Overrides the study sets for each run; the user's own values for them are not passed on.
PLACE_KEYS = ("seed=", "output_dir=", "run_name=", "resume=", "study.", "log.progress=")
REQUEST = "study-request.json"
SLURM_CHECK_TIMEOUT_S = 30


@dataclass(frozen=True)
class Member:
    """One run of the study: member k < N is same-seed run k, member N + k is different-seed run k."""

    index: int
    group: str
    seed: int
    run_name: str


def members(runs: int, seed: int) -> list[Member]:
    same = [Member(k, GROUPS[0], seed, f"same-seed-{k:02d}") for k in range(runs)]
    different = [Member(runs + k, GROUPS[1], (seed + 1 + k) % 2**32, f"different-seed-{k:02d}") for k in range(runs)]
    return same + different


def study_paths(study_dir: Path) -> dict[str, Path]:
    return {name: study_dir / name for name in ("runs", "logs", "results", "hydra", "slurm")}


# ---- the driver ------------------------------------------------------------------------------------------


def run_study(cfg, overrides: list[str], config_files: list[str], out=print) -> dict:
    from reprocube.config import child_args

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
    out(f"study: {len(plan)} runs of {cfg.framework.name} ({cfg.study.runs} with seed {cfg.seed}, {cfg.study.runs} with seeds "
        f"{plan[cfg.study.runs].seed}..{plan[-1].seed}) through Hydra multirun, launcher {cfg.study.launcher}, in {study_dir}")
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
        try:
            earlier = json.loads(path.read_text())
        except (OSError, ValueError) as exc:
            raise ConfigError(f"study.dir={study_dir}: unreadable {REQUEST} ({exc}); choose another study.dir") from None
        differing = sorted(k for k in request if k != "cwd" and earlier.get(k) != request[k])
        if differing:
            raise ConfigError(f"study.dir={study_dir} holds another study (its {', '.join(differing)} differ); choose another study.dir")
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
        done = subprocess.run(["sinfo", "-h", "-o", "%P"], capture_output=True, text=True, timeout=SLURM_CHECK_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise ReprocubeError(f"study.launcher=slurm: SLURM is not reachable (sinfo gave no answer in {SLURM_CHECK_TIMEOUT_S} s)") from None
    if done.returncode != 0:
        lines = done.stderr.strip().splitlines() or [f"exit {done.returncode}"]
        raise ReprocubeError(f"study.launcher=slurm: SLURM is not reachable: {lines[-1]}")


def wait_for_slurm_jobs(study_dir: Path, timeout_s: float, out=print, poll_s: float = 3.0) -> None:
    """Until no job of this study (submitit's folders are named after the job ids) is in the queue."""
    job_ids = sorted({entry.name.split("_")[0] for entry in (study_dir / "slurm").iterdir() if entry.name.split("_")[0].isdigit()})
    if not job_ids:
        return
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        queued = subprocess.run(["squeue", "-h", "-o", "%i", "-j", ",".join(job_ids)], capture_output=True, text=True)
        if queued.returncode == 0 and not queued.stdout.strip():
            return
        out(f"study: waiting for the study's other SLURM jobs ({len(queued.stdout.split())} queued or running)")
        time.sleep(poll_s)
    out(f"study: gave up waiting for SLURM jobs {', '.join(job_ids)} after {timeout_s:.0f} s; run the study again to collect them")


def _launch(study_dir: Path, cfg, request: dict, out) -> str | None:
    """Hydra multirun over the members, in a child process; its output goes to the terminal and to
    logs/launcher.log. Returns the launcher's error, if it failed (the runs' results are still read)."""
    config_dir = study_dir / "hydra" / "config"
    config_dir.mkdir(parents=True, exist_ok=True)
    write_file_atomic(config_dir / "study.yaml", OmegaConf.to_yaml(_job_config(study_dir, cfg, request)).encode())
    command = [sys.executable, "-m", "reprocube.study_job", "--config-path", str(config_dir), "--config-name", "study",
               "--multirun", f"study.member=range(0,{2 * cfg.study.runs})"]  # fmt: skip
    log_path = study_dir / "logs" / "launcher.log"
    with open(log_path, "a") as log, subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) as child:
        for line in child.stdout:
            log.write(line)
            log.flush()
            out(f"  {line.rstrip()}")
    if child.returncode != 0:
        return f"the Hydra launcher exited {child.returncode}; see {log_path}"
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
            "additional_parameters": OmegaConf.to_container(slurm.additional_parameters) if slurm.additional_parameters else {},
        }
    return {
        "defaults": [{"override hydra/launcher": launcher}, "_self_"],
        "study": {"dir": str(study_dir), "runs": cfg.study.runs, "seed": cfg.seed, "member": None,
                  "train_args": request["train_args"], "cwd": request["cwd"]},  # fmt: skip
        "hydra": hydra,
    }


# ---- one run (called by reprocube.study_job in the launcher's job) ----------------------------------------


def run_member(study_dir: Path, runs: int, seed: int, index: int, train_args: list[str], cwd: str) -> dict:
    """Train one member with `reprocube train` in a fresh process and record its result. Never raises
    for a failed run: the failure is recorded, so that the other runs go on and are reported."""
    member = members(runs, seed)[index]
    paths = study_paths(study_dir)
    log_path = paths["logs"] / f"{member.run_name}.log"
    command = [sys.executable, "-m", "reprocube", "train", *train_args, f"seed={member.seed}", f"output_dir={paths['runs']}",
               f"run_name={member.run_name}", "resume=auto", "log.progress=false"]  # fmt: skip
    with open(log_path, "a") as log:
        log.write(f"$ {' '.join(command)}\n")
        log.flush()
        status = subprocess.run(command, stdout=log, stderr=subprocess.STDOUT, cwd=cwd).returncode
    record = {"member": member.index, "group": member.group, "seed": member.seed, "run": str(paths["runs"] / member.run_name),
              "log": str(log_path), "exit_code": status, "slurm_job_id": os.environ.get("SLURM_JOB_ID")}  # fmt: skip
    if status == 0:
        final = _final_epoch(paths["runs"] / member.run_name)
        if final is None:
            record.update(status="failed", error="the run finished without an epoch record in metrics.jsonl")
        else:
            record.update(status="ok", **{k: final[k] for k in ("epoch", "test_accuracy", "test_loss", "train_loss", "weights_digest")})
    else:
        record.update(status="failed", error=f"reprocube train exited {status}: {_last_error(log_path)}")
    write_file_atomic(paths["results"] / f"{member.run_name}.json", json.dumps(record, indent=2).encode())
    return record


def _final_epoch(run_dir: Path) -> dict | None:
    from reprocube.metrics import read_metrics

    path = run_dir / "metrics.jsonl"
    epochs = [r for r in read_metrics(path) if r.get("kind") == "epoch"] if path.exists() else []
    return epochs[-1] if epochs else None


def _last_error(log_path: Path) -> str:
    lines = log_path.read_text(errors="replace").strip().splitlines()
    errors = [line for line in lines if line.startswith("reprocube:") or "Error" in line]
    return (errors or lines or ["no output"])[-1][:300]


# ---- results ---------------------------------------------------------------------------------------------


def collect(study_dir: Path, runs: int, seed: int, launcher: str = "local") -> dict:
    """Every member's recorded result; a member without one is listed as failed, with its logs."""
    paths = study_paths(study_dir)
    records, failures = [], []
    for member in members(runs, seed):
        path = paths["results"] / f"{member.run_name}.json"
        try:
            record = json.loads(path.read_text())
        except FileNotFoundError:
            logs = [str(paths["logs"] / f"{member.run_name}.log")] + ([_slurm_folder(paths["slurm"], member.index)] if launcher == "slurm" else [])
            record = {"member": member.index, "group": member.group, "seed": member.seed, "status": "failed",
                      "error": "no result recorded (the job did not finish)", "log": " and ".join(logs)}  # fmt: skip
        except (OSError, ValueError) as exc:
            record = {"member": member.index, "group": member.group, "seed": member.seed, "status": "failed", "error": f"unreadable {path}: {exc}"}
        (records if record.get("status") == "ok" else failures).append(record)
    groups = {group: _group_summary([r for r in records if r["group"] == group]) for group in GROUPS}
    same, different = groups[GROUPS[0]], groups[GROUPS[1]]
    result = {
        "study_dir": str(study_dir),
        "runs_per_group": runs,
        "seed": seed,
        "groups": groups,
        "runs": records,
        "failures": failures,
        # Morin & Willetts' figure: the same-seed std as a share of the different-seed std.
        "nondeterminism_std_ratio": _ratio(same["test_accuracy"]["std"], different["test_accuracy"]["std"]),
        "nondeterminism_variance_ratio": _ratio(_square(same["test_accuracy"]["std"]), _square(different["test_accuracy"]["std"])),
    }
    return result


def _slurm_folder(slurm_dir: Path, index: int) -> str:
    """submitit's folder for a member's job (JOBID_INDEX; the newest, if the study ran more than once)."""
    folders = sorted(slurm_dir.glob(f"*_{index}"), key=lambda p: p.stat().st_mtime) if slurm_dir.is_dir() else []
    return str(folders[-1]) if folders else str(slurm_dir)


def _group_summary(records: list[dict]) -> dict:
    summary = {"runs": len(records), "distinct_weights_digests": len({r["weights_digest"] for r in records})}
    for key in ("test_accuracy", "test_loss"):
        values = [float(r[key]) for r in records]
        summary[key] = {
            "mean": statistics.fmean(values) if values else None,
            "std": statistics.stdev(values) if len(values) > 1 else None,  # sample std (n - 1)
            "min": min(values, default=None),
            "max": max(values, default=None),
        }
    return summary


def _ratio(a, b):
    return None if a is None or not b else a / b


def _square(value):
    return None if value is None else value * value


def summary_lines(result: dict) -> list[str]:
    lines = []
    for group, summary in result["groups"].items():
        acc, loss = summary["test_accuracy"], summary["test_loss"]
        lines.append(f"{group}: {summary['runs']} runs, test accuracy mean {_fmt(acc['mean'])} std {_fmt(acc['std'])}, "
                     f"test loss mean {_fmt(loss['mean'])} std {_fmt(loss['std'])}, {summary['distinct_weights_digests']} distinct weights_digest")  # fmt: skip
    lines.append(f"non-determinism: same-seed std / different-seed std = {_fmt(result['nondeterminism_std_ratio'])} "
                 f"(variance ratio {_fmt(result['nondeterminism_variance_ratio'])}; Morin & Willetts: 0.020 / 0.027 = 0.74)")  # fmt: skip
    for failure in result["failures"]:
        lines.append(f"FAILED run {failure['member']} ({failure['group']}, seed {failure['seed']}): {failure['error']}; log: {failure.get('log')}")
    if result.get("launcher_error"):
        lines.append(f"launcher: {result['launcher_error']}")
    return lines


def _fmt(value) -> str:
    return "n/a" if value is None else f"{value:.6g}"


def write_study(result: dict, study_dir: Path) -> None:
    write_file_atomic(study_dir / "study.json", json.dumps(result, indent=2).encode())
    write_file_atomic(study_dir / "study.png", box_plot(result))
    write_file_atomic(study_dir / "study.md", study_markdown(result).encode())


def study_markdown(result: dict) -> str:
    rows = ["| group | runs | test accuracy mean | std | test loss mean | std | distinct weights_digest |", "|---|---|---|---|---|---|---|"]
    for group, s in result["groups"].items():
        rows.append(f"| {group} | {s['runs']} | {_fmt(s['test_accuracy']['mean'])} | {_fmt(s['test_accuracy']['std'])} | "
                    f"{_fmt(s['test_loss']['mean'])} | {_fmt(s['test_loss']['std'])} | {s['distinct_weights_digests']} |")  # fmt: skip
    text = ["# Variance study", "", f"Study directory: `{result['study_dir']}`; {result['runs_per_group']} runs per group, seed {result['seed']}.", "",
            *rows, "", *[f"- {line}" for line in summary_lines(result)[2:]],
            f"- Same-seed std / different-seed std: {_fmt(result['nondeterminism_std_ratio'])} (Morin & Willetts: 0.74).", "",
            "![box plot](study.png)", ""]  # fmt: skip
    return "\n".join(text)


def box_plot(result: dict) -> bytes:
    import io

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(9, 4), layout="constrained")
    for ax, key in zip(axes, ("test_accuracy", "test_loss")):
        data = [[float(r[key]) for r in result["runs"] if r["group"] == group] for group in GROUPS]
        ax.boxplot([d or [float("nan")] for d in data], tick_labels=[f"{g}\n({len(d)} runs)" for g, d in zip(GROUPS, data)])
        for position, values in enumerate(data, start=1):
            ax.scatter([position] * len(values), values, s=14, alpha=0.7, zorder=3)
        ax.set_title(key.replace("_", " "))
        ax.grid(alpha=0.3)
    fig.suptitle("final test metrics: same seed vs different seeds")
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=110)
    plt.close(fig)
    return buffer.getvalue()
