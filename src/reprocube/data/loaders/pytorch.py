"""PyTorch: torchdata's StatefulDataLoader over a map-style dataset, `workers` worker processes, its
state_dict in the checkpoint. The sampler yields (epoch, example index) pairs, so each worker computes an
example's augmentation from the position alone (reprocube.data.augment).

The state_dict read back is checked first (torchdata_schema: exactly what torchdata 0.11 writes for this
loader, every count the position's), since torchdata trusts it: a sampler `next` of -1 resumes silently at
another example, a `_num_workers` edit fails an assertion, a `_base_seed` past 64 bits kills the workers."""

from __future__ import annotations

import numpy as np
import torch
from torchdata.stateful_dataloader import StatefulDataLoader

from reprocube.data.pipeline import (
    EPOCH,
    STEP_IN_EPOCH,
    WORKERS,
    Batch,
    ExampleSource,
    Integer,
    RestoredStateGuard,
    StateSchema,
    check_envelope,
    run_context,
)
from reprocube.data.sampler import steps_per_epoch
from reprocube.errors import CheckpointError

PREFETCH_FACTOR = 2
LIBRARY = "torchdata"  # the library state's key in reprocube's loader state
MAX_BASE_SEED = 2**63 - 1  # torch draws `_base_seed` as a non-negative int64


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


def torchdata_schema(
    epoch: int, step_in_epoch: int, examples: int, batch_size: int, workers: int, yielded: int | None
) -> dict:
    """The StatefulDataLoader state_dict (torchdata 0.11, snapshot every step, map-style dataset, this
    module's sampler) after `step_in_epoch` batches of the epoch, `yielded` of them by this loader (fewer
    when it started mid-epoch from the position: resumed with another worker count; None: any from 1).
    The sampler's `next` counts the epoch's examples; torchdata's own counts, this loader's."""
    done = min(step_in_epoch * batch_size, examples)  # the examples of the epoch served so far
    if yielded is None:
        batches, samples = Integer(1, step_in_epoch), Integer(0, done)
    else:
        first = step_in_epoch - yielded  # the batch this loader started at
        batches, samples = yielded, done - first * batch_size
    sampler_iter = {"sampler_state": {"epoch": epoch, "next": done}, "samples_yielded": samples}
    common = {
        "_IterableDataset_len_called": None,
        "_index_sampler_state": None,
        "_sampler_iter_state": sampler_iter,
        "_sampler_iter_yielded": batches,
        "_shared_seed": None,
    }
    if workers == 0:
        return {
            **common,
            "_iterator_finished": False,
            "_num_yielded": batches,
            "dataset_state": None,
            "fetcher_state": None,
        }
    last_worker = Integer(0, workers - 1) if yielded is None else (yielded - 1) % workers
    return {
        "_iterator_finished": False,
        "_snapshot": {
            "_last_yielded_worker_id": last_worker,
            "_main_snapshot": {**common, "_base_seed": Integer(0, MAX_BASE_SEED), "_num_workers": workers},
            "_snapshot_step": batches,
            "_worker_snapshots": {
                f"worker_{i}": {"dataset_state": None, "fetcher_state": None, "worker_id": i} for i in range(workers)
            },
        },
        "_steps_since_snapshot": 0,
    }


def check_state(
    state: dict,
    epoch: int,
    step_in_epoch: int,
    examples: int,
    batch_size: int,
    steps: int,
    origin: str = "the checkpoint",
) -> int:
    """Check a loader state from a checkpoint (TorchDataPipeline.state()) against this run: one
    CheckpointError naming the key otherwise. Returns the worker count it was made with."""
    context = run_context(epoch, step_in_epoch, steps, examples, batch_size)
    schema = StateSchema(origin, context)
    workers = check_envelope(schema, state, epoch, step_in_epoch, steps, LIBRARY)
    schema.context = run_context(epoch, step_in_epoch, steps, examples, batch_size, workers)
    loose = torchdata_schema(epoch, step_in_epoch, examples, batch_size, workers, None)
    schema.check(state[LIBRARY], loose, LIBRARY)  # the structure; then every value, from the count yielded
    library = state[LIBRARY]
    yielded = library["_sampler_iter_yielded"] if workers == 0 else library["_snapshot"]["_snapshot_step"]
    schema.check(library, torchdata_schema(epoch, step_in_epoch, examples, batch_size, workers, yielded), LIBRARY)
    return workers


class TorchDataPipeline(RestoredStateGuard):
    LIBRARY = LIBRARY
    LIBRARY_NAME = "torchdata's StatefulDataLoader"

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
        self.restored: StateSchema | None = None  # until the first batch after restoring a state
        # As the tutorials do: one generator, seeded once, from which every epoch's iterator draws its workers'
        # base seed. The stateless augmentation never reads it; the stateful control depends on it, and a
        # resumed process starts it afresh: that is the trap.
        self.generator = torch.Generator().manual_seed(seed)

    def start(
        self, epoch: int, order: np.ndarray, step_in_epoch: int, state: dict | None, origin: str = "the checkpoint"
    ) -> None:
        self.close()
        self.epoch, self.step_in_epoch = epoch, step_in_epoch
        n = len(order)
        steps = steps_per_epoch(n, self.batch_size, self.drop_last)
        saved_workers = (
            None if state is None else check_state(state, epoch, step_in_epoch, n, self.batch_size, steps, origin)
        )
        # torchdata restores its own state only with the worker count it was saved with; with another count
        # the sampler starts at the position (the examples and their augmentation follow from it alone).
        own_state = saved_workers == self.workers
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
        if not own_state:
            self.iterator = iter(self.loader)
            return
        # Defence in depth: whatever torchdata still raises on the checked state (restoring it happens in
        # iter(): the workers start with its seeds) is the checkpoint's fault, said in one line.
        self.restored = StateSchema(origin, run_context(epoch, step_in_epoch, steps, n, self.batch_size))
        try:
            self.loader.load_state_dict(state[LIBRARY])
            self.iterator = iter(self.loader)
        except Exception as exc:
            self.restored.library_failed(LIBRARY, self.LIBRARY_NAME, exc)

    def _next_batches(self, count: int) -> list[Batch]:
        batches = []
        for _ in range(count):
            images, labels = next(self.iterator)
            batches.append((images.numpy(), labels.numpy()))
        self.step_in_epoch += count
        return batches

    def state(self) -> dict:
        return {
            EPOCH: self.epoch,
            STEP_IN_EPOCH: self.step_in_epoch,
            WORKERS: self.workers,
            LIBRARY: self.loader.state_dict(),
        }

    def close(self) -> None:
        self.loader = self.iterator = None  # the iterator's finaliser shuts its worker processes down
        self.restored = None
