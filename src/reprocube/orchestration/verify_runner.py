"""How verify's checks run: each is one or more `reprocube train` processes, run one after another in
its own run directory. Here, up to `jobs` checks at once (a check that starts from a reference checkpoint
waits until the reference has written it, so the reference and the checks overlap); on SLURM, one job
per check through the launcher the study uses (reprocube.orchestration.launcher), the reference first.
Whatever runs where, a check's result is only its exit statuses: verify judges the run directories."""

from __future__ import annotations

import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from reprocube.config import override
from reprocube.errors import EXIT_OK, CheckpointError
from reprocube.files import write_json_atomic
from reprocube.orchestration.children import (
    DEFAULT_WATCHDOG,
    ProgressWatch,
    StalledChild,
    Watchdog,
    last_error_line,
    reprocube_command,
    run_child,
    start_child,
)
from reprocube.orchestration.launcher import hydra_settings, launch_multirun, wait_for_slurm_jobs
from reprocube.untrusted import Fields, read_json

POLL_S = 0.2
MAX_RESULT_BYTES = 1 << 20


@dataclass(frozen=True)
class Stage:
    """One `reprocube train` process of a check: its overrides (after the user's) and the exit statuses
    that mean it did what it was meant to (75: stopped by the SIGTERM drill)."""

    args: tuple[str, ...]
    expect: tuple[int, ...] = (EXIT_OK,)


@dataclass
class Check:
    name: str  # its run directory under the verify directory, and its log's name
    label: str  # its row in verify's table
    stages: list[Stage]
    judge: str  # how verify judges it: reference | link | control | run | other-seed
    needs: str | None = None  # a reference checkpoint it starts from: it starts once that exists
    env: dict[str, str] = field(default_factory=dict)  # set in its processes' environment
    compare_at: str | None = None  # link: the reference checkpoint its own must equal
    statuses: list[int] = field(default_factory=list)
    error: str | None = None  # why it did not run as planned (None: every stage exited as expected)


def child_commands(check: Check, user: list[str], framework: str, base: Path) -> list[list[str]]:
    return [
        reprocube_command(
            "train",
            *user,
            f"framework={framework}",
            override("output_dir", str(base)),
            f"run_name={check.name}",
            "log.progress=false",
            *stage.args,
        )
        for stage in check.stages
    ]


def _stage_failed(check: Check, stage: Stage, status: int, log: Path) -> str | None:
    check.statuses.append(status)
    if status in stage.expect:
        return None
    return f"exited {status}: {last_error_line(log)} (log: {log})"


def run_local(
    checks: list[Check],
    commands: dict[str, list[list[str]]],
    jobs: int,
    reference: Path,
    logs: Path,
    out,
    base: Path,
    watchdog: Watchdog = DEFAULT_WATCHDOG,
):
    """Run the checks, at most `jobs` processes at once, in list order as far as their needs allow; each
    process watched (a check that makes no progress is reported, and ended and failed past the watchdog's
    stop time)."""
    pending, running = list(checks), {}  # name -> (check, stage index, process, its watch)

    def ready(check: Check) -> bool:
        return check.needs is None or (reference / "checkpoints" / check.needs).is_dir()

    def start(check: Check, index: int) -> None:
        if index == 0:
            out(f"  start {check.name}: {check.label}")
        env = {**os.environ, **check.env} if check.env else None
        command, log = commands[check.name][index], logs / f"{check.name}.log"

        def on_stall(seconds: float) -> None:
            out(f"  {check.name}: no progress for {seconds:.0f} s (its log and metrics.jsonl unchanged); still waiting")

        watch = ProgressWatch(command, log, [base / check.name / "metrics.jsonl"], watchdog, on_stall)
        running[check.name] = (check, index, start_child(command, log, env=env), watch)

    while pending or running:
        for check in [c for c in pending if ready(c)]:
            if len(running) >= jobs:
                break
            pending.remove(check)
            start(check, 0)
        if pending and not running:  # nothing runs that could still write what they need
            for check in pending:
                check.error = f"not run: the reference wrote no {check.needs}"
            pending = []
        time.sleep(POLL_S)
        for name, (check, index, process, watch) in list(running.items()):
            status = process.poll()
            if status is None:
                try:
                    watch.poll(process)
                    continue
                except StalledChild as exc:  # ended: the check fails, the others go on
                    del running[name]
                    check.statuses.append(process.wait())
                    check.error = str(exc)
                    out(f"  FAILED {check.name}: {check.error}")
                    continue
            del running[name]
            check.error = _stage_failed(check, check.stages[index], status, logs / f"{check.name}.log")
            if check.error is None and index + 1 < len(check.stages):
                start(check, index + 1)
            else:
                out(
                    f"  {'done' if check.error is None else 'FAILED'} {check.name}"
                    + (f": {check.error}" if check.error else "")
                )


# ---- SLURM: one job per check, through Hydra's submitit launcher ---------------------------------------------


def run_slurm(checks: list[Check], commands: dict[str, list[list[str]]], cfg, base: Path, out) -> None:
    """The reference (if it is to be trained) as one job, then every other check as one array."""
    reference = [c for c in checks if c.judge == "reference"]
    for phase, group in (("reference", reference), ("checks", [c for c in checks if c.judge != "reference"])):
        if not group:
            continue
        if phase == "checks" and reference and reference[0].error:
            for check in group:
                check.error = "not run: the reference failed"
            continue
        work = base / "slurm" / phase
        (work / "results").mkdir(parents=True, exist_ok=True)
        plan = [
            {"name": c.name, "commands": commands[c.name], "expect": [list(s.expect) for s in c.stages], "env": c.env}
            for c in group
        ]
        write_json_atomic(work / "plan.json", {"cwd": os.getcwd(), "checks": plan}, indent=2)
        settings = hydra_settings(work, "job.member", "slurm", cfg.verify.slurm, f"reprocube-verify-{phase}")
        config = {**settings, "job": {"plan": str(work / "plan.json"), "logs": str(base / "logs"), "member": None}}
        out(f"  submitting {len(group)} SLURM job(s): {', '.join(c.name for c in group)}")
        error = launch_multirun(
            "reprocube.orchestration.verify_job",
            "verify",
            work,
            config,
            "job.member",
            len(group),
            work / "launcher.log",
            echo=lambda line: out(f"    {line}"),
        )
        if error:
            wait_for_slurm_jobs(work, cfg.verify.slurm.timeout_min * 60 + 120, out=lambda line: out(f"  {line}"))
        for check in group:
            _read_result(check, work / "results" / f"{check.name}.json", error)


def run_planned(plan_path: Path, logs: Path, member: int) -> dict:
    """In a SLURM job (reprocube.orchestration.verify_job): run one planned check's processes, record their
    exit statuses in RESULTS/NAME.json, and return that record."""
    plan = Fields(read_json(plan_path, CheckpointError, MAX_RESULT_BYTES), str(plan_path), CheckpointError)
    checks = plan.records("checks")
    if not 0 <= member < len(checks):
        raise CheckpointError(f"{plan_path}: no check {member} (it plans {len(checks)})")
    entry = checks[member]
    name, commands, expect = entry.text("name"), entry.value.get("commands"), entry.value.get("expect")
    if not (_list_of_lists(commands, str) and _list_of_lists(expect, int) and len(commands) == len(expect)):
        raise CheckpointError(f"{entry.where}: commands and expect must be lists, one per process")
    env = entry.value.get("env")
    if not (isinstance(env, dict) and all(isinstance(k, str) and isinstance(v, str) for k, v in env.items())):
        raise CheckpointError(f"{entry.where}: env must map names to strings")
    record, log = {"statuses": []}, logs / f"{name}.log"
    for command, expected in zip(commands, expect, strict=True):
        status = run_child(command, log, cwd=plan.text("cwd"), env={**os.environ, **env} if env else None)
        record["statuses"].append(status)
        if status not in expected:
            record["error"] = f"exited {status}: {last_error_line(log)} (log: {log})"
            break
    record.update(name=name, slurm_job_id=os.environ.get("SLURM_JOB_ID"))
    write_json_atomic(plan_path.parent / "results" / f"{name}.json", record, indent=None)
    return record


def _list_of_lists(value, kind: type) -> bool:
    return isinstance(value, list) and all(
        isinstance(item, list) and all(isinstance(x, kind) and not isinstance(x, bool) for x in item) for item in value
    )


def _read_result(check: Check, path: Path, launcher_error: str | None) -> None:
    if not path.is_file():
        check.error = f"no result from its SLURM job ({launcher_error or 'the job did not finish'})"
        return
    record = Fields(read_json(path, CheckpointError, MAX_RESULT_BYTES), str(path), CheckpointError)
    statuses = record.value.get("statuses")
    if not _list_of_lists([statuses], int):
        raise CheckpointError(f"{path}: statuses must be a list of exit statuses")
    check.statuses = statuses
    check.error = record.text("error", optional=True)


def describe(check: Check) -> dict:
    return {k: v for k, v in asdict(check).items() if k in ("name", "label", "needs", "statuses", "error")}
