"""The shared training loop: data order, epoch and mid-epoch checkpoints, metrics, progress,
signals and resume. Framework code stays behind the Backend contract (reprocube.training.backend); what a
checkpoint holds, and how it is read back, is reprocube.training.state."""

from __future__ import annotations

import math
import os
import signal
import sys
import time
from dataclasses import dataclass

from tqdm import tqdm

from reprocube.config import config_hash, to_plain
from reprocube.data.pipeline import create_pipeline
from reprocube.data.sampler import EpochSampler
from reprocube.data.store import load_dataset
from reprocube.errors import EXIT_OK, EXIT_PREEMPTED, ConfigError, TrainingError
from reprocube.formats.env import collect_env, threads_warning, usable_cpus
from reprocube.formats.env_comparison import NUMERIC_SETTINGS, env_differences, not_a_cause
from reprocube.formats.trace import StepTrace
from reprocube.terminal import counted, raw_stderr, shown_value
from reprocube.training.backend import STEPS_PER_CALL, Backend, create_backend
from reprocube.training.checkpoint import (
    Checkpoint,
    epoch_name,
    run_fields,
    step_name,
    weights_digest,
    write_checkpoint,
)
from reprocube.training.metrics import MetricsHistory
from reprocube.training.preemption import StopRequest
from reprocube.training.receipt_writer import build_receipt, write_receipt
from reprocube.training.rng import seed_host_rng
from reprocube.training.runs import RunDirectory, open_run
from reprocube.training.state import SESSION_ENV, SESSION_FROM_STEP, EpochTotals, FrameworkState, Position, TrainState
from reprocube.training.steps import StepWalk


@dataclass(frozen=True)
class Schedule:
    """When the loop has something to do besides training: pure arithmetic on the position, so that a
    resumed run acts at the same global steps as the uninterrupted one."""

    steps_per_epoch: int
    epochs: int
    log_every_steps: int = 0  # 0: never
    checkpoint_every_steps: int = 0  # 0: never
    checkpoint_every_epochs: int = 1
    preempt_at_step: int | None = None
    trace_every_steps: int = 0  # 0: weight digests at epoch ends and checkpoints only
    trace_at_steps: frozenset[int] = frozenset()  # and at these global steps

    @classmethod
    def from_config(cls, cfg, steps_per_epoch: int) -> Schedule:
        return cls(
            steps_per_epoch,
            cfg.epochs,
            cfg.log.every_steps,
            cfg.checkpoint.every_steps,
            cfg.checkpoint.every_epochs,
            cfg.preempt_at_step,
            cfg.trace.every_steps,
            frozenset(cfg.trace.at_steps),
        )

    def group_end(self, position: Position) -> int:
        """The end (a step in the epoch) of the next group of steps: the first step after which the loop
        has something to do (a loss record, a mid-epoch checkpoint, a trace boundary, the preemption drill,
        the epoch's end), at most STEPS_PER_CALL away, which bounds how long a signal waits."""
        step, done = position.step_in_epoch, position.global_step
        end = min(self.steps_per_epoch, step + STEPS_PER_CALL)
        for every in (self.log_every_steps, self.checkpoint_every_steps, self.trace_every_steps):
            if every:
                end = min(end, step + every - done % every)
        for at in (self.preempt_at_step, min((s for s in self.trace_at_steps if s > done), default=None)):
            if at is not None and at > done:
                end = min(end, step + at - done)
        return end

    def trace_boundary_due(self, global_step: int) -> bool:
        every = self.trace_every_steps
        return bool(every) and global_step % every == 0 or global_step in self.trace_at_steps

    def log_due(self, global_step: int) -> bool:
        return bool(self.log_every_steps) and global_step % self.log_every_steps == 0

    def epoch_checkpoint_due(self, epochs_done: int) -> bool:
        return epochs_done == self.epochs or epochs_done % self.checkpoint_every_epochs == 0

    def mid_epoch_checkpoint_due(self, position: Position) -> bool:
        every = self.checkpoint_every_steps
        if not every or position.global_step % every:
            return False
        # At an epoch's end the epoch checkpoint follows with the same state (and the evaluation).
        at_epoch_end = position.step_in_epoch == self.steps_per_epoch
        return not (at_epoch_end and self.epoch_checkpoint_due(position.epoch + 1))


def train(cfg, out=print) -> int:
    """Train (or resume) the run described by `cfg`; returns the exit status."""
    with StopRequest() as stop:  # from the start: a signal during set-up still ends in a checkpoint
        config = to_plain(cfg)
        warning = threads_warning(cfg.framework.name, cfg.threads, usable_cpus() or os.cpu_count())
        if warning:
            print(f"reprocube: warning: {warning}", file=sys.stderr)
        with open_run(cfg, config) as (run, checkpoint):
            dataset = load_dataset(cfg)
            try:
                sampler = EpochSampler(cfg.seed, len(dataset.train), cfg.batch_size, cfg.data.drop_last)
            except ValueError as exc:
                raise ConfigError(str(exc)) from None
            seed_host_rng(cfg.seed)
            backend = create_backend(cfg, dataset)
            pipeline = create_pipeline(cfg, dataset.train, cfg.batch_size) if cfg.data.pipeline == "loader" else None
            loop = TrainingLoop(cfg, config, run, sampler, backend, out, pipeline)
            if checkpoint:
                loop.restore(checkpoint)
            # Only now, with data, trainer and checkpoint all accepted, is the run directory written.
            loop.begin_session(collect_env(loop.framework_info))
            run.initialize(
                config, loop.history, loop.env, checkpoint.path if checkpoint else None, loop.position.as_dict()
            )
            return loop.run(stop)


class TrainingLoop:
    """One process's training of a run: from a fresh start or a checkpoint, to the last epoch or a stop."""

    def __init__(
        self, cfg, config: dict, run: RunDirectory, sampler: EpochSampler, backend: Backend, out, pipeline=None
    ):
        self.cfg, self.config, self.run_dir, self.sampler, self.backend, self.out = (
            cfg,
            config,
            run,
            sampler,
            backend,
            out,
        )
        self.schedule = Schedule.from_config(cfg, sampler.steps_per_epoch)
        self.position = Position()
        self.history = MetricsHistory()
        self.config_hash = config_hash(config)
        self.framework_info = backend.info()
        self.env: dict = {}  # env.json's fingerprint of this process, for the receipt
        self.trace = StepTrace(cfg.trace.every_steps, first_step=0)
        self.sessions: list[dict] = []  # [{from_step, env}] of every process that trained this run
        # The way through the steps (reprocube.training.steps), the replay's too; pipeline: data.pipeline=loader.
        self.walk = StepWalk(backend, sampler, pipeline)

    # --- save and resume: mirror images through TrainState ----------------------------------------
    def _save(self, name: str, reason: str, framework: FrameworkState | None = None):
        framework = framework or self.backend.export_state()
        self.trace.add_boundary(self.position.global_step, framework.weights)
        loader = self.walk.loader_state(self.position)
        state = TrainState.capture(
            self.position, self.backend, self.history, framework, self.trace, loader, self.sessions
        )
        if not math.isfinite(state.epoch_totals.loss_sum):
            raise TrainingError(
                f"training diverged at global step {self.position.global_step} "
                f"(loss is {state.epoch_totals.loss_sum}); earlier checkpoints are kept; try a smaller optimizer.lr"
            )
        identity = run_fields(self.cfg.framework.name, self.framework_info, self.cfg.seed, self.config_hash, reason)
        content, manifest_fields = state.to_checkpoint(self.config, self.sampler.steps_per_epoch, identity)
        path = write_checkpoint(self.run_dir.checkpoints, name, content, manifest_fields)
        # After the checkpoint: a receipt never describes a state that no checkpoint holds.
        write_receipt(
            self.run_dir.path,
            build_receipt(
                self.config, self.env, self.history, self.trace, self.position, self.run_dir.checkpoints, self.sessions
            ),
        )
        return path

    def restore(self, checkpoint: Checkpoint) -> None:
        state = self.walk.resume(checkpoint)
        self.position, self.history = state.position, state.history
        self.sessions = list(state.sessions or [])  # the earlier processes'; begin_session adds this one
        if state.trace is not None:
            self.trace = state.trace
            self.trace.every_steps = self.cfg.trace.every_steps  # a cadence, like log.every_steps
        else:  # a checkpoint from before traces: this run's trace starts here
            self.trace = StepTrace(self.cfg.trace.every_steps, first_step=self.position.global_step)
        p = self.position
        self.out(
            f"resumed from {checkpoint.path} at epoch {p.epoch}, step {p.step_in_epoch} (global step {p.global_step})"
        )
        self._note_environment_change(checkpoint)

    def begin_session(self, env: dict) -> None:
        """This process's session: from where it starts, under its environment. A resume whose settings
        that change numbers differ from the previous session's is said (the run then mixes two settings)."""
        self.env = env
        if self.sessions:
            previous = self.sessions[-1][SESSION_ENV]
            changed = [row for row in env_differences(previous, env) if "not_a_cause" not in row]
            changed = [row for row in changed if row["key"].startswith(NUMERIC_SETTINGS)]
            if changed:
                shown = "; ".join(f"{r['key']}: {shown_value(r['a'])} -> {shown_value(r['b'])}" for r in changed[:6])
                self.out(
                    f"note: this session's numeric settings differ from the previous session's ({shown}); the run's "
                    "steps before and after this resume are computed under different settings "
                    "(the receipt records both)"
                )
        self.sessions.append({SESSION_FROM_STEP: self.position.global_step, SESSION_ENV: env})

    def _note_environment_change(self, checkpoint: Checkpoint) -> None:
        """Resuming elsewhere (another device, library version, CPU kernels) is allowed, but the result
        may then differ from an uninterrupted run where the checkpoint was made: say so."""
        saved = checkpoint.manifest.framework_info
        if not isinstance(saved, dict):
            return
        changed = [
            f"{k}: {saved.get(k)} -> {self.framework_info.get(k)}"
            for k in sorted(set(saved) | set(self.framework_info))
            if saved.get(k) != self.framework_info.get(k)
            and not not_a_cause(f"framework.{k}", saved.get("backend"), self.framework_info.get("backend"))
        ]
        if changed:
            self.out(
                "note: resuming in a different environment (bit-exactness with the original machine is not expected): "
                + "; ".join(changed)
            )

    # --- the loop -----------------------------------------------------------------------------
    def run(self, stop: StopRequest) -> int:
        cfg = self.cfg
        if self.position.epoch >= cfg.epochs:
            self.out(f"{self.run_dir.path}: already trained for {counted(self.position.epoch, 'epoch')}; nothing to do")
            return EXIT_OK
        show_progress = cfg.log.progress is True or (cfg.log.progress == "auto" and sys.stderr.isatty())
        try:
            return self._run(stop, show_progress)
        finally:
            self.walk.close()

    def _run(self, stop: StopRequest, show_progress: bool) -> int:
        cfg, sampler, backend = self.cfg, self.sampler, self.backend
        fresh = self.position.global_step == 0 and self.trace.last_step == 0
        if fresh or not self.trace.tensor_names:
            weights = backend.export_state().weights
            if not self.trace.tensor_names:  # the columns of the per-tensor fingerprints, before any boundary
                self.trace.tensor_names = sorted(weights)
            if fresh:  # the initial weights' digests
                self.trace.add_boundary(0, weights)
        while self.position.epoch < cfg.epochs:
            position = self.position
            self.walk.begin_epoch(position)
            first_step, started = position.step_in_epoch, time.perf_counter()
            bar = tqdm(
                total=sampler.steps_per_epoch,
                initial=first_step,
                desc=f"epoch {position.epoch + 1}/{cfg.epochs}",
                disable=not show_progress,
                file=raw_stderr(),  # the bar's carriage returns are not escaped; it prints no file's value
                leave=False,
            )
            while position.step_in_epoch < sampler.steps_per_epoch:
                step, end = position.step_in_epoch, self.schedule.group_end(position)
                self.walk.train(position, end)
                losses = backend.group_losses()
                self.trace.add_losses(losses, backend.group_fingerprints())
                bar.update(end - step)
                self._log_step(float(losses[-1]))
                if self.schedule.trace_boundary_due(position.global_step) and end < sampler.steps_per_epoch:
                    self.trace.add_boundary(position.global_step, backend.export_state().weights)
                if position.global_step == cfg.preempt_at_step:
                    os.kill(os.getpid(), signal.SIGTERM)  # a drill through the real signal path
                # A stop at an epoch's last step ends the epoch first (its evaluation, record and
                # checkpoint): a checkpoint is never written at step_in_epoch == steps_per_epoch.
                if stop.requested and position.step_in_epoch < sampler.steps_per_epoch:
                    bar.close()
                    path = self._save(step_name(position.global_step), reason=stop.signal_name)
                    self.out(f"stopped by {stop.signal_name}: checkpoint {path}; continue with resume=latest")
                    return EXIT_PREEMPTED
                if self.schedule.mid_epoch_checkpoint_due(position):
                    self._save(step_name(position.global_step), reason="every_steps")
            bar.close()
            self._finish_epoch(started, position.step_in_epoch - first_step, stop)
            if self.position.epoch == cfg.stop_after_epoch and self.position.epoch < cfg.epochs:
                self.out(f"stopped after epoch {self.position.epoch} (stop_after_epoch); continue with resume=latest")
                return EXIT_OK
            if stop.requested and self.position.epoch < cfg.epochs:
                self.out(
                    f"stopped by {stop.signal_name} after epoch {self.position.epoch}; continue with resume=latest"
                )
                return EXIT_PREEMPTED
        self.out(
            f"done: {self.run_dir.path} ({counted(self.position.epoch, 'epoch')}, "
            f"weights_digest {self.history.epochs[-1]['weights_digest']})"
        )
        return EXIT_OK

    def _log_step(self, loss: float) -> None:
        if self.schedule.log_due(self.position.global_step):
            # `epoch` counts from 1 here, as in the epoch records and the progress bar.
            record = {
                "epoch": self.position.epoch + 1,
                "global_step": self.position.global_step,
                "loss": loss if math.isfinite(loss) else None,  # strict JSON: a diverged step is null
            }
            self.history.steps.append(record)
            self.run_dir.metrics.append("step", record)

    def _finish_epoch(self, started: float, steps_run: int, stop: StopRequest) -> None:
        seen = min(self.position.step_in_epoch * self.sampler.batch_size, self.sampler.num_examples)
        totals = self.backend.epoch_totals()
        # Timed after reading the totals, a host sync: an asynchronous trainer (JAX) may only have queued its steps.
        wall_s = time.perf_counter() - started
        evaluation = self.backend.evaluate()
        self.position = Position(self.position.epoch + 1, 0, self.position.global_step)
        self.backend.set_epoch_totals(EpochTotals())  # the checkpoint's position is the start of the next epoch
        samples = min(steps_run * self.sampler.batch_size, self.sampler.num_examples)
        record = {
            "epoch": self.position.epoch,
            "global_step": self.position.global_step,
            "train_loss": totals.loss_sum / seen,
            "train_accuracy": totals.correct / seen,
            **evaluation,
            "wall_s": round(wall_s, 4),
            "samples_per_s": round(samples / wall_s, 1) if wall_s > 0 else None,
        }
        if not all(math.isfinite(record[k]) for k in ("train_loss", "test_loss")):
            raise TrainingError(
                f"training diverged in epoch {self.position.epoch} "
                f"(train_loss {record['train_loss']}, test_loss {record['test_loss']}); "
                f"earlier checkpoints are kept; try a smaller optimizer.lr"
            )
        framework_state = self.backend.export_state()
        record["weights_digest"] = weights_digest(framework_state.weights)
        self.trace.add_boundary(self.position.global_step, framework_state.weights)
        self.history.epochs.append(record)
        # A stop requested before or during the evaluation still needs this epoch's checkpoint.
        stopping_here = self.position.epoch == self.cfg.stop_after_epoch
        if stop.requested or stopping_here or self.schedule.epoch_checkpoint_due(self.position.epoch):
            self._save(epoch_name(self.position.epoch), reason="epoch", framework=framework_state)
        self.run_dir.metrics.append("epoch", record)
        self.out(
            f"epoch {self.position.epoch}/{self.cfg.epochs}: train_loss {record['train_loss']:.4f} "
            f"test_loss {record['test_loss']:.4f} test_accuracy {record['test_accuracy']:.4f} "
            f"({wall_s:.2f} s, {record['samples_per_s']} samples/s)"
        )
