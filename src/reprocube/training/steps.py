"""The walk through a run's steps, written once: the training loop (reprocube.training.loop) and the replay of one
step (reprocube.training.replay) both go this way, so the step a replay records is the step training ran.

An epoch begins by handing its example order to the data feed (and, at its first step, by resetting the
epoch totals); then steps run in groups that never cross the epoch's end, each group's data taken from
the feed. The feed is where the data comes from, behind one protocol:
  ResidentFeed  data.pipeline=resident: the dataset lives with the trainer; a group is a slice of the
                epoch's order (bounds), nothing is fetched
  LoaderFeed    data.pipeline=loader: the framework's loader (reprocube.data.pipeline) yields the batches;
                its state is saved mid-epoch and restored when the resumed epoch begins
Moving to the next epoch is the caller's (the loop evaluates and checkpoints first)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

import numpy as np

from reprocube.data.pipeline import BatchPipeline, check_position
from reprocube.data.sampler import EpochSampler
from reprocube.training.checkpoint import Checkpoint
from reprocube.training.state import EpochTotals, Position, TrainState


class Feed(Protocol):
    def start(self, epoch: int, order: np.ndarray, step_in_epoch: int, state: dict | None, origin: str) -> None:
        """Begin (or continue, at `step_in_epoch`) the epoch whose example order is `order`; `state`: a
        loader's saved state to restore (None at an epoch's start)."""

    def group(self, first: int, end: int, global_step: int) -> Callable[[], None]:
        """Steps first..end of the epoch as a call: the data is taken now, once, so that the call can be
        made twice from the same trainer state (the replay does)."""

    def state(self) -> dict | None:
        """What a mid-epoch checkpoint must hold to continue the feed (None: nothing)."""

    def close(self) -> None: ...


class ResidentFeed:
    def __init__(self, backend, sampler: EpochSampler):
        self.backend, self.sampler = backend, sampler

    def start(self, epoch: int, order: np.ndarray, step_in_epoch: int, state: dict | None, origin: str) -> None:
        self.backend.begin_epoch(order)

    def group(self, first: int, end: int, global_step: int) -> Callable[[], None]:
        bounds = self.sampler.steps_bounds(first, end)
        return lambda: self.backend.train_steps(bounds, global_step)

    def state(self) -> dict | None:
        return None

    def close(self) -> None:
        pass


class LoaderFeed:
    def __init__(self, backend, pipeline: BatchPipeline):
        self.backend, self.pipeline = backend, pipeline

    def start(self, epoch: int, order: np.ndarray, step_in_epoch: int, state: dict | None, origin: str) -> None:
        self.pipeline.start(epoch, order, step_in_epoch, state, origin)

    def group(self, first: int, end: int, global_step: int) -> Callable[[], None]:
        batches = self.pipeline.next_batches(end - first)
        return lambda: self.backend.train_batches(batches, global_step)

    def state(self) -> dict | None:
        return self.pipeline.state()

    def close(self) -> None:
        self.pipeline.close()  # its worker processes


class StepWalk:
    """One process's way through the steps, from a position the caller owns and advances through here."""

    def __init__(self, backend, sampler: EpochSampler, pipeline: BatchPipeline | None = None):
        self.backend, self.sampler = backend, sampler
        self.feed: Feed = ResidentFeed(backend, sampler) if pipeline is None else LoaderFeed(backend, pipeline)
        self.has_loader = pipeline is not None
        self.started_epoch: int | None = None
        self.saved_loader: dict | None = None  # to restore when the resumed epoch begins
        self.saved_origin = "the checkpoint"  # where it was read (named by the pipeline's checks)

    def resume(self, checkpoint: Checkpoint) -> TrainState:
        """The checkpoint's state put into the trainer, and its loader state (checked against its
        position) kept for the resumed epoch's beginning; the state, for the caller's records."""
        state = TrainState.resume_from(checkpoint, self.sampler.steps_per_epoch, self.backend)
        if self.has_loader:
            where = f"checkpoint {checkpoint.path}"
            check_position(state.loader, state.position.epoch, state.position.step_in_epoch, where)
            self.saved_loader, self.saved_origin = state.loader, where
        return state

    def begin_epoch(self, position: Position) -> None:
        """The epoch of `position` handed to the feed, once per epoch however often it is called."""
        if self.started_epoch == position.epoch:
            return
        order = self.sampler.epoch_order(position.epoch)
        self.feed.start(position.epoch, order, position.step_in_epoch, self.saved_loader, self.saved_origin)
        self.saved_loader = None
        if position.step_in_epoch == 0:
            self.backend.set_epoch_totals(EpochTotals())
        self.started_epoch = position.epoch

    def group(self, position: Position, end: int) -> Callable[[], None]:
        """The steps from `position` to `end` (within its epoch) as a call, their data taken now."""
        self.begin_epoch(position)
        return self.feed.group(position.step_in_epoch, end, position.global_step)

    def train(self, position: Position, end: int) -> None:
        """Train the steps from `position` to `end` (within its epoch) and move `position` there."""
        self.group(position, end)()
        position.step_in_epoch, position.global_step = end, position.global_step + (end - position.step_in_epoch)

    def loader_state(self, position: Position) -> dict | None:
        """What a checkpoint at `position` holds of the feed: a loader's state mid-epoch, else nothing."""
        return self.feed.state() if position.step_in_epoch > 0 else None

    def close(self) -> None:
        self.feed.close()
