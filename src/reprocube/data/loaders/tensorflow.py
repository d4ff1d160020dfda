"""TensorFlow: tf.data, a dataset of batch numbers mapped in parallel (`workers` parallel calls, order
kept: deterministic=True) to the augmented batch, then prefetched. tf.data's own iterator state is saved
by tf.train.Checkpoint files, not in a form a reprocube checkpoint reads; it is not needed either: the
map is a pure function of the batch number, so the pipeline restarts exactly from the position. Its saved
state is that position, checked all the same (exactly these keys, this position)."""

from __future__ import annotations

import numpy as np

from reprocube.data.pipeline import EPOCH, STEP_IN_EPOCH, Batch, ExampleSource, StateSchema, run_context
from reprocube.data.sampler import steps_per_epoch
from reprocube.runtime.tensorflow_import import tf

PREFETCH_BATCHES = 2


class TfDataPipeline:
    def __init__(self, source: ExampleSource, batch_size: int, drop_last: bool, workers: int, seed: int):
        self.source, self.batch_size, self.drop_last, self.workers = source, batch_size, drop_last, workers
        self.iterator = None
        self.epoch = self.step_in_epoch = 0

    def start(
        self, epoch: int, order: np.ndarray, step_in_epoch: int, state: dict | None, origin: str = "the checkpoint"
    ) -> None:
        self.epoch, self.step_in_epoch = epoch, step_in_epoch
        n = len(order)
        steps = steps_per_epoch(n, self.batch_size, self.drop_last)
        if state is not None:
            schema = StateSchema(origin, run_context(epoch, step_in_epoch, steps, n, self.batch_size))
            if not 1 <= step_in_epoch <= steps:
                schema.fail(STEP_IN_EPOCH, f"is {step_in_epoch}: a loader state is saved from step 1 to {steps} only")
            schema.check(state, {EPOCH: epoch, STEP_IN_EPOCH: step_in_epoch})

        def load(batch: np.int64):
            lo = int(batch) * self.batch_size
            return self.source.examples(epoch, order[lo : min(lo + self.batch_size, n)])

        dataset = tf.data.Dataset.range(step_in_epoch, steps).map(
            lambda batch: tf.numpy_function(load, [batch], (tf.float32, tf.int64), stateful=False),
            num_parallel_calls=self.workers or None,  # 0: in the calling thread, one batch after another
            deterministic=True,
        )
        self.iterator = iter(dataset.prefetch(PREFETCH_BATCHES) if self.workers else dataset)

    def next_batches(self, count: int) -> list[Batch]:
        batches = [tuple(t.numpy() for t in next(self.iterator)) for _ in range(count)]
        self.step_in_epoch += count
        return batches

    def state(self) -> dict:
        return {EPOCH: self.epoch, STEP_IN_EPOCH: self.step_in_epoch}

    def close(self) -> None:
        self.iterator = None
