"""The host random generators (Python `random`, NumPy's global state): seeded at start, captured as
arrays plus JSON scalars and restored on resume. No pickle, so a checkpoint from elsewhere cannot
execute code. Framework generators (torch CPU/CUDA, ...) are captured by each trainer in the same form."""

from __future__ import annotations

import random
from dataclasses import dataclass

import numpy as np

from reprocube.errors import CheckpointError

# Array names in rng.safetensors; every other name there belongs to the framework.
PYTHON_STATE = "python.mt19937"  # 624 words + position
NUMPY_STATE = "numpy.mt19937"
HOST_PREFIXES = ("python.", "numpy.")


def seed_host_rng(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)


@dataclass
class HostRng:
    arrays: dict[str, np.ndarray]  # the generators' key arrays
    meta: dict  # their scalars: {"python": {...}, "numpy": {...}}

    @classmethod
    def capture(cls) -> HostRng:
        version, internal, gauss_next = random.getstate()
        np_kind, np_keys, np_pos, np_has_gauss, np_cached = np.random.get_state()
        arrays = {
            PYTHON_STATE: np.asarray(internal, dtype=np.uint32),
            NUMPY_STATE: np.asarray(np_keys, dtype=np.uint32),
        }
        meta = {
            "python": {"version": version, "gauss_next": gauss_next},
            "numpy": {
                "kind": np_kind,
                "pos": int(np_pos),
                "has_gauss": int(np_has_gauss),
                "cached_gaussian": float(np_cached),
            },
        }
        return cls(arrays, meta)

    @staticmethod
    def split(arrays: dict[str, np.ndarray]) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
        """A checkpoint's generator states: (the host's Python and NumPy ones, the framework's)."""
        host = {k: v for k, v in arrays.items() if k.startswith(HOST_PREFIXES)}
        return host, {k: v for k, v in arrays.items() if k not in host}

    def validate(self, where: str) -> None:
        """Every array and scalar a capture makes, with its type and range; one CheckpointError otherwise."""
        shapes = {PYTHON_STATE: (625,), NUMPY_STATE: (624,)}
        if set(self.arrays) != set(shapes):
            raise CheckpointError(f"{where}: host generator arrays {sorted(self.arrays)}, expected {sorted(shapes)}")
        for name, shape in shapes.items():
            if self.arrays[name].dtype != np.uint32 or self.arrays[name].shape != shape:
                raise CheckpointError(
                    f"{where}: {name} is {self.arrays[name].dtype}{list(self.arrays[name].shape)}, "
                    f"expected uint32{list(shape)}"
                )
        python, numpy_meta = self.meta.get("python"), self.meta.get("numpy")
        python_ok = (
            isinstance(python, dict)
            and python.get("version") == 3
            and "gauss_next" in python
            and (python["gauss_next"] is None or _finite(python["gauss_next"]))
        )
        position = int(self.arrays[PYTHON_STATE][-1])
        numpy_ok = (
            isinstance(numpy_meta, dict)
            and numpy_meta.get("kind") == "MT19937"
            and _integer(numpy_meta.get("pos"), 0, 624)
            and _integer(numpy_meta.get("has_gauss"), 0, 1)
            and _finite(numpy_meta.get("cached_gaussian"))
        )
        if not (python_ok and numpy_ok and 0 <= position <= 624):
            raise CheckpointError(
                f"{where}: the host generator scalars (state.json rng) are not a state Python and NumPy accept"
            )

    def restore(self) -> None:
        try:
            python_meta, numpy_meta = self.meta["python"], self.meta["numpy"]
            internal = tuple(int(x) for x in self.arrays[PYTHON_STATE])
            random.setstate((python_meta["version"], internal, python_meta["gauss_next"]))
            np.random.set_state(
                (
                    numpy_meta["kind"],
                    self.arrays[NUMPY_STATE].astype(np.uint32),
                    numpy_meta["pos"],
                    numpy_meta["has_gauss"],
                    numpy_meta["cached_gaussian"],
                )
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise CheckpointError(f"checkpoint holds an unusable host RNG state ({exc})") from None


def _integer(value, low: int, high: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and low <= value <= high


def _finite(value) -> bool:
    return isinstance(value, float) and np.isfinite(value)
