"""The trainer contract: what a framework trainer provides to the shared training loop.

A backend holds only framework code: the model, the optimizer, the framework's generators and device
placement. The loop (reprocube.training.loop) owns data order, checkpoints, metrics, signals and resume; what a
checkpoint holds is defined in reprocube.training.state. In each trainer the one-batch optimizer update is named
`_batch_step`, whatever its framework makes of it (a PyTorch method, a tf.function, a jitted function)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

import numpy as np
from omegaconf import DictConfig

from reprocube.data.store import Dataset
from reprocube.errors import CheckpointError, ConfigError
from reprocube.runtime.registry import import_registered
from reprocube.training.state import EpochTotals, FrameworkState


class Backend(Protocol):
    def __init__(self, cfg: DictConfig, dataset: Dataset) -> None:
        """Apply the determinism settings, seed the framework, build model and optimizer, and place
        the dataset on the device."""

    def info(self) -> dict:
        """Framework versions, device, determinism settings and threads, for env.json."""

    def begin_epoch(self, order: np.ndarray) -> None:
        """Receive the epoch's permutation of training-example indices."""

    def train_steps(self, bounds: np.ndarray, first_global_step: int) -> None:
        """One optimizer step per row (lo, hi) of `bounds`, in order, on the examples order[lo:hi],
        adding to the epoch totals on the device. `first_global_step` counts the steps before the
        first one: a trainer with stateless randomness (JAX) derives each step's key from its global
        step. The loop hands over up to STEPS_PER_CALL steps at once so that a compiled trainer
        (TensorFlow) runs them without returning to Python; the result must not depend on how the
        steps are grouped (a resumed run groups them differently)."""

    def train_batches(self, batches: list[tuple[np.ndarray, np.ndarray]], first_global_step: int) -> None:
        """data.pipeline=loader: one optimizer step per (images float32 (b, 1, 28, 28), labels int64 (b,))
        batch from the loader, in order, as train_steps does for the resident dataset."""

    def group_losses(self) -> np.ndarray:
        """The float32 mean loss of each step of the last train_steps call, in order: one host sync per
        group (the loop's trace records every step's loss bits; reprocube.formats.trace)."""

    def group_fingerprints(self) -> np.ndarray:
        """uint32 (steps, tensors): the weight fingerprint (reprocube.formats.trace.fingerprint) after each step of
        the last group, one column per weight tensor in sorted name order; computed on the device in the
        step and fetched with the losses (no host sync of its own)."""

    def epoch_totals(self) -> EpochTotals:
        """The loss sum and correct count of the steps since the last set_epoch_totals."""

    def set_epoch_totals(self, totals: EpochTotals) -> None:
        """Reset (EpochTotals()) or restore the epoch totals."""

    def evaluate(self) -> dict:
        """{"test_loss": float, "test_accuracy": float} over the whole test split."""

    def export_state(self) -> FrameworkState: ...

    def import_state(self, state: FrameworkState) -> None:
        """Raise CheckpointError (check_arrays) when the arrays do not fit the model."""

    def record_ops(self, run_step: Callable[[], None]) -> list[dict]:
        """Run `run_step` (one optimizer step through train_steps or train_batches) with each of its
        operations recorded in order: name, where it ran, a digest of each input before and each output
        after it (reprocube.training.replay writes them to OPS.json). Recording changes nothing the step computes."""


# The most steps the loop hands to a trainer at once; also how many steps a signal may wait (well under
# a second here).
STEPS_PER_CALL = 100

BACKENDS = {
    "pytorch": "reprocube.frameworks.pytorch:PytorchBackend",
    "tensorflow": "reprocube.frameworks.tensorflow:TensorflowBackend",
    "jax": "reprocube.frameworks.jax:JaxBackend",
}
FRAMEWORKS = tuple(BACKENDS)  # the one list of frameworks: verify, bench and the tests use it
# Each trainer's weight tensors, as its export_state names them (a trace's tensor_names): a receipt that
# names other tensors, or more, describes no model of ours and is refused before anything is compared.
_LAYERS = ("conv1", "conv2", "fc1", "fc2")
_KERNEL = {"pytorch": "weight", "tensorflow": "kernel", "jax": "kernel"}
WEIGHT_NAMES = {
    framework: tuple(sorted(f"{layer}.{part}" for layer in _LAYERS for part in ("bias", kernel)))
    for framework, kernel in _KERNEL.items()
}


def create_backend(cfg: DictConfig, dataset: Dataset) -> Backend:
    """Import the framework's module only now: each framework is an optional, heavy dependency."""
    target = BACKENDS.get(cfg.framework.name)
    if target is None:
        raise ConfigError(
            f"framework={cfg.framework.name} is not available (choose from {', '.join(sorted(BACKENDS))})"
        )
    return import_registered(target, f"framework={cfg.framework.name}")(cfg, dataset)


def check_arrays(what: str, arrays: dict[str, np.ndarray], expected: dict[str, tuple[tuple[int, ...], object]]) -> None:
    """That a checkpoint's arrays are exactly the model's: the same names, and for each the shape and
    dtype in `expected` (name -> (shape, dtype)); one CheckpointError naming the first mismatch."""
    if set(arrays) != set(expected):
        raise CheckpointError(f"checkpoint {what} {sorted(arrays)} do not match the model's {sorted(expected)}")
    for name, (shape, dtype) in expected.items():
        array, dtype = arrays[name], np.dtype(dtype)
        if tuple(array.shape) != tuple(shape) or array.dtype != dtype:
            raise CheckpointError(
                f"checkpoint tensor {name} is {array.dtype}{list(array.shape)}, the model needs {dtype}{list(shape)}"
            )
