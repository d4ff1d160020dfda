"""PyTorch: torchdata's StatefulDataLoader over a map-style dataset, `workers` worker processes, its
state_dict in the checkpoint. The sampler yields (epoch, example index) pairs, so each worker computes an
example's augmentation from the position alone (reprocube.data.augment)."""

from __future__ import annotations

import numpy as np
import torch
from torchdata.stateful_dataloader import StatefulDataLoader

from reprocube.data.pipeline import Batch, ExampleSource
from reprocube.errors import CheckpointError

PREFETCH_FACTOR = 2


class _Examples(torch.utils.data.Dataset):
    def __init__(self, source: ExampleSource):
        self.source = source

    def __len__(self) -> int:
        return len(self.source.split)

    def __getitem__(self, key):
        epoch, index = key
        images, labels = self.source.examples(epoch, np.array([index]))
        return torch.from_numpy(images[0]), torch.from_numpy(labels[:1])[0]


class _EpochOrder(torch.utils.data.Sampler):
    """The epoch's order from a position; its state (the next position) is part of the loader's."""

    def __init__(self, epoch: int, order: np.ndarray, start: int):
        self.epoch, self.order, self.next = epoch, order, start

    def __len__(self) -> int:
        return len(self.order)

    def __iter__(self):
        while self.next < len(self.order):
            self.next += 1
            yield self.epoch, int(self.order[self.next - 1])

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "next": self.next}

    def load_state_dict(self, state: dict) -> None:
        if state.get("epoch") != self.epoch or not isinstance(state.get("next"), int):
            raise CheckpointError(f"loader sampler state {state!r} is not one of epoch {self.epoch}")
        self.next = state["next"]


def _seed_worker(worker_id: int) -> None:
    """The reference tutorial's worker_init_fn (the negative control's generator): NumPy's global generator
    seeded from torch's per-worker seed, fresh in every new iterator, saved by nobody."""
    np.random.seed(torch.initial_seed() % 2**32)


class TorchDataPipeline:
    def __init__(self, source: ExampleSource, batch_size: int, drop_last: bool, workers: int, seed: int):
        self.source, self.batch_size, self.drop_last, self.workers, self.seed = (
            source,
            batch_size,
            drop_last,
            workers,
            seed,
        )
        self.loader = self.iterator = None
        self.epoch = self.step_in_epoch = 0
        # As the tutorials do: one generator, seeded once, from which every epoch's iterator draws its workers'
        # base seed. The stateless augmentation never reads it; the stateful control depends on it, and a
        # resumed process starts it afresh: that is the trap.
        self.generator = torch.Generator().manual_seed(seed)

    def start(self, epoch: int, order: np.ndarray, step_in_epoch: int, state: dict | None) -> None:
        self.close()
        self.epoch, self.step_in_epoch = epoch, step_in_epoch
        # torchdata restores its own state only with the worker count it was saved with; with another count
        # the sampler starts at the position (the examples and their augmentation follow from it alone).
        own_state = state is not None and state.get("workers") == self.workers
        start = 0 if own_state or state is None else step_in_epoch * self.batch_size
        self.loader = StatefulDataLoader(
            _Examples(self.source),
            batch_size=self.batch_size,
            sampler=_EpochOrder(epoch, order, start),
            drop_last=self.drop_last,
            num_workers=self.workers,
            prefetch_factor=PREFETCH_FACTOR if self.workers else None,
            persistent_workers=False,
            worker_init_fn=_seed_worker if self.workers else None,
            generator=self.generator,
        )
        if own_state:
            try:
                self.loader.load_state_dict(state["torchdata"])
            except (AssertionError, KeyError, TypeError, ValueError) as exc:
                raise CheckpointError(
                    f"the checkpoint's StatefulDataLoader state does not fit this loader: {exc!r}"
                ) from None
        self.iterator = iter(self.loader)

    def next_batches(self, count: int) -> list[Batch]:
        batches = []
        for _ in range(count):
            images, labels = next(self.iterator)
            batches.append((images.numpy(), labels.numpy()))
        self.step_in_epoch += count
        return batches

    def state(self) -> dict:
        return {
            "epoch": self.epoch,
            "step_in_epoch": self.step_in_epoch,
            "workers": self.workers,
            "torchdata": self.loader.state_dict(),
        }

    def close(self) -> None:
        self.loader = self.iterator = None  # the iterator's finaliser shuts its worker processes down
