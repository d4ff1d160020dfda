"""`reprocube verify`: prove that a configuration restarts and resumes bit-exactly. For each framework:
train the uninterrupted reference (or reuse `run=PATH`), then, each in a fresh process, one link per
epoch (plan_linear: about 2N+1 epochs of training for N) or, with verify.full=true, the exhaustive checks
(plan_full: a whole restart, a whole other-seed run, a resume from every epoch checkpoint to the end).
The checks run here (verify.jobs at once) or as SLURM jobs (reprocube.orchestration.verify_runner); this
module plans them and judges the run directories they leave."""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

from reprocube import compilation_cache
from reprocube.analysis.run_comparison import compare_runs, load_run, subject_of
from reprocube.backend import STEPS_PER_CALL
from reprocube.checkpoint import epoch_name, read_checkpoint, scan_checkpoints, weights_digest
from reprocube.config import config_differences, override, to_plain
from reprocube.data.sampler import EpochSampler
from reprocube.env import usable_cpus
from reprocube.errors import EXIT_DIFFERENT, EXIT_OK, EXIT_PREEMPTED, CheckpointError, ConfigError
from reprocube.orchestration.children import Watchdog, child_args
from reprocube.orchestration.invocation import add_config_arguments
from reprocube.orchestration.launcher import check_slurm
from reprocube.orchestration.verify_runner import Check, Stage, child_commands, describe, run_local, run_slurm
from reprocube.results.compare_result import summary_line
from reprocube.results.verify_result import VERIFY_RESULT, write_verify
from reprocube.state import TrainState
from reprocube.trace import compare_traces

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


def _print_now(line: str) -> None:
    print(line, flush=True)  # progress must reach a batch job's log as it happens


HELP = "prove bit-exact restart and resume: reprocube verify framework=all epochs=3"


def add_arguments(parser) -> None:
    add_config_arguments(parser, all_frameworks_default="pytorch")


def run(args) -> int:
    invocation = args.invocation
    passed = verify(invocation.frameworks, invocation.cfg, invocation.overrides, invocation.config_files)
    return EXIT_OK if passed else EXIT_DIFFERENT


def verify(frameworks: list[str], cfg, overrides: list[str], config_files: list[str], out=_print_now) -> bool:
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
    steps = _steps_per_epoch(cfg)
    plan = (
        plan_full(cfg, steps, reference)
        if cfg.verify.full
        else plan_linear(cfg, steps, reference, _reference_epochs(cfg))
    )
    if framework == "jax":
        # device=auto through SLURM: the compute nodes may have a GPU that this machine lacks.
        on_cpu = _runs_on_cpu(cfg) and not (cfg.verify.launcher == "slurm" and cfg.device == "auto")
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
        f"[{framework}] {'passed' if result['passed'] else 'FAILED'} in {result['wall_s']} s: {report_dir / VERIFY_RESULT.markdown_name}"
    )
    return result


# JAX compiles its steps in every process (about 3 s of each check's start-up here). Every check but the
# fresh process from scratch loads the compiled code from a cache the first process writes (verify's own,
# not the user's: reprocube.compilation_cache); that one compiles anew, so a compilation that gave other
# bits is still caught. Only on the CPU: on a GPU, autotuning may choose other kernels in each
# compilation, which a cache would hide from the resumes, so there every check compiles anew.
FRESH_CHECKS = ("link-epoch-1", "restart")  # the checks that compile anew


def share_compiled_code(plan: list[Check], cache: Path | None) -> None:
    for check in plan:
        shared = cache is not None and check.name not in FRESH_CHECKS
        check.env = {**check.env, compilation_cache.VARIABLE: str(cache.resolve()) if shared else compilation_cache.OFF}


def _runs_on_cpu(cfg) -> bool:
    """device=cpu, or device=auto on a host without NVIDIA's driver tools."""
    return cfg.device == "cpu" or (cfg.device == "auto" and shutil.which("nvidia-smi") is None)


def default_jobs(threads: int) -> int:
    """Checks at once when verify.jobs is not given: as many as the usable CPUs hold at `threads` each."""
    return max(1, (usable_cpus() or os.cpu_count() or 1) // threads)


def _steps_per_epoch(cfg) -> int:
    """From the config alone (the reference may not exist yet): an IDX label file is an 8-byte header and
    one byte per example; the steps are the sampler's, as training will count them."""
    examples = cfg.dataset.files.train_labels.bytes - 8
    if cfg.data.train_limit is not None:
        examples = min(examples, cfg.data.train_limit)
    try:
        return EpochSampler(cfg.seed, max(examples, 1), cfg.batch_size, cfg.data.drop_last).steps_per_epoch
    except ValueError as exc:
        raise ConfigError(str(exc)) from None


def _reference_epochs(cfg) -> list[int]:
    """The epochs after which the reference holds a checkpoint (a link runs between two of them)."""
    if not cfg.run:
        every = cfg.checkpoint.every_epochs
        return [k for k in range(1, cfg.epochs + 1) if k % every == 0 or k == cfg.epochs]
    found, _ = scan_checkpoints(Path(cfg.run) / "checkpoints")
    return sorted(int(p.name.split("-")[1]) for p in found if p.name.startswith("epoch-"))


def _sigterm_step(cfg, steps: int) -> int:
    stop_at = cfg.verify.mid_epoch_step or (steps + steps // 2 if cfg.epochs > 1 else max(steps // 2, 1))
    if stop_at >= cfg.epochs * steps:
        raise ConfigError(
            f"verify.mid_epoch_step={stop_at} is not before the run's last step ({cfg.epochs * steps}); choose an earlier step"
        )
    return stop_at


def _reference_check(cfg) -> list[Check]:
    if cfg.run:
        return []
    return [Check("reference", "reference: the uninterrupted run", [Stage((f"seed={cfg.seed}",))], "reference")]


def plan_linear(cfg, steps: int, reference: Path, epochs: list[int]) -> list[Check]:
    """The reference, then one link per pair of consecutive reference checkpoints a < b: a fresh process
    that starts from the reference's checkpoint a (the first: from scratch), trains to b and must equal the
    reference's checkpoint b in every byte of its state. By induction on b that proves a fresh process and
    a resume at every checkpoint reproduce the uninterrupted run: a state a checkpoint misses or restores
    wrongly was carried by the reference and not by the link, which then differs. One link is stopped by a
    real SIGTERM mid-epoch and resumed; the other-seed control runs one group of steps and must differ."""
    if not epochs or epochs[-1] != cfg.epochs:
        raise ConfigError(
            f"run={cfg.run} is not a completed {cfg.epochs}-epoch run (its last epoch checkpoint is {epochs[-1:] or 'none'})"
        )
    checks = _reference_check(cfg)
    stop_at = _sigterm_step(cfg, steps) if cfg.verify.mid_epoch else None
    for a, b in zip([0, *epochs[:-1]], epochs, strict=True):
        start = (f"seed={cfg.seed}", f"stop_after_epoch={b}") + (
            (override("resume", str(_checkpoint(reference, a))),) if a else ()
        )
        span = f"epoch {b}" if b == a + 1 else f"epochs {a + 1}-{b}"
        label = f"fresh process, from scratch: {span}" if a == 0 else f"resume from epoch {a}: {span}"
        stages = [Stage(start)]
        if stop_at is not None and a * steps < stop_at < b * steps:
            resumed = tuple(arg for arg in start if not arg.startswith("resume=")) + ("resume=latest",)
            stages = [Stage((*start, f"preempt_at_step={stop_at}"), expect=(EXIT_PREEMPTED,)), Stage(resumed)]
            label += f", stopped by SIGTERM at step {stop_at} and resumed"
        name = f"link-epoch-{b}"
        checks.append(Check(name, label, stages, "link", needs=epoch_name(a) if a else None, compare_at=epoch_name(b)))
    # Another seed differs from the first step: one group of steps shows it (the trace has every loss).
    control_steps = min(STEPS_PER_CALL, cfg.epochs * steps)
    # Stopped at the run's last step, it simply ends (a stop at an epoch's last step finishes the epoch).
    control = Stage((f"seed={(cfg.seed + 1) % 2**32}", f"preempt_at_step={control_steps}"),
                    expect=(EXIT_PREEMPTED, EXIT_OK))  # fmt: skip
    checks.insert(
        2 if not cfg.run else 1,
        Check("control-other-seed", f"negative control: another seed, {control_steps} steps", [control], "control"),
    )
    return checks


def plan_full(cfg, steps: int, reference: Path) -> list[Check]:
    """verify.full=true: the whole restart, the whole other-seed run, a resume from every epoch checkpoint
    to the end, and the SIGTERM run, each compared with the reference at every checkpoint both hold."""
    checks = _reference_check(cfg)
    checks.append(Check("restart", "restart (same seed, fresh process)", [Stage((f"seed={cfg.seed}",))], "run"))
    other = Stage((f"seed={(cfg.seed + 1) % 2**32}",))
    checks.append(Check("other-seed", "negative control (another seed must differ)", [other], "other-seed"))
    for k in _reference_epochs(cfg):
        if k < cfg.epochs:
            resume = Stage((f"seed={cfg.seed}", override("resume", str(_checkpoint(reference, k)))))
            checks.append(Check(f"resume-epoch-{k}", f"resume from epoch {k}", [resume], "run", needs=epoch_name(k)))
    if cfg.verify.mid_epoch:
        stop_at = _sigterm_step(cfg, steps)
        stages = [
            Stage((f"seed={cfg.seed}", f"preempt_at_step={stop_at}"), expect=(EXIT_PREEMPTED,)),
            Stage((f"seed={cfg.seed}", "resume=latest")),
        ]
        checks.append(Check("sigterm", f"SIGTERM at step {stop_at}, resume=latest", stages, "run"))
    return checks


def _checkpoint(reference: Path, epoch: int) -> Path:
    return (reference / "checkpoints" / epoch_name(epoch)).resolve()


# ---- judging: the run directories the checks left --------------------------------------------------------


def _row(check: Check, passed: bool, summary: str, detail: dict | None = None) -> dict:
    """One row of verify's table and of verify.json's checks."""
    return {"name": check.name, "check": check.label, "passed": passed, "summary": summary, "detail": detail}


def judge(plan: list[Check], reference: Path, base: Path, tolerance: float) -> list[dict]:
    rows = []
    try:
        ref = load_run(reference)
    except CheckpointError as exc:
        first = plan[0] if plan and plan[0].judge == "reference" else None
        reason = first.error if first is not None and first.error else str(exc)
        return [_row(Check("reference", "reference", [], "reference"), False, f"failed: {reason}")]
    for check in plan:
        if check.error:
            rows.append(_row(check, False, f"failed: {check.error}"))
            continue
        if check.judge == "reference":
            final = max((n for n in ref["checkpoints"] if n.startswith("epoch-")), default=None)
            summary = f"trained ({final})" if final else "wrote no epoch checkpoint"
            rows.append(_row(check, final is not None, summary, {"inputs": ref["inputs"]}))
            continue
        try:
            rows.append(_judge_one(check, ref, base, tolerance))
        except CheckpointError as exc:  # a run directory (or trace) that cannot be read fails its check
            rows.append(_row(check, False, f"failed: {exc}"))
    return rows


def _judge_one(check: Check, ref: dict, base: Path, tolerance: float) -> dict:
    def row(passed: bool, summary: str, detail: dict | None = None) -> dict:
        return _row(check, passed, summary, detail)

    run = load_run(base / check.name)
    if check.judge == "link":
        # What was read of the link's run, by digest (the reference's is in its own row).
        detail = compare_link(ref, run, check.compare_at, tolerance) | {"inputs": run["inputs"]}
        stopped = len(check.stages) == 1 or any(n.startswith("step-") for n in run["checkpoints"])
        return row(
            detail["passed"] and stopped,
            detail["summary"] if stopped else "the SIGTERM left no step checkpoint",
            detail,
        )
    if check.judge == "control":
        divergence = compare_traces(_trace(ref), _trace(run))
        differs = divergence.step is not None
        summary = (
            f"differs from global step {divergence.step}, as it must"
            if differs
            else "IDENTICAL: the verdict is meaningless"
        )
        return row(
            differs,
            summary,
            {"first_differing_step": divergence.step, "identical": not differs, "inputs": run["inputs"]},
        )
    result = compare_runs(ref, run, tolerance)
    if check.judge == "other-seed":
        differs = not result["identical"]
        return row(differs, "differs, as it must" if differs else "IDENTICAL: the verdict is meaningless", result)
    return row(result["passed"], summary_line(result), result)


def compare_link(ref: dict, run: dict, name: str, tolerance: float) -> dict:
    """A link's checkpoint `name` against the reference's: the weights (as compare does: tensor by tensor,
    with ULPs), then the rest of the state a resume depends on (optimizer, every RNG, every step's loss and
    the trace's weight digests, the epoch records)."""
    if name not in run["checkpoints"]:
        return {"passed": False, "identical": False, "summary": f"wrote no {name}", "state_differences": []}
    result = compare_runs({**ref, "checkpoints": {name: ref["checkpoints"][name]}, "unreadable": {}},
                          {**run, "checkpoints": {name: run["checkpoints"][name]}}, tolerance)  # fmt: skip
    a, b = ref["checkpoints"][name], run["checkpoints"][name]
    state = [
        part
        for part, x, y in (
            ("optimizer state", a.content.optimizer, b.content.optimizer),
            ("RNG state", a.content.rng, b.content.rng),
        )
        if weights_digest(x) != weights_digest(y)
    ]
    divergence = compare_traces(_trace(ref, name), _trace(run, name))
    if divergence.step is not None:
        state.append(f"step trace from global step {divergence.step}")
    identical = result["identical"] and not state
    steps = a.manifest.global_step
    if identical:
        summary = f"identical at {name} (weights, optimizer, RNG, {steps} step losses)"
    else:
        summary = summary_line(result) if not result["identical"] else f"weights identical at {name}"
        summary += "".join(f"; {part} differs" for part in state)
    passed = identical or (tolerance > 0 and result["passed"])
    return {**result, "passed": passed, "identical": identical, "summary": summary, "state_differences": state}


def _trace(run: dict, name: str | None = None):
    """The step trace a run's checkpoint holds (the newest if no name is given)."""
    checkpoint = run["checkpoints"][name] if name else next(reversed(run["checkpoints"].values()))
    trace = TrainState.from_checkpoint(checkpoint, checkpoint.manifest.steps_per_epoch).trace
    if trace is None:
        raise CheckpointError(f"checkpoint {checkpoint.path} holds no step trace (made before reprocube traced steps)")
    return trace


def _table(rows) -> str:
    widths = [max(len(str(r[i])) for r in rows + [("framework", "check", "result", "")]) for i in range(3)]
    line = lambda r: "  ".join(str(c).ljust(w) for c, w in zip(r, widths, strict=True))  # noqa: E731
    return "\n".join(
        [line(("framework", "check", "result")), line(["-" * w for w in widths])]
        + [line(r[:3]) + ("" if r[3] else "   <-- FAIL") for r in rows]
    )


def known_not_to_resume(cfg) -> str | None:
    """A setting that reprocube keeps as a negative control: verify is expected to fail on it."""
    if cfg.data.pipeline == "loader" and cfg.data.augment and cfg.data.augment_rng == "stateful":
        return (
            "data.augment_rng=stateful is known not to resume exactly: the augmentation draws from each loader "
            "worker's own generator, seeded when the worker starts and saved in no checkpoint (docs/design.md: "
            "'Random augmentation that resumes exactly'); use data.augment_rng=stateless"
        )
    return None
