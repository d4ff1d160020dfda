"""The subject a piece of evidence names: the run it is about (reprocube.analysis.run_comparison.run_subject:
the final epoch checkpoint's name, config_hash and weights_digest), read back strictly."""

from __future__ import annotations

from reprocube.errors import CheckpointError
from reprocube.untrusted import Fields


def read_run_subject(subject: Fields) -> dict:
    checked = {
        "checkpoint": subject.text("checkpoint"),
        "config_hash": subject.sha256("config_hash", nullable=True),
        "weights_digest": subject.sha256("weights_digest"),
    }
    if not checked["checkpoint"].startswith("epoch-"):
        raise CheckpointError(f"{subject.where}: checkpoint must name an epoch checkpoint (epoch-NNNN)")
    return checked
