"""The study's members: who they are (same seed, different seeds), where each one's run, log and
record live, one member trained in its job (`run_member`, called by reprocube.orchestration.study_job),
and every member's record collected into the study's result (reprocube.results.study_result)."""

from __future__ import annotations

import os
import statistics
from dataclasses import dataclass
from pathlib import Path

from reprocube.config import override
from reprocube.errors import EXIT_TRAINING, ReprocubeError
from reprocube.files import write_json_atomic
from reprocube.orchestration.children import (
    DEFAULT_WATCHDOG,
    StalledChild,
    Watchdog,
    last_error_line,
    reprocube_command,
    run_watched,
)
from reprocube.results.study_result import GROUPS, MEMBER_OK_KEYS, read_member
from reprocube.training.metrics import read_epoch_records


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


def collect(study_dir: Path, runs: int, seed: int, launcher: str = "local") -> dict:
    """Every member's recorded result; a member without one is listed as failed, with its logs."""
    paths = study_paths(study_dir)
    records, failures = [], []
    for member in members(runs, seed):
        path = paths["results"] / f"{member.run_name}.json"
        try:
            record = read_member(path)
        except FileNotFoundError:
            logs = [str(paths["logs"] / f"{member.run_name}.log")] + (
                [_slurm_folder(paths["slurm"], member.index)] if launcher == "slurm" else []
            )
            record = {
                "member": member.index,
                "group": member.group,
                "seed": member.seed,
                "status": "failed",
                "error": "no result recorded (the job did not finish)",
                "log": " and ".join(logs),
            }
        except (OSError, ReprocubeError) as exc:
            record = {
                "member": member.index,
                "group": member.group,
                "seed": member.seed,
                "status": "failed",
                "error": f"unreadable result: {exc}",
            }
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
        "nondeterminism_variance_ratio": _ratio(
            _square(same["test_accuracy"]["std"]), _square(different["test_accuracy"]["std"])
        ),
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


def run_member(
    study_dir: Path,
    runs: int,
    seed: int,
    index: int,
    train_args: list[str],
    cwd: str,
    watchdog: Watchdog = DEFAULT_WATCHDOG,
) -> dict:
    """Train one member with `reprocube train` in a fresh process, watched, and record its result. Never
    raises for a failed or stalled run: the failure is recorded, so that the other runs go on and are
    reported."""
    member = members(runs, seed)[index]
    paths = study_paths(study_dir)
    log_path = paths["logs"] / f"{member.run_name}.log"
    command = reprocube_command(
        "train",
        *train_args,
        f"seed={member.seed}",
        override("output_dir", str(paths["runs"])),
        f"run_name={member.run_name}",
        "resume=auto",
        "log.progress=false",
    )
    run_dir = paths["runs"] / member.run_name

    def on_stall(seconds: float) -> None:
        print(
            f"study: {member.run_name}: no progress for {seconds:.0f} s (its log and metrics.jsonl unchanged); "
            "still waiting",
            flush=True,
        )

    stalled = None
    try:
        status = run_watched(command, log_path, [run_dir / "metrics.jsonl"], on_stall, watchdog=watchdog, cwd=cwd)
    except StalledChild as exc:
        status, stalled = EXIT_TRAINING, str(exc)
    record = {
        "member": member.index,
        "group": member.group,
        "seed": member.seed,
        "run": str(paths["runs"] / member.run_name),
        "log": str(log_path),
        "exit_code": status,
        "slurm_job_id": os.environ.get("SLURM_JOB_ID"),
    }
    if status == 0:
        final = _final_epoch(paths["runs"] / member.run_name)
        if final is None:
            record.update(status="failed", error="the run finished without an epoch record in metrics.jsonl")
        else:
            record.update(
                status="ok",
                **{k: final[k] for k in MEMBER_OK_KEYS},
            )
    else:
        error = stalled or f"reprocube train exited {status}: {last_error_line(log_path)}"
        record.update(status="failed", error=error)
    write_json_atomic(paths["results"] / f"{member.run_name}.json", record, indent=2)
    return record


def _final_epoch(run_dir: Path) -> dict | None:
    path = run_dir / "metrics.jsonl"
    epochs = read_epoch_records(path) if path.exists() else []
    return epochs[-1] if epochs else None
