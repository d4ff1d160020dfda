"""The step trace: the exact bits of every optimizer step's loss, and a digest of every weight tensor at
fixed global steps (every `trace.every_steps`, each epoch's end and each checkpoint). It travels in every
checkpoint (state.json "trace") and in the run's receipt, so that another machine can find the first
step at which its run computes differently from ours without any of our checkpoints.

The losses are fetched once per group of steps (the loop already returns to Python there), never with a
host sync per step. They are stored as the little-endian bytes of one float32 array, base64-encoded:
4 bytes a step. The trace depends only on the global steps, not on how the loop grouped them or where a
run was resumed, so an interrupted run's trace equals the uninterrupted one's."""

from __future__ import annotations

import base64
import binascii
import hashlib
import re
from dataclasses import dataclass, field

import numpy as np

from reprocube.errors import ReprocubeError
from reprocube.untrusted import Fields

TRACE_VERSION = 1
TENSOR_DIGEST = re.compile(r"^[0-9a-f]{16}$")
MAX_TRACE_STEPS = 50_000_000  # 200 MB of loss bits: beyond any run this benchmark trains


def tensor_digest(array: np.ndarray) -> str:
    """64 bits of the sha256 of one tensor's dtype, shape and little-endian bytes: enough to tell two
    tensors apart by accident (the receipt's own sha256 and signature guard against forgery)."""
    array = np.asarray(array, order="C")
    array = array.astype(array.dtype.newbyteorder("<"), copy=False)
    digest = hashlib.sha256(f"{array.dtype.str}{list(array.shape)}".encode())
    digest.update(array.tobytes())
    return digest.hexdigest()[:16]


@dataclass
class Boundary:
    step: int  # global steps done
    tensors: list[str]  # tensor_digest of each weight, in StepTrace.tensor_names order


@dataclass
class StepTrace:
    every_steps: int  # 0: boundaries only at epoch ends and checkpoints
    first_step: int  # global steps done before the first traced loss (a run resumed from an old checkpoint)
    tensor_names: list[str] = field(default_factory=list)
    boundaries: list[Boundary] = field(default_factory=list)
    _chunks: list[np.ndarray] = field(default_factory=list, repr=False)

    @property
    def losses(self) -> np.ndarray:
        """float32 losses of the global steps first_step+1, first_step+2, ..."""
        if len(self._chunks) != 1:
            joined = np.concatenate(self._chunks) if self._chunks else np.zeros(0, np.float32)
            self._chunks = [joined]
        return self._chunks[0]

    @property
    def last_step(self) -> int:
        return self.first_step + sum(len(c) for c in self._chunks)

    def add_losses(self, losses: np.ndarray) -> None:
        self._chunks.append(np.asarray(losses, dtype=np.float32).reshape(-1))

    def boundary_due(self, global_step: int) -> bool:
        return bool(self.every_steps) and global_step % self.every_steps == 0

    def add_boundary(self, global_step: int, weights: dict[str, np.ndarray]) -> None:
        if self.boundaries and self.boundaries[-1].step == global_step:
            return  # the epoch's end and its checkpoint: one boundary
        names = sorted(weights)
        if not self.tensor_names:
            self.tensor_names = names
        self.boundaries.append(Boundary(global_step, [tensor_digest(weights[n]) for n in self.tensor_names]))

    def loss_bits(self) -> np.ndarray:
        return self.losses.view(np.uint32)

    def to_json(self) -> dict:
        blob = self.losses.astype("<f4", copy=False).tobytes()
        return {
            "version": TRACE_VERSION,
            "every_steps": self.every_steps,
            "first_step": self.first_step,
            "steps": len(self.losses),
            "loss_f32_le_base64": base64.b64encode(blob).decode("ascii"),
            "tensor_names": self.tensor_names,
            "boundaries": [[b.step, b.tensors] for b in self.boundaries],
        }

    @classmethod
    def from_json(cls, value, where: str, error: type[ReprocubeError]) -> StepTrace:
        """The mirror of to_json, every key checked (one line naming the key when wrong)."""
        fields = Fields(value, where, error)
        version = fields.integer("version")
        if version != TRACE_VERSION:
            raise error(f"{where}: trace version {version} is not one this reprocube reads ({TRACE_VERSION})")
        every = fields.integer("every_steps")
        first = fields.integer("first_step")
        steps = fields.integer("steps", 0, MAX_TRACE_STEPS)
        encoded = fields.text("loss_f32_le_base64", optional=True) or ""
        try:
            blob = base64.b64decode(encoded.encode("ascii"), validate=True)
        except (binascii.Error, UnicodeEncodeError):
            raise error(f"{where}.loss_f32_le_base64 is not base64") from None
        if len(blob) != 4 * steps:
            raise error(f"{where}.loss_f32_le_base64 holds {len(blob)} bytes, not 4 for each of its {steps} steps")
        names = value.get("tensor_names")
        if not (isinstance(names, list) and all(isinstance(n, str) and n for n in names)):
            raise error(f"{where}.tensor_names must be a list of tensor names")
        if len(set(names)) != len(names):
            raise error(f"{where}.tensor_names repeats a name")
        raw = value.get("boundaries")
        if not isinstance(raw, list):
            raise error(f"{where}.boundaries must be a list")
        boundaries, previous = [], first
        for i, entry in enumerate(raw):
            ok = (
                isinstance(entry, list)
                and len(entry) == 2
                and isinstance(entry[0], int)
                and not isinstance(entry[0], bool)
                and previous <= entry[0] <= first + steps
                and isinstance(entry[1], list)
                and len(entry[1]) == len(names)
                and all(isinstance(d, str) and TENSOR_DIGEST.match(d) for d in entry[1])
            )
            if not ok or (boundaries and entry[0] == boundaries[-1].step):
                raise error(
                    f"{where}.boundaries[{i}] must be [global step (increasing, within the trace), "
                    f"[one 16-hex digest per tensor name]]"
                )
            previous = entry[0]
            boundaries.append(Boundary(entry[0], list(entry[1])))
        losses = np.frombuffer(blob, dtype="<f4").astype(np.float32)
        return cls(every, first, list(names), boundaries, [losses])


@dataclass(frozen=True)
class Divergence:
    """Where two traces first disagree (None fields: they agree over what both cover)."""

    common_first: int  # the first global step both traces cover (steps after it are compared)
    common_last: int
    first_loss_step: int | None  # the first global step whose loss bits differ
    first_boundary: Boundary | None  # in trace A: the first boundary whose digests differ in B
    last_matching_boundary: int | None  # the last boundary step before the first difference, digests equal
    tensors: list[str]  # at first_boundary: the tensors whose digests differ (in name order)
    compared_boundaries: int

    @property
    def step(self) -> int | None:
        """The first diverging global step: the first loss that differs, or the first boundary whose
        weights differ if that comes first (a step whose forward pass agrees but whose update does not)."""
        boundary = self.first_boundary.step if self.first_boundary is not None else None
        candidates = [s for s in (self.first_loss_step, boundary) if s is not None]
        return min(candidates) if candidates else None


def compare_traces(a: StepTrace, b: StepTrace) -> Divergence:
    """Compare the steps and boundaries both traces cover, bit for bit."""
    first, last = max(a.first_step, b.first_step), min(a.last_step, b.last_step)
    first_loss = None
    if last > first:
        bits_a = a.loss_bits()[first - a.first_step : last - a.first_step]
        bits_b = b.loss_bits()[first - b.first_step : last - b.first_step]
        differing = np.flatnonzero(bits_a != bits_b)
        if differing.size:
            first_loss = first + int(differing[0]) + 1
    b_at = {boundary.step: boundary for boundary in b.boundaries}
    compared, first_bad, last_good, tensors = 0, None, None, []
    same_names = a.tensor_names == b.tensor_names
    for boundary in a.boundaries:
        other = b_at.get(boundary.step)
        if other is None:
            continue
        compared += 1
        if same_names and other.tensors == boundary.tensors:
            if first_bad is None and (first_loss is None or boundary.step < first_loss):
                last_good = boundary.step
            continue
        if first_bad is None:
            first_bad = boundary
            if same_names:
                tensors = [n for n, x, y in zip(a.tensor_names, boundary.tensors, other.tensors, strict=True) if x != y]
            else:
                tensors = sorted(set(a.tensor_names) ^ set(b.tensor_names))
    return Divergence(first, last, first_loss, first_bad, last_good, tensors, compared)
