"""Capture and restore of the host random generators (Python `random`, NumPy's global state) as
arrays plus JSON scalars: no pickle, so a checkpoint from elsewhere cannot execute code.
Framework generators (torch CPU/CUDA, ...) are captured by each trainer in the same form."""

from __future__ import annotations

import random

import numpy as np

from reprocube.errors import CheckpointError


def seed_host_rng(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)


def capture_host_rng() -> tuple[dict[str, np.ndarray], dict]:
    version, internal, gauss_next = random.getstate()
    np_kind, np_keys, np_pos, np_has_gauss, np_cached = np.random.get_state()
    arrays = {
        "python.mt19937": np.asarray(internal, dtype=np.uint32),  # 624 words + position
        "numpy.mt19937": np.asarray(np_keys, dtype=np.uint32),
    }
    meta = {
        "python": {"version": version, "gauss_next": gauss_next},
        "numpy": {"kind": np_kind, "pos": int(np_pos), "has_gauss": int(np_has_gauss), "cached_gaussian": float(np_cached)},
    }
    return arrays, meta


def split_host_rng(arrays: dict[str, np.ndarray]) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """A checkpoint's generator states: (the host's Python and NumPy ones, the framework's)."""
    host = {k: v for k, v in arrays.items() if k.startswith(("python.", "numpy."))}
    return host, {k: v for k, v in arrays.items() if k not in host}


def restore_host_rng(arrays: dict[str, np.ndarray], meta: dict) -> None:
    try:
        python_meta, numpy_meta = meta["python"], meta["numpy"]
        internal = tuple(int(x) for x in arrays["python.mt19937"])
        random.setstate((python_meta["version"], internal, python_meta["gauss_next"]))
        np.random.set_state(
            (
                numpy_meta["kind"],
                arrays["numpy.mt19937"].astype(np.uint32),
                numpy_meta["pos"],
                numpy_meta["has_gauss"],
                numpy_meta["cached_gaussian"],
            )
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise CheckpointError(f"checkpoint holds an unusable host RNG state ({exc})") from None
