"""Training metrics: the history kept in every checkpoint manifest, mirrored to metrics.jsonl.

The manifest's copy is the truth: on resume, metrics.jsonl is rewritten from the checkpoint, so a
process killed between a log line and its checkpoint never leaves lines the resumed run repeats."""

from __future__ import annotations

import json
from pathlib import Path

from reprocube.errors import CheckpointError
from reprocube.files import write_file_atomic

# Fields that depend only on the computation; wall time and throughput do not.
DETERMINISTIC_EPOCH_FIELDS = ("epoch", "global_step", "train_loss", "train_accuracy", "test_loss", "test_accuracy")


class MetricsHistory:
    def __init__(self, epochs: list[dict] | None = None, steps: list[dict] | None = None):
        self.epochs = list(epochs or [])
        self.steps = list(steps or [])

    @classmethod
    def from_manifest(cls, manifest: dict) -> MetricsHistory:
        metrics = manifest.get("metrics")
        if not (
            isinstance(metrics, dict)
            and isinstance(metrics.get("epochs"), list)
            and isinstance(metrics.get("steps"), list)
        ):
            raise CheckpointError("checkpoint manifest holds no valid metrics history")
        return cls(metrics["epochs"], metrics["steps"])

    def as_dict(self) -> dict:
        return {"epochs": self.epochs, "steps": self.steps}


class MetricsFile:
    """metrics.jsonl: one JSON object per line, `kind` "step" or "epoch"."""

    def __init__(self, path: Path):
        self.path = path

    def rewrite(self, history: MetricsHistory) -> None:
        records = [{"kind": "step", **r} for r in history.steps] + [{"kind": "epoch", **r} for r in history.epochs]
        records.sort(key=lambda r: (r["global_step"], r["kind"] == "epoch"))
        write_file_atomic(self.path, "".join(json.dumps(r) + "\n" for r in records).encode())

    def append(self, kind: str, record: dict) -> None:
        with open(self.path, "a") as f:
            f.write(json.dumps({"kind": kind, **record}) + "\n")
            f.flush()


def read_metrics(path: Path) -> list[dict]:
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]
