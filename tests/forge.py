"""Forging receipts for the tests, with the project's own hashing: a changed receipt whose config_hash and
receipt_sha256 are recomputed (reprocube.config.config_hash, reprocube.training.receipt.self_digest), so that the
reader's integrity checks pass and only the comparison can tell. The attacks of tests/test_claims.py and
the mutations of tests/test_receipt_mutations.py are built on it."""

from __future__ import annotations

import base64
import copy
import json
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np

from reprocube.config import config_hash
from reprocube.formats.trace import LOSS_KEYS, TRACE_VERSION, decode_losses, encode_losses
from reprocube.training.receipt import RECEIPT, SELF_DIGEST, self_digest

LOSS_KEY = LOSS_KEYS[TRACE_VERSION]


def forged_bytes(value: dict, keep: tuple[str, ...] = ()) -> bytes:
    """The receipt's bytes with config_hash and receipt_sha256 recomputed (except the keys in `keep`, when a
    test changes one of those itself), written as reprocube writes receipts."""
    value = dict(value)  # the top level only: a test may nest a value past what deepcopy survives
    if "config_hash" not in keep:
        value["config_hash"] = config_hash(value["config"])
    if SELF_DIGEST not in keep:
        value[SELF_DIGEST] = self_digest(value)
    return json.dumps(value, sort_keys=True, separators=(",", ":")).encode()


def write_forged(value: dict, directory: Path, keep: tuple[str, ...] = ()) -> Path:
    """directory/receipt.json holding the forged receipt; the directory (a run directory as reproduce takes)."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / RECEIPT).write_bytes(forged_bytes(value, keep))
    return directory


def losses(value: dict) -> np.ndarray:
    trace = value["trace"]
    return decode_losses(trace[LOSS_KEY], trace["steps"], "trace", ValueError).copy()


def set_losses(value: dict, array: np.ndarray) -> None:
    value["trace"][LOSS_KEY] = encode_losses(np.asarray(array, np.float32))


def u32(text: str) -> np.ndarray:
    return np.frombuffer(base64.b64decode(text), "<u4").copy()


def u32_text(array: np.ndarray) -> str:
    return base64.b64encode(np.ascontiguousarray(array, "<u4").tobytes()).decode()


def drop_fingerprints(value: dict) -> None:
    """A trace as written before fingerprints existed (the four keys come together)."""
    for key in (
        "fingerprint_first_step",
        "fingerprint_u32_le_base64",
        "tensor_fingerprint_steps",
        "tensor_fingerprint_u32_le_base64",
    ):
        value["trace"].pop(key, None)


# --- every leaf, and what changing it means ----------------------------------------------------------
def leaves(value, path: tuple = ()) -> Iterator[tuple[tuple, object]]:
    """(path, value) of every leaf: numbers, strings, booleans, nulls and empty containers; a path is the
    tuple of keys and list indexes leading to it."""
    if isinstance(value, dict) and value:
        for key, item in value.items():
            yield from leaves(item, (*path, key))
    elif isinstance(value, list) and value:
        for index, item in enumerate(value):
            yield from leaves(item, (*path, index))
    else:
        yield path, value


def lists(value, path: tuple = ()) -> Iterator[tuple[tuple, list]]:
    """(path, list) of every non-empty list (for adding and dropping elements)."""
    if isinstance(value, dict):
        for key, item in value.items():
            yield from lists(item, (*path, key))
    elif isinstance(value, list):
        if value:
            yield path, value
        for index, item in enumerate(value):
            yield from lists(item, (*path, index))


def at(value, path: tuple):
    for part in path:
        value = value[part]
    return value


def changed_leaf(leaf):
    """A different value of the same kind (a float by one ULP: the smallest change a machine makes)."""
    if isinstance(leaf, bool):
        return not leaf
    if isinstance(leaf, int):
        return leaf + 1
    if isinstance(leaf, float):
        return float(np.nextafter(leaf, np.inf))
    if isinstance(leaf, str):
        last = leaf[-1:] or "a"
        return leaf[:-1] + ("b" if last == "a" else "a") if leaf else "a"
    if leaf is None:
        return 0
    return [0] if isinstance(leaf, list) else {"x": 0}


Mutation = tuple[str, tuple, Callable[[dict], None]]


def mutations(receipt: dict) -> Iterator[Mutation]:
    """(description, path of the leaf it changes, change in place) for every leaf of the receipt, every
    list's first and last element dropped and one more element added, and the trace's encoded arrays (a
    leaf holding many claims) changed by one bit at each step's loss and each fingerprint."""
    for path, leaf in leaves(receipt):
        yield f"{path} changed", path, _setter(path, changed_leaf(leaf))
    for path, items in lists(receipt):
        for index in sorted({0, len(items) - 1}):
            yield f"{path}[{index}] dropped", (*path, index), _dropper(path, index)
        yield f"{path} given one more element", (*path, len(items)), _adder(path)
    for step in range(receipt["trace"]["steps"]):
        yield f"loss of step {step + 1}: one bit", ("trace", LOSS_KEY), _loss_bit(step)
    for key in ("fingerprint_u32_le_base64", "tensor_fingerprint_u32_le_base64"):
        for index in range(len(u32(receipt["trace"][key])) if key in receipt["trace"] else 0):
            yield f"{key}[{index}]: one bit", ("trace", key), _u32_bit(key, index)


def _setter(path: tuple, new) -> Callable[[dict], None]:
    def change(value: dict) -> None:
        at(value, path[:-1])[path[-1]] = new

    return change


def _dropper(path: tuple, index: int) -> Callable[[dict], None]:
    return lambda value: at(value, path).pop(index)


def _adder(path: tuple) -> Callable[[dict], None]:
    def add(value: dict) -> None:
        items = at(value, path)
        extra = copy.deepcopy(items[-1])
        if isinstance(extra, list) and extra and isinstance(extra[0], int):  # a boundary: a step A never had
            extra[0] += 1
        items.append(extra)

    return add


def _loss_bit(step: int) -> Callable[[dict], None]:
    def flip(value: dict) -> None:
        array = losses(value)
        array.view(np.uint32)[step] ^= 1
        set_losses(value, array)

    return flip


def _u32_bit(key: str, index: int) -> Callable[[dict], None]:
    def flip(value: dict) -> None:
        array = u32(value["trace"][key])
        array[index] ^= 1
        value["trace"][key] = u32_text(array)

    return flip
