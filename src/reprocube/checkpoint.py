"""Checkpoint directories: written whole or not at all, verified before anything is loaded.

A checkpoint is a directory (checkpoints/epoch-0003/, checkpoints/step-000450/) holding
  weights.safetensors    model parameters, canonical names (framework-neutral format)
  optimizer.safetensors  optimizer tensors (e.g. momentum buffers)
  rng.safetensors        every generator's state as arrays
  state.json             position, epoch accumulators, host RNG scalars (reprocube.state)
  config.json            the resolved config of the run
  manifest.json          format, position, config hash, seed, sha256 of every file, weights digest,
                         metrics so far, and the sha256 of the manifest itself
Only safetensors and JSON are read back: nothing in a checkpoint can execute code. This module knows
files and digests; what the content means is reprocube.state's.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from safetensors import SafetensorError
from safetensors.numpy import load as load_safetensors
from safetensors.numpy import save as save_safetensors

from reprocube import __version__
from reprocube.errors import CheckpointError
from reprocube.files import fsync_dir

FORMAT_VERSION = 1
MANIFEST = "manifest.json"
TENSOR_FILES = ("weights", "optimizer", "rng")
JSON_FILES = ("state", "config")
MAX_JSON_BYTES = 64 << 20
NAME_PATTERN = re.compile(r"^(epoch-\d{4,}|step-\d{6,})$")


@dataclass
class CheckpointContent:
    weights: dict[str, np.ndarray]
    optimizer: dict[str, np.ndarray]
    rng: dict[str, np.ndarray]
    state: dict  # JSON-serialisable
    config: dict  # the resolved config (plain)


@dataclass
class Checkpoint:
    path: Path
    manifest: dict
    content: CheckpointContent = field(repr=False)


def epoch_name(epochs_done: int) -> str:
    return f"epoch-{epochs_done:04d}"


def step_name(global_step: int) -> str:
    return f"step-{global_step:06d}"


def weights_digest(weights: dict[str, np.ndarray]) -> str:
    """sha256 over the parameters in a canonical order: for each name (sorted), the name, dtype,
    shape and the little-endian C-order bytes. Equal digests mean bit-identical weights."""
    digest = hashlib.sha256()
    for name in sorted(weights):
        array = np.asarray(weights[name], order="C")  # (np.ascontiguousarray would make a scalar 1-d)
        array = array.astype(array.dtype.newbyteorder("<"), copy=False)
        digest.update(json.dumps([name, array.dtype.str, list(array.shape)]).encode())
        digest.update(array.tobytes())
    return digest.hexdigest()


def _canonical_json(obj) -> bytes:
    return json.dumps(obj, sort_keys=True, indent=1, allow_nan=False).encode()


def manifest_self_digest(manifest: dict) -> str:
    """The sha256 a manifest holds of itself: it detects damage and careless edits, not forgery (anyone
    can recompute it; the tests do, to make consistent edits)."""
    body = {k: v for k, v in manifest.items() if k != "manifest_sha256"}
    return hashlib.sha256(_canonical_json(body)).hexdigest()


def write_checkpoint(checkpoints_dir: Path, name: str, content: CheckpointContent, manifest_fields: dict) -> Path:
    """Write a checkpoint to a temporary directory, fsync every file, then rename it into place."""
    final = checkpoints_dir / name
    if final.exists():
        raise CheckpointError(f"checkpoint {final} already exists; refusing to overwrite it")
    checkpoints_dir.mkdir(parents=True, exist_ok=True)
    tmp = checkpoints_dir / f".tmp-{name}-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    try:
        blobs = {
            "weights.safetensors": save_safetensors(_contiguous(content.weights)),
            "optimizer.safetensors": save_safetensors(_contiguous(content.optimizer)),
            "rng.safetensors": save_safetensors(_contiguous(content.rng)),
            "state.json": _canonical_json(content.state),
            "config.json": _canonical_json(content.config),
        }
        manifest = {
            "format_version": FORMAT_VERSION,
            "reprocube_version": __version__,
            **manifest_fields,
            "weights_digest": weights_digest(content.weights),
            "files": {fname: hashlib.sha256(blob).hexdigest() for fname, blob in sorted(blobs.items())},
            "created_unix": time.time(),
        }
        manifest["manifest_sha256"] = manifest_self_digest(manifest)
        blobs[MANIFEST] = _canonical_json(manifest)
        for fname, blob in blobs.items():
            with open(tmp / fname, "wb") as f:
                f.write(blob)
                f.flush()
                os.fsync(f.fileno())
        fsync_dir(tmp)
        os.rename(tmp, final)
        fsync_dir(checkpoints_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return final


def _contiguous(arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    return {k: np.asarray(v, order="C") for k, v in arrays.items()}


def read_manifest(path: Path) -> dict:
    """Parse and self-check a checkpoint's manifest (cheap: no tensor is read)."""
    manifest_path = path / MANIFEST
    if not path.is_dir():
        raise CheckpointError(f"checkpoint {path} does not exist or is not a directory")
    manifest = _read_json(manifest_path)
    if not isinstance(manifest, dict):
        raise CheckpointError(f"{manifest_path} is not a JSON object")
    if manifest.get("format_version") != FORMAT_VERSION:
        raise CheckpointError(
            f"{manifest_path}: unsupported format_version {manifest.get('format_version')!r} (this reprocube reads {FORMAT_VERSION})"
        )
    if manifest.get("manifest_sha256") != manifest_self_digest(manifest):
        raise CheckpointError(f"{manifest_path} was modified: its manifest_sha256 does not match its content")
    return manifest


def read_checkpoint(path: Path) -> Checkpoint:
    """Verify every file of a checkpoint against its manifest, then load it."""
    path = Path(path)
    manifest = read_manifest(path)
    expected = manifest.get("files")
    if not isinstance(expected, dict):
        raise CheckpointError(f"{path / MANIFEST} lists no files")
    present = {p.name for p in path.iterdir()} - {MANIFEST}
    wanted = {f"{n}.safetensors" for n in TENSOR_FILES} | {f"{n}.json" for n in JSON_FILES}
    missing = sorted((set(expected) | wanted) - present)
    if missing:
        raise CheckpointError(f"checkpoint {path} is incomplete: missing {', '.join(missing)}")
    unexpected = sorted(present - set(expected))
    if unexpected:
        raise CheckpointError(f"checkpoint {path} holds files its manifest does not list: {', '.join(unexpected)}")
    blobs = {}
    for fname, digest in sorted(expected.items()):
        blob = (path / fname).read_bytes()
        if hashlib.sha256(blob).hexdigest() != digest:
            raise CheckpointError(
                f"checkpoint {path}: {fname} does not match its sha256 in the manifest (corrupted or modified)"
            )
        blobs[fname] = blob
    try:
        tensors = {n: load_safetensors(blobs[f"{n}.safetensors"]) for n in TENSOR_FILES}
    except (SafetensorError, ValueError) as exc:
        raise CheckpointError(f"checkpoint {path}: unreadable safetensors file ({exc})") from None
    state = _parse_json(blobs["state.json"], path / "state.json")
    config = _parse_json(blobs["config.json"], path / "config.json")
    content = CheckpointContent(tensors["weights"], tensors["optimizer"], tensors["rng"], state, config)
    if weights_digest(content.weights) != manifest.get("weights_digest"):
        raise CheckpointError(f"checkpoint {path}: weights do not match the manifest's weights_digest")
    return Checkpoint(path, manifest, content)


def _read_json(path: Path):
    try:
        with open(path, "rb") as f:
            blob = f.read(MAX_JSON_BYTES + 1)
    except FileNotFoundError:
        raise CheckpointError(f"{path} is missing: not a complete checkpoint") from None
    if len(blob) > MAX_JSON_BYTES:
        raise CheckpointError(f"{path} is larger than {MAX_JSON_BYTES} bytes")
    return _parse_json(blob, path)


def _parse_json(blob: bytes, path: Path):
    try:
        return json.loads(blob)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CheckpointError(f"{path} is not valid JSON ({exc})") from None


def list_checkpoints(checkpoints_dir: Path) -> list[Path]:
    """Completed checkpoint directories (temporaries excluded), oldest first by (step, epoch-last)."""
    if not checkpoints_dir.is_dir():
        return []
    found = []
    for path in checkpoints_dir.iterdir():
        if path.is_dir() and NAME_PATTERN.match(path.name):
            step = read_manifest(path).get("global_step")
            if not isinstance(step, int):
                raise CheckpointError(f"{path / MANIFEST}: global_step is not an integer")
            # At equal global step, the epoch checkpoint (with evaluation) is the later one.
            found.append(((step, path.name.startswith("epoch-")), path))
    return [p for _, p in sorted(found)]


def latest_checkpoint(checkpoints_dir: Path) -> Path | None:
    found = list_checkpoints(checkpoints_dir)
    return found[-1] if found else None
