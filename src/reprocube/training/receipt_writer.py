"""The run's receipt made and written (receipt.json, reprocube.training.receipt): built from the run's config,
environment, epoch records, trace and sessions, with the digests of reprocube's installed source, then
self-hashed and written atomically."""

from __future__ import annotations

import functools
import hashlib
from pathlib import Path

from reprocube import __version__
from reprocube.config import config_hash
from reprocube.files import write_json_atomic
from reprocube.formats.trace import StepTrace
from reprocube.training.checkpoint import NAME_PATTERN
from reprocube.training.metrics import MetricsHistory
from reprocube.training.receipt import RECEIPT, RECEIPT_FORMAT, RECEIPT_VERSION, SELF_DIGEST, self_digest


@functools.lru_cache(maxsize=1)
def _source_file_digests() -> dict[str, bytes]:
    """sha256 of each of reprocube's installed source files (every .py and .yaml under the package), by
    relative path."""
    root = Path(__file__).resolve().parents[1]  # the package, above this room
    files = sorted(p for p in root.rglob("*") if p.suffix in (".py", ".yaml") and p.is_file())
    return {path.relative_to(root).as_posix(): hashlib.sha256(path.read_bytes()).digest() for path in files}


def source_sha256() -> str:
    """sha256 over reprocube's installed source, path by path: two installs with equal digests run the same
    reprocube code."""
    digest = hashlib.sha256()
    for name, file_digest in _source_file_digests().items():
        digest.update(name.encode() + b"\0")
        digest.update(file_digest)
    return digest.hexdigest()


def source_files() -> dict[str, str]:
    """64 bits of each source file's sha256, by relative path: which files two installs differ in."""
    return {name: file_digest.hex()[:16] for name, file_digest in _source_file_digests().items()}


def build_receipt(
    config: dict,
    env: dict,
    history: MetricsHistory,
    trace: StepTrace,
    position,
    checkpoints: Path,
    sessions: list[dict] | None = None,
):
    """`env` is this process's environment; `sessions` every process's ({from_step, env}, this one last)."""
    present = (
        sorted(p.name for p in checkpoints.iterdir() if NAME_PATTERN.match(p.name)) if checkpoints.is_dir() else []
    )
    receipt = {
        "format": RECEIPT_FORMAT,
        "version": RECEIPT_VERSION,
        "reprocube": {"version": __version__, "source_sha256": source_sha256(), "source_files": source_files()},
        "config": config,
        "config_hash": config_hash(config),
        "dataset": {
            "name": config["dataset"]["name"],
            "payload_sha256": {key: spec["sha256"] for key, spec in sorted(config["dataset"]["files"].items())},
        },
        "env": env,
        "position": position.as_dict(),
        "complete": position.epoch >= config["epochs"] and position.step_in_epoch == 0,
        "epochs": history.epochs,
        "checkpoints": present,
        "trace": trace.to_json(),
        "sessions": _session_records(sessions or [{"from_step": trace.first_step, "env": env}], env, position),
    }
    receipt[SELF_DIGEST] = self_digest(receipt)
    return receipt


def _session_records(sessions: list[dict], env: dict, position) -> list[dict]:
    """Each session's steps (from_step + 1 .. to_step) and environment; null where it is the receipt's env
    (the last session's, usually every session's: written once)."""
    ends = [s["from_step"] for s in sessions[1:]] + [position.global_step]
    return [
        {"from_step": s["from_step"], "to_step": end, "env": None if s["env"] == env else s["env"]}
        for s, end in zip(sessions, ends, strict=True)
    ]


def write_receipt(run_path: Path, receipt: dict) -> None:
    # Compact: the trace's base64 is most of it, and indentation would add a fifth to the rest.
    write_json_atomic(run_path / RECEIPT, receipt, indent=None, sort_keys=True, compact=True)
