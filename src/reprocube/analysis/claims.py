"""Every claim a published run's receipt (A) makes, each classified against this machine's run (B) as
reproduced, differs, or not checked (with the reason): the ledger a verdict is read from, so that no
verdict says more than was compared.

A claim is one recorded fact about A's computation: each step's loss bits, each step's weight
fingerprint (the model's, and each tensor's for the first steps), each tensor's digest at each weight
boundary (the initial weights apart), each deterministic field of each epoch record (the trained
weights' digest apart), each result-affecting config key, each dataset payload, and the weights at the
end of each of A's sessions. What a receipt holds that is not a claim (A's machine, described; its
code's digests; timings; cadences) is named with the reason in reprocube.training.receipt.NOT_EVIDENCE."""

from __future__ import annotations

import json
from dataclasses import dataclass, field

import numpy as np

from reprocube.config import result_config
from reprocube.formats.trace import StepTrace
from reprocube.training.metrics import DETERMINISTIC_EPOCH_FIELDS
from reprocube.training.receipt import Receipt

REPRODUCED, DIFFERS, NOT_CHECKED = "reproduced", "differs", "not_checked"

# The kinds of claim, in the order they are shown. The weight claims say what the trained model is; the
# loss claims what the training steps reported (they may differ while every update agrees).
LOSS_BITS = "loss bits"
MODEL_FINGERPRINTS = "model fingerprints"
TENSOR_FINGERPRINTS = "tensor fingerprints"
INITIAL_DIGESTS = "initial weight digests"
BOUNDARY_DIGESTS = "boundary weight digests"
EPOCH_WEIGHTS = "epoch weight digests"
EPOCH_TRAINING = "epoch training metrics"
EPOCH_TEST = "epoch test metrics"
SESSION_ENDS = "session ends"
CONFIG = "config keys"
DATASET = "dataset payloads"
KINDS = (
    LOSS_BITS,
    MODEL_FINGERPRINTS,
    TENSOR_FINGERPRINTS,
    INITIAL_DIGESTS,
    BOUNDARY_DIGESTS,
    EPOCH_WEIGHTS,
    EPOCH_TRAINING,
    EPOCH_TEST,
    SESSION_ENDS,
    CONFIG,
    DATASET,
)
WEIGHT_KINDS = (MODEL_FINGERPRINTS, TENSOR_FINGERPRINTS, INITIAL_DIGESTS, BOUNDARY_DIGESTS, EPOCH_WEIGHTS, SESSION_ENDS)
LOSS_KINDS = (LOSS_BITS, EPOCH_TRAINING)
TRAINING_FIELDS = ("train_loss", "train_accuracy")  # computed from the steps' own losses and predictions
TEST_FIELDS = tuple(f for f in DETERMINISTIC_EPOCH_FIELDS[2:] if f not in TRAINING_FIELDS)
MAX_REASONS = 4  # reasons kept per kind (the counts hold the rest)


@dataclass
class Tally:
    reproduced: int = 0
    differs: int = 0
    not_checked: int = 0
    why_not_checked: list[str] = field(default_factory=list)

    def add(self, outcome: str, count: int = 1, why: str | None = None) -> None:
        if count <= 0:
            return
        setattr(self, outcome, getattr(self, outcome) + count)
        if (
            outcome == NOT_CHECKED
            and why
            and why not in self.why_not_checked
            and len(self.why_not_checked) < MAX_REASONS
        ):
            self.why_not_checked.append(why)

    def as_dict(self) -> dict:
        return {
            REPRODUCED: self.reproduced,
            DIFFERS: self.differs,
            NOT_CHECKED: self.not_checked,
            "why_not_checked": self.why_not_checked,
        }


@dataclass
class Ledger:
    """Counts per kind of claim, and the latest global step of a weight claim that B reproduced."""

    tallies: dict[str, Tally] = field(default_factory=lambda: {kind: Tally() for kind in KINDS})
    last_reproduced_weight_step: int | None = None

    def weight_reproduced_at(self, step: int) -> None:
        if self.last_reproduced_weight_step is None or step > self.last_reproduced_weight_step:
            self.last_reproduced_weight_step = step

    def count(self, outcome: str, kinds=KINDS) -> int:
        return sum(getattr(self.tallies[kind], outcome) for kind in kinds)

    def as_dict(self) -> dict:
        return {
            "kinds": {kind: tally.as_dict() for kind, tally in self.tallies.items() if _any(tally)},
            "totals": {outcome: self.count(outcome) for outcome in (REPRODUCED, DIFFERS, NOT_CHECKED)},
            "last_reproduced_weight_step": self.last_reproduced_weight_step,
        }


def _any(tally: Tally) -> bool:
    return bool(tally.reproduced or tally.differs or tally.not_checked)


def account(a: Receipt, b: Receipt) -> Ledger:
    """Every claim of A's receipt against B's, classified."""
    ledger = Ledger()
    _per_step(
        ledger.tallies[LOSS_BITS],
        a.trace.first_step,
        a.trace.loss_bits(),
        b.trace.first_step,
        b.trace.loss_bits(),
        "B's trace",
    )
    _fingerprints(ledger, a.trace, b.trace)
    _boundaries(ledger, a.trace, b.trace)
    _epochs(ledger, a, b)
    _session_ends(ledger, a, b)
    config_a, config_b = result_config(a.config), result_config(b.config)
    for key, value in config_a.items():
        if key == "device":  # where it ran, not what it computed: the device used is in the environment
            continue
        same = key in config_b and _canonical(config_b[key]) == _canonical(value)  # 1 is not true, 2.0 not 2
        ledger.tallies[CONFIG].add(REPRODUCED if same else DIFFERS)
    payloads_a, payloads_b = _payloads(a), _payloads(b)
    for name, digest in payloads_a.items():
        ledger.tallies[DATASET].add(REPRODUCED if payloads_b.get(name) == digest else DIFFERS)
    return ledger


def _canonical(value) -> str:
    return json.dumps(value, sort_keys=True)


def _payloads(receipt: Receipt) -> dict:
    files = receipt.config["dataset"]["files"]
    return {name: spec.get("sha256") for name, spec in files.items() if isinstance(spec, dict)}


def _per_step(
    tally: Tally, first_a: int, values_a: np.ndarray, first_b: int, values_b: np.ndarray, what: str
) -> np.ndarray:
    """One claim per step of A's values (steps first_a+1 ..): equal in B, differing, or outside B's. The
    steps (1-based global) that B reproduced are returned."""
    last_a, last_b = first_a + len(values_a), first_b + len(values_b)
    lo, hi = max(first_a, first_b), min(last_a, last_b)
    if hi <= lo:
        tally.add(NOT_CHECKED, values_a.size, f"{what} holds no step of A's {first_a + 1}..{last_a}")
        return np.zeros(0, np.int64)
    same = values_a[lo - first_a : hi - first_a] == values_b[lo - first_b : hi - first_b]  # per cell
    tally.add(REPRODUCED, int(same.sum()))
    tally.add(DIFFERS, int(same.size - same.sum()))
    outside = len(values_a) - (hi - lo)
    if outside:
        tally.add(
            NOT_CHECKED,
            outside * (values_a.shape[1] if values_a.ndim > 1 else 1),
            f"{what} covers steps {first_b + 1}..{last_b}, A's {first_a + 1}..{last_a}",
        )
    rows = same if same.ndim == 1 else same.all(axis=1)
    return lo + 1 + np.flatnonzero(rows)


def _fingerprints(ledger: Ledger, a: StepTrace, b: StepTrace) -> None:
    if a.fingerprint_first_step is None:
        return  # A records none: no claim
    models, tensors = ledger.tallies[MODEL_FINGERPRINTS], ledger.tallies[TENSOR_FINGERPRINTS]
    rows_a = a.tensor_fingerprints
    if b.fingerprint_first_step is None:
        models.add(NOT_CHECKED, len(a.fingerprints), "B's trace holds no weight fingerprints")
        tensors.add(NOT_CHECKED, rows_a.size, "B's trace holds no weight fingerprints")
        return
    reproduced = _per_step(
        models, a.fingerprint_first_step, a.fingerprints, b.fingerprint_first_step, b.fingerprints, "B's fingerprints"
    )
    if reproduced.size:
        ledger.weight_reproduced_at(int(reproduced[-1]))
    if not rows_a.size:
        return
    if a.tensor_names != b.tensor_names:
        tensors.add(NOT_CHECKED, rows_a.size, "B's trace names other tensors")
        return
    _per_step(
        tensors,
        a.fingerprint_first_step,
        rows_a,
        b.fingerprint_first_step,
        b.tensor_fingerprints,
        "B's per-tensor fingerprints",
    )


def _boundaries(ledger: Ledger, a: StepTrace, b: StepTrace) -> None:
    b_at = {boundary.step: dict(zip(b.tensor_names, boundary.tensors, strict=True)) for boundary in b.boundaries}
    for boundary in a.boundaries:
        tally = ledger.tallies[INITIAL_DIGESTS if boundary.step == 0 else BOUNDARY_DIGESTS]
        other = b_at.get(boundary.step)
        if other is None:
            tally.add(
                NOT_CHECKED, len(boundary.tensors), f"B recorded no weight digests at global step {boundary.step}"
            )
            continue
        agree = True
        for name, digest in zip(a.tensor_names, boundary.tensors, strict=True):
            if name not in other:
                tally.add(NOT_CHECKED, 1, f"B's trace has no tensor {name}")
                agree = False
            elif other[name] == digest:
                tally.add(REPRODUCED)
            else:
                tally.add(DIFFERS)
                agree = False
        if agree:
            ledger.weight_reproduced_at(boundary.step)


def _epochs(ledger: Ledger, a: Receipt, b: Receipt) -> None:
    b_epochs = {record["epoch"]: record for record in b.epochs}
    for record in a.epochs:
        other = b_epochs.get(record["epoch"])
        for kind, keys in (
            (EPOCH_WEIGHTS, ("weights_digest",)),
            (EPOCH_TRAINING, TRAINING_FIELDS),
            (EPOCH_TEST, TEST_FIELDS),
        ):
            tally = ledger.tallies[kind]
            for key in keys:
                if other is None:
                    tally.add(NOT_CHECKED, 1, f"B has no record of epoch {record['epoch']}")
                elif other[key] == record[key] and other["global_step"] == record["global_step"]:
                    # each record's claims are about the state after its global_step: both must agree
                    tally.add(REPRODUCED)
                    if kind == EPOCH_WEIGHTS:
                        ledger.weight_reproduced_at(record["global_step"])
                else:
                    tally.add(DIFFERS)


def _session_ends(ledger: Ledger, a: Receipt, b: Receipt) -> None:
    """The weights where each of A's sessions ended (where it was stopped, or the run's end): B's weight
    digest (a boundary) or, failing that, its model fingerprint at that step. A session that trained no
    step claims nothing."""
    tally = ledger.tallies[SESSION_ENDS]
    b_boundaries = {boundary.step: boundary for boundary in b.trace.boundaries}
    a_boundaries = {boundary.step: boundary for boundary in a.trace.boundaries}
    for session in a.sessions:
        step = session["to_step"]
        if step <= session["from_step"]:
            continue
        mine, theirs = a_boundaries.get(step), b_boundaries.get(step)
        if mine is not None and theirs is not None and a.trace.tensor_names == b.trace.tensor_names:
            same = mine.tensors == theirs.tensors
        else:
            fa, fb = _fingerprint_at(a.trace, step), _fingerprint_at(b.trace, step)
            if fa is None or fb is None:
                tally.add(NOT_CHECKED, 1, f"no weight digest or fingerprint of step {step} in both traces")
                continue
            same = fa == fb
        tally.add(REPRODUCED if same else DIFFERS)
        if same:
            ledger.weight_reproduced_at(step)


def _fingerprint_at(trace: StepTrace, step: int) -> int | None:
    first = trace.fingerprint_first_step
    if first is None or not first < step <= trace.last_step:
        return None
    return int(trace.fingerprints[step - first - 1])
