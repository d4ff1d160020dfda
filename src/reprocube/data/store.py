"""The local dataset store: <data_dir>/<dataset>/<IDX file>, verified against the pinned checksums
every time it is read. Training only reads from here; it never downloads."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from omegaconf import DictConfig

from reprocube.data.idx import parse_idx
from reprocube.errors import DataError
from reprocube.untrusted import read_bytes

IMAGE_SHAPE = (28, 28)  # what the CNN of all three trainers takes
# The normalised images start on a 64-byte boundary, the largest any framework's CPU kernels require
# (TensorFlow's Eigen with AVX-512): TensorFlow then takes them as they are instead of copying them.
ALIGNMENT = 64


@dataclass(frozen=True)
class Split:
    images: np.ndarray  # float32 (N, 1, 28, 28), normalised
    labels: np.ndarray  # int64 (N,)

    def __len__(self) -> int:
        return len(self.labels)


@dataclass(frozen=True)
class Dataset:
    name: str
    train: Split
    test: Split
    num_classes: int


def dataset_dir(cfg: DictConfig) -> Path:
    return Path(cfg.data_dir) / cfg.dataset.name


def read_verified(path: Path, spec: DictConfig) -> bytes:
    """Read a stored IDX file and check it against its pinned size and sha256 (a regular file, read up to
    its pinned size: a link to a device or a directory is refused, not read)."""
    payload = read_bytes(path, spec.bytes, DataError, follow_links=True)
    if len(payload) != spec.bytes:
        raise DataError(f"{path}: {len(payload)} bytes, expected {spec.bytes}")
    actual = hashlib.sha256(payload).hexdigest()
    if actual != spec.sha256:
        raise DataError(f"{path}: sha256 {actual} does not match the pinned {spec.sha256}")
    return payload


def load_dataset(cfg: DictConfig) -> Dataset:
    """Load, verify and normalise both splits, applying data.train_limit / data.test_limit."""
    directory = dataset_dir(cfg)
    if not directory.is_dir():
        raise DataError(
            f"dataset {cfg.dataset.name} not found in {directory}; fetch it first with "
            f"`reprocube download dataset={cfg.dataset.name} data_dir={cfg.data_dir}`"
        )
    files = cfg.dataset.files
    for spec in files.values():
        gzipped = directory / f"{spec.name}.gz"
        if not (directory / spec.name).exists() and gzipped.exists():
            # Training reads decompressed, checksummed IDX files; copied .gz files were a GPU host's first failure.
            raise DataError(
                f"{directory / spec.name} is missing ({gzipped.name} is there: `reprocube download "
                f"dataset={cfg.dataset.name} data_dir={cfg.data_dir} data.source_dir={directory}` decompresses "
                f"and checks it)"
            )
    arrays = {
        key: parse_idx(read_verified(directory / spec.name, spec), str(directory / spec.name))
        for key, spec in files.items()
    }
    train = _split(cfg, arrays["train_images"], arrays["train_labels"], cfg.data.train_limit, "train")
    test = _split(cfg, arrays["test_images"], arrays["test_labels"], cfg.data.test_limit, "test")
    return Dataset(cfg.dataset.name, train, test, cfg.dataset.num_classes)


def _split(cfg: DictConfig, images: np.ndarray, labels: np.ndarray, limit: int | None, split: str) -> Split:
    if images.shape[1:] != IMAGE_SHAPE or labels.ndim != 1 or len(images) != len(labels):
        raise DataError(
            f"{split} split: images {images.shape} and labels {labels.shape} do not form a dataset of "
            f"{IMAGE_SHAPE[0]}x{IMAGE_SHAPE[1]} images (the model's input)"
        )
    if limit is not None:
        if limit > len(labels):
            raise DataError(f"data.{split}_limit={limit} exceeds the {len(labels)} {split} examples")
        images, labels = images[:limit], labels[:limit]
    if labels.size and labels.max() >= cfg.dataset.num_classes:
        raise DataError(f"{split} split: label {int(labels.max())} outside [0, {cfg.dataset.num_classes})")
    # Normalise once, in float32 on the host, so every framework sees the same input bits: (x / 255 - mean)
    # / std, each operation rounded to float32, in place in one array (the whole training set's floats
    # once, not three times: a third of the memory, and faster to start).
    normalised = _aligned_empty((len(images), 1, *IMAGE_SHAPE), np.float32)
    flat = normalised.reshape(images.shape)
    np.divide(images, np.float32(255.0), out=flat, dtype=np.float32)
    np.subtract(flat, np.float32(cfg.dataset.mean), out=flat)
    np.divide(flat, np.float32(cfg.dataset.std), out=flat)
    return Split(normalised, labels.astype(np.int64))


def _aligned_empty(shape: tuple[int, ...], dtype) -> np.ndarray:
    """np.empty whose data starts on an ALIGNMENT-byte boundary (numpy guarantees only 16)."""
    nbytes = int(np.prod(shape)) * np.dtype(dtype).itemsize
    buffer = np.empty(nbytes + ALIGNMENT, np.uint8)
    start = -buffer.ctypes.data % ALIGNMENT
    return buffer[start : start + nbytes].view(dtype).reshape(shape)
