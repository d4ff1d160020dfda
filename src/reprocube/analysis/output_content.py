"""Two different files of one name compared by their format, for reprocube.analysis.outputs (which
compares their bytes first): the first differing tensor by name, with the ULP statistics of
reprocube.analysis.tensors (safetensors, `.pt`/`.pth` zips read without importing torch or running any
pickle's code, `.npz` and `.npy`, Keras `.h5` and `.keras` archives), JSON key or text line. A file that
cannot be read as its format is a difference that says so, never an exception."""

from __future__ import annotations

import numpy as np

from reprocube.analysis.output_fields import fields_difference, first_key
from reprocube.analysis.tensors import tensor_differences
from reprocube.errors import CheckpointError
from reprocube.formats.checkpoint_formats import SUFFIXES, by_name
from reprocube.formats.output_files import ORBAX_TIMESTAMP
from reprocube.formats.tensor_readers import KERAS_VOLATILE, read_keras
from reprocube.formats.torch_structure import torch_structure
from reprocube.results.wording import first_difference
from reprocube.terminal import one_line
from reprocube.untrusted import parse_json

TENSOR_SUFFIXES = SUFFIXES  # the tensor formats of formats.checkpoint_formats
TEXT_SUFFIXES = (".json", ".jsonl", ".csv", ".txt", ".log", ".tsv", ".yaml", ".yml")


def content_difference(name: str, a: bytes, b: bytes, ignore_fields: list[str] = ()) -> dict:
    """Where two different files of one name differ, by their format: the first tensor (with its ULP
    statistics), JSON key or line; "detail" says it in words. "same": True where the only differences lie
    in `ignore_fields` (or a Keras archive's date_saved), which "ignored_fields" lists. A file that cannot
    be read as its format is a difference that says so, never an exception."""
    suffix = next((s for s in (*TENSOR_SUFFIXES, *TEXT_SUFFIXES) if name.endswith(s)), None)
    if name == ORBAX_TIMESTAMP or name.endswith("/" + ORBAX_TIMESTAMP):
        suffix = ".json"  # Orbax's step metadata: JSON without the suffix
    try:
        if ignore_fields:
            return fields_difference(suffix, a, b, list(ignore_fields), one_line(name))
        if suffix == ".keras" and a.startswith(b"PK") and b.startswith(b"PK"):
            return _keras_difference(a, b, one_line(name))
        if suffix in TENSOR_SUFFIXES:
            ta, tb = load_tensors(suffix, a, f"{name} (A)"), load_tensors(suffix, b, f"{name} (B)")
            found = _tensors_difference(ta, tb)
            if found["tensor"] is None and suffix in (".pt", ".pth"):
                return _torch_layout(a, b, name)
            return found
        if suffix == ".json":
            return first_key(parse_json(a, "A", CheckpointError), parse_json(b, "B", CheckpointError))
        if suffix in TEXT_SUFFIXES:
            return _first_line(a, b)
    except Exception as exc:  # a reader meeting someone else's file: a difference, named
        return {"detail": f"the bytes differ; the file could not be read as {suffix}: {one_line(str(exc))[:200]}"}
    return {"detail": f"the bytes differ ({len(a)} vs {len(b)} bytes; a format this comparison does not read)"}


def _tensors_difference(ta: dict, tb: dict) -> dict:
    rows = [row for row in tensor_differences(ta, tb) if not row["identical"]]
    if not rows:
        return {"detail": "the bytes differ, every tensor is identical (metadata or layout)", "tensor": None}
    first, detail = first_difference(rows, ta, tb)
    return {
        "tensor": first,
        "detail": detail,
    }


def _torch_layout(a: bytes, b: bytes, name: str) -> dict:
    """Two torch.save files whose every tensor and value read the same: a layout difference only where
    everything torch would load is the same too, types, keys and nesting included (torch_structure)."""
    if torch_structure(a, f"{name} (A)") == torch_structure(b, f"{name} (B)"):
        return {
            "detail": "the bytes differ, everything torch would load is identical, every type and key too (a "
            "layout difference: pickle's memo or the archive's order)",
            "tensor": None,
            "layout": True,
        }
    return {
        "detail": "the bytes differ, every tensor is identical, but what torch would load is not (a value's "
        "type, a key's type, the nesting, a set, a Parameter, or how tensors share storage)",
        "tensor": None,
    }


def _keras_difference(a: bytes, b: bytes, name: str) -> dict:
    """Two Keras 3 archives by their weights, config.json and metadata.json (without date_saved, which
    changes with every save), and any other member by its bytes."""
    pa, pb = read_keras(a, f"{name} (A)"), read_keras(b, f"{name} (B)")
    ignored = {"ignored_fields": [f"metadata.json:{key}" for key in KERAS_VOLATILE]}
    weights = _tensors_difference(pa["weights"], pb["weights"])
    if weights["tensor"] is not None:
        return {"same": False, **weights, **ignored}
    for part in ("config", "metadata"):
        if repr(pa[part]) != repr(pb[part]):
            key = first_key(pa[part], pb[part])
            return {
                "same": False,
                "detail": f"{part}.json: {key['detail']}",
                "key": f"{part}.json:{key['key']}",
                **ignored,
            }
    for member in sorted(set(pa["other"]) | set(pb["other"])):
        if pa["other"].get(member) != pb["other"].get(member):
            return {"same": False, "detail": f"the archive's {one_line(member)} differs", **ignored}
    return {
        "same": True,
        "detail": f"identical weights and config; only {', '.join(ignored['ignored_fields'])} differs (ignored)",
        "tensor": None,
        **ignored,
    }


def load_tensors(suffix: str, data: bytes, where: str = "the file") -> dict[str, np.ndarray]:
    """name -> array of a tensor file, by the handler its suffix names (formats.checkpoint_formats): nothing
    in the file is run, every size it declares checked before anything is allocated."""
    handler = by_name(suffix)
    if handler is None:
        raise CheckpointError(f"{where}: {suffix} is no tensor format read here")
    return handler.read(data, where)


def _first_line(a: bytes, b: bytes) -> dict:
    la, lb = a.decode("utf-8", "replace").splitlines(), b.decode("utf-8", "replace").splitlines()
    for number, (x, y) in enumerate(zip(la, lb, strict=False), start=1):
        if x != y:
            return {"detail": f"line {number}: {x[:80]!r} vs {y[:80]!r}", "line": number}
    return {"detail": f"{len(la)} vs {len(lb)} lines", "line": min(len(la), len(lb)) + 1}
