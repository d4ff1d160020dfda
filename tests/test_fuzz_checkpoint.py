"""Fuzzing of checkpoint.read_checkpoint followed by TrainState.from_checkpoint: naive and re-signed
mutations of a real checkpoint (its files, manifest and layout) read whole or raise one CheckpointError line."""

from __future__ import annotations

import functools
import json
import math
import random
import shutil
from pathlib import Path

import numpy as np
import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from reprocube.errors import CheckpointError
from reprocube.training.checkpoint import FILE_NAMES, MANIFEST, read_checkpoint, weights_digest
from reprocube.training.metrics import DETERMINISTIC_EPOCH_FIELDS
from reprocube.training.state import TrainState
from reprocube.untrusted import parse_json

from fuzz_helpers import (
    DTYPE_SIZE,
    TRACE_PATHS,
    UNIQUE,
    FuzzError,
    build_checkpoint,
    byte_ops,
    expect_value_or_error,
    fuzz_settings,
    json_scalars,
    json_values,
    nested,
    raw_json_texts,
    self_digest,
    sha256,
    state_values,
)

pytestmark = pytest.mark.process  # every test here starts a process: not in make test-quick

STEPS_PER_EPOCH = 21  # the generated dataset: 650 examples, batch 32
TENSOR_FILES = ("weights.safetensors", "optimizer.safetensors", "rng.safetensors")
STATE_PATHS = [
    ["version"],
    ["position"],
    ["position", "epoch"],
    ["position", "step_in_epoch"],
    ["position", "global_step"],
    ["epoch_totals"],
    ["epoch_totals", "loss_sum"],
    ["epoch_totals", "correct"],
    ["rng"],
    ["rng", "python"],
    ["rng", "python", "version"],
    ["rng", "python", "gauss_next"],
    ["rng", "numpy"],
    ["rng", "numpy", "kind"],
    ["rng", "numpy", "pos"],
    ["rng", "numpy", "has_gauss"],
    ["rng", "numpy", "cached_gaussian"],
    ["framework"],
    *TRACE_PATHS,
]
MANIFEST_PATHS = [
    ["format_version"],
    ["epoch"],
    ["step_in_epoch"],
    ["global_step"],
    ["steps_per_epoch"],
    ["seed"],
    ["framework"],
    ["framework_info"],
    ["framework_info", "torch"],
    ["reason"],
    ["config_hash"],
    ["reprocube_version"],
    ["weights_digest"],
    ["created_unix"],
    ["files"],
    *[["files", name] for name in FILE_NAMES],
    ["file_bytes"],
    *[["file_bytes", name] for name in FILE_NAMES],
    ["metrics"],
    ["metrics", "epochs"],
    ["metrics", "steps"],
    *[["metrics", "epochs", 0, key] for key in (*DETERMINISTIC_EPOCH_FIELDS, "weights_digest")],
    ["metrics", "steps", 0],
    ["metrics", "steps", 1, "loss"],
    ["metrics", "steps", 2, "global_step"],
]
SAFETENSORS_DTYPES = ["BF16", "F8_E4M3", "F8_E5M2", "F8_E8M0", "F4", "C64", "F16", "F32", "F64"]
SAFETENSORS_DTYPES += ["I8", "I16", "I32", "I64", "U8", "U16", "U32", "U64", "BOOL", "f32", "", "X"]
NUMPY_DTYPES = ["float16", "float32", "float64", "int8", "int32", "int64", "uint8", "uint32", "uint64", "bool"]
shapes = st.one_of(
    st.lists(st.integers(0, 64), max_size=4),
    st.lists(st.integers(-(2**41), 2**41), max_size=3),
    st.lists(json_scalars, max_size=3),
    st.just([1] * 70),  # more dimensions than NumPy holds
    json_values,
)
offsets = st.one_of(
    st.tuples(st.integers(-(2**65), 2**65), st.integers(-(2**65), 2**65)).map(list),
    st.lists(st.integers(0, 1 << 20), max_size=3),
    json_values,
)
header_ops = st.one_of(
    st.tuples(
        st.just("field"), st.integers(0, 10), st.just("dtype"), st.sampled_from(SAFETENSORS_DTYPES) | json_values
    ),
    st.tuples(st.just("field"), st.integers(0, 10), st.just("shape"), shapes),
    st.tuples(st.just("field"), st.integers(0, 10), st.just("data_offsets"), offsets),
    st.tuples(st.just("field"), st.integers(0, 10), st.text(max_size=8), json_values),
    st.tuples(st.just("entry"), st.integers(0, 10), json_values),
    st.tuples(st.just("drop"), st.integers(0, 10)),
    st.tuples(st.just("rename"), st.integers(0, 10), st.text(max_size=12)),
    st.tuples(st.just("metadata"), json_values),
    st.tuples(st.just("raw"), raw_json_texts),
    st.tuples(st.just("length"), st.integers(0, 2**64 - 1)),
)
array_ops = st.one_of(
    st.tuples(st.just("astype"), st.integers(0, 10), st.sampled_from(NUMPY_DTYPES)),
    st.tuples(st.just("reshape"), st.integers(0, 10), st.sampled_from(["flat", "transpose", "add-dim", "scalar"])),
    st.tuples(st.just("slice"), st.integers(0, 10), st.integers(0, 100)),
    st.tuples(
        st.just("poke"),
        st.integers(0, 10),
        st.integers(0, 2**20),
        st.sampled_from([np.nan, np.inf, -np.inf, 1e38, -0.0, 2**32 - 1]),
    ),
    st.tuples(st.just("drop"), st.integers(0, 10)),
    st.tuples(st.just("rename"), st.integers(0, 10), st.text(min_size=1, max_size=12)),
    st.tuples(st.just("add"), st.text(min_size=1, max_size=12), st.sampled_from(NUMPY_DTYPES), st.integers(0, 8)),
    st.tuples(st.just("exotic"), st.integers(0, 10), st.sampled_from(list(DTYPE_SIZE))),
)
content_ops = st.one_of(
    st.tuples(st.just("bytes"), st.sampled_from(FILE_NAMES), byte_ops),
    st.tuples(st.just("replace"), st.sampled_from(["state.json", "config.json"]), raw_json_texts),
    st.tuples(
        st.just("state"), st.sampled_from(STATE_PATHS + [["extra"], ["position", "extra"]]), state_values, st.booleans()
    ),
    st.tuples(st.just("header"), st.sampled_from(TENSOR_FILES), header_ops),
    st.tuples(st.just("arrays"), st.sampled_from(TENSOR_FILES), array_ops),
)
manifest_ops = st.one_of(
    st.tuples(st.just("set"), st.sampled_from(MANIFEST_PATHS), state_values),
    st.tuples(st.just("delete"), st.sampled_from(MANIFEST_PATHS)),
    st.tuples(st.just("deep"), st.sampled_from(MANIFEST_PATHS), st.integers(1, 2500)),
)
file_names = st.text(
    st.characters(blacklist_categories=("Cs",), blacklist_characters="/\x00"), min_size=1, max_size=20
).filter(lambda n: n not in (".", "..") and len(n.encode()) < 200)
layout_ops = st.one_of(
    st.tuples(st.sampled_from(["missing", "directory", "symlink", "fifo"]), st.sampled_from(FILE_NAMES + (MANIFEST,))),
    st.tuples(st.just("extra"), file_names),
)


@st.composite
def checkpoint_mutations(draw):
    return {
        "content": draw(st.lists(content_ops, max_size=3)),
        "resign_files": draw(st.sampled_from([True, True, True, False])),
        "manifest": draw(st.lists(manifest_ops, max_size=2)),
        "resign_manifest": draw(st.sampled_from([True, True, True, False])),
        "manifest_bytes": draw(st.lists(byte_ops, max_size=1)) if draw(st.integers(0, 3)) == 0 else [],
        "layout": draw(st.lists(layout_ops, max_size=1)) if draw(st.integers(0, 3)) == 0 else [],
    }


def check_loaded_checkpoint(directory: Path) -> tuple[bool, str]:
    """read_checkpoint then from_checkpoint: CheckpointError, or a state whose every promise holds."""
    ok, result = expect_value_or_error(
        lambda: (lambda c: (c, TrainState.from_checkpoint(c, STEPS_PER_EPOCH)))(read_checkpoint(directory)),
        CheckpointError,
    )
    if not ok:
        return False, result
    checkpoint, state = result
    # What the reader guarantees on success: integrity ...
    manifest = json.loads((directory / MANIFEST).read_bytes())
    assert manifest["manifest_sha256"] == self_digest(manifest)
    assert sorted(p.name for p in directory.iterdir()) == sorted((*FILE_NAMES, MANIFEST))
    for name in FILE_NAMES:
        assert (directory / name).is_file() and not (directory / name).is_symlink()
        assert manifest["files"][name] == sha256((directory / name).read_bytes()), name
    assert weights_digest(state.framework.weights) == manifest["weights_digest"]
    # ... and a structurally valid state.
    position = state.position
    for count in (position.epoch, position.step_in_epoch, position.global_step, state.epoch_totals.correct):
        assert type(count) is int and 0 <= count < 2**63
    assert position.step_in_epoch <= STEPS_PER_EPOCH and position.global_step == manifest["global_step"]
    assert type(state.epoch_totals.loss_sum) is float and math.isfinite(state.epoch_totals.loss_sum)
    for arrays in (state.framework.weights, state.framework.optimizer, state.framework.rng, state.host_rng.arrays):
        assert all(isinstance(a, np.ndarray) for a in arrays.values())
    assert all(np.isfinite(a).all() for a in state.framework.weights.values() if a.dtype.kind == "f")
    assert all(isinstance(r, dict) for r in state.history.epochs + state.history.steps)
    saved = random.getstate(), np.random.get_state()
    try:
        state.host_rng.restore()  # validated: Python and NumPy accept it
    finally:
        random.setstate(saved[0])
        np.random.set_state(saved[1])
    return True, ""


def test_the_unmutated_checkpoint_reads_whole(base, scratch):
    """The baseline the properties start from reads whole (so the fuzz is not refusing everything)."""
    plan = {"content": [], "resign_files": True, "manifest": [], "resign_manifest": True}
    build_checkpoint(base, {**plan, "manifest_bytes": [], "layout": []}, scratch / "unmutated")
    assert check_loaded_checkpoint(scratch / "unmutated") == (True, "")


@pytest.mark.parametrize(
    "op, expected",
    [
        # re-signed, each reaches a check behind the digests (the re-signing helper works)
        (("arrays", "weights.safetensors", ("poke", 0, 3, np.nan)), "holds NaN or infinity"),
        (("arrays", "weights.safetensors", ("exotic", 0, "BF16")), "has dtype 'BF16'"),
        (("arrays", "rng.safetensors", ("astype", 0, "int64")), "expected uint32"),
        (("state", ["epoch_totals", "loss_sum"], "0.5", False), "loss_sum is not a finite number"),
        (("header", "optimizer.safetensors", ("field", 0, "shape", [3, 3])), "inconsistent shape or data_offsets"),
    ],
)
def test_resigned_mutations_reach_the_content_checks(base, scratch, op, expected):
    plan = {"content": [op], "resign_files": True, "manifest": [], "resign_manifest": True}
    directory = scratch / f"resigned-{next(UNIQUE)}"
    build_checkpoint(base, {**plan, "manifest_bytes": [], "layout": []}, directory)
    ok, message = check_loaded_checkpoint(directory)
    assert not ok and expected in message
    # the same change unsigned stops at the sha256 (or at the manifest's own digest)
    plan["resign_files"] = False
    build_checkpoint(base, {**plan, "manifest_bytes": [], "layout": []}, directory.with_name(directory.name + "u"))
    ok, message = check_loaded_checkpoint(directory.with_name(directory.name + "u"))
    assert not ok and ("does not match its sha256" in message or "bytes, more than the" in message), message


def deepest_parsed() -> int:
    """The deepest nesting parse_json accepts here (readers deeper in the stack accept a little less)."""
    low, high = 1, 100_000
    while low < high:
        middle = (low + high + 1) // 2
        blob = nested(middle, "list").encode()
        ok, _ = expect_value_or_error(functools.partial(parse_json, blob, "x", FuzzError), FuzzError)
        low, high = (middle, high) if ok else (low, middle - 1)
    return low


@pytest.mark.parametrize(
    "place", ["state.json", "config.json", "manifest.json framework_info", "manifest.json metrics", "weights header"]
)
def test_nesting_around_the_recursion_limit(base, scratch, place):
    """Every depth from just within to just past what the JSON parser accepts: what is parsed is then
    hashed, flattened and type-checked by recursive code (a RecursionError there would escape)."""
    outcomes = set()
    deepest = deepest_parsed()
    for depth in range(deepest - 12, deepest + 3):
        for kind in ("list", "dict") if not place.startswith("manifest") else ("list",):
            if place.startswith("manifest.json"):
                ops = {"content": [], "manifest": [("deep", [place.split()[1], "deep"], depth)]}
            elif place == "weights header":
                ops = {"content": [("header", "weights.safetensors", ("raw", nested(depth, kind)))], "manifest": []}
            else:
                ops = {"content": [("replace", place, nested(depth, kind))], "manifest": []}
            plan = {**ops, "resign_files": True, "resign_manifest": True, "manifest_bytes": [], "layout": []}
            directory = scratch / f"deep-{next(UNIQUE)}"
            build_checkpoint(base, plan, directory)
            ok, message = check_loaded_checkpoint(directory)
            outcomes.add("read" if ok else message.replace(str(directory), "<checkpoint>"))
            shutil.rmtree(directory)
    # both sides of the limit were reached: refused as too deep, and parsed (then read or refused otherwise)
    assert any("nested too deeply" in outcome for outcome in outcomes), outcomes
    assert any("nested too deeply" not in outcome for outcome in outcomes), outcomes


@fuzz_settings(600)
@given(checkpoint_mutations())
@example(  # a dtype that is not a string (a JSON list): unhashable
    {
        "content": [("header", "weights.safetensors", ("field", 0, "dtype", []))],
        "resign_files": True,
        "manifest": [],
        "resign_manifest": True,
        "manifest_bytes": [],
        "layout": [],
    }
)
@example(  # a tensor name with a line break: the error must still be one line
    {
        "content": [
            ("arrays", "weights.safetensors", ("rename", 0, "a\nb")),
            ("header", "weights.safetensors", ("field", 0, "dtype", "BF16")),
        ],
        "resign_files": True,
        "manifest": [],
        "resign_manifest": True,
        "manifest_bytes": [],
        "layout": [],
    }
)
@example(  # a file name with a carriage return beside the checkpoint's files: one line still
    {
        "content": [],
        "resign_files": True,
        "manifest": [],
        "resign_manifest": True,
        "manifest_bytes": [],
        "layout": [("extra", "notes\r")],
    }
)
@example(  # rng.python.gauss_next deleted: validate() accepts what HostRng.restore() then refuses
    {
        "content": [("state", ["rng", "python", "gauss_next"], None, True)],
        "resign_files": True,
        "manifest": [],
        "resign_manifest": True,
        "manifest_bytes": [],
        "layout": [],
    }
)
def test_any_mutated_checkpoint_reads_whole_or_raises_checkpoint_error(base, scratch, plan):
    directory = scratch / f"c{next(UNIQUE)}"
    try:
        build_checkpoint(base, plan, directory)
        check_loaded_checkpoint(directory)
    finally:
        shutil.rmtree(directory, ignore_errors=True)
        Path(f"{directory}-target").unlink(missing_ok=True)
