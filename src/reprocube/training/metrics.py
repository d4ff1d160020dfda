"""Training metrics: the history kept in every checkpoint manifest, mirrored to metrics.jsonl.

The manifest's copy is the truth: on resume, metrics.jsonl is rewritten from the checkpoint, so a
process killed between a log line and its checkpoint never leaves lines the resumed run repeats."""

from __future__ import annotations

from pathlib import Path

from reprocube.errors import CheckpointError, ReprocubeError
from reprocube.files import append_line, json_text, write_file_atomic
from reprocube.untrusted import Fields, iter_json_lines

# Fields that depend only on the computation; wall time and throughput do not.
DETERMINISTIC_EPOCH_FIELDS = ("epoch", "global_step", "train_loss", "train_accuracy", "test_loss", "test_accuracy")
MAX_METRICS_BYTES = 256 << 20  # read as a stream: the bound is on time, not memory


def check_epoch_record(record: Fields) -> dict:
    for key in ("epoch", "global_step"):
        record.integer(key)
    for key in DETERMINISTIC_EPOCH_FIELDS[2:]:
        record.number(key)
    record.text("weights_digest")
    return record.value


def check_step_record(record: Fields) -> dict:
    for key in ("epoch", "global_step"):
        record.integer(key)
    if record.value.get("loss") is not None:  # null: the loss was not finite (a diverging run)
        record.number("loss")
    return record.value


class MetricsHistory:
    def __init__(self, epochs: list[dict] | None = None, steps: list[dict] | None = None):
        self.epochs = list(epochs or [])
        self.steps = list(steps or [])

    @classmethod
    def from_manifest(cls, manifest: dict, where: str = "checkpoint manifest") -> MetricsHistory:
        metrics = Fields(manifest, where, CheckpointError).mapping("metrics")
        epochs = [check_epoch_record(record) for record in metrics.records("epochs")]
        steps = [check_step_record(record) for record in metrics.records("steps")]
        return cls(epochs, steps)

    def as_dict(self) -> dict:
        return {"epochs": self.epochs, "steps": self.steps}


class MetricsFile:
    """metrics.jsonl: one JSON object per line, `kind` "step" or "epoch"."""

    def __init__(self, path: Path):
        self.path = path

    def rewrite(self, history: MetricsHistory) -> None:
        records = [{"kind": "step", **r} for r in history.steps] + [{"kind": "epoch", **r} for r in history.epochs]
        records.sort(key=lambda r: (r["global_step"], r["kind"] == "epoch"))
        write_file_atomic(self.path, "".join(json_text(r, indent=None) + "\n" for r in records).encode())

    def append(self, kind: str, record: dict) -> None:
        append_line(self.path, json_text({"kind": kind, **record}, indent=None))


def read_epoch_records(path: Path, error: type[ReprocubeError] = CheckpointError) -> list[dict]:
    """The epoch records of a metrics.jsonl, every line type-checked on the way (streamed: the step
    records, most of a long run's file, are checked and dropped)."""
    epochs = []
    for number, value in iter_json_lines(path, error, MAX_METRICS_BYTES):
        record = Fields(value, f"{path}:{number}", error)
        kind = record.text("kind")
        if kind == "epoch":
            epochs.append(check_epoch_record(record))
        elif kind == "step":
            check_step_record(record)
        else:
            raise error(f"{path}:{number}: kind must be step or epoch, got {kind!r}")
    return epochs


def last_logged_step(path: Path) -> int | None:
    """The global step of a metrics.jsonl's last complete record (a stalled child's: where it was stuck),
    None where there is none or the file cannot be read as one (a line may be half written)."""
    last = None
    try:
        for _, value in iter_json_lines(path, CheckpointError, MAX_METRICS_BYTES):
            step = value.get("global_step") if isinstance(value, dict) else None
            if isinstance(step, int) and not isinstance(step, bool):
                last = step
    except ReprocubeError:
        pass
    return last
