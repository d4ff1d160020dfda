"""The probe's traces (reprocube.probe) read back and compared: for `reprocube check`, the first step at
which one run of a script departs from another, and for a stopped run, after which stop, where each
restart resumed and whether it resumed at all.

A trace is written by someone else's process: read through reprocube.untrusted (a regular file, bounded,
strict JSON lines), every record type-checked, and a malformed one is a CheckpointError naming the file
and line. Each attempt of a stopped run has its own file. An attempt's records carry the global step when
the script passed it; otherwise the first attempt counts from step 1 and a later one from where it
resumed, found by its first update: the uninterrupted run's step whose loss bits and fingerprints it
equals (an update at another step does not give the same bits), else the last checkpoint an earlier
attempt announced (then the attempt departs at its first update, and the answer says it assumed)."""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field
from pathlib import Path

from reprocube.errors import CheckpointError
from reprocube.untrusted import Fields, iter_json_lines

PROBE_VERSION = 1
MAX_TRACE_BYTES = 512 << 20  # about 5 million steps of an 8-tensor model
MAX_TENSORS = 100_000
LOSS_DTYPES = {"float16": 2, "bfloat16": 2, "float32": 4, "float64": 8}
HEX = re.compile(r"^[0-9a-f]*\Z")


@dataclass(frozen=True)
class Update:
    loss: str  # the loss's little-endian bits, hex
    loss_dtype: str
    fingerprints: tuple[int, ...]  # per tensor, in the header's name order


@dataclass
class AttemptTrace:
    path: Path
    names: list[str] = field(default_factory=list)
    updates: list[tuple[int | None, Update]] = field(default_factory=list)  # (the step the script gave, update)
    checkpoints: list[int] = field(default_factory=list)  # global steps announced, in order


def read_trace(path: Path, expect_sha256: str | None = None) -> AttemptTrace | None:
    """One attempt's trace; None where the script wrote none (no probe, or stopped before its first step).
    `expect_sha256`: the sha256 a receipt records of it, checked against the very bytes parsed."""
    if not path.exists() and not path.is_symlink():
        return None
    trace, where = AttemptTrace(path), str(path)
    last_given = 0
    digest = hashlib.sha256() if expect_sha256 is not None else None
    for number, value in iter_json_lines(path, CheckpointError, MAX_TRACE_BYTES, digest):
        fields = Fields(value, f"{where}:{number}", CheckpointError)
        if number == 1:
            _keys(fields, ("probe",))
            fields.integer("probe", PROBE_VERSION, PROBE_VERSION)
        elif fields.has("names"):
            if trace.names:
                raise CheckpointError(f"{fields.where}: a second names record")
            _names(fields, trace)
        elif fields.has("checkpoint"):
            _keys(fields, ("checkpoint", "after_index"))
            fields.integer("after_index", len(trace.updates), len(trace.updates))  # the steps recorded before it
            trace.checkpoints.append(fields.integer("checkpoint", 0, 2**62))
        else:
            if not trace.names:
                raise CheckpointError(f"{fields.where}: an update before the names record")
            given, update = _update(fields, len(trace.updates) + 1, len(trace.names))
            if given is not None:  # the script's own steps only increase (the probe refuses others)
                fields.integer("step", last_given + 1, 2**62)
                last_given = given
            trace.updates.append((given, update))
    if digest is not None and digest.hexdigest() != expect_sha256:
        raise CheckpointError(f"{path}: its sha256 is not the one its receipt records (the trace was changed)")
    return trace


def _names(fields: Fields, trace: AttemptTrace) -> None:
    _keys(fields, ("names",))
    trace.names = fields.texts("names")
    if not 0 < len(trace.names) <= MAX_TENSORS or len(set(trace.names)) != len(trace.names):
        raise CheckpointError(f"{fields.where}: names must be 1 to {MAX_TENSORS} distinct names")


def _update(fields: Fields, index: int, tensors: int) -> tuple[int | None, Update]:
    _keys(fields, ("index", "step", "loss", "loss_dtype", "fingerprints"))
    fields.integer("index", index, index)
    step = fields.nullable("step", lambda key: fields.integer(key, 1, 2**62))
    dtype = fields.one_of("loss_dtype", tuple(LOSS_DTYPES))
    loss = fields.text("loss")
    if len(loss) != 2 * LOSS_DTYPES[dtype] or not HEX.match(loss):
        raise CheckpointError(f"{fields.where}: loss must be {2 * LOSS_DTYPES[dtype]} lowercase hex digits (a {dtype})")
    prints = fields.present("fingerprints")
    if not (
        isinstance(prints, list)
        and len(prints) == tensors
        and all(isinstance(p, int) and not isinstance(p, bool) and 0 <= p < 2**32 for p in prints)
    ):
        raise CheckpointError(f"{fields.where}: fingerprints must be a list of {tensors} integers from 0 to 2**32-1")
    return step, Update(loss, dtype, tuple(prints))


def _keys(fields: Fields, keys: tuple[str, ...]) -> None:
    unknown = sorted(set(fields.value) - set(keys))
    if unknown:
        raise CheckpointError(f"{fields.where}: unknown key {unknown[0]!r}")
    for key in keys:
        fields.present(key)


def steps_of(trace: AttemptTrace, start: int) -> dict[int, Update]:
    """The attempt's updates by global step: the step the script gave, else one after the previous."""
    steps, step = {}, start
    for given, update in trace.updates:
        step = given if given is not None else step + 1
        steps[step] = update
    return steps


def first_difference(a: dict[int, Update], b: dict[int, Update], names: list[str]) -> dict | None:
    """The first step both traces hold whose update differs: the loss bits, and the tensors whose
    fingerprints differ, named."""
    for step in sorted(set(a) & set(b)):
        if a[step] != b[step]:
            return _described(step, a[step], b[step], names)
    return None


def _described(step: int, a: Update, b: Update, names: list[str]) -> dict:
    tensors = [name for name, x, y in zip(names, a.fingerprints, b.fingerprints, strict=True) if x != y]
    return {
        "step": step,
        "loss_a": loss_value(a),
        "loss_b": loss_value(b),
        "loss_same": a.loss == b.loss,
        "tensors": tensors,
        "tensor_count": len(names),
    }


def loss_value(update: Update) -> str:
    """The loss as a number, from its bits (a finite float prints exactly enough to tell two apart)."""
    import numpy as np

    dtype = np.float32 if update.loss_dtype == "bfloat16" else np.dtype(update.loss_dtype).newbyteorder("<")
    raw = bytes.fromhex(update.loss)
    if update.loss_dtype == "bfloat16":  # its bits are a float32's upper half
        raw = b"\x00\x00" + raw
    return repr(float(np.frombuffer(raw, dtype=dtype)[0]))


def compare_stopped(clean: AttemptTrace, attempts: list[AttemptTrace | None]) -> dict:
    """The stopped run's attempts against the uninterrupted run's trace: where each attempt resumed
    (given, matched or assumed), whether a restart started again from step 1, the first differing update
    and after which stop, and the uninterrupted run's steps no attempt recorded (a stop ends an attempt
    before the probe writes its last steps: those after the last checkpoint it announced are lost, and
    retrained by the restart only if it resumes from that checkpoint; they are not compared)."""
    reference = steps_of(clean, 0)
    by_update = {update: step for step, update in reference.items()}
    described, trained, announced, first = [], {}, [], None
    for number, trace in enumerate(attempts, start=1):
        if trace is None or not trace.updates:
            described.append({"attempt": number, "steps": 0})
            announced += trace.checkpoints if trace else []
            continue
        if trace.names != clean.names:
            return {
                "error": f"attempt {number} recorded other tensors than the uninterrupted run ({len(trace.names)} "
                f"vs {len(clean.names)})",
                "attempts": described,
            }
        given, update = trace.updates[0]
        if number == 1 or given is not None:
            start, how = (given - 1 if given is not None else 0), "given" if given is not None else "first"
        elif update in by_update:
            start, how = by_update[update] - 1, "matched"
        else:
            start, how = (announced[-1] if announced else 0), "assumed"
        steps = steps_of(trace, start)
        # From scratch: began at step 1 again although an earlier attempt had announced a checkpoint (a
        # restart before the first checkpoint rightly begins at step 1).
        entry = {
            "attempt": number,
            "steps": len(steps),
            "resumed_at": start,
            "how": how,
            "last_announced": announced[-1] if announced else None,
            "from_scratch": number > 1 and start == 0 and how != "assumed" and any(announced),
        }
        described.append(entry)
        difference = first_difference(reference, steps, clean.names)
        if difference is not None and first is None:
            first = {**difference, "attempt": number, "after_stop": number - 1}
        trained.update(steps)
        announced += trace.checkpoints
    missing = sorted(set(reference) - set(trained))
    return {
        "attempts": described,
        "first_difference": first,
        "compared_steps": len(set(reference) & set(trained)),
        "reference_steps": len(reference),
        "unrecorded_steps": _ranges(missing),
        "extra_steps": _ranges(sorted(set(trained) - set(reference))),
    }


def _ranges(steps: list[int]) -> list[list[int]]:
    """[[first, last], ...] of consecutive steps."""
    ranges: list[list[int]] = []
    for step in steps:
        if ranges and ranges[-1][1] == step - 1:
            ranges[-1][1] = step
        else:
            ranges.append([step, step])
    return ranges


def describe_difference(difference: dict, a: str = "A", b: str = "B") -> str:
    """The losses (labelled a and b) and the tensors whose fingerprints differ, in a few words."""
    tensors = difference["tensors"]
    named = ", ".join(tensors[:4]) + (f" and {len(tensors) - 4} more" if len(tensors) > 4 else "")
    weights = f"weights differ in {named}" if tensors else "the weights after it are the same"
    if difference["loss_same"]:
        return f"the same loss; {weights}"
    return f"loss {difference['loss_b']} {b} vs {difference['loss_a']} {a}; {weights}"
