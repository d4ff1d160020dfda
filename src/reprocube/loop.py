"""The shared training loop: data order, epoch and mid-epoch checkpoints, metrics, progress,
signals and resume. Framework code stays behind the Backend contract (reprocube.backend)."""

from __future__ import annotations

import math
import os
import signal
import sys
import time
from dataclasses import dataclass

from tqdm import tqdm

from reprocube.backend import STEPS_PER_CALL, Backend, FrameworkState, create_backend
from reprocube.checkpoint import Checkpoint, CheckpointContent, epoch_name, step_name, weights_digest, write_checkpoint
from reprocube.config import config_hash, to_plain
from reprocube.data.sampler import EpochSampler
from reprocube.data.store import load_dataset
from reprocube.env import collect_env
from reprocube.errors import EXIT_OK, EXIT_PREEMPTED, CheckpointError, ConfigError, TrainingError
from reprocube.metrics import MetricsHistory
from reprocube.preemption import StopRequest
from reprocube.rng import capture_host_rng, restore_host_rng, seed_host_rng, split_host_rng
from reprocube.runs import RunDirectory, open_run


@dataclass
class Position:
    """Where training stands: `epoch` epochs are complete, and `step` steps of the next one."""

    epoch: int = 0
    step: int = 0
    global_step: int = 0

    def as_dict(self) -> dict:
        return {"epoch": self.epoch, "step_in_epoch": self.step, "global_step": self.global_step}


def train(cfg, out=print) -> int:
    """Train (or resume) the run described by `cfg`; returns the exit status."""
    with StopRequest() as stop:  # from the start: a signal during set-up still ends in a checkpoint
        config = to_plain(cfg)
        with open_run(cfg, config) as (run, checkpoint):
            dataset = load_dataset(cfg)
            try:
                sampler = EpochSampler(cfg.seed, len(dataset.train), cfg.batch_size, cfg.data.drop_last)
            except ValueError as exc:
                raise ConfigError(str(exc)) from None
            seed_host_rng(cfg.seed)
            backend = create_backend(cfg, dataset)
            trainer = _Trainer(cfg, config, run, sampler, backend, out)
            if checkpoint:
                trainer.restore(checkpoint)
            # Only now, with data, trainer and checkpoint all accepted, is the run directory written.
            run.initialize(config, trainer.history, collect_env(trainer.framework_info), checkpoint.path if checkpoint else None, trainer.position.as_dict())
            return trainer.run(stop)


class _Trainer:
    def __init__(self, cfg, config: dict, run: RunDirectory, sampler: EpochSampler, backend: Backend, out):
        self.cfg, self.config, self.run_dir, self.sampler, self.backend, self.out = cfg, config, run, sampler, backend, out
        self.position = Position()
        self.history = MetricsHistory()
        self.config_hash = config_hash(config)
        self.framework_info = backend.info()

    # --- resume -------------------------------------------------------------------------------
    def restore(self, checkpoint: Checkpoint) -> None:
        manifest, content = checkpoint.manifest, checkpoint.content
        try:
            position = content.state["position"]
            self.position = Position(position["epoch"], position["step_in_epoch"], position["global_step"])
            loss_sum, correct = content.state["epoch_totals"]["loss_sum"], content.state["epoch_totals"]["correct"]
            rng_meta = content.state["rng"]
            framework_meta = content.state["framework"]
        except (KeyError, TypeError) as exc:
            raise CheckpointError(f"checkpoint {checkpoint.path}: state.json lacks {exc}") from None
        p = self.position
        valid = all(isinstance(v, int) and v >= 0 for v in (p.epoch, p.step, p.global_step, correct)) and p.step <= self.sampler.steps_per_epoch
        if not valid or not isinstance(loss_sum, float) or manifest.get("global_step") != p.global_step or manifest.get("steps_per_epoch") != self.sampler.steps_per_epoch:
            raise CheckpointError(f"checkpoint {checkpoint.path}: its position does not match its manifest or this dataset")
        host, framework_rng = split_host_rng(content.rng)
        try:
            self.backend.import_state(FrameworkState(content.weights, content.optimizer, framework_rng, framework_meta))
        except (RuntimeError, TypeError, ValueError) as exc:
            raise CheckpointError(f"checkpoint {checkpoint.path}: unusable framework state ({' '.join(str(exc).split())})") from None
        self.backend.set_epoch_totals(loss_sum, correct)
        restore_host_rng(host, rng_meta)
        self.history = MetricsHistory.from_manifest(manifest)
        self.out(f"resumed from {checkpoint.path} at epoch {p.epoch}, step {p.step} (global step {p.global_step})")
        self._note_environment_change(checkpoint)

    def _note_environment_change(self, checkpoint: Checkpoint) -> None:
        """Resuming elsewhere (another device, library version, CPU kernels) is allowed, but the result
        may then differ from an uninterrupted run where the checkpoint was made: say so."""
        saved = checkpoint.manifest.get("framework_info")
        if not isinstance(saved, dict):
            return
        changed = [f"{k}: {saved.get(k)} -> {self.framework_info.get(k)}" for k in sorted(set(saved) | set(self.framework_info)) if saved.get(k) != self.framework_info.get(k)]
        if changed:
            self.out("note: resuming in a different environment (bit-exactness with the original machine is not expected): " + "; ".join(changed))

    # --- the loop -----------------------------------------------------------------------------
    def run(self, stop: StopRequest) -> int:
        cfg, sampler, backend = self.cfg, self.sampler, self.backend
        if self.position.epoch >= cfg.epochs:
            self.out(f"{self.run_dir.path}: already trained for {self.position.epoch} epochs; nothing to do")
            return EXIT_OK
        show_progress = cfg.log.progress is True or (cfg.log.progress == "auto" and sys.stderr.isatty())
        while self.position.epoch < cfg.epochs:
            epoch = self.position.epoch
            backend.begin_epoch(sampler.epoch_order(epoch))
            if self.position.step == 0:
                backend.set_epoch_totals(0.0, 0)
            first_step, started = self.position.step, time.perf_counter()
            bar = tqdm(total=sampler.steps_per_epoch, initial=first_step, desc=f"epoch {epoch + 1}/{cfg.epochs}", disable=not show_progress, file=sys.stderr, leave=False)
            step = first_step
            while step < sampler.steps_per_epoch:
                end = self._steps_until_action(step)
                backend.train_steps(sampler.steps_bounds(step, end), self.position.global_step)
                self.position.step, self.position.global_step = end, self.position.global_step + (end - step)
                bar.update(end - step)
                step = end
                self._log_step()
                if self.position.global_step == cfg.preempt_at_step:
                    os.kill(os.getpid(), signal.SIGTERM)  # a drill through the real signal path
                if stop.requested:
                    bar.close()
                    path = self._save(step_name(self.position.global_step), reason=stop.signal_name)
                    self.out(f"stopped by {stop.signal_name}: checkpoint {path}; continue with resume=latest")
                    return EXIT_PREEMPTED
                if self._mid_epoch_checkpoint_due():
                    self._save(step_name(self.position.global_step), reason="every_steps")
            bar.close()
            self._finish_epoch(started, self.position.step - first_step, stop)
            if stop.requested and self.position.epoch < cfg.epochs:
                self.out(f"stopped by {stop.signal_name} after epoch {self.position.epoch}; continue with resume=latest")
                return EXIT_PREEMPTED
        self.out(f"done: {self.run_dir.path} ({self.position.epoch} epochs, weights_digest {self.history.epochs[-1]['weights_digest']})")
        return EXIT_OK

    def _steps_until_action(self, step: int) -> int:
        """The end of the next group of steps: the first step after which the loop has something to do
        (a loss record, a mid-epoch checkpoint, the preemption drill, the epoch's end), at most
        STEPS_PER_CALL away, which bounds how long a signal waits."""
        done = self.position.global_step
        end = min(self.sampler.steps_per_epoch, step + STEPS_PER_CALL)
        for every in (self.cfg.log.every_steps, self.cfg.checkpoint.every_steps):
            if every:
                end = min(end, step + every - done % every)
        if self.cfg.preempt_at_step is not None and self.cfg.preempt_at_step > done:
            end = min(end, step + self.cfg.preempt_at_step - done)
        return end

    def _epoch_checkpoint_due(self, epochs_done: int) -> bool:
        return epochs_done == self.cfg.epochs or epochs_done % self.cfg.checkpoint.every_epochs == 0

    def _mid_epoch_checkpoint_due(self) -> bool:
        every = self.cfg.checkpoint.every_steps
        if not every or self.position.global_step % every:
            return False
        # At an epoch's end the epoch checkpoint follows with the same state (and the evaluation).
        at_epoch_end = self.position.step == self.sampler.steps_per_epoch
        return not (at_epoch_end and self._epoch_checkpoint_due(self.position.epoch + 1))

    def _log_step(self) -> None:
        every = self.cfg.log.every_steps
        if every and self.position.global_step % every == 0:
            # `epoch` counts from 1 here, as in the epoch records and the progress bar.
            record = {"epoch": self.position.epoch + 1, "global_step": self.position.global_step, "loss": self.backend.last_loss()}
            self.history.steps.append(record)
            self.run_dir.metrics.append("step", record)

    def _finish_epoch(self, started: float, steps_run: int, stop: StopRequest) -> None:
        seen = min(self.position.step * self.sampler.batch_size, self.sampler.num_examples)
        totals = self.backend.epoch_totals()
        # Timed after reading the totals, a host sync: an asynchronous trainer (JAX) may only have queued its steps.
        wall_s = time.perf_counter() - started
        evaluation = self.backend.evaluate()
        self.position = Position(self.position.epoch + 1, 0, self.position.global_step)
        self.backend.set_epoch_totals(0.0, 0)  # the checkpoint's position is the start of the next epoch
        samples = min(steps_run * self.sampler.batch_size, self.sampler.num_examples)
        record = {
            "epoch": self.position.epoch,
            "global_step": self.position.global_step,
            "train_loss": totals["loss_sum"] / seen,
            "train_accuracy": totals["correct"] / seen,
            **evaluation,
            "wall_s": round(wall_s, 4),
            "samples_per_s": round(samples / wall_s, 1) if wall_s > 0 else None,
        }
        if not all(math.isfinite(record[k]) for k in ("train_loss", "test_loss")):
            raise TrainingError(
                f"training diverged in epoch {self.position.epoch} (train_loss {record['train_loss']}, test_loss {record['test_loss']}); "
                f"earlier checkpoints are kept; try a smaller optimizer.lr"
            )
        framework_state = self.backend.export_state()
        record["weights_digest"] = weights_digest(framework_state.weights)
        self.history.epochs.append(record)
        # A stop requested before or during the evaluation still needs this epoch's checkpoint.
        if stop.requested or self._epoch_checkpoint_due(self.position.epoch):
            self._save(epoch_name(self.position.epoch), reason="epoch", framework=framework_state)
        self.run_dir.metrics.append("epoch", record)
        self.out(
            f"epoch {self.position.epoch}/{self.cfg.epochs}: train_loss {record['train_loss']:.4f} "
            f"test_loss {record['test_loss']:.4f} test_accuracy {record['test_accuracy']:.4f} "
            f"({wall_s:.2f} s, {record['samples_per_s']} samples/s)"
        )

    def _save(self, name: str, reason: str, framework: FrameworkState | None = None):
        framework = framework or self.backend.export_state()
        totals = self.backend.epoch_totals()
        if not math.isfinite(totals["loss_sum"]):
            raise TrainingError(f"training diverged at global step {self.position.global_step} (loss is {totals['loss_sum']}); earlier checkpoints are kept; try a smaller optimizer.lr")
        host_arrays, host_meta = capture_host_rng()
        position = self.position.as_dict()
        state = {"position": position, "epoch_totals": totals, "rng": host_meta, "framework": framework.meta}
        content = CheckpointContent(framework.weights, framework.optimizer, {**host_arrays, **framework.rng}, state, self.config)
        manifest_fields = {
            "framework": self.cfg.framework.name,
            "framework_info": self.framework_info,
            **position,
            "steps_per_epoch": self.sampler.steps_per_epoch,
            "seed": self.cfg.seed,
            "config_hash": self.config_hash,
            "reason": reason,
            "metrics": self.history.as_dict(),
        }
        return write_checkpoint(self.run_dir.checkpoints, name, content, manifest_fields)
