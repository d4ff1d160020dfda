"""One `reprocube bench` measurement, in a fresh process: `python -m reprocube.orchestration.bench_measure
--result FILE [--config-file F] KEY=VALUE ...` times one framework with one determinism setting and writes
its figures to FILE as JSON. The suite around it is reprocube.commands.bench (repeats) and
reprocube.results.bench_result (statistics, Markdown)."""

from __future__ import annotations

import json
import math
import os
import resource
import sys
import tempfile
import time
from pathlib import Path

from reprocube.config import load_config
from reprocube.data.pipeline import create_pipeline
from reprocube.data.sampler import EpochSampler
from reprocube.data.store import load_dataset
from reprocube.errors import TrainingError, exit_status_of
from reprocube.files import write_json_atomic
from reprocube.formats.trace import StepTrace
from reprocube.training.backend import create_backend
from reprocube.training.checkpoint import read_checkpoint, run_fields, write_checkpoint
from reprocube.training.loop import Schedule
from reprocube.training.metrics import MetricsHistory
from reprocube.training.rng import seed_host_rng
from reprocube.training.state import EpochTotals, Position, TrainState

WARM_STEPS = 20  # after the first (compiling) step, before the timed epoch


def measure(cfg) -> dict:
    """Time one framework in this process. The timed epoch is epoch 1's full order, after the first step
    and WARM_STEPS more of epoch 0; every timing ends with a host sync (epoch_totals/group_losses). The
    checkpoint write and restore are what the training loop does: TrainState captured (a host sync of
    the epoch totals included), written, read back, verified and restored (host generators included)."""
    dataset = load_dataset(cfg)
    sampler = EpochSampler(cfg.seed, len(dataset.train), cfg.batch_size, cfg.data.drop_last)
    seed_host_rng(cfg.seed)
    started = time.perf_counter()
    backend = create_backend(cfg, dataset)
    build_s = time.perf_counter() - started

    pipeline = create_pipeline(cfg, dataset.train, cfg.batch_size) if cfg.data.pipeline == "loader" else None
    try:
        first_step_s = _warm_up(backend, sampler, pipeline)
        # The timed epoch, in the groups of steps the training loop uses without logging or signals; then the
        # next epoch again with the receipt's trace kept as the loop keeps it, for its cost side by side.
        schedule = Schedule(sampler.steps_per_epoch, epochs=3, trace_every_steps=cfg.trace.every_steps)
        epoch_s, _ = _timed_epoch(backend, sampler, schedule, Position(1, 0, sampler.steps_per_epoch), pipeline)
        trace = StepTrace(cfg.trace.every_steps, first_step=2 * sampler.steps_per_epoch)
        traced_epoch_s, trace_s = _timed_epoch(
            backend, sampler, schedule, Position(2, 0, trace.first_step), pipeline, trace
        )
    finally:
        if pipeline is not None:
            pipeline.close()
    position = Position(3, 0, 3 * sampler.steps_per_epoch)

    started = time.perf_counter()
    backend.evaluate()
    eval_first_s = time.perf_counter() - started
    started = time.perf_counter()
    evaluation = backend.evaluate()
    eval_s = time.perf_counter() - started

    with tempfile.TemporaryDirectory(prefix="reprocube-bench-") as scratch:
        # What the training loop does at a checkpoint: capture the state, then write the files durably.
        started = time.perf_counter()
        state = TrainState.capture(position, backend, history=MetricsHistory())
        if not math.isfinite(state.epoch_totals.loss_sum):  # as the loop refuses to checkpoint a diverged run
            raise TrainingError(
                f"the measured epoch diverged (loss sum {state.epoch_totals.loss_sum}); try a smaller optimizer.lr"
            )
        content, manifest_fields = state.to_checkpoint({}, sampler.steps_per_epoch, run_fields(cfg.framework.name))
        path = write_checkpoint(Path(scratch), "epoch-0003", content, manifest_fields)
        checkpoint_write_s = time.perf_counter() - started
        started = time.perf_counter()
        TrainState.from_checkpoint(read_checkpoint(path), sampler.steps_per_epoch).restore(backend)
        checkpoint_restore_s = time.perf_counter() - started
        checkpoint_bytes = sum(f.stat().st_size for f in path.iterdir())

    return {
        "framework": cfg.framework.name,
        "pid": os.getpid(),
        "deterministic": bool(cfg.deterministic),
        "device": backend.info().get("device"),
        "batch_size": cfg.batch_size,
        "threads": cfg.threads,
        "steps": sampler.steps_per_epoch,
        "build_s": build_s,
        "first_step_s": first_step_s,
        "epoch_s": epoch_s,
        "traced_epoch_s": traced_epoch_s,
        "trace_s": trace_s,
        "trace_fraction": trace_s / traced_epoch_s,
        "trace_bytes_per_epoch": len(json.dumps(trace.to_json(), separators=(",", ":"))),
        "samples_per_s": sampler.num_examples / epoch_s,
        "eval_first_s": eval_first_s,
        "eval_s": eval_s,
        "test_accuracy": evaluation["test_accuracy"],
        "checkpoint_write_s": checkpoint_write_s,
        "checkpoint_restore_s": checkpoint_restore_s,
        "checkpoint_bytes": checkpoint_bytes,
        "peak_rss_mb": _peak_rss_mb(),
        "peak_gpu_mb": _peak_gpu_mb(cfg.framework.name),
    }


def _peak_rss_mb() -> float:
    """This process's peak resident memory. Not ru_maxrss: a child started by fork or vfork and exec carries
    its parent's resident size at the exec into ru_maxrss, so a large parent shows as the child's peak."""
    try:
        with open("/proc/self/status") as status:
            return next(int(line.split()[1]) for line in status if line.startswith("VmHWM:")) / 1024
    except (OSError, StopIteration, ValueError):  # not Linux
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _warm_up(backend, sampler, pipeline) -> float:
    """The first step (compiling, timed) and WARM_STEPS more of epoch 0."""
    order, warm_end = sampler.epoch_order(0), min(1 + WARM_STEPS, sampler.steps_per_epoch)
    backend.set_epoch_totals(EpochTotals())
    if pipeline is None:
        backend.begin_epoch(order)
        steps = lambda first, end: backend.train_steps(sampler.steps_bounds(first, end), first)
    else:
        pipeline.start(0, order, 0, None)
        steps = lambda first, end: backend.train_batches(pipeline.next_batches(end - first), first)
    started = time.perf_counter()
    steps(0, 1)
    backend.group_losses()
    first_step_s = time.perf_counter() - started
    steps(1, warm_end)
    backend.epoch_totals()
    return first_step_s


def _timed_epoch(backend, sampler, schedule: Schedule, position: Position, pipeline=None, trace=None):
    """(epoch seconds, seconds of trace work). The trace work is timed after a host sync (epoch_totals, not
    counted), so that an asynchronous trainer's (JAX's) queued steps are not billed to it; the sync itself
    is in the traced epoch's time. With a loader pipeline its start (worker processes) is in the epoch."""
    order = sampler.epoch_order(position.epoch)
    trace_s, started = 0.0, time.perf_counter()
    if pipeline is None:
        backend.begin_epoch(order)
    else:
        pipeline.start(position.epoch, order, 0, None)
    backend.set_epoch_totals(EpochTotals())
    while position.step_in_epoch < sampler.steps_per_epoch:
        step, end = position.step_in_epoch, schedule.group_end(position)
        if pipeline is None:
            backend.train_steps(sampler.steps_bounds(step, end), position.global_step)
        else:
            backend.train_batches(pipeline.next_batches(end - step), position.global_step)
        position.step_in_epoch, position.global_step = end, position.global_step + (end - step)
        if trace is not None:
            backend.epoch_totals()
            trace_started = time.perf_counter()
            trace.add_losses(backend.group_losses())
            if trace.boundary_due(position.global_step) or end == sampler.steps_per_epoch:
                trace.add_boundary(position.global_step, backend.export_state().weights)
            trace_s += time.perf_counter() - trace_started
    backend.epoch_totals()
    return time.perf_counter() - started, trace_s


def _peak_gpu_mb(framework: str) -> float | None:
    try:
        if framework == "pytorch":
            import torch

            return torch.cuda.max_memory_allocated() / 2**20 if torch.cuda.is_available() else None
        if framework == "jax":
            import jax

            device = jax.devices()[0]
            stats = device.memory_stats() if device.platform == "gpu" else None
            return stats["peak_bytes_in_use"] / 2**20 if stats else None
        if framework == "tensorflow":
            import tensorflow as tf

            return (
                tf.config.experimental.get_memory_info("GPU:0")["peak"] / 2**20
                if tf.config.list_logical_devices("GPU")
                else None
            )
    except (ImportError, RuntimeError, KeyError, ValueError):
        return None
    return None


def main(argv: list[str]) -> int:
    config_files, overrides, result, args = [], [], None, list(argv)
    while args:
        arg = args.pop(0)
        if arg == "--config-file" and args:
            config_files.append(args.pop(0))
        elif arg == "--result" and args:
            result = Path(args.pop(0))
        else:
            overrides.append(arg)
    if result is None:
        sys.exit(
            "usage: python -m reprocube.orchestration.bench_measure --result FILE [--config-file F] KEY=VALUE ... "
            "(use `reprocube bench`)"
        )

    def run() -> int:
        write_json_atomic(result, measure(load_config(overrides, config_files)), indent=None)
        return 0

    return exit_status_of(run)


if __name__ == "__main__":
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    sys.exit(main(sys.argv[1:]))
