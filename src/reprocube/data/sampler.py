"""The data order, as pure state: the permutation of epoch e is a function of (seed, e) alone, and the
loader's position is (epoch, step). Every framework draws its batches from here, so all three see the
same examples in the same order, and resuming needs nothing but the position."""

from __future__ import annotations

import numpy as np


def steps_per_epoch(num_examples: int, batch_size: int, drop_last: bool) -> int:
    """How many batches an epoch has: the last one short unless drop_last (then it is dropped)."""
    full, rest = divmod(num_examples, batch_size)
    return full if (drop_last or rest == 0) else full + 1


class EpochSampler:
    def __init__(self, seed: int, num_examples: int, batch_size: int, drop_last: bool = False):
        if num_examples < 1:
            raise ValueError("cannot sample from an empty dataset")
        self.seed = seed
        self.num_examples = num_examples
        self.batch_size = batch_size
        self.steps_per_epoch = steps_per_epoch(num_examples, batch_size, drop_last)
        if self.steps_per_epoch == 0:
            raise ValueError(f"batch_size {batch_size} exceeds the {num_examples} examples with drop_last")

    def epoch_order(self, epoch: int) -> np.ndarray:
        """The permutation of example indices for `epoch` (int64), from Philox keyed on (seed, epoch)."""
        bit_generator = np.random.Philox(key=np.array([self.seed, epoch], dtype=np.uint64))
        return np.random.Generator(bit_generator).permutation(self.num_examples)

    def steps_bounds(self, first: int, end: int) -> np.ndarray:
        """[lo, hi) of the batches first..end-1, one row each (int32: what the trainers index with)."""
        lo = np.arange(first, end, dtype=np.int64) * self.batch_size
        return np.stack([lo, np.minimum(lo + self.batch_size, self.num_examples)], axis=1).astype(np.int32)
