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
tutorials do, which no checkpoint holds.

A loader state read from a checkpoint is data from a file anyone can edit (its sha256 in the manifest
detects accidents, not forgery), and the libraries trust their own states: torchdata resumes a sampler at
`next: -1` silently, Grain indexes past its source. So before a library sees one, its pipeline checks it
against a schema (StateSchema): exactly the keys and types the library writes for this pipeline, and every
value the one this run's position and config imply (the example counts from the position, the batch size
and the dataset; the worker count recorded beside the state; seeds in the library's range). Whatever a
library still raises on a state (its set_state, the first batch after it) becomes a CheckpointError too.
Each names the checkpoint and the key: one line, exit status 4."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import NoReturn, Protocol

import numpy as np

from reprocube.data import augment
from reprocube.data.store import Split
from reprocube.errors import CheckpointError
from reprocube.runtime.registry import import_registered
from reprocube.terminal import one_line

PIPELINES = {
    "pytorch": "reprocube.data.loaders.pytorch:TorchDataPipeline",
    "tensorflow": "reprocube.data.loaders.tensorflow:TfDataPipeline",
    "jax": "reprocube.data.loaders.jax:GrainPipeline",
}
Batch = tuple[np.ndarray, np.ndarray]  # float32 (b, 1, 28, 28) images, int64 (b,) labels
MAX_WORKERS = 64  # data.workers' bound (reprocube.config)


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
    def start(
        self, epoch: int, order: np.ndarray, step_in_epoch: int, state: dict | None, origin: str = "the checkpoint"
    ) -> None:
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
    pipeline = import_registered(PIPELINES[cfg.framework.name], f"data.pipeline=loader for {cfg.framework.name}")
    return pipeline(source, batch_size, bool(cfg.data.drop_last), workers, cfg.seed)


EPOCH, STEP_IN_EPOCH, WORKERS = "epoch", "step_in_epoch", "workers"  # the keys reprocube writes itself (every loader)


def check_position(state: dict | None, epoch: int, step_in_epoch: int, where: str) -> None:
    """A loader state must be the one of this position (it is restored, then trusted to continue here)."""
    if state is None:
        if step_in_epoch:
            raise CheckpointError(f"{where}: no loader state, but the checkpoint is mid-epoch (data.pipeline=loader)")
        return
    schema = StateSchema(where, f"the checkpoint's position: epoch {epoch}, step {step_in_epoch}")
    schema.check(state, {EPOCH: epoch, STEP_IN_EPOCH: step_in_epoch}, partial=True)
    if not step_in_epoch:
        schema.fail("", "is present, but reprocube saves none at an epoch's start (the position is enough there)")


class AnyValue:
    """A schema leaf that accepts any value (a part checked by a later, more precise schema)."""


class Integer:
    """A schema leaf: an integer (not a boolean) from `low` to `high`."""

    def __init__(self, low: int, high: int):
        self.low, self.high = low, high


class Text:
    """A schema leaf: any string (a later schema gives the exact one)."""


class StateSchema:
    """Checks a loader state read from a checkpoint, as JSON, against a schema: a dict (exactly these keys,
    each value checked by its schema), Integer, Text, AnyValue, or a literal (None, a boolean, an integer, a
    string: that value, of that type). Only the schema is walked, never the state's own nesting. A
    violation is one CheckpointError naming the checkpoint (`where`) and the key's path in state.json;
    `context` (this run's position and config) says where the expected values come from."""

    def __init__(self, where: str, context: str):
        self.where, self.context = where, context

    def fail(self, path: str, problem: str, cause: str = "") -> NoReturn:
        key = f"loader.{path}" if path else "loader"
        raise CheckpointError(f"{self.where}: state.json {key} {problem}" + (f" ({cause})" if cause else "")) from None

    def check(self, value, schema, path: str = "", partial: bool = False) -> None:
        """`partial`: the top-level mapping may hold keys the schema does not name (checked later)."""
        if isinstance(schema, dict):
            if not isinstance(value, dict):
                self.fail(path, f"is {_kind(value)}, not a JSON object")
            for key in schema:
                if key not in value:
                    self.fail(_join(path, key), "is missing")
            if not partial:
                for key in value:
                    if key not in schema:
                        self.fail(_join(path, key), "is a key the loader's state does not have")
            for key, item in schema.items():
                self.check(value[key], item, _join(path, key))
        elif isinstance(schema, AnyValue):
            return
        elif isinstance(schema, Integer):
            if not _is_int(value):
                self.fail(path, f"is {_kind(value)}, not an integer")
            if not schema.low <= value <= schema.high:
                self.fail(path, f"is {_shown(value)}, outside {schema.low}..{schema.high}", f"from {self.context}")
        elif isinstance(schema, Text):
            if not isinstance(value, str):
                self.fail(path, f"is {_kind(value)}, not a string")
        elif type(value) is not type(schema) or value != schema:
            if type(value) is not type(schema) and not (_is_int(value) and _is_int(schema)):
                self.fail(path, f"is {_kind(value)}, not {_kind(schema)} ({_shown(schema)})")
            self.fail(path, f"is {_shown(value)}, not {_shown(schema)}", f"expected from {self.context}")

    def library_failed(self, path: str, library: str, exc: BaseException) -> NoReturn:
        """Defence in depth: the library raised on a state the schema accepted."""
        message = one_line(" ".join(f"{type(exc).__name__}: {exc}".split()).rstrip(":"))
        if len(message) > 300:
            message = message[:297] + "..."
        self.fail(path, f"was refused by {library}", message)


class RestoredStateGuard:
    """For a loader whose library state was restored (self.restored, its StateSchema, until the next
    batches are drawn): those first batches are the library's first use of a state it accepted, and an
    exception there is the checkpoint's fault, said in one line. A loader sets LIBRARY (the library
    state's key) and LIBRARY_NAME, and draws its batches in _next_batches."""

    LIBRARY: str
    LIBRARY_NAME: str
    restored: StateSchema | None = None

    def next_batches(self, count: int) -> list:
        if self.restored is None:
            return self._next_batches(count)
        try:
            batches = self._next_batches(count)
        except Exception as exc:
            self.restored.library_failed(self.LIBRARY, f"{self.LIBRARY_NAME} at the first batch after it", exc)
        self.restored = None
        return batches

    def _next_batches(self, count: int) -> list:
        raise NotImplementedError


def _join(path: str, key: str) -> str:
    shown = key if isinstance(key, str) and key.isidentifier() else _shown(key)
    return f"{path}.{shown}" if path else shown


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _kind(value) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int):
        return "an integer"
    if isinstance(value, float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "a list"
    return "a JSON object" if isinstance(value, dict) else type(value).__name__


def _shown(value) -> str:
    """A JSON value as JSON (escaped: no control character reaches the terminal), at most 80 characters."""
    if isinstance(value, (dict, list)):
        return _kind(value)
    if _is_int(value) and value.bit_length() > 64:
        return f"an integer of {value.bit_length()} bits"
    text = json.dumps(value)
    return text if len(text) <= 80 else text[:77] + "..."


def run_context(
    epoch: int, step_in_epoch: int, steps: int, examples: int, batch_size: int, workers: int | None = None
) -> str:
    """What a loader state's expected values follow from, for StateSchema's lines."""
    text = f"this run: epoch {epoch}, step {step_in_epoch} of {steps}, batch size {batch_size}, {examples} examples"
    return text + (f", the state's {workers} workers" if workers is not None else "")


def check_envelope(schema: StateSchema, state: dict, epoch: int, step_in_epoch: int, steps: int, library: str) -> int:
    """reprocube's own keys around a library's state (`library`: its key, checked by the caller); returns
    the worker count the state was made with."""
    if not 1 <= step_in_epoch <= steps:
        schema.fail(STEP_IN_EPOCH, f"is {step_in_epoch}: a loader state is saved from step 1 to {steps} only")
    schema.check(
        state, {EPOCH: epoch, STEP_IN_EPOCH: step_in_epoch, WORKERS: Integer(0, MAX_WORKERS), library: AnyValue()}
    )
    return state[WORKERS]
