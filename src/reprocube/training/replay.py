"""Replaying one optimizer step of a run with every operation recorded, to find which operation first
computes differently on two machines (reprocube.analysis.first_differing_operation compares two recordings).

The replay resumes from the newest checkpoint of the run at or before step N-1 (a fresh start when
there is none), trains to step N-1 exactly as the loop does (same data order, same trainer calls, no
checkpoint, no metric, nothing written to the run), then runs step N twice from the same state: once
plainly, once recorded by the trainer (Backend.record_ops: PyTorch's every operation, JAX's and
TensorFlow's inputs and kernels). That the recording changed nothing is checked, not assumed: both runs
of step N must give the same loss bits and the same weights, optimizer tensors and generator states.
The recorded loss is also compared with the run's own trace (and the weights with its boundary at step
N, where it has one).

The evaluation at each epoch's end is skipped: it draws no random number and changes no state the
training reads (the comparison with the run's trace would show otherwise)."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from reprocube.config import config_differences, flatten_keys, load_config, override, result_config, to_plain
from reprocube.data.pipeline import create_pipeline
from reprocube.data.sampler import EpochSampler
from reprocube.data.store import load_dataset
from reprocube.errors import CheckpointError, ConfigError
from reprocube.formats.env import ENV_PREFIXES, ENV_VARS
from reprocube.formats.ops_format import OPS_VERSION
from reprocube.formats.trace import StepTrace, tensor_digest
from reprocube.training.backend import FRAMEWORKS, STEPS_PER_CALL, create_backend
from reprocube.training.checkpoint import Checkpoint, read_checkpoint, read_manifest, scan_checkpoints
from reprocube.training.metrics import MetricsHistory
from reprocube.training.rng import seed_host_rng
from reprocube.training.state import FrameworkState, Position, TrainState
from reprocube.training.steps import StepWalk

# Besides the run's result keys: the places and counts a replay of it needs (where its data is).
REPLAY_PLACE_KEYS = ("epochs", "data_dir", "data.source_dir", "data.workers", "framework.inter_op_threads")


@dataclass(frozen=True)
class ReplayPlan:
    cfg: object  # the run's config (DictConfig), with the caller's place overrides
    run: Path
    step: int  # the global step to record (1-based: the step that makes global_step == step)
    latest: Checkpoint  # the run's newest checkpoint: its trace is the reference
    start: Checkpoint | None  # where the replay resumes (None: a fresh start)


def plan_replay(run: Path, step: int, overrides: list[str] = (), config_files: list[str] = ()) -> ReplayPlan:
    """Read the run (its newest checkpoint holds its config and trace), build its config with the
    caller's overrides (place keys only: a result-affecting change is refused), and pick the checkpoint
    to resume from. Refuses a framework that is not ours before importing anything (ConfigError, exit 2):
    every trainer records its operations (Backend.record_ops)."""
    run = Path(run)
    found, _ = scan_checkpoints(run / "checkpoints")
    if not found:
        raise CheckpointError(f"{run}: no readable checkpoint in {run / 'checkpoints'} (is it a run directory?)")
    latest = read_checkpoint(found[-1])
    config = latest.content.config
    framework = config.get("framework", {}).get("name") if isinstance(config.get("framework"), dict) else None
    if framework not in FRAMEWORKS:
        raise ConfigError(f"replay_step: the run's framework {str(framework)!r} is not one of {', '.join(FRAMEWORKS)}")
    cfg = load_config(run_overrides(config, latest.path) + list(overrides), config_files)
    differences = config_differences(config, to_plain(cfg))
    if differences:
        raise ConfigError(
            f"replay_step replays the run's own config; these overrides change it: {'; '.join(differences)}"
        )
    last = latest.manifest.global_step
    if not 1 <= step <= last:
        raise ConfigError(f"--step {step}: the run {run} has steps 1 to {last}")
    start = None
    for path in reversed(found):
        if _global_step(path) <= step - 1:
            start = read_checkpoint(path)
            break
    if start is not None and config_differences(start.content.config, config):
        raise CheckpointError(f"checkpoint {start.path} was made with another config than {latest.path}")
    return ReplayPlan(cfg, run, step, latest, start)


def _global_step(path: Path) -> int:
    return read_manifest(path).global_step


def run_overrides(config: dict, where: Path) -> list[str]:
    """A run's config as Hydra overrides (each value as data, through config.override): its framework
    group, every result-affecting key, and the places a replay needs."""
    flat = flatten_keys(config)
    keys = dict(result_config(config))
    keys.update({k: flat[k] for k in REPLAY_PLACE_KEYS if k in flat})
    try:
        return [override("framework", config["framework"]["name"])] + [override(k, v) for k, v in sorted(keys.items())]
    except ConfigError as exc:
        raise CheckpointError(f"checkpoint {where}: config: {exc}") from None


def replay(plan: ReplayPlan) -> dict:
    """Replay step plan.step and return the content of OPS.json (reprocube.analysis.first_differing_operation
    reads it)."""
    cfg = plan.cfg
    dataset = load_dataset(cfg)
    try:
        sampler = EpochSampler(cfg.seed, len(dataset.train), cfg.batch_size, cfg.data.drop_last)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    seed_host_rng(cfg.seed)  # as train() does, before the trainer seeds its own generators
    backend = create_backend(cfg, dataset)
    pipeline = create_pipeline(cfg, dataset.train, cfg.batch_size) if cfg.data.pipeline == "loader" else None
    reference = TrainState.from_checkpoint(plan.latest, sampler.steps_per_epoch).trace
    try:
        steps = _Steps(backend, sampler, pipeline)
        if plan.start is not None:
            steps.restore(plan.start)
        start_step = steps.position.global_step
        steps.advance_to(plan.step - 1)
        run_step = steps.next_step()
        before = TrainState.capture(steps.position, backend, MetricsHistory())
        run_step()
        plain = _outcome(backend)
        before.restore(backend)
        ops = backend.record_ops(run_step)
        recorded = _outcome(backend)
    finally:
        if pipeline is not None:
            pipeline.close()
    run_loss, weights_match = _run_reference(reference, plan.step, recorded[2])
    return {
        "version": OPS_VERSION,
        "framework": cfg.framework.name,
        "step": plan.step,
        "run": str(plan.run),
        "resumed_from": plan.start.path.name if plan.start is not None else None,
        "start_step": start_step,  # the steps after it, to N-1, were trained here before step N
        "framework_info": backend.info(),
        "env_vars": {k: v for k, v in sorted(os.environ.items()) if k in ENV_VARS or k.startswith(ENV_PREFIXES)},
        "loss_f32": recorded[0],
        "run_loss_f32": run_loss,
        "loss_matches_run": None if run_loss is None else run_loss == recorded[0],
        "weights_match_run": weights_match,
        "recording_changed_nothing": plain[:2] == recorded[:2],
        "ops": ops,
    }


def _outcome(backend) -> tuple[str, dict[str, str], dict[str, np.ndarray]]:
    """After a step: its loss bits (8 hex), a digest of every weight, optimizer tensor and generator state,
    and the weights."""
    loss = np.asarray(backend.group_losses(), dtype=np.float32)[-1]
    state: FrameworkState = backend.export_state()
    digests = {
        f"{kind}/{name}": tensor_digest(array)
        for kind, arrays in (("weights", state.weights), ("optimizer", state.optimizer), ("rng", state.rng))
        for name, array in arrays.items()
    }
    return loss_hex(loss), digests, state.weights


def loss_hex(loss) -> str:
    return f"{int(np.asarray(loss, dtype=np.float32).view(np.uint32)):08x}"


def _run_reference(
    trace: StepTrace | None, step: int, weights: dict[str, np.ndarray]
) -> tuple[str | None, bool | None]:
    """The run's loss bits at `step` (None where its trace does not cover it), and whether the weights
    equal its boundary digests at `step` (None where it has no boundary there)."""
    if trace is None or not trace.first_step < step <= trace.last_step:
        return None, None
    run_loss = loss_hex(trace.losses[step - trace.first_step - 1])
    boundary = next((b for b in trace.boundaries if b.step == step), None)
    if boundary is None or sorted(weights) != sorted(trace.tensor_names):
        return run_loss, None
    return run_loss, [tensor_digest(weights[n]) for n in trace.tensor_names] == boundary.tensors


class _Steps:
    """The replay's way to step N: the training loop's walk (reprocube.training.steps.StepWalk), from a checkpoint
    or a fresh start, in groups of at most STEPS_PER_CALL steps (grouping never changes what is computed),
    each epoch's end moving on to the next (the replay keeps no records)."""

    def __init__(self, backend, sampler: EpochSampler, pipeline):
        self.walk, self.sampler = StepWalk(backend, sampler, pipeline), sampler
        self.position = Position()

    def restore(self, checkpoint: Checkpoint) -> None:
        self.position = self.walk.resume(checkpoint).position

    def advance_to(self, global_step: int) -> None:
        p, per_epoch = self.position, self.sampler.steps_per_epoch
        while p.global_step < global_step:
            end = min(per_epoch, p.step_in_epoch + STEPS_PER_CALL, p.step_in_epoch + global_step - p.global_step)
            self.walk.train(p, end)
            if end == per_epoch:
                p.epoch, p.step_in_epoch = p.epoch + 1, 0

    def next_step(self) -> Callable[[], None]:
        """The next step as a call that can be made twice from the same state (its data taken once)."""
        return self.walk.group(self.position, self.position.step_in_epoch + 1)
