"""JAX: Google Grain's DataLoader (`workers` worker processes) over the epoch's batches, its iterator state
(Grain's own JSON) in the checkpoint. Grain checks on restore that the sampler, the
data source and the worker count are the ones the state was made with, by their repr: the source's repr
names the epoch and its size, stable across processes."""

from __future__ import annotations

import json

import grain.python as grain
import numpy as np
from absl import flags

from reprocube.data.pipeline import Batch, ExampleSource
from reprocube.errors import CheckpointError


class _EpochBatches(grain.RandomAccessDataSource):
    """Record i is batch `first + i` of the epoch, its examples augmented. Whole batches, not examples, are
    the records: Grain runs its operations (a Batch too) inside each worker on the records that worker
    gets, round-robin, so batching examples there would make a batch's examples depend on the worker
    count."""

    def __init__(self, source: ExampleSource, epoch: int, order: np.ndarray, batch_size: int, steps: int, first: int):
        self.source, self.epoch, self.order = source, epoch, order
        self.batch_size, self.steps, self.first = batch_size, steps, first

    def __len__(self) -> int:
        return self.steps - self.first

    def __getitem__(self, record: int):
        lo = (self.first + record) * self.batch_size
        return self.source.examples(self.epoch, self.order[lo : lo + self.batch_size])

    def __repr__(self) -> str:
        return f"reprocube.EpochBatches(epoch={self.epoch}, batches={self.first}..{self.steps})"


class GrainPipeline:
    def __init__(self, source: ExampleSource, batch_size: int, drop_last: bool, workers: int, seed: int):
        if not flags.FLAGS.is_parsed():
            flags.FLAGS.mark_as_parsed()  # Grain's workers read absl flags (their defaults); nothing else parses them
        self.source, self.batch_size, self.drop_last, self.workers = source, batch_size, drop_last, workers
        self.iterator = None
        self.epoch = self.step_in_epoch = 0

    def start(self, epoch: int, order: np.ndarray, step_in_epoch: int, state: dict | None) -> None:
        self.close()
        self.epoch, self.step_in_epoch = epoch, step_in_epoch
        steps = len(order) // self.batch_size if self.drop_last else -(-len(order) // self.batch_size)
        # Grain restores its own state only with the worker count it was saved with; with another count the
        # source starts at the position (the batches and their augmentation follow from it alone).
        own_state = state is not None and state.get("workers") == self.workers
        first = 0 if own_state or state is None else step_in_epoch
        source = _EpochBatches(self.source, epoch, order, self.batch_size, steps, first)
        loader = grain.DataLoader(
            data_source=source,
            sampler=grain.IndexSampler(len(source), shuffle=False, num_epochs=1),  # the order is the source's
            worker_count=self.workers,
        )
        self.iterator = iter(loader)
        if own_state:
            try:
                self.iterator.set_state(json.dumps(state["grain"]).encode())
            except (ValueError, KeyError, TypeError) as exc:
                raise CheckpointError(
                    f"the checkpoint's Grain iterator state does not fit this loader: {' '.join(str(exc).split())}"
                ) from None

    def next_batches(self, count: int) -> list[Batch]:
        batches = [tuple(np.asarray(a) for a in next(self.iterator)) for _ in range(count)]
        self.step_in_epoch += count
        return batches

    def state(self) -> dict:
        grain_state = json.loads(self.iterator.get_state())
        return {"epoch": self.epoch, "step_in_epoch": self.step_in_epoch, "workers": self.workers, "grain": grain_state}

    def close(self) -> None:
        self.iterator = None
