"""How far two sets of weights differ, tensor by tensor: identical bytes, max |a-b|, and ULP statistics
with sign flips and non-finite values counted apart."""

from __future__ import annotations

import numpy as np


def ulp_statistics(a: np.ndarray, b: np.ndarray) -> dict:
    """How far two arrays of one dtype differ, in units in the last place, over the values that differ:
    max, median and 99th percentile, the largest relative error, and the sign flips counted apart (a
    value that crosses zero is billions of ULP away however small the change, and would swamp the rest)."""
    differing = a != b
    # ml_dtypes' bfloat16 and float8 are floats NumPy does not call "f" (kind "V"): as integers they truncate
    floating = a.dtype.kind == "f" or a.dtype.name.startswith(("bfloat16", "float8", "float6", "float4"))
    if not floating:
        gaps = np.abs(a.astype(np.int64) - b.astype(np.int64))[differing]
        flips = np.zeros(gaps.shape, bool)
    else:
        differing &= ~(np.isnan(a) & np.isnan(b))
        int_type = {1: np.int8, 2: np.int16, 4: np.int32, 8: np.int64}[a.dtype.itemsize]

        def ordered(x):  # map float bit patterns onto a monotonic integer line
            bits = x.view(int_type).astype(np.int64)
            return np.where(bits < 0, np.int64(np.iinfo(int_type).min) - bits, bits)

        flips = (np.signbit(a) != np.signbit(b))[differing]
        gaps = np.abs(ordered(a) - ordered(b))[differing]
    kept = gaps[~flips]
    x, y = a[differing].astype(np.float64), b[differing].astype(np.float64)
    with np.errstate(over="ignore", invalid="ignore"):
        scale = np.maximum(np.abs(x), np.abs(y))
        relative = np.abs(x - y)[scale > 0] / scale[scale > 0]
    relative = relative[np.isfinite(relative)]  # only numbers JSON can hold (NaN and infinity counted apart)
    return {
        "values_differing": int(gaps.size),
        "sign_flips": int(flips.sum()),
        "max_ulp": int(kept.max()) if kept.size else 0,
        "median_ulp": float(np.median(kept)) if kept.size else 0.0,
        "p99_ulp": float(np.percentile(kept, 99)) if kept.size else 0.0,
        "max_relative": float(relative.max()) if relative.size else 0.0,
    }


def tensor_differences(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> list[dict]:
    """Per tensor: identical bytes?, max |a-b| and the ULP statistics; missing or reshaped tensors named."""
    rows = []
    for name in sorted(set(a) | set(b)):
        if name not in a or name not in b:
            rows.append({"tensor": name, "identical": False, "problem": f"only in run {'A' if name in a else 'B'}"})
            continue
        x, y = a[name], b[name]
        if x.shape != y.shape or x.dtype != y.dtype:
            rows.append(
                {"tensor": name, "identical": False, "problem": f"{x.dtype}{list(x.shape)} vs {y.dtype}{list(y.shape)}"}
            )
            continue
        if x.tobytes() == y.tobytes():
            rows.append({"tensor": name, "identical": True, "max_abs": 0.0, "max_ulp": 0})
            continue
        with np.errstate(over="ignore", invalid="ignore"):  # a NaN or infinity in a weight: counted apart
            gaps = np.abs(x.astype(np.float64) - y.astype(np.float64))
        finite = np.isfinite(gaps)
        row = {"tensor": name, "identical": False, "max_abs": float(gaps[finite].max()) if finite.any() else 0.0}
        row.update(ulp_statistics(x, y))
        non_finite = int(np.sum(~finite & (x != y) & ~(_isnan(x) & _isnan(y))))
        if non_finite:
            row["non_finite"] = non_finite  # values whose difference is NaN or infinite (no number says how far)
        rows.append(row)
    return rows


def _isnan(x: np.ndarray) -> np.ndarray:
    return np.isnan(x) if x.dtype.kind == "f" else np.zeros(x.shape, bool)
