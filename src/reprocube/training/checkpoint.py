"""Checkpoint directories: written whole or not at all, verified before anything is loaded.

A checkpoint is a directory (checkpoints/epoch-0003/, checkpoints/step-000450/) holding
  weights.safetensors    model parameters, canonical names (framework-neutral format)
  optimizer.safetensors  optimizer tensors (e.g. momentum buffers)
  rng.safetensors        every generator's state as arrays
  state.json             position, epoch accumulators, host RNG scalars (reprocube.training.state)
  config.json            the resolved config of the run
  manifest.json          format, position, config hash, seed, sha256 and size of every file, weights
                         digest, metrics so far, and the sha256 of the manifest itself
Only safetensors and JSON are read back, through reprocube.untrusted (regular files of bounded size,
strict JSON, safetensors headers checked before loading): nothing in a checkpoint can execute code, hang
or exhaust memory. The sha256s detect accidents (a truncated copy, a flipped bit, a careless edit), not
forgery: anyone can recompute them. This module knows files and digests; what the content means is
reprocube.training.state's.
"""

from __future__ import annotations

import hashlib
import json
import math
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
from reprocube.config import config_hash_matches
from reprocube.errors import CheckpointError
from reprocube.files import fsync_dir
from reprocube.untrusted import Fields, parse_json, read_bytes

FORMAT_VERSION = 1
MANIFEST = "manifest.json"
TENSOR_FILES = ("weights", "optimizer", "rng")
JSON_FILES = ("state", "config")
FILE_NAMES = tuple(f"{n}.safetensors" for n in TENSOR_FILES) + tuple(f"{n}.json" for n in JSON_FILES)
MAX_MANIFEST_BYTES = 64 << 20  # the metrics history of a long run with per-step records
MAX_FILE_BYTES = 2 << 30  # a manifest from before file sizes were recorded: a bound, not a size
# safetensors dtypes NumPy can hold (BF16 and the F8 types are valid safetensors, but not ours).
TENSOR_DTYPES = {
    "BOOL": 1,
    "U8": 1,
    "I8": 1,
    "U16": 2,
    "I16": 2,
    "F16": 2,
    "U32": 4,
    "I32": 4,
    "F32": 4,
    "U64": 8,
    "I64": 8,
    "F64": 8,
}
HEX_DIGEST = re.compile(r"^[0-9a-f]{64}\Z")  # \Z: "$" would also match before a final newline
# The manifest's schema (format_version above): the keys its caller gives (the position and metrics from
# reprocube.training.state's TrainState.to_checkpoint, the run's identity from the loop), then the keys
# write_checkpoint adds. read_manifest types each one.
MANIFEST_FIELD_KEYS = (
    "epoch",
    "step_in_epoch",
    "global_step",
    "steps_per_epoch",
    "metrics",
    "framework",
    "framework_info",
    "seed",
    "config_hash",
    "reason",
)
MANIFEST_OWN_KEYS = (
    "format_version",
    "reprocube_version",
    "weights_digest",
    "files",
    "file_bytes",
    "created_unix",
    "manifest_sha256",
)
NAME_PATTERN = re.compile(r"^(epoch-\d{4,}|step-\d{6,})\Z")


@dataclass
class CheckpointContent:
    weights: dict[str, np.ndarray]
    optimizer: dict[str, np.ndarray]
    rng: dict[str, np.ndarray]
    state: dict  # JSON-serialisable
    config: dict  # the resolved config (plain)


@dataclass(frozen=True)
class Manifest:
    """A checkpoint's manifest.json as read_manifest checked it, its keys read by name here only. `fields`
    is the file's whole content (reprocube.training.state and reprocube.training.metrics read their own keys from it)."""

    fields: dict

    epoch = property(lambda self: self.fields["epoch"])  # epochs done
    step_in_epoch = property(lambda self: self.fields["step_in_epoch"])
    global_step = property(lambda self: self.fields["global_step"])
    steps_per_epoch = property(lambda self: self.fields["steps_per_epoch"])
    weights_digest = property(lambda self: self.fields["weights_digest"])
    files = property(lambda self: self.fields["files"])  # file name -> sha256
    file_bytes = property(lambda self: self.fields.get("file_bytes", {}))  # absent in older manifests
    config_hash = property(lambda self: self.fields.get("config_hash"))
    framework_info = property(lambda self: self.fields.get("framework_info"))


def run_fields(framework: str, framework_info=None, seed=None, config_hash=None, reason=None) -> dict:
    """The run's identity, recorded in each manifest beside the state's own fields (write_checkpoint);
    what is not given is left out."""
    fields = {
        "framework": framework,
        "framework_info": framework_info,
        "seed": seed,
        "config_hash": config_hash,
        "reason": reason,
    }
    return {key: value for key, value in fields.items() if value is not None}


@dataclass
class Checkpoint:
    path: Path
    manifest: Manifest
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
    unknown = sorted(set(manifest_fields) - set(MANIFEST_FIELD_KEYS))
    if unknown:  # reprocube's own bug: a manifest key that no reader types
        raise ValueError(f"manifest keys {unknown} are not in the manifest's schema (checkpoint.MANIFEST_FIELD_KEYS)")
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
            "file_bytes": {fname: len(blob) for fname, blob in sorted(blobs.items())},
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
    except OSError as exc:  # disk full, permissions: name the checkpoint, not a temporary file
        shutil.rmtree(tmp, ignore_errors=True)
        raise OSError(exc.errno, exc.strerror, str(final)) from None
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return final


def _contiguous(arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    return {k: np.asarray(v, order="C") for k, v in arrays.items()}


def read_manifest(path: Path) -> Manifest:
    """Parse, type-check and self-check a checkpoint's manifest (cheap: no tensor is read)."""
    manifest_path = path / MANIFEST
    if path.is_symlink() or not path.is_dir():
        raise CheckpointError(f"checkpoint {path} does not exist or is not a directory")
    manifest = parse_json(
        read_bytes(manifest_path, MAX_MANIFEST_BYTES, CheckpointError), str(manifest_path), CheckpointError
    )
    fields = Fields(manifest, str(manifest_path), CheckpointError)
    if manifest.get("format_version") != FORMAT_VERSION or isinstance(manifest.get("format_version"), bool):
        newer = CheckpointError(
            f"{manifest_path}: unsupported format_version {manifest.get('format_version')!r} "
            f"(this reprocube reads {FORMAT_VERSION})"
        )
        newer.damaged = False
        raise newer
    if manifest.get("manifest_sha256") != manifest_self_digest(manifest):
        raise CheckpointError(f"{manifest_path} was modified: its manifest_sha256 does not match its content")
    files = fields.mapping("files")
    for name in files.value:
        if name not in FILE_NAMES or not HEX_DIGEST.match(str(files.value[name])):
            raise CheckpointError(
                f"{manifest_path}: files lists {name!r}, which is not a checkpoint file with a sha256"
            )
    if fields.has("file_bytes"):
        sizes = fields.mapping("file_bytes")
        for name in files.value:
            sizes.integer(name, 0, MAX_FILE_BYTES)
    for key in ("epoch", "step_in_epoch", "global_step"):
        fields.integer(key)
    fields.integer("steps_per_epoch", 1)
    if not HEX_DIGEST.match(fields.text("weights_digest")):
        raise CheckpointError(f"{manifest_path}: weights_digest is not a sha256")
    fields.mapping("metrics")
    for key in ("framework", "reason", "config_hash", "reprocube_version"):
        fields.text(key, optional=True)
    if fields.has("seed"):
        fields.integer("seed", 0, 2**32 - 1)
    if fields.has("framework_info"):
        fields.mapping("framework_info")
    return Manifest(manifest)


def read_checkpoint(path: Path) -> Checkpoint:
    """Verify every file of a checkpoint against its manifest, then load it."""
    path = Path(path)
    manifest = read_manifest(path)
    expected = manifest.files
    present = {p.name for p in path.iterdir()} - {MANIFEST}
    missing = sorted((set(expected) | set(FILE_NAMES)) - present)
    if missing:
        raise CheckpointError(f"checkpoint {path} is incomplete: missing {', '.join(missing)}")
    unexpected = sorted(present - set(expected))
    if unexpected:
        raise CheckpointError(
            f"checkpoint {path} holds files its manifest does not list: {', '.join(map(repr, unexpected))}"
        )
    sizes = manifest.file_bytes
    blobs = {}
    for fname, digest in sorted(expected.items()):
        blob = read_bytes(path / fname, sizes.get(fname, MAX_FILE_BYTES), CheckpointError)
        if hashlib.sha256(blob).hexdigest() != digest:
            raise CheckpointError(
                f"checkpoint {path}: {fname} does not match its sha256 in the manifest (corrupted or modified)"
            )
        blobs[fname] = blob
    tensors = {n: _load_tensors(blobs[f"{n}.safetensors"], path / f"{n}.safetensors") for n in TENSOR_FILES}
    state = parse_json(blobs["state.json"], str(path / "state.json"), CheckpointError)
    config = parse_json(blobs["config.json"], str(path / "config.json"), CheckpointError)
    if not isinstance(config, dict) or (
        manifest.config_hash is not None and not config_hash_matches(config, manifest.config_hash)
    ):
        raise CheckpointError(f"checkpoint {path}: config.json does not match the manifest's config_hash")
    content = CheckpointContent(tensors["weights"], tensors["optimizer"], tensors["rng"], state, config)
    if weights_digest(content.weights) != manifest.weights_digest:
        raise CheckpointError(f"checkpoint {path}: weights do not match the manifest's weights_digest")
    return Checkpoint(path, manifest, content)


def _load_tensors(blob: bytes, where: Path) -> dict[str, np.ndarray]:
    """A safetensors file, its header checked first: dtypes NumPy holds, shapes and offsets that agree."""
    if len(blob) < 8 or int.from_bytes(blob[:8], "little") > len(blob) - 8:
        raise CheckpointError(f"{where}: not a safetensors file (truncated header)")
    size = int.from_bytes(blob[:8], "little")
    header = Fields(parse_json(blob[8 : 8 + size], str(where), CheckpointError), f"{where} header", CheckpointError)
    for name in header.value:
        if name == "__metadata__":
            continue
        entry = header.mapping(name)
        dtype, shape, offsets = entry.value.get("dtype"), entry.value.get("shape"), entry.value.get("data_offsets")
        if not isinstance(dtype, str) or dtype not in TENSOR_DTYPES:
            raise CheckpointError(
                f"{where}: tensor {name!r} has dtype {dtype!r}; reprocube reads {', '.join(TENSOR_DTYPES)}"
            )
        shape_ok = isinstance(shape, list) and all(
            isinstance(d, int) and not isinstance(d, bool) and 0 <= d < 2**40 for d in shape
        )
        offsets_ok = (
            isinstance(offsets, list)
            and len(offsets) == 2
            and all(isinstance(o, int) and not isinstance(o, bool) for o in offsets)
        )
        if not (shape_ok and offsets_ok and offsets[1] - offsets[0] == math.prod(shape) * TENSOR_DTYPES[dtype]):
            raise CheckpointError(f"{where}: tensor {name!r} has an inconsistent shape or data_offsets")
    try:
        return load_safetensors(blob)
    except (SafetensorError, ValueError, KeyError, TypeError, OverflowError) as exc:
        raise CheckpointError(f"{where}: unreadable safetensors file ({' '.join(str(exc).split())})") from None


def scan_checkpoints(checkpoints_dir: Path) -> tuple[list[Path], dict[Path, CheckpointError]]:
    """(completed checkpoint directories whose manifest reads, oldest first by (step, epoch-last);
    {the others: why each is unreadable}). Temporaries (.tmp-*), set-aside ones (.unreadable-*) and
    symbolic links are not checkpoints."""
    if not checkpoints_dir.is_dir():
        return [], {}
    found, unreadable = [], {}
    for path in checkpoints_dir.iterdir():
        if NAME_PATTERN.match(path.name) and not path.is_symlink() and path.is_dir():
            try:
                step = read_manifest(path).global_step
            except CheckpointError as exc:
                unreadable[path] = exc
                continue
            # At equal global step, the epoch checkpoint (with evaluation) is the later one.
            found.append(((step, path.name.startswith("epoch-")), path))
    return [p for _, p in sorted(found)], unreadable


def list_checkpoints(checkpoints_dir: Path) -> list[Path]:
    """The completed checkpoints, oldest first; an unreadable one is an error."""
    found, unreadable = scan_checkpoints(checkpoints_dir)
    if unreadable:
        raise next(iter(unreadable.values()))
    return found


def latest_checkpoint(checkpoints_dir: Path) -> Path | None:
    found = list_checkpoints(checkpoints_dir)
    return found[-1] if found else None
