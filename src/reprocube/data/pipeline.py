"""data.pipeline=loader: batches from each framework's own loader (worker processes, prefetching, random
augmentation) instead of indexing the device-resident dataset, resumed exactly all the same.

What makes it exact (and what the loaders share, framework-neutral, here):
- the order: epoch e's permutation is a pure function of (seed, e) (reprocube.data.sampler), so the
  examples of a batch depend on the position only;
- the augmentation: a pure function of (seed, epoch, example index) (reprocube.data.augment), computed
  in whichever worker loads the example: neither the number of workers nor prefetching nor a resume can
  change it;
- the loader's own state (torchdata's StatefulDataLoader state_dict, Grain's iterator state; tf.data's
  position) travels in the checkpoint (state.json "loader") and is restored there, checked against the
  position.
data.augment_rng=stateful is the negative control: draws from each worker's global generator, as the
tutorials do, which no checkpoint holds."""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from reprocube.data import augment
from reprocube.data.store import Split
from reprocube.errors import CheckpointError, ConfigError

PIPELINES = {
    "pytorch": "reprocube.data.loaders.pytorch:TorchDataPipeline",
    "tensorflow": "reprocube.data.loaders.tensorflow:TfDataPipeline",
    "jax": "reprocube.data.loaders.jax:GrainPipeline",
}
Batch = tuple[np.ndarray, np.ndarray]  # float32 (b, 1, 28, 28) images, int64 (b,) labels


@dataclass(frozen=True)
class ExampleSource:
    """The training split with its augmentation: what every framework's loader reads examples through.
    Picklable (worker processes receive a copy)."""

    split: Split
    seed: int
    augment: bool
    stateful_rng: bool  # the negative control
    background: float  # a black pixel, normalised: what a shift uncovers

    def examples(self, epoch: int, indices: np.ndarray) -> Batch:
        indices = np.asarray(indices, dtype=np.int64)
        images = self.split.images[indices]
        if self.augment:
            params = (
                augment.stateful_params(len(indices))
                if self.stateful_rng
                else augment.stateless_params(self.seed, epoch, indices)
            )
            images = augment.apply(images, params, np.float32(self.background))
        return images, self.split.labels[indices]


class BatchPipeline(Protocol):
    def start(self, epoch: int, order: np.ndarray, step_in_epoch: int, state: dict | None) -> None:
        """Begin (or continue, at `step_in_epoch`) the epoch whose example order is `order`. `state` is
        what state() returned when the checkpoint was made, to be restored, or None at an epoch's start."""

    def next_batches(self, count: int) -> list[Batch]: ...

    def state(self) -> dict:
        """The loader's state now, JSON-serialisable, for state.json "loader"."""

    def close(self) -> None: ...


def create_pipeline(cfg, split: Split, batch_size: int) -> BatchPipeline:
    workers = cfg.data.workers
    source = ExampleSource(
        split,
        cfg.seed,
        bool(cfg.data.augment),
        cfg.data.augment_rng == "stateful",
        float((np.float32(0.0) - np.float32(cfg.dataset.mean)) / np.float32(cfg.dataset.std)),
    )
    module_name, class_name = PIPELINES[cfg.framework.name].split(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigError(
            f"data.pipeline=loader for {cfg.framework.name} needs a package that is not installed: {exc}"
        ) from None
    return getattr(module, class_name)(source, batch_size, bool(cfg.data.drop_last), workers, cfg.seed)


def check_position(state: dict | None, epoch: int, step_in_epoch: int, where: str) -> None:
    """A loader state must be the one of this position (it is restored, then trusted to continue here)."""
    if state is None:
        if step_in_epoch:
            raise CheckpointError(f"{where}: no loader state, but the checkpoint is mid-epoch (data.pipeline=loader)")
        return
    if (state.get("epoch"), state.get("step_in_epoch")) != (epoch, step_in_epoch):
        raise CheckpointError(
            f"{where}: the loader state is at epoch {state.get('epoch')!r}, step {state.get('step_in_epoch')!r}, "
            f"not at the checkpoint's epoch {epoch}, step {step_in_epoch}"
        )
