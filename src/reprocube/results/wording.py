"""How a finding reads, written once for every page, Markdown file and terminal line that states it:
which tensors, the first update that changed the weights, a tensor row's difference and which row
explains a checkpoint best."""

from __future__ import annotations


def tensor_list(tensors: list[str], shown: int = 4) -> str:
    """`a`, `b`, ... (N tensors): a few names, and how many there are."""
    names = ", ".join(tensors[:shown]) + (", ..." if len(tensors) > shown else "")
    return f"{names} ({len(tensors)} tensor{'s' if len(tensors) != 1 else ''})"


def first_update_text(first: dict) -> str:
    """Where the first update that changed the weights is known: by the per-step fingerprints to the step
    (and the tensors it changed, for the steps that have per-tensor fingerprints), else a window; or that
    the initial weights already differ (no update made them differ)."""
    if first.get("initial_tensors"):
        return (
            f"the initial weights already differ, before any update: {tensor_list(first['initial_tensors'])} "
            "(the initialisation computed differently)"
        )
    if first.get("first_weight_step") is not None:
        tensors = first.get("weight_tensors")
        return f"the first update that changed the weights: step {first['first_weight_step']}" + (
            f", which changed {tensor_list(tensors)}"
            if tensors
            else " (the model's fingerprint; no per-tensor one that far)"
        )
    if first.get("fingerprinted"):
        return "the weights agree after every step both runs fingerprint"
    window = first.get("window")
    if window is None:
        return "the first update that changed the weights is not known"
    return (
        f"the first update that made the weights differ is one of steps {window[0]}..{window[1]} (A's receipt has "
        "no per-step weight fingerprints; trace.every_steps=1 pins it to one step)"
    )


def worst_tensor(tensors: list[dict]) -> dict | None:
    """The row that explains a checkpoint's difference best: a missing/reshaped tensor, else max ULP."""
    return max(
        tensors,
        key=lambda t: ("problem" in t, not t["identical"], t.get("max_ulp", 0), t.get("sign_flips", 0)),
        default=None,
    )


# reprocube.formats.torch_pickle's name for an object's pickled state: a state dict's `_metadata` (its
# modules' version numbers) reads as `model.__state__._metadata..version`, values that are not tensors.
PICKLED_STATE = "__state__"


def _is_metadata(name: str) -> bool:
    return PICKLED_STATE in name.split(".")


def first_and_count(rows: list[dict], a: dict, b: dict) -> tuple[dict, str]:
    """Of two files' differing rows (tensor_differences of `a` and `b`, name order): the row to name first
    (a tensor before a plain value, before a state dict's metadata) and "k of n tensors differ", plain
    values (a step count, a learning rate, a string: no dimension) and the metadata counted apart (a
    4-tensor model's state dict is 4 tensors, not 4 and its 6 version entries and the step saved beside)."""
    kinds = {name: _kind(name, a.get(name, b.get(name))) for name in set(a) | set(b)}
    by_kind: dict[str, list[dict]] = {"tensor": [], "value": [], "metadata": []}
    for row in rows:
        by_kind[kinds[row["tensor"]]].append(row)
    tensors, values, metadata = by_kind["tensor"], by_kind["value"], by_kind["metadata"]
    total = sum(1 for kind in kinds.values() if kind == "tensor")
    count = f"{len(tensors)} of {total} tensors differ"
    if values:
        names = ", ".join(row["tensor"] for row in values[:3]) + (", ..." if len(values) > 3 else "")
        count += f"; {len(values)} other {'value differs' if len(values) == 1 else 'values differ'} ({names})"
    if metadata:
        also = " too" if tensors or values else ""
        count += f"; {len(metadata)} metadata {'entry differs' if len(metadata) == 1 else 'entries differ'}{also}"
    return (tensors or values or metadata)[0], count


def first_difference(rows: list[dict], a: dict, b: dict) -> tuple[dict, str]:
    """The first differing row (first_and_count) and the difference in words: "tensor NAME: max abs ..., max
    ... ULP (k of n tensors differ)", or for a plain value "value NAME: 3 vs 4" (a number; text: "other text")."""
    first, count = first_and_count(rows, a, b)
    name = first["tensor"]
    if first.get("problem") or _kind(name, a.get(name, b.get(name))) != "value":
        return first, f"tensor {name}: {difference_size(first)} ({count})"
    x, y = a[name], b[name]
    plain = x.ndim == 0 and y.ndim == 0 and x.dtype.kind in "biuf" and y.dtype.kind in "biuf"
    return first, f"value {name}: {f'{x.item()!r} vs {y.item()!r}' if plain else 'other text'} ({count})"


def _kind(name: str, value) -> str:
    if _is_metadata(name):
        return "metadata"
    # a number saved beside the weights is a 0-d array; text, bytes or None a PlainValue (formats.tensor_readers)
    return "tensor" if getattr(value, "ndim", 0) >= 1 and not getattr(value, "plain_value", False) else "value"


def difference_size(row: dict) -> str:
    """A tensor row's difference: the problem (only in one run, reshaped), else max abs and max ULP."""
    if row.get("problem"):
        return row["problem"]
    flips = f", {row['sign_flips']} sign flips" if row.get("sign_flips") else ""
    non_finite = f", {row['non_finite']} NaN or infinite" if row.get("non_finite") else ""
    return f"max abs {row['max_abs']:.3g}, max {row['max_ulp']} ULP{flips}{non_finite}"
