"""The step trace: the exact bits of every optimizer step's loss, a fingerprint of the weights after every
step, and a digest of every weight tensor at fixed global steps (every `trace.every_steps`, each epoch's
end and each checkpoint). It travels in every checkpoint (state.json "trace") and in the run's receipt, so
that another machine can find the first step at which its run computes differently from ours without any
of our checkpoints.

A fresh run's trace also holds a boundary at global step 0: the digests of the initial weights, so
that an initialisation computed differently is told apart from the first update doing so.

The losses are fetched once per group of steps (the loop already returns to Python there), never with a
host sync per step. They are stored as the little-endian bytes of one float32 array in byte planes (every
step's first byte, then every second, ...), deflated and base64-encoded (`encode_losses`): a run's losses
share their sign and exponent bytes, which makes them about 3 bytes a step instead of 4 (trace version
2; version 1, the plain bytes, is still read). The trace depends only on the global steps, not on how
the loop grouped them or where a run was resumed, so an interrupted run's trace equals the uninterrupted
one's.

The weight fingerprint (`fingerprint`): per tensor, the sum modulo 2**32 of its float32 bit patterns read
as unsigned integers, each first mixed (`mix`: x XOR x*x): without it, two elements changed by one unit
in opposite directions (+1 and -1 in their last bit, what another CPU's kernels often give) left the sum
unchanged, and an AVX-512 machine capped at SSE4.1 changed conv1.weight and fc2.weight without changing
their fingerprints. It is exact and independent of the order of the additions, so each framework
computes it on its device inside the step (no host sync) and all agree on equal weights, whatever the
tensor's layout (a transposed kernel has the same fingerprint). The trace stores, for every step, the
model's fingerprint (the tensors' fingerprints summed modulo 2**32: 4 bytes a step, like the losses), and
the fingerprint of each tensor for the first TENSOR_FINGERPRINT_STEPS global steps only (where a machine
usually first computes differently; 8 tensors x 4 bytes every step would make a receipt 80 KB an epoch).
Traces written before fingerprints existed have none; a trace resumed from one starts them at the
resume (`fingerprint_first_step`)."""

from __future__ import annotations

import base64
import binascii
import hashlib
import re
import zlib
from dataclasses import dataclass, field

import numpy as np

from reprocube.errors import ReprocubeError
from reprocube.untrusted import Fields

TRACE_VERSION = 2  # 2: the losses deflated (1: their plain bytes; the fingerprint keys optional in both)
LOSS_KEYS = {1: "loss_f32_le_base64", 2: "loss_f32_le_planes_deflate_base64"}  # by trace version
TENSOR_DIGEST = re.compile(r"^[0-9a-f]{16}\Z")  # \Z: "$" would also match before a final newline
MAX_TRACE_STEPS = 50_000_000  # 200 MB of loss bits: beyond any run this benchmark trains
FINGERPRINT_KEYS = (
    "fingerprint_first_step",
    "fingerprint_u32_le_base64",
    "tensor_fingerprint_steps",
    "tensor_fingerprint_u32_le_base64",
)
TENSOR_FINGERPRINT_STEPS = 64  # per-tensor fingerprints for the global steps 1..64 (2.7 KB of base64 for 8 tensors)


def mix(bits: np.ndarray) -> np.ndarray:
    """What each trainer applies to every uint32 bit pattern before summing: x XOR (x * x mod 2**32). Not
    linear, so opposite changes of two elements do not cancel in the sum (a multiply by a constant would
    keep +1 and -1 cancelling); a flipped bit anywhere, the sign's included, changes it. Cheap: one
    product and one XOR (a full 32-bit hash cost 90 us a step in PyTorch here, this 3 us)."""
    x = np.asarray(bits, dtype=np.uint32)
    return x ^ (x * x)


def fingerprint(weights: dict[str, np.ndarray]) -> np.ndarray:
    """The reference of what each trainer computes on its device after a step: for each float32 tensor, in
    sorted name order, the sum modulo 2**32 of its mixed bit patterns (exact, any order of addition)."""
    sums = []
    for name in sorted(weights):
        array = np.ascontiguousarray(weights[name])
        if array.dtype != np.float32:
            raise ValueError(f"fingerprint of {name}: {array.dtype} is not float32")
        sums.append(mix(array.reshape(-1).view(np.uint32)).sum(dtype=np.uint32))
    return np.array(sums, dtype=np.uint32)


def model_fingerprint(tensor_fingerprints: np.ndarray) -> np.ndarray:
    """(steps, tensors) uint32 -> (steps,) uint32: each step's tensor fingerprints summed modulo 2**32."""
    return np.asarray(tensor_fingerprints, dtype=np.uint32).sum(axis=-1, dtype=np.uint32)


def text_digest(text: str) -> str:
    """64 bits of the sha256 of a text, as tensor_digest gives for a tensor (an operation's non-tensor
    arguments in a replay's recording)."""
    return hashlib.sha256(text.encode()).hexdigest()[:16]


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
    # Global steps done before the first fingerprinted step; None: the trace holds no fingerprints.
    fingerprint_first_step: int | None = None
    tensor_fingerprint_steps: int = TENSOR_FINGERPRINT_STEPS  # per-tensor rows for global steps up to this
    _model_chunks: list[np.ndarray] = field(default_factory=list, repr=False)  # uint32 (steps,)
    _tensor_chunks: list[np.ndarray] = field(default_factory=list, repr=False)  # uint32 (steps, tensors)

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

    @property
    def fingerprints(self) -> np.ndarray:
        """uint32 model fingerprints of the global steps fingerprint_first_step+1 .. last_step."""
        if len(self._model_chunks) != 1:
            joined = np.concatenate(self._model_chunks) if self._model_chunks else np.zeros(0, np.uint32)
            self._model_chunks = [joined]
        return self._model_chunks[0]

    @property
    def tensor_fingerprints(self) -> np.ndarray:
        """uint32 (steps, len(tensor_names)): each tensor's fingerprint at the global steps
        fingerprint_first_step+1 .. min(last_step, tensor_fingerprint_steps)."""
        if len(self._tensor_chunks) != 1:
            width = len(self.tensor_names)
            joined = np.concatenate(self._tensor_chunks) if self._tensor_chunks else np.zeros((0, width), np.uint32)
            self._tensor_chunks = [joined]
        return self._tensor_chunks[0]

    @property
    def tensor_fingerprint_last(self) -> int:
        """The last global step with per-tensor fingerprints (fingerprint_first_step when none)."""
        first = self.fingerprint_first_step if self.fingerprint_first_step is not None else self.first_step
        return max(first, min(self.last_step, self.tensor_fingerprint_steps))

    def add_losses(self, losses: np.ndarray, fingerprints: np.ndarray | None = None) -> None:
        """One group of steps: their float32 losses and, from a trainer that computes them, their
        (steps, tensors) uint32 weight fingerprints (columns in sorted weight-name order)."""
        losses = np.asarray(losses, dtype=np.float32).reshape(-1)
        if fingerprints is None:
            if self.fingerprint_first_step is not None:
                raise ValueError("a trace with weight fingerprints needs them for every step")
            self._chunks.append(losses)
            return
        fingerprints = np.asarray(fingerprints, dtype=np.uint32)
        if fingerprints.ndim != 2 or len(fingerprints) != len(losses):
            raise ValueError(f"fingerprints {fingerprints.shape} do not match {len(losses)} losses")
        if self.tensor_names and fingerprints.shape[1] != len(self.tensor_names):
            raise ValueError(
                f"fingerprints of {fingerprints.shape[1]} tensors, the trace names {len(self.tensor_names)}"
            )
        before = self.last_step
        if self.fingerprint_first_step is None:
            self.fingerprint_first_step = before  # a fresh trace, or one resumed from before fingerprints
        self._chunks.append(losses)
        self._model_chunks.append(model_fingerprint(fingerprints))
        keep = max(0, min(len(fingerprints), self.tensor_fingerprint_steps - before))
        if keep:
            if not self.tensor_names:
                raise ValueError("per-tensor fingerprints need the trace's tensor_names first")
            self._tensor_chunks.append(fingerprints[:keep].copy())

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
        value = {
            "version": TRACE_VERSION,
            "every_steps": self.every_steps,
            "first_step": self.first_step,
            "steps": len(self.losses),
            LOSS_KEYS[TRACE_VERSION]: encode_losses(self.losses),
            "tensor_names": self.tensor_names,
            "boundaries": [[b.step, b.tensors] for b in self.boundaries],
        }
        if self.fingerprint_first_step is not None:
            value.update(
                fingerprint_first_step=self.fingerprint_first_step,
                fingerprint_u32_le_base64=_encode_u32(self.fingerprints),
                tensor_fingerprint_steps=self.tensor_fingerprint_steps,
                tensor_fingerprint_u32_le_base64=_encode_u32(self.tensor_fingerprints),
            )
        return value

    @classmethod
    def from_json(cls, value, where: str, error: type[ReprocubeError]) -> StepTrace:
        """The mirror of to_json, every key checked (one line naming the key when wrong)."""
        fields = Fields(value, where, error)
        version = fields.integer("version")
        if version not in LOSS_KEYS:
            raise error(
                f"{where}: trace version {version} is not one this reprocube reads ({', '.join(map(str, LOSS_KEYS))})"
            )
        every = fields.integer("every_steps")
        first = fields.integer("first_step")
        steps = fields.integer("steps", 0, MAX_TRACE_STEPS)
        key = LOSS_KEYS[version]
        other = next((k for k in LOSS_KEYS.values() if k != key and k in value), None)
        if other is not None:
            raise error(f"{where}.{other} is not a key of a version {version} trace")
        if version == 1:  # the plain bytes (an empty trace may leave the key out)
            blob = _decode_base64(fields.text(key, optional=True) or "", f"{where}.{key}", error)
            if len(blob) != 4 * steps:
                raise error(f"{where}.{key} holds {len(blob)} bytes, not 4 for each of its {steps} steps")
            losses = np.frombuffer(blob, dtype="<f4").astype(np.float32)
        else:
            losses = decode_losses(fields.text(key), steps, f"{where}.{key}", error)
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
        trace = cls(every, first, list(names), boundaries, [losses])
        present = [key for key in FINGERPRINT_KEYS if key in value]
        if present:  # none: a trace from before fingerprints (or from a trainer without them)
            if len(present) != len(FINGERPRINT_KEYS):
                missing = ", ".join(key for key in FINGERPRINT_KEYS if key not in value)
                raise error(f"{where}: the fingerprint keys come together; {missing} missing")
            _read_fingerprints(trace, fields, where, error)
        return trace


def encode_losses(losses: np.ndarray) -> str:
    """float32 losses as trace version 2 stores them: their little-endian bytes in byte planes, raw
    deflate, base64. Losses that repeat so much that they deflate past what a reader expands
    (MAX_INFLATION) are stored in deflate's uncompressed blocks instead: what we write, we read."""
    planes = np.ascontiguousarray(losses, dtype="<f4").view(np.uint8).reshape(-1, 4).T.tobytes()
    deflated = _deflate(planes, 9)
    if len(planes) > MAX_INFLATION * len(deflated) + INFLATION_SLACK:
        deflated = _deflate(planes, 0)
    return base64.b64encode(deflated).decode("ascii")


def _deflate(data: bytes, level: int) -> bytes:
    compressor = zlib.compressobj(level, zlib.DEFLATED, -15)
    return compressor.compress(data) + compressor.flush()


def decode_losses(text: str, steps: int, where: str, error) -> np.ndarray:
    """The float32 losses of encode_losses' text for `steps` steps (one line naming `where` if it is not)."""
    blob = _inflate_planes(_decode_base64(text, where, error), 4 * steps, where, error)  # exactly 4 * steps
    return np.frombuffer(blob, dtype="<f4").astype(np.float32)


# The most a deflated loss trace may expand: real losses shrink to about 0.77 (benchmarks/README.md); a
# small forged trace must not expand to hundreds of MB.
MAX_INFLATION = 16
INFLATION_SLACK = 1 << 16


def _decode_base64(text: str, where: str, error) -> bytes:
    """Canonical base64 only: bits past the data in the last character (which b64decode ignores) would let
    two different texts claim the same bytes."""
    try:
        blob = base64.b64decode(text.encode("ascii"), validate=True)
    except (binascii.Error, UnicodeEncodeError):
        raise error(f"{where} is not base64") from None
    if base64.b64encode(blob).decode("ascii") != text:
        raise error(f"{where} is not canonical base64 (bits beyond its bytes are set)")
    return blob


def _inflate_planes(deflated: bytes, size: int, where: str, error) -> bytes:
    """Byte planes (encode_losses) back to little-endian float32 bytes: exactly `size` bytes of one whole
    raw deflate stream, expanded at most MAX_INFLATION times."""
    if size > MAX_INFLATION * len(deflated) + INFLATION_SLACK:
        raise error(f"{where}: {len(deflated)} deflated bytes cannot hold {size // 4} steps' losses")
    inflater = zlib.decompressobj(-15)
    try:
        planes = inflater.decompress(deflated, size + 1)
    except zlib.error:
        raise error(f"{where} is not a deflate stream") from None
    if len(planes) != size or not inflater.eof or inflater.unused_data or inflater.unconsumed_tail:
        raise error(f"{where} does not hold exactly {size // 4} steps' losses in one deflate stream")
    return np.frombuffer(planes, np.uint8).reshape(4, -1).T.tobytes()


def _encode_u32(array: np.ndarray) -> str:
    return base64.b64encode(np.ascontiguousarray(array, dtype="<u4").tobytes()).decode("ascii")


def _decode_u32(fields: Fields, key: str, count: int, what: str, where: str, error) -> np.ndarray:
    blob = _decode_base64(fields.text(key), f"{where}.{key}", error)
    if len(blob) != 4 * count:
        raise error(f"{where}.{key} holds {len(blob)} bytes, not 4 for each of its {count} {what}")
    return np.frombuffer(blob, dtype="<u4").astype(np.uint32)


def _read_fingerprints(trace: StepTrace, fields: Fields, where: str, error) -> None:
    """The optional fingerprint keys of a trace, each checked against the losses' steps and the tensor names."""
    last = trace.last_step
    trace.fingerprint_first_step = fields.integer("fingerprint_first_step", trace.first_step, last)
    trace.tensor_fingerprint_steps = fields.integer("tensor_fingerprint_steps", 0, MAX_TRACE_STEPS)
    steps = last - trace.fingerprint_first_step
    trace._model_chunks = [_decode_u32(fields, "fingerprint_u32_le_base64", steps, "fingerprinted steps", where, error)]
    rows, width = trace.tensor_fingerprint_last - trace.fingerprint_first_step, len(trace.tensor_names)
    if rows and not width:
        raise error(f"{where}.tensor_fingerprint_u32_le_base64 needs tensor_names")
    values = _decode_u32(
        fields,
        "tensor_fingerprint_u32_le_base64",
        rows * width,
        f"values ({rows} steps x {width} tensors)",
        where,
        error,
    )
    tensors = values.reshape(rows, width)
    if rows and not np.array_equal(model_fingerprint(tensors), trace.fingerprints[:rows]):
        raise error(f"{where}.tensor_fingerprint_u32_le_base64 does not sum to the model fingerprints")
    trace._tensor_chunks = [tensors]


def first_weight_difference(a: StepTrace, b: StepTrace) -> dict | None:
    """The first global step after which the two runs' weights differ, by their fingerprints: {"step",
    "tensors"} (the names of the tensors whose fingerprints differ there, in name order; None where the
    traces hold no per-tensor fingerprints for that step or name different tensors). None when every
    step both traces fingerprint agrees (or there is none: see fingerprint_overlap)."""
    first, last = fingerprint_overlap(a, b)
    if last <= first:
        return None
    fa = a.fingerprints[first - a.fingerprint_first_step : last - a.fingerprint_first_step]
    fb = b.fingerprints[first - b.fingerprint_first_step : last - b.fingerprint_first_step]
    differs = fa != fb
    same_names = a.tensor_names == b.tensor_names
    # Per-tensor rows both traces hold: a difference whose tensor sums cancel in the model's sum still counts.
    tensor_last = min(a.tensor_fingerprint_last, b.tensor_fingerprint_last, last)
    ta = tb = None
    if same_names and tensor_last > first:
        ta = a.tensor_fingerprints[first - a.fingerprint_first_step : tensor_last - a.fingerprint_first_step]
        tb = b.tensor_fingerprints[first - b.fingerprint_first_step : tensor_last - b.fingerprint_first_step]
        differs[: tensor_last - first] |= (ta != tb).any(axis=1)
    where = np.flatnonzero(differs)
    if not where.size:
        return None
    index = int(where[0])
    tensors = None
    if ta is not None and index < len(ta):
        tensors = [n for n, x, y in zip(a.tensor_names, ta[index], tb[index], strict=True) if x != y]
    return {"step": first + index + 1, "tensors": tensors}


def fingerprint_overlap(a: StepTrace, b: StepTrace) -> tuple[int, int]:
    """(first, last): both traces fingerprint the global steps first+1 .. last (last <= first: none)."""
    if a.fingerprint_first_step is None or b.fingerprint_first_step is None:
        return 0, 0
    return max(a.fingerprint_first_step, b.fingerprint_first_step), min(a.last_step, b.last_step)


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
    # The weight fingerprints (first_weight_difference): the first step after which the weights differ,
    # and the tensors that differ there (None: no per-tensor fingerprints for that step).
    first_weight_step: int | None = None
    first_weight_tensors: list[str] | None = None
    fingerprinted_steps: int = 0  # the steps both traces fingerprint (0: one of them has none)
    # Every common fingerprint and boundary digest equal (without fingerprints: the boundaries alone).
    weights_identical: bool = True
    # Loss bits differ while every common step's fingerprint and every boundary agree, and the
    # fingerprints cover every common step: the weights never differed (a loss computed differently).
    loss_only: bool = False
    # The initial weights (both traces' boundary at global step 0, before any update): the tensors whose
    # digests differ ([]: they agree; None: a trace has no such boundary, as those written before it).
    initial_tensors: list[str] | None = None

    @property
    def step(self) -> int | None:
        """The first diverging global step: the first loss that differs, or the first step whose weights
        differ (fingerprint, else boundary) if that comes first (a step whose forward pass agrees but whose
        update does not)."""
        boundary = self.first_boundary.step if self.first_boundary is not None else None
        candidates = [s for s in (self.first_loss_step, self.first_weight_step, boundary) if s is not None]
        if self.initial_tensors:  # differing initial weights: the first step already starts elsewhere
            candidates.append(self.common_first + 1)
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
    weights = first_weight_difference(a, b)
    weight_step = weights["step"] if weights else None
    earliest = min((s for s in (first_loss, weight_step) if s is not None), default=None)
    b_at = {boundary.step: boundary for boundary in b.boundaries}
    compared, first_bad, last_good, tensors, initial = 0, None, None, [], None
    same_names = a.tensor_names == b.tensor_names
    for boundary in a.boundaries:
        other = b_at.get(boundary.step)
        if other is None:
            continue
        if boundary.step == 0:  # the initial weights: named apart, the first differing step stays a step
            initial = _differing(a.tensor_names, boundary, b.tensor_names, other)
            if initial:  # every later boundary comes after the difference
                earliest = min(first + 1, earliest) if earliest is not None else first + 1
            elif same_names:
                last_good = 0
            continue
        compared += 1  # after the updates: what tells losses-only without fingerprints
        if same_names and other.tensors == boundary.tensors:
            if first_bad is None and (earliest is None or boundary.step < earliest):
                last_good = boundary.step
            continue
        if first_bad is None:
            first_bad = boundary
            tensors = _differing(a.tensor_names, boundary, b.tensor_names, other)
    fp_first, fp_last = fingerprint_overlap(a, b)
    fingerprinted = max(fp_last - fp_first, 0)
    identical = weights is None and first_bad is None and same_names and not initial
    return Divergence(
        first,
        last,
        first_loss,
        first_bad,
        last_good,
        tensors,
        compared,
        first_weight_step=weight_step,
        first_weight_tensors=weights["tensors"] if weights else None,
        fingerprinted_steps=fingerprinted,
        weights_identical=identical,
        loss_only=first_loss is not None and identical and last > first and (fp_first, fp_last) == (first, last),
        initial_tensors=initial,
    )


def _differing(names_a: list[str], a: Boundary, names_b: list[str], b: Boundary) -> list[str]:
    """The tensors whose digests differ at a boundary both traces hold, by name (a name only one of them
    has differs), in name order."""
    digests_a, digests_b = dict(zip(names_a, a.tensors, strict=True)), dict(zip(names_b, b.tensors, strict=True))
    return sorted(n for n in digests_a.keys() | digests_b.keys() if digests_a.get(n) != digests_b.get(n))
