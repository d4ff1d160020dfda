"""JAX: Google Grain's DataLoader (`workers` worker processes) over the epoch's batches, its iterator state
(Grain's own JSON) in the checkpoint. Grain checks on restore that the sampler, the
data source and the worker count are the ones the state was made with, by their repr: the source's repr
names the epoch and its size, stable across processes.

The state read back is checked first (grain_schema: exactly what Grain 0.2 writes for this loader, every
index the position's), since Grain trusts the rest of it: an index past the source fails in a worker
(IndexError), an edited one resumes at another batch."""

from __future__ import annotations

import json
import re

import grain.python as grain
import numpy as np
from absl import flags

from reprocube.data.pipeline import (
    EPOCH,
    STEP_IN_EPOCH,
    WORKERS,
    Batch,
    ExampleSource,
    Integer,
    RestoredStateGuard,
    StateSchema,
    Text,
    check_envelope,
    run_context,
)
from reprocube.data.sampler import steps_per_epoch

LIBRARY = "grain"  # the library state's key in reprocube's loader state
GRAIN_STATE_VERSION = 2  # the "version" Grain's DataLoader writes (grain 0.2)
_SOURCE_REPR = re.compile(r"reprocube\.EpochBatches\(epoch=\d{1,9}, batches=(\d{1,9})\.\.\d{1,9}\)")


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
        return self.describe(self.epoch, self.first, self.steps)

    @staticmethod
    def describe(epoch: int, first: int, steps: int) -> str:
        return f"reprocube.EpochBatches(epoch={epoch}, batches={first}..{steps})"


def _sampler(records: int) -> grain.IndexSampler:
    return grain.IndexSampler(records, shuffle=False, num_epochs=1)  # the order is the source's


def grain_schema(epoch: int, step_in_epoch: int, steps: int, workers: int, first: int | None) -> dict:
    """Grain's DataLoader state (JSON) after `step_in_epoch` batches of the epoch, by a loader whose source
    started at batch `first` (> 0 when it started mid-epoch from the position: resumed with another worker
    count; None: the structure only). Records go round-robin to the workers (to the one lane when there
    are none); Grain records the last index each has produced and the last worker that produced one."""
    lanes = max(workers, 1)
    if first is None:
        return {
            "data_source": Text(),
            "last_seen_indices": {str(i): Integer(-lanes, steps - 1) for i in range(lanes)},
            "last_worker_index": Integer(-1, lanes - 1),
            "sampler": Text(),
            "version": GRAIN_STATE_VERSION,
            "worker_count": workers,
        }
    consumed = step_in_epoch - first  # this loader's records so far
    return {
        "data_source": _EpochBatches.describe(epoch, first, steps),
        "last_seen_indices": {str(i): i - lanes + (consumed - i + lanes - 1) // lanes * lanes for i in range(lanes)},
        "last_worker_index": consumed % lanes - 1,
        "sampler": repr(_sampler(steps - first)),
        "version": GRAIN_STATE_VERSION,
        "worker_count": workers,
    }


def check_state(
    state: dict,
    epoch: int,
    step_in_epoch: int,
    examples: int,
    batch_size: int,
    steps: int,
    origin: str = "the checkpoint",
):
    """Check a loader state from a checkpoint (GrainPipeline.state()) against this run: one CheckpointError
    naming the key otherwise. Returns (the worker count it was made with, the batch its source started at)."""
    schema = StateSchema(origin, run_context(epoch, step_in_epoch, steps, examples, batch_size))
    workers = check_envelope(schema, state, epoch, step_in_epoch, steps, LIBRARY)
    schema.context = run_context(epoch, step_in_epoch, steps, examples, batch_size, workers)
    schema.check(state[LIBRARY], grain_schema(epoch, step_in_epoch, steps, workers, None), LIBRARY)
    match = _SOURCE_REPR.fullmatch(state[LIBRARY]["data_source"])
    first = int(match[1]) if match and int(match[1]) < step_in_epoch else 0
    schema.check(state[LIBRARY], grain_schema(epoch, step_in_epoch, steps, workers, first), LIBRARY)
    return workers, first


class GrainPipeline(RestoredStateGuard):
    LIBRARY = LIBRARY
    LIBRARY_NAME = "Grain's DataLoader"

    def __init__(self, source: ExampleSource, batch_size: int, drop_last: bool, workers: int, seed: int):
        if not flags.FLAGS.is_parsed():
            flags.FLAGS.mark_as_parsed()  # Grain's workers read absl flags (their defaults); nothing else parses them
        self.source, self.batch_size, self.drop_last, self.workers = source, batch_size, drop_last, workers
        self.iterator = None
        self.restored: StateSchema | None = None  # until the first batch after restoring a state
        self.epoch = self.step_in_epoch = 0

    def start(
        self, epoch: int, order: np.ndarray, step_in_epoch: int, state: dict | None, origin: str = "the checkpoint"
    ) -> None:
        self.close()
        self.epoch, self.step_in_epoch = epoch, step_in_epoch
        n = len(order)
        steps = steps_per_epoch(n, self.batch_size, self.drop_last)
        saved_workers, saved_first = (
            (None, 0) if state is None else check_state(state, epoch, step_in_epoch, n, self.batch_size, steps, origin)
        )
        # Grain restores its own state only with the worker count it was saved with (and its source: the
        # state's first batch); with another count the source starts at the position (the batches and their
        # augmentation follow from it alone).
        own_state = saved_workers == self.workers
        first = saved_first if own_state else (0 if state is None else step_in_epoch)
        source = _EpochBatches(self.source, epoch, order, self.batch_size, steps, first)
        loader = grain.DataLoader(data_source=source, sampler=_sampler(len(source)), worker_count=self.workers)
        self.iterator = iter(loader)
        if own_state:
            # Defence in depth: whatever Grain still raises on the checked state, in set_state or at the first
            # batch after it, is the checkpoint's fault, said in one line.
            self.restored = StateSchema(origin, run_context(epoch, step_in_epoch, steps, n, self.batch_size))
            try:
                self.iterator.set_state(json.dumps(state[LIBRARY]).encode())
            except Exception as exc:
                self.restored.library_failed(LIBRARY, self.LIBRARY_NAME, exc)

    def _next_batches(self, count: int) -> list[Batch]:
        batches = [tuple(np.asarray(a) for a in next(self.iterator)) for _ in range(count)]
        self.step_in_epoch += count
        return batches

    def state(self) -> dict:
        grain_state = json.loads(self.iterator.get_state())
        return {EPOCH: self.epoch, STEP_IN_EPOCH: self.step_in_epoch, WORKERS: self.workers, LIBRARY: grain_state}

    def close(self) -> None:
        self.iterator = None
        self.restored = None
