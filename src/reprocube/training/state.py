"""The reproducibility contract: everything an exact resume needs, in one object, and the only code that
turns it into checkpoint content and back.

A run's state between two optimizer steps (TrainState) is:
  position      epochs done, steps done in the next epoch, global steps        state.json "position"
  epoch_totals  the running loss sum and correct count of the epoch in progress state.json "epoch_totals"
  host_rng      Python `random` and NumPy's global generator                     rng.safetensors "python.*",
                                                                                 "numpy.*" + state.json "rng"
  framework     weights, optimizer tensors, the framework's generators          weights/optimizer.safetensors,
                (torch CPU/CUDA, Keras seed generators, the JAX run key)         rng.safetensors (other names)
  history       every epoch record and logged step so far                       manifest.json "metrics"
  trace         every step's loss bits and weight digests at fixed steps        state.json "trace"
                (reprocube.formats.trace; absent in checkpoints made before it existed)
  loader        data.pipeline=loader, mid-epoch: the framework loader's state   state.json "loader"
                (reprocube.data.pipeline; absent otherwise)
  sessions      each process that trained the run: the global step it started   state.json "sessions"
                at and its environment (env.json's fingerprint); not needed to resume, carried so that the
                receipt says under which settings each step was computed
The data order needs nothing more: epoch e's permutation is a pure function of (seed, e)
(reprocube.data.sampler), so the position alone says which examples come next.

How it is checked: checkpoint.read_checkpoint verifies every file's sha256 against the self-checked
manifest before anything is parsed; from_checkpoint then checks each key's type and range, and that the
position agrees with the manifest and with this dataset's steps per epoch; the trainers check that the
arrays match their model (backend.check_arrays). Only safetensors and JSON are read: no pickle.

Versions of state.json: 1 (no "version" key) held a "framework" mapping of scalars nobody read; 2 writes
it empty (reprocube before version 2 requires the key) and ignores it, and gained "trace", "loader" and
"sessions" as optional keys; 3 writes every key every time ("loader" null where there is no loader state,
"trace" and "sessions" null only where a resumed checkpoint had none). All three are read: an older one is
brought to version 3 in one place (_upgraded: each missing key as what its absence meant), and the reader
knows one shape. A checkpoint without a trace resumes with a trace that starts at its position. The
checkpoint's file set (checkpoint.FORMAT_VERSION) is unchanged."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from reprocube.errors import CheckpointError
from reprocube.formats.trace import StepTrace
from reprocube.training.checkpoint import Checkpoint, CheckpointContent
from reprocube.training.metrics import MetricsHistory
from reprocube.training.rng import HostRng

STATE_VERSION = 3
READABLE_STATE_VERSIONS = (1, 2, 3)

# state.json keys
VERSION = "version"
POSITION = "position"
EPOCH = "epoch"
STEP_IN_EPOCH = "step_in_epoch"
GLOBAL_STEP = "global_step"
EPOCH_TOTALS = "epoch_totals"
LOSS_SUM = "loss_sum"
CORRECT = "correct"
HOST_RNG = "rng"
TRACE = "trace"
LOADER = "loader"
SESSIONS = "sessions"
SESSION_FROM_STEP = "from_step"
SESSION_ENV = "env"
MAX_SESSIONS = 1000
LEGACY_FRAMEWORK = "framework"
# manifest.json keys the state owns (the position's three keys are copied there too)
STEPS_PER_EPOCH = "steps_per_epoch"
METRICS = "metrics"


@dataclass
class Position:
    """Where training stands: `epoch` epochs are complete, and `step_in_epoch` steps of the next one."""

    epoch: int = 0
    step_in_epoch: int = 0
    global_step: int = 0

    def as_dict(self) -> dict:
        return {EPOCH: self.epoch, STEP_IN_EPOCH: self.step_in_epoch, GLOBAL_STEP: self.global_step}


@dataclass
class EpochTotals:
    """The running sums of the epoch in progress (the epoch's train loss and accuracy come from them)."""

    loss_sum: float = 0.0
    correct: int = 0

    def as_dict(self) -> dict:
        return {LOSS_SUM: self.loss_sum, CORRECT: self.correct}


@dataclass
class FrameworkState:
    """What a trainer exports and imports (reprocube.training.backend): arrays only, under canonical names."""

    weights: dict[str, np.ndarray]  # parameter name -> array
    optimizer: dict[str, np.ndarray]  # e.g. momentum buffers
    rng: dict[str, np.ndarray]  # generator states, names prefixed by the framework ("torch.", "keras.", "jax.")


@dataclass
class TrainState:
    position: Position
    epoch_totals: EpochTotals
    host_rng: HostRng
    framework: FrameworkState
    history: MetricsHistory
    trace: StepTrace | None = None  # None: read from a checkpoint made before traces existed
    loader: dict | None = None  # the loader's state mid-epoch (data.pipeline=loader)
    sessions: list[dict] | None = None  # [{from_step, env}]; None: read from a checkpoint made before sessions

    @classmethod
    def capture(
        cls,
        position: Position,
        backend,
        history: MetricsHistory,
        framework: FrameworkState | None = None,
        trace: StepTrace | None = None,
        loader: dict | None = None,
        sessions: list[dict] | None = None,
    ) -> TrainState:
        """The state of this process now. `framework` may be passed when it was just exported."""
        return cls(
            position=Position(position.epoch, position.step_in_epoch, position.global_step),
            epoch_totals=backend.epoch_totals(),
            host_rng=HostRng.capture(),
            framework=framework or backend.export_state(),
            history=history,
            trace=trace,
            loader=loader,
            sessions=sessions,
        )

    def restore(self, backend) -> None:
        """Put this state into the trainer and the host generators (the position is the caller's)."""
        backend.import_state(self.framework)
        backend.set_epoch_totals(self.epoch_totals)
        self.host_rng.restore()

    def to_checkpoint(self, config: dict, steps_per_epoch: int, run_fields: dict) -> tuple[CheckpointContent, dict]:
        """The checkpoint's files and manifest fields. `run_fields` are the run's identity (framework,
        seed, config hash, reason, ...), recorded in the manifest beside the state's own fields."""
        state_json = {
            VERSION: STATE_VERSION,
            POSITION: self.position.as_dict(),
            EPOCH_TOTALS: self.epoch_totals.as_dict(),
            HOST_RNG: self.host_rng.meta,
            LEGACY_FRAMEWORK: {},  # read (and ignored) by reprocube before state version 2
            TRACE: None if self.trace is None else self.trace.to_json(),
            LOADER: self.loader,
            SESSIONS: self.sessions,
        }
        rng = {**self.host_rng.arrays, **self.framework.rng}
        content = CheckpointContent(self.framework.weights, self.framework.optimizer, rng, state_json, config)
        manifest_fields = {
            **run_fields,
            **self.position.as_dict(),
            STEPS_PER_EPOCH: steps_per_epoch,
            METRICS: self.history.as_dict(),
        }
        return content, manifest_fields

    @classmethod
    def resume_from(cls, checkpoint: Checkpoint, steps_per_epoch: int, backend) -> TrainState:
        """Read a checkpoint's state and put it into the trainer; a framework's refusal of it is one line."""
        state = cls.from_checkpoint(checkpoint, steps_per_epoch)
        try:
            state.restore(backend)
        except (RuntimeError, TypeError, ValueError) as exc:
            raise CheckpointError(
                f"checkpoint {checkpoint.path}: unusable framework state ({' '.join(str(exc).split())})"
            ) from None
        return state

    @classmethod
    def from_checkpoint(cls, checkpoint: Checkpoint, steps_per_epoch: int) -> TrainState:
        """The mirror of to_checkpoint, key by key, with every value checked (one line naming the key)."""
        where = f"checkpoint {checkpoint.path}"
        state, manifest = checkpoint.content.state, checkpoint.manifest
        if not isinstance(state, dict):
            raise CheckpointError(f"{where}: state.json is not a JSON object")
        version = state.get(VERSION, 1)
        if version not in READABLE_STATE_VERSIONS or isinstance(version, bool):
            raise CheckpointError(
                f"{where}: state.json version {version!r} is not one this reprocube reads ({READABLE_STATE_VERSIONS})"
            )
        state = _upgraded(state, version, where)
        missing = [key for key in (TRACE, LOADER, SESSIONS) if key not in state]
        if missing:
            raise CheckpointError(f"{where}: state.json version {STATE_VERSION} lacks {missing[0]}")
        position_json = _mapping(state, POSITION, where)
        position = Position(
            *(
                _count(position_json, key, f"{where}: state.json {POSITION}")
                for key in (EPOCH, STEP_IN_EPOCH, GLOBAL_STEP)
            )
        )
        totals_json = _mapping(state, EPOCH_TOTALS, where)
        loss_sum = totals_json.get(LOSS_SUM)
        if not (isinstance(loss_sum, float) and math.isfinite(loss_sum)):
            raise CheckpointError(f"{where}: state.json {EPOCH_TOTALS}.{LOSS_SUM} is not a finite number")
        totals = EpochTotals(loss_sum, _count(totals_json, CORRECT, f"{where}: state.json {EPOCH_TOTALS}"))
        if (
            position.step_in_epoch > steps_per_epoch
            or manifest.global_step != position.global_step
            or manifest.steps_per_epoch != steps_per_epoch
        ):
            raise CheckpointError(f"{where}: its position does not match its manifest or this dataset")
        host_arrays, framework_rng = HostRng.split(checkpoint.content.rng)
        host_rng = HostRng(host_arrays, _mapping(state, HOST_RNG, where))
        host_rng.validate(where)
        for name, array in checkpoint.content.weights.items():
            if array.dtype.kind == "f" and not np.isfinite(array).all():
                raise CheckpointError(
                    f"{where}: weight {name} holds NaN or infinity (reprocube never saves such weights)"
                )
        framework = FrameworkState(checkpoint.content.weights, checkpoint.content.optimizer, framework_rng)
        trace = None
        if state[TRACE] is not None:
            trace = StepTrace.from_json(state[TRACE], f"{where}: state.json {TRACE}", CheckpointError)
            if trace.last_step != position.global_step:
                raise CheckpointError(
                    f"{where}: state.json {TRACE} ends at global step {trace.last_step}, not at the checkpoint's "
                    f"{position.global_step}"
                )
        loader = _mapping(state, LOADER, where) if state[LOADER] is not None else None  # checked by the pipeline
        sessions = _sessions(state[SESSIONS], position.global_step, where) if state[SESSIONS] is not None else None
        return cls(
            position,
            totals,
            host_rng,
            framework,
            MetricsHistory.from_manifest(manifest.fields, f"{checkpoint.path}/manifest.json"),
            trace,
            loader,
            sessions,
        )


def _upgraded(state: dict, version: int, where: str) -> dict:
    """An older state.json as version 3: the keys versions 1 and 2 may lack, as what their absence meant
    (no trace, no loader state, no sessions recorded). Version 3 is as it is: there a missing key is an
    error the reader names. Versions 1 and 2 never wrote null for these keys: a null is refused, as their
    reader refused it."""
    if version == STATE_VERSION:
        return state
    for key in (TRACE, LOADER, SESSIONS):
        if key in state and state[key] is None:
            raise CheckpointError(f"{where}: state.json {key} is null, which version {version} never writes")
    return {TRACE: None, LOADER: None, SESSIONS: None, **state, VERSION: STATE_VERSION}


def _sessions(value, global_step: int, where: str) -> list[dict]:
    """state.json sessions: at most MAX_SESSIONS of {from_step, env}, from_step never decreasing and not past
    the checkpoint's global step; each env a JSON object (its values are shown as data, never used)."""
    if not (isinstance(value, list) and len(value) <= MAX_SESSIONS):
        raise CheckpointError(f"{where}: state.json {SESSIONS} must be a list of at most {MAX_SESSIONS} sessions")
    previous = 0
    for i, session in enumerate(value):
        if not (isinstance(session, dict) and set(session) == {SESSION_FROM_STEP, SESSION_ENV}):
            raise CheckpointError(f"{where}: state.json {SESSIONS}[{i}] must hold exactly from_step and env")
        step = _count(session, SESSION_FROM_STEP, f"{where}: state.json {SESSIONS}[{i}]")
        if not previous <= step <= global_step or not isinstance(session[SESSION_ENV], dict):
            raise CheckpointError(
                f"{where}: state.json {SESSIONS}[{i}]: from_step must not decrease nor pass the checkpoint's "
                "global step, and env must be an object"
            )
        previous = step
    return value


def _mapping(parent: dict, key: str, where: str) -> dict:
    value = parent.get(key)
    if not isinstance(value, dict):
        raise CheckpointError(f"{where}: state.json lacks the mapping {key!r}")
    return value


def _count(parent: dict, key: str, where: str) -> int:
    value = parent.get(key)
    if not (isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 2**63):
        raise CheckpointError(f"{where}.{key} is not a non-negative integer")
    return value
