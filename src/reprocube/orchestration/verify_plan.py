"""verify's plan: which checks prove that a configuration restarts and resumes bit-exactly, each a list
of `reprocube train` processes (orchestration.verify_runner runs them; orchestration.verify_judgement
judges the run directories they leave). plan_linear: one link per epoch (about 2N+1 epochs of training
for N); plan_full (verify.full=true): a whole restart, a whole other-seed run, a resume from every epoch
checkpoint to the end."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from reprocube.config import override
from reprocube.data.sampler import EpochSampler
from reprocube.errors import EXIT_OK, EXIT_PREEMPTED, ConfigError
from reprocube.formats.env import usable_cpus
from reprocube.orchestration.verify_runner import Check, Stage
from reprocube.runtime import compilation_cache
from reprocube.training.backend import STEPS_PER_CALL
from reprocube.training.checkpoint import epoch_name, scan_checkpoints

# JAX compiles its steps in every process (about 3 s of each check's start-up here). Every check but the
# fresh process from scratch loads the compiled code from a cache the first process writes (verify's own,
# not the user's: reprocube.runtime.compilation_cache); that one compiles anew, so a compilation that gave other
# bits is still caught. Only on the CPU: on a GPU, autotuning may choose other kernels in each
# compilation, which a cache would hide from the resumes, so there every check compiles anew.
FRESH_CHECKS = ("link-epoch-1", "restart")  # the checks that compile anew


def share_compiled_code(plan: list[Check], cache: Path | None) -> None:
    for check in plan:
        shared = cache is not None and check.name not in FRESH_CHECKS
        check.env = {**check.env, compilation_cache.VARIABLE: str(cache.resolve()) if shared else compilation_cache.OFF}


def runs_on_cpu(cfg) -> bool:
    """device=cpu, or device=auto on a host without NVIDIA's driver tools."""
    return cfg.device == "cpu" or (cfg.device == "auto" and shutil.which("nvidia-smi") is None)


def default_jobs(threads: int) -> int:
    """Checks at once when verify.jobs is not given: as many as the usable CPUs hold at `threads` each."""
    return max(1, (usable_cpus() or os.cpu_count() or 1) // threads)


def steps_per_epoch(cfg) -> int:
    """From the config alone (the reference may not exist yet): an IDX label file is an 8-byte header and
    one byte per example; the steps are the sampler's, as training will count them."""
    examples = cfg.dataset.files.train_labels.bytes - 8
    if cfg.data.train_limit is not None:
        examples = min(examples, cfg.data.train_limit)
    try:
        return EpochSampler(cfg.seed, max(examples, 1), cfg.batch_size, cfg.data.drop_last).steps_per_epoch
    except ValueError as exc:
        raise ConfigError(str(exc)) from None


def reference_epochs(cfg) -> list[int]:
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
            f"verify.mid_epoch_step={stop_at} is not before the run's last step ({cfg.epochs * steps}); "
            "choose an earlier step"
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
            f"run={cfg.run} is not a completed {cfg.epochs}-epoch run "
            f"(its last epoch checkpoint is {epochs[-1:] or 'none'})"
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
    control = Stage(
        (f"seed={(cfg.seed + 1) % 2**32}", f"preempt_at_step={control_steps}"), expect=(EXIT_PREEMPTED, EXIT_OK)
    )
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
    for k in reference_epochs(cfg):
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


def known_not_to_resume(cfg) -> str | None:
    """A setting that reprocube keeps as a negative control: verify is expected to fail on it."""
    if cfg.data.pipeline == "loader" and cfg.data.augment and cfg.data.augment_rng == "stateful":
        return (
            "data.augment_rng=stateful is known not to resume exactly: the augmentation draws from each loader "
            "worker's own generator, seeded when the worker starts and saved in no checkpoint (docs/design.md: "
            "'Random augmentation that resumes exactly'); use data.augment_rng=stateless"
        )
    return None
