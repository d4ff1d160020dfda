"""`reprocube verify`: prove that a configuration restarts and resumes bit-exactly. For each framework:
train the uninterrupted reference (or reuse `run=PATH`), then, each in a fresh process, one link per
epoch (plan_linear: about 2N+1 epochs of training for N) or, with verify.full=true, the exhaustive checks
(plan_full: a whole restart, a whole other-seed run, a resume from every epoch checkpoint to the end).
The checks are planned (orchestration.verify_plan), run here (verify.jobs at once) or as SLURM jobs
(orchestration.verify_runner), and judged from the run directories they leave
(orchestration.verify_judgement); this command ties them together and writes verify.json."""

from __future__ import annotations

import time
from pathlib import Path

from reprocube.analysis.run_comparison import subject_of
from reprocube.config import config_differences, to_plain
from reprocube.errors import EXIT_DIFFERENT, EXIT_OK, ConfigError
from reprocube.orchestration.children import Watchdog, child_args, print_now
from reprocube.orchestration.invocation import add_config_arguments
from reprocube.orchestration.launcher import check_slurm
from reprocube.orchestration.verify_judgement import judge
from reprocube.orchestration.verify_plan import (
    default_jobs,
    known_not_to_resume,
    plan_full,
    plan_linear,
    reference_epochs,
    runs_on_cpu,
    share_compiled_code,
    steps_per_epoch,
)
from reprocube.orchestration.verify_runner import child_commands, describe, run_local, run_slurm
from reprocube.results.verify_result import VERIFY_RESULT, write_verify
from reprocube.training.checkpoint import read_checkpoint, scan_checkpoints

SET_ON_CHILDREN = (
    "framework=",
    "run_name=",
    "output_dir=",
    "resume=",
    "run=",
    "seed=",
    "preempt_at_step=",
    "stop_after_epoch=",
    "log.progress=",
)


HELP = "prove bit-exact restart and resume: reprocube verify framework=all epochs=3"


def add_arguments(parser) -> None:
    add_config_arguments(parser, all_frameworks_default="pytorch")


def run(args) -> int:
    invocation = args.invocation
    passed = verify(invocation.frameworks, invocation.cfg, invocation.overrides, invocation.config_files)
    return EXIT_OK if passed else EXIT_DIFFERENT


def verify(frameworks: list[str], cfg, overrides: list[str], config_files: list[str], out=print_now) -> bool:
    """Returns True only if every comparison of every framework passes."""
    if cfg.run:
        if len(frameworks) > 1:
            raise ConfigError("run=PATH is one reference run: name its framework (framework=...), not framework=all")
        _check_reference_config(Path(cfg.run), to_plain(cfg))
    if cfg.verify.launcher == "slurm":
        check_slurm("verify.launcher")  # before anything is written
    user = child_args(overrides, config_files, SET_ON_CHILDREN)
    rows, all_passed = [], True
    for framework in frameworks:
        result = _verify_framework(framework, cfg, user, out)
        all_passed &= result["passed"]
        rows += [(framework, check["check"], check["summary"], check["passed"]) for check in result["checks"]]
    out("")
    out(_table(rows))
    out(f"verdict: {'all bit-identical' if all_passed else 'NOT reproducible (see above)'}")
    warning = known_not_to_resume(cfg)
    if warning:
        out(f"note: {warning}")
    return all_passed


def _check_reference_config(reference: Path, config: dict) -> None:
    """A reused reference must have been trained under the config verify trains the others with: else
    every check would fail for a reason no check names."""
    found, _ = scan_checkpoints(reference / "checkpoints")
    if not found:
        raise ConfigError(f"run={reference} holds no readable checkpoint (not a reprocube run?)")
    differences = config_differences(read_checkpoint(found[-1]).content.config, config)
    if differences:
        raise ConfigError(
            f"run={reference} was trained with a different config ({'; '.join(differences)}); "
            "give verify the same overrides, or drop run= to train a reference"
        )


def _verify_framework(framework: str, cfg, user: list[str], out) -> dict:
    started = time.perf_counter()
    base = Path(cfg.output_dir) / f"verify-{framework}"
    if base.exists() and any(p.name != "logs" for p in base.iterdir()):
        raise ConfigError(f"{base} holds an earlier verify's runs; remove it or choose another output_dir=")
    logs = base / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    reference = Path(cfg.run) if cfg.run else base / "reference"
    steps = steps_per_epoch(cfg)
    plan = (
        plan_full(cfg, steps, reference)
        if cfg.verify.full
        else plan_linear(cfg, steps, reference, reference_epochs(cfg))
    )
    if framework == "jax":
        # device=auto through SLURM: the compute nodes may have a GPU that this machine lacks.
        on_cpu = runs_on_cpu(cfg) and not (cfg.verify.launcher == "slurm" and cfg.device == "auto")
        share_compiled_code(plan, base / "jax-cache" if on_cpu else None)
    commands = {check.name: child_commands(check, user, framework, base) for check in plan}
    jobs = cfg.verify.jobs or default_jobs(cfg.threads)
    where = "SLURM jobs" if cfg.verify.launcher == "slurm" else f"{jobs} at a time"
    out(f"[{framework}] {len(plan)} checks ({'full' if cfg.verify.full else 'linear'}), {where}, in {base}")
    if cfg.verify.launcher == "slurm":
        run_slurm(plan, commands, cfg, base, out)
    else:
        run_local(plan, commands, jobs, reference, logs, out, base=base, watchdog=Watchdog.of_config(cfg))
    checks = judge(plan, reference, base, cfg.verify.tolerance)
    result = {
        # What this verdict is about: the reference's final epoch checkpoint (report checks it against the run).
        "subject": subject_of(reference),
        "framework": framework,
        "passed": all(c["passed"] for c in checks),
        "mode": "full" if cfg.verify.full else "linear",
        "jobs": None if cfg.verify.launcher == "slurm" else jobs,
        "launcher": cfg.verify.launcher,
        "tolerance": cfg.verify.tolerance,
        "known_not_to_resume": known_not_to_resume(cfg),
        "wall_s": round(time.perf_counter() - started, 1),
        "checks": checks,
        "processes": [describe(check) for check in plan],
    }
    # Beside the reference it trained; never into a run given with run=PATH (someone else's published run).
    trained_here = not cfg.run and (reference / "checkpoints").is_dir()
    report_dir = reference if trained_here else base
    write_verify(result, report_dir)
    out(
        f"[{framework}] {'passed' if result['passed'] else 'FAILED'} in {result['wall_s']} s: "
        f"{report_dir / VERIFY_RESULT.markdown_name}"
    )
    return result


def _table(rows) -> str:
    widths = [max(len(str(r[i])) for r in rows + [("framework", "check", "result", "")]) for i in range(3)]
    line = lambda r: "  ".join(str(c).ljust(w) for c, w in zip(r, widths, strict=True))
    return "\n".join(
        [line(("framework", "check", "result")), line(["-" * w for w in widths])]
        + [line(r[:3]) + ("" if r[3] else "   <-- FAIL") for r in rows]
    )
