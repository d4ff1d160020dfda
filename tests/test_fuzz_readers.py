"""Property-based fuzzing (Hypothesis) of the readers of untrusted files, in-process: reprocube.untrusted
(parse_json, Fields, iter_json_lines, parse_yaml), checkpoint.read_checkpoint followed by
TrainState.from_checkpoint, and metrics.read_epoch_records. The contract under test is the one
untrusted.py states: whatever the bytes, a reader returns a value or raises the caller's ReprocubeError
(one line), never another exception, and quickly. Checkpoints are mutated both naively (the sha256s then
refuse them) and RE-SIGNED (every sha256 in the manifest, the weights_digest and manifest_sha256
recomputed, as anyone can), so that the content checks behind the digests are reached too. A few
mutated checkpoints then go through the CLI (compare, train resume=PATH) end to end.

Examples are derandomized (the same ones each run: a failure reproduces); REPROCUBE_FUZZ_EXAMPLES=N
runs N times as many."""

from __future__ import annotations

import functools
import hashlib
import itertools
import json
import math
import os
import random
import shutil
import sys
import tempfile
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from hypothesis.configuration import set_hypothesis_home_dir
from safetensors.numpy import load as load_safetensors
from safetensors.numpy import save as save_safetensors

from reprocube.checkpoint import FILE_NAMES, MANIFEST, manifest_self_digest, read_checkpoint, weights_digest
from reprocube.errors import CheckpointError, ConfigError, ReprocubeError
from reprocube.metrics import DETERMINISTIC_EPOCH_FIELDS, read_epoch_records
from reprocube.state import TrainState
from reprocube.untrusted import MAX_INT_DIGITS, Fields, iter_json_lines, parse_json, parse_yaml

from conftest import error_lines, reprocube

SCALE = int(os.environ.get("REPROCUBE_FUZZ_EXAMPLES", "1"))
# Hypothesis caches constants it finds in the source under .hypothesis/: not in the work tree.
set_hypothesis_home_dir(Path(tempfile.gettempdir()) / "reprocube-hypothesis")
UNIQUE = itertools.count()  # names of the scratch checkpoints and files


def fuzz_settings(examples: int):
    return settings(
        max_examples=examples * SCALE,
        deadline=2000,  # ms per example: a reader that hangs or crawls on some input fails here
        derandomize=True,
        database=None,  # nothing written into the work tree (.hypothesis/)
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much],
    )


class FuzzError(ReprocubeError):
    """The error class the tests hand to the readers: they must raise exactly this one."""


def expect_value_or_error(read, error: type[ReprocubeError]):
    """Run `read`; return (True, value) or (False, message) when it raised `error` (exactly that class,
    with a one-line message); any other exception fails the test with its traceback."""
    try:
        return True, read()
    except error as exc:
        assert type(exc) is error, f"{type(exc).__name__} instead of {error.__name__}: {exc}"
        message = str(exc)
        assert message and "\n" not in message and "\r" not in message, f"not one line: {message!r}"
        return False, message


def walk(value):
    """Every node of a JSON value, iteratively (a value may be nested ~1000 deep)."""
    stack = [value]
    while stack:
        node = stack.pop()
        yield node
        if isinstance(node, dict):
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)


def assert_strict_json(value) -> None:
    """What parse_json promises to return: finite floats, integers of at most MAX_INT_DIGITS digits."""
    for node in walk(value):
        if isinstance(node, float):
            assert math.isfinite(node), node
        elif isinstance(node, int) and not isinstance(node, bool):
            assert len(str(abs(node))) <= MAX_INT_DIGITS, node
        else:
            assert node is None or isinstance(node, (bool, str, list, dict)), type(node)


# --- strategies ----------------------------------------------------------------------------------

json_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.sampled_from([0, -1, 1, 3, 21, 624, 625, 2**31, 2**32, 2**63 - 1, 2**63, 2**64, 10**39, -(10**39)]),
    st.floats(allow_nan=False, allow_infinity=False),
    st.sampled_from([0.0, -0.0, 1.0, 1e308, -1e308, 5e-324]),
    st.text(max_size=12),
    st.sampled_from(["", "MT19937", "F32", "BF16", "U32", "epoch", "step", "a" * 64, "0" * 64]),
)
json_values = st.recursive(
    json_scalars,
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=10), children, max_size=4),
    max_leaves=16,
)


def nested(depth: int, kind: str) -> str:
    return "[" * depth + "]" * depth if kind == "list" else '{"a":' * depth + "1" + "}" * depth


# JSON texts json.dumps cannot write: deep nesting, constants, long integers, duplicate keys, surrogates.
raw_json_texts = st.one_of(
    json_values.map(json.dumps),
    st.builds(nested, st.integers(1, 3000), st.sampled_from(["list", "dict"])),
    st.sampled_from(
        [
            "NaN",
            "-Infinity",
            '{"a": Infinity}',
            "1e999",
            "-1e400",
            "1" * (MAX_INT_DIGITS + 1),
            "-" + "9" * (MAX_INT_DIGITS + 1),
            "1" * MAX_INT_DIGITS,
            '{"a": 1, "a": 2}',
            '"\\ud800"',
            '{"\\udfff": [1]}',
            "\ufeff{}",
            "",
            " ",
            "nul",
            "[1,]",
            '{"a" 1}',
            "0" * 5000,
            "1." + "0" * 5000 + "1",
            "1e-99999",
        ]
    ),
)

positions = st.one_of(st.integers(0, 1100), st.integers(0, 2**31))  # JSON headers sit in the first bytes
byte_ops = st.one_of(
    st.tuples(st.just("flip"), positions, st.integers(1, 255)),
    st.tuples(st.just("truncate"), positions),
    st.tuples(st.just("insert"), positions, st.binary(min_size=1, max_size=16)),
    st.tuples(st.just("delete"), positions, st.integers(1, 64)),
    st.tuples(st.just("overwrite"), positions, st.binary(min_size=1, max_size=16)),
)


def apply_byte_op(blob: bytes, op) -> bytes:
    kind, where = op[0], op[1] % (len(blob) + 1)
    if kind == "flip":
        if not blob:
            return blob
        where %= len(blob)
        return blob[:where] + bytes([blob[where] ^ op[2]]) + blob[where + 1 :]
    if kind == "truncate":
        return blob[:where]
    if kind == "insert":
        return blob[:where] + op[2] + blob[where:]
    if kind == "delete":
        return blob[:where] + blob[where + op[2] :]
    return blob[:where] + op[2] + blob[where + len(op[2]) :]


# --- (a) parse_json and Fields ---------------------------------------------------------------------


def parse(blob: bytes):
    ok, value = expect_value_or_error(lambda: parse_json(blob, "fuzz.json", FuzzError), FuzzError)
    if ok:
        assert_strict_json(value)
    else:
        assert value.startswith("fuzz.json")
    return ok, value


@fuzz_settings(300)
@given(st.binary(max_size=300))
@example(b"\xff\xfe")
@example(b"[" * 100_000)
def test_parse_json_on_arbitrary_bytes(blob):
    parse(blob)


@fuzz_settings(300)
@given(raw_json_texts, st.lists(byte_ops, max_size=3))
@example('{"a": 1}', [("insert", 5, b"NaN")])
def test_parse_json_on_mutated_documents(text, ops):
    blob = text.encode("utf-8", "surrogatepass")
    for op in ops:
        blob = apply_byte_op(blob, op)
    parse(blob)


@fuzz_settings(200)
@given(json_values)
def test_parse_json_accepts_what_strict_json_writes(value):
    """Not everything is refused: a document within the rules reads back equal (so that the other
    properties cannot pass by refusing every input)."""
    blob = json.dumps(value, allow_nan=False).encode()
    ok, back = parse(blob)
    has_long_int = any(
        isinstance(n, int) and not isinstance(n, bool) and len(str(abs(n))) > MAX_INT_DIGITS for n in walk(value)
    )
    assert ok != has_long_int, back
    if ok:
        assert back == value


# The keys reprocube asks for are its own constants (one line each); the object's keys are anything.
code_keys = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\n\r"), max_size=6)
ACCESSORS = st.one_of(
    st.tuples(st.just("integer"), st.integers(-(2**64), 2**64), st.integers(-(2**64), 2**64)),
    st.tuples(st.just("integer")),
    st.tuples(st.just("number")),
    st.tuples(st.just("text"), st.booleans()),
    st.tuples(st.just("boolean")),
    st.tuples(st.just("mapping")),
    st.tuples(st.just("records")),
    st.tuples(st.just("has")),
)


@fuzz_settings(400)
@given(raw_json_texts, st.lists(st.tuples(code_keys, ACCESSORS), min_size=1, max_size=6))
@example('{"n": true}', [("n", ("integer",)), ("n", ("number",))])
@example('{"t": null}', [("t", ("text", True)), ("t", ("text", False))])
def test_fields_accessors_return_the_checked_type_or_the_error(text, calls):
    ok, value = parse(text.encode("utf-8", "surrogatepass"))
    if not ok:
        return
    made, fields = expect_value_or_error(lambda: Fields(value, "fuzz.json", FuzzError), FuzzError)
    assert made == isinstance(value, dict)
    if not made:
        return
    keys = [k for k in value if "\n" not in k and "\r" not in k]
    for key, (name, *args) in calls:
        if keys and len(key) % 2:  # half the calls on a key the object holds
            key = keys[len(key) % len(keys)]
        ok, got = expect_value_or_error(functools.partial(getattr(fields, name), key, *args), FuzzError)
        raw = value.get(key)
        if name == "has":
            assert ok and got == (key in value)
        elif not ok:
            assert key in got  # the message names the key
        elif name == "integer":
            low, high = (args or (0, 2**63 - 1))[:2]
            assert type(got) is int and low <= got <= high and got == raw
        elif name == "number":
            assert type(got) is float and math.isfinite(got) and got == float(raw) and not isinstance(raw, bool)
        elif name == "text":
            assert got == raw and (isinstance(got, str) or (got is None and args[0]))
        elif name == "boolean":
            assert type(got) is bool and got is raw
        elif name == "mapping":
            assert isinstance(got, Fields) and got.value is raw and isinstance(raw, dict)
        elif name == "records":
            assert isinstance(raw, list) and [f.value for f in got] == raw
            assert all(isinstance(item, dict) for item in raw)


# --- (b) checkpoints: read_checkpoint + TrainState.from_checkpoint --------------------------------

STEPS_PER_EPOCH = 21  # the generated dataset: 650 examples, batch 32
TENSOR_FILES = ("weights.safetensors", "optimizer.safetensors", "rng.safetensors")


@pytest.fixture(scope="module")
def real_run(generated, tmp_path_factory):
    """One real PyTorch run of one epoch (a checkpoint the trainer itself wrote), read into memory."""
    cwd = tmp_path_factory.mktemp("fuzz-run")
    reprocube(
        "train", "framework=pytorch", *generated.overrides(), "epochs=1", "log.every_steps=5", "run_name=r", cwd=cwd
    )
    return cwd / "runs" / "r"


class Baseline(dict):
    """The real checkpoint's files and manifest (a short repr: Hypothesis prints its arguments)."""

    def __repr__(self) -> str:
        return "<the real epoch-0001 checkpoint>"


@pytest.fixture(scope="module")
def base(real_run):
    checkpoint = real_run / "checkpoints" / "epoch-0001"
    files = {name: (checkpoint / name).read_bytes() for name in FILE_NAMES}
    return Baseline(files=files, manifest=json.loads((checkpoint / MANIFEST).read_bytes()))


@pytest.fixture(scope="module")
def scratch(tmp_path_factory):
    return tmp_path_factory.mktemp("fuzz-checkpoints")


def split_safetensors(blob: bytes) -> tuple[bytes, bytes]:
    size = int.from_bytes(blob[:8], "little")
    return blob[8 : 8 + size], blob[8 + size :]


def join_safetensors(header: bytes, data: bytes) -> bytes:
    return len(header).to_bytes(8, "little") + header + data


def sha256(blob: bytes) -> str:
    return hashlib.sha256(blob).hexdigest()


def self_digest(manifest: dict) -> str:
    """manifest_self_digest, with room for the deeply nested values some examples put in."""
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(max(limit, 5_000))
    try:
        return manifest_self_digest(manifest)
    finally:
        sys.setrecursionlimit(limit)


def self_digest_of(text: str, depth: int) -> str:
    """The self digest of a manifest given as JSON text (nested `depth` deep somewhere); beyond what any
    reader parses (about the recursion limit) it does not matter, and is not computed."""
    if depth > sys.getrecursionlimit() + 100:
        return "0" * 64
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(max(limit, 5_000))
    try:
        return self_digest(json.loads(text))
    finally:
        sys.setrecursionlimit(limit)


def set_path(document, path: list, value, delete: bool = False):
    """Set (or delete) document[path...], creating mappings on the way; returns the new document."""
    if not path:
        return value
    if isinstance(document, list) and isinstance(path[0], int) and document:
        index = path[0] % len(document)
        document[index] = set_path(document[index], path[1:], value, delete)
        return document
    if not isinstance(document, dict):
        document = {}
    key = str(path[0])
    if delete and len(path) == 1:
        document.pop(key, None)
    else:
        document[key] = set_path(document.get(key), path[1:], value, delete)
    return document


TRACE_PATHS = [
    ["trace"],
    ["trace", "version"],
    ["trace", "every_steps"],
    ["trace", "first_step"],
    ["trace", "steps"],
    ["trace", "loss_f32_le_planes_deflate_base64"],
    ["trace", "tensor_names"],
    ["trace", "tensor_names", 0],
    ["trace", "boundaries"],
    ["trace", "boundaries", 0],
    ["trace", "boundaries", 0, 0],
    ["trace", "boundaries", 1, 1],
    ["trace", "boundaries", 1, 1, 0],
    ["trace", "fingerprint_first_step"],
    ["trace", "fingerprint_u32_le_base64"],
    ["trace", "tensor_fingerprint_steps"],
    ["trace", "tensor_fingerprint_u32_le_base64"],
]
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
DTYPE_SIZE = {"BF16": 2, "F8_E4M3": 1, "F8_E5M2": 1, "F8_E8M0": 1, "C64": 8}
NUMPY_DTYPES = ["float16", "float32", "float64", "int8", "int32", "int64", "uint8", "uint32", "uint64", "bool"]

state_values = st.one_of(json_values, st.sampled_from([0.0, 1.5, -1, 2**63, "0", [], {}, True, None]))
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


def mutate_header(blob: bytes, op) -> bytes:
    header_bytes, data = split_safetensors(blob)
    header = json.loads(header_bytes)
    names = sorted(k for k in header if k != "__metadata__")
    kind = op[0]
    if kind == "field":
        entry = header[names[op[1] % len(names)]]
        entry[op[2]] = op[3]
    elif kind == "entry":
        header[names[op[1] % len(names)]] = op[2]
    elif kind == "drop":
        del header[names[op[1] % len(names)]]
    elif kind == "rename":
        header[op[2]] = header.pop(names[op[1] % len(names)])
    elif kind == "metadata":
        header["__metadata__"] = op[1]
    elif kind == "raw":
        return join_safetensors(op[1].encode("utf-8", "surrogatepass"), data)
    elif kind == "length":
        return op[1].to_bytes(8, "little") + blob[8:]
    return join_safetensors(json.dumps(header).encode(), data)


def mutate_arrays(blob: bytes, op) -> bytes:
    """Consistent re-encodings: a valid safetensors file with other dtypes, shapes, names or values."""
    arrays = dict(load_safetensors(blob))
    names = sorted(arrays)
    kind = op[0]
    name = names[op[1] % len(names)] if kind != "add" else None
    if kind == "astype":
        arrays[name] = arrays[name].astype(op[2])
    elif kind == "reshape":
        array = arrays[name]
        arrays[name] = {
            "flat": array.reshape(-1),
            "transpose": array.T,
            "add-dim": array[None],
            "scalar": np.asarray(array.reshape(-1)[0] if array.size else 0, dtype=array.dtype),
        }[op[2]]
    elif kind == "slice":
        arrays[name] = arrays[name].reshape(-1)[: op[2]]
    elif kind == "poke":
        array = np.array(arrays[name])
        if array.size:
            flat = array.reshape(-1)
            try:
                flat[op[2] % flat.size] = op[3]
            except (ValueError, OverflowError):
                pass
        arrays[name] = array
    elif kind == "drop":
        del arrays[name]
    elif kind == "rename":
        arrays[op[2]] = arrays.pop(name)
    elif kind == "add":
        arrays[op[1]] = np.zeros(op[3], dtype=op[2])
    elif kind == "exotic":
        # safetensors dtypes NumPy cannot hold (BF16, F8, ...), with consistent offsets: rewrite the header
        header = json.loads(split_safetensors(blob)[0])
        entry = header[name]
        entry["dtype"] = op[2]
        size = math.prod(entry["shape"]) * DTYPE_SIZE[op[2]]
        # lay the tensors out again, this one with its new byte size
        data, chunks, offset = split_safetensors(blob)[1], [], 0
        for key in sorted((k for k in header if k != "__metadata__"), key=lambda k: header[k]["data_offsets"][0]):
            lo, hi = header[key]["data_offsets"]
            chunk = data[lo:hi] if key != name else (data[lo:hi] * 2)[:size]
            header[key]["data_offsets"] = [offset, offset + len(chunk)]
            chunks.append(chunk)
            offset += len(chunk)
        return join_safetensors(json.dumps(header).encode(), b"".join(chunks))
    return save_safetensors({k: np.ascontiguousarray(v) for k, v in arrays.items()})


def apply_content_op(files: dict[str, bytes], op) -> None:
    kind, name = op[0], op[1]
    if kind == "bytes":
        files[name] = apply_byte_op(files[name], op[2])
    elif kind == "replace":
        files[name] = op[2].encode("utf-8", "surrogatepass")
    elif kind == "state":
        try:
            state = json.loads(files["state.json"])
        except (ValueError, RecursionError):
            state = {}
        files["state.json"] = json.dumps(set_path(state, list(name), op[2], delete=op[3])).encode()
    else:
        try:
            with np.errstate(all="ignore"):  # casts of NaN to integers are wanted here
                files[name] = (mutate_header if kind == "header" else mutate_arrays)(files[name], op[2])
        except Exception:  # noqa: BLE001
            pass  # an earlier op left this file unusable for the test's own tools: keep it as it is


def build_checkpoint(base: dict, plan: dict, directory: Path) -> None:
    files = dict(base["files"])
    manifest = json.loads(json.dumps(base["manifest"]))
    for op in plan["content"]:
        apply_content_op(files, op)
    if plan["resign_files"]:  # what anyone can do: recompute every digest the manifest holds
        manifest["files"] = {name: sha256(blob) for name, blob in files.items()}
        manifest["file_bytes"] = {name: len(blob) for name, blob in files.items()}
        try:
            manifest["weights_digest"] = weights_digest(load_safetensors(files["weights.safetensors"]))
        except Exception:  # noqa: BLE001  (the test's own loader refused it: leave the old digest)
            pass
    deep, deep_depths = {}, []
    for op in plan["manifest"]:
        if op[0] == "set":
            manifest = set_path(manifest, list(op[1]), op[2])
        elif op[0] == "delete":
            manifest = set_path(manifest, list(op[1]), None, delete=True)
        else:
            marker = f"@deep{len(deep)}@"
            deep[marker] = nested(op[2], "list")
            deep_depths.append(op[2])
            manifest = set_path(manifest, list(op[1]), marker)
    if plan["resign_manifest"]:
        manifest.pop("manifest_sha256", None)
        manifest["manifest_sha256"] = self_digest_of(
            _with_deep(json.dumps(manifest), deep), max(deep_depths, default=0)
        )
    blob = _with_deep(json.dumps(manifest), deep).encode()
    for op in plan["manifest_bytes"]:
        blob = apply_byte_op(blob, op)
    files[MANIFEST] = blob
    directory.mkdir()
    for name, content in files.items():
        (directory / name).write_bytes(content)
    for kind, name in plan["layout"]:
        path = directory / name
        if kind == "extra":
            if not path.exists():
                path.write_bytes(b"{}")
            continue
        path.unlink(missing_ok=True)
        if kind == "directory":
            path.mkdir()
        elif kind == "symlink":
            target = directory.parent / f"{directory.name}-target"
            target.write_bytes(files[name])
            path.symlink_to(target)
        elif kind == "fifo":
            os.mkfifo(path)


def _with_deep(text: str, deep: dict[str, str]) -> str:
    for marker, value in deep.items():
        text = text.replace(json.dumps(marker), value)
    return text


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


# --- (c) metrics.jsonl -------------------------------------------------------------------------------

line_ops = st.one_of(
    st.tuples(st.just("bytes"), byte_ops),
    st.tuples(st.just("duplicate"), st.integers(0, 100)),
    st.tuples(st.just("delete"), st.integers(0, 100)),
    st.tuples(st.just("swap"), st.integers(0, 100), st.integers(0, 100)),
    st.tuples(st.just("insert"), st.integers(0, 100), raw_json_texts),
    st.tuples(
        st.just("field"),
        st.integers(0, 100),
        st.sampled_from(["kind", "epoch", "global_step", "loss", *DETERMINISTIC_EPOCH_FIELDS, "weights_digest"]),
        state_values,
    ),
    st.tuples(st.just("blank"), st.integers(0, 100), st.sampled_from(["", " ", "\t", "\r", "\x0c"])),
)


def mutate_lines(blob: bytes, op) -> bytes:
    if op[0] == "bytes":
        return apply_byte_op(blob, op[1])
    lines = blob.split(b"\n")
    if not lines:
        return blob
    i = op[1] % len(lines)
    if op[0] == "duplicate":
        lines.insert(i, lines[i])
    elif op[0] == "delete":
        del lines[i]
    elif op[0] == "swap":
        j = op[2] % len(lines)
        lines[i], lines[j] = lines[j], lines[i]
    elif op[0] == "insert":
        lines.insert(i, op[2].encode("utf-8", "surrogatepass"))
    elif op[0] == "field":
        try:
            record = json.loads(lines[i])
            record[op[2]] = op[3]
            lines[i] = json.dumps(record).encode()
        except (ValueError, TypeError, RecursionError):
            pass  # not an object the test can edit: leave the line as it is
    else:
        lines.insert(i, op[2].encode())
    return b"\n".join(lines)


class MetricsBlob(bytes):
    def __repr__(self) -> str:
        return "<the real run's metrics.jsonl>"


@pytest.fixture(scope="module")
def metrics_blob(real_run):
    return MetricsBlob((real_run / "metrics.jsonl").read_bytes())


def test_the_unmutated_metrics_read_back(real_run, metrics_blob):
    records = [json.loads(line) for line in metrics_blob.splitlines()]
    assert [r for r in records if r["kind"] == "epoch"] == read_epoch_records(real_run / "metrics.jsonl")
    assert len(records) == 5  # steps 5, 10, 15, 20 and the epoch


@fuzz_settings(300)
@given(st.lists(line_ops, min_size=1, max_size=4))
@example([("insert", 0, "[]")])
@example([("field", 4, "weights_digest", 7)])
def test_mutated_metrics_read_or_raise_the_error(metrics_blob, scratch, ops):
    blob = metrics_blob
    for op in ops:
        blob = mutate_lines(blob, op)
    path = scratch / f"metrics-{next(UNIQUE)}.jsonl"
    path.write_bytes(blob)
    try:
        ok, values = expect_value_or_error(lambda: list(iter_json_lines(path, FuzzError, 1 << 20)), FuzzError)
        if ok:
            assert [n for n, _ in values] == [n for n, line in enumerate(blob.split(b"\n"), 1) if line.strip()]
            for _, value in values:
                assert_strict_json(value)
        ok, epochs = expect_value_or_error(lambda: read_epoch_records(path, FuzzError), FuzzError)
        if ok:
            for record in epochs:
                assert type(record["epoch"]) is int and type(record["global_step"]) is int
                assert all(math.isfinite(record[k]) for k in DETERMINISTIC_EPOCH_FIELDS[2:])
                assert isinstance(record["weights_digest"], str)
    finally:
        path.unlink()


# --- receipts: read_receipt on re-hashed mutations (the checks behind its own sha256) -----------------

RECEIPT_PATHS = [
    ["format"],
    ["version"],
    ["reprocube"],
    ["config"],
    ["config", "framework"],
    ["config", "framework", "name"],
    ["config", "dataset", "files", "train_images", "sha256"],
    ["config", "seed"],
    ["config", "epochs"],
    ["config_hash"],
    ["env"],
    ["position"],
    ["position", "epoch"],
    ["position", "global_step"],
    ["complete"],
    ["epochs"],
    *[["epochs", 0, key] for key in (*DETERMINISTIC_EPOCH_FIELDS, "weights_digest")],
    ["checkpoints"],
    ["checkpoints", 0],
    *TRACE_PATHS,
]


@pytest.fixture(scope="module")
def receipt_document(real_run):
    return json.loads((real_run / "receipt.json").read_bytes())


def test_the_unmutated_receipt_reads_back(real_run):
    from reprocube.receipt import read_receipt

    receipt = read_receipt(real_run)
    assert receipt.global_step == receipt.trace.last_step == 21 and receipt.complete


@fuzz_settings(300)
@given(
    st.lists(
        st.one_of(
            st.tuples(st.just("set"), st.sampled_from(RECEIPT_PATHS), state_values),
            st.tuples(st.just("delete"), st.sampled_from(RECEIPT_PATHS)),
        ),
        min_size=1,
        max_size=3,
    ),
    st.booleans(),
)
def test_mutated_receipts_read_or_raise_the_error(receipt_document, scratch, ops, rehash):
    from reprocube.receipt import read_receipt
    from reprocube.receipt import self_digest as receipt_digest

    document = json.loads(json.dumps(receipt_document))
    for op in ops:
        document = set_path(document, op[1], op[2] if op[0] == "set" else None, delete=op[0] == "delete")
    if rehash and isinstance(document, dict):
        document["receipt_sha256"] = receipt_digest(document)  # as anyone can: the content checks are reached
    path = scratch / f"receipt-{next(UNIQUE)}.json"
    path.write_text(json.dumps(document))
    try:
        ok, receipt = expect_value_or_error(lambda: read_receipt(path, FuzzError), FuzzError)
        if ok:
            assert receipt.trace.last_step == receipt.global_step
            assert len(receipt.trace.losses) == receipt.trace.last_step - receipt.trace.first_step
    finally:
        path.unlink()


# --- (d) parse_yaml ------------------------------------------------------------------------------------

yaml_fragments = st.sampled_from(
    [
        "a: ",
        "b:",
        "- ",
        "? ",
        ": ",
        "\n",
        "\n  ",
        "  ",
        "[",
        "]",
        "{",
        "}",
        ",",
        "&x ",
        "*x",
        "!!int ",
        "!!float ",
        "!!bool ",
        "!!str ",
        "!!binary ",
        "!!timestamp ",
        "!!set ",
        "!!omap ",
        "!!python/object:os.system ",
        "!local ",
        "%YAML 1.1\n---\n",
        "---\n",
        "...\n",
        "2001-02-30",
        "2001-13-01",
        "2001-12-14t21:59:43.10-05:00",
        "0x",
        "0o8",
        "0b102",
        "1_000",
        "190:20:30",
        "1:2" + "0" * 4400,
        ".nan",
        "-.inf",
        "1e999",
        "yes",
        "maybe",
        "~",
        "null",
        "'",
        '"',
        '"\\x',
        "|",
        ">-",
        "#",
        "\t",
        "\ufeff",
        "\x85",
        "9" * 4400,
        "1",
        "abc",
    ]
)
yaml_texts = st.one_of(st.text(max_size=80), st.lists(yaml_fragments | st.text(max_size=3), max_size=10).map("".join))


@fuzz_settings(500)
@given(yaml_texts)
@example("a: 2001-02-30")  # a date the resolver matches but datetime refuses (ValueError)
@example("a: !!int abc")
@example("a: !!bool maybe")  # KeyError inside PyYAML's bool constructor
@example("a: " + "1" * 5000)  # more digits than int() converts (ValueError)
@example("a: &x 1\nb: *x")  # an alias: refused, not expanded
@example("a: !!timestamp x")  # AttributeError inside PyYAML's timestamp constructor
@example("!!int")  # IndexError inside PyYAML's int constructor
def test_parse_yaml_on_arbitrary_text(text):
    blob = text.encode("utf-8", "surrogatepass")
    ok, result = expect_value_or_error(lambda: parse_yaml(blob, "fuzz.yaml", ConfigError), ConfigError)
    if not ok:
        assert result.startswith("fuzz.yaml")


# --- end to end: mutated checkpoints through the CLI -------------------------------------------------

# (name, content ops, exit status of `compare` against the original run, of `train resume=PATH`).
# compare reads checkpoints but not their state: a re-signed state.json edit still compares equal (0), a
# re-signed change to the weights compares as different (6), anything read_checkpoint refuses leaves
# run B without a readable checkpoint (4).
E2E_CASES = [
    ("flipped-byte", [("bytes", "weights.safetensors", ("flip", 5000, 0x10))], False, 4, 4),
    ("dtype-not-a-string", [("header", "weights.safetensors", ("field", 0, "dtype", ["F32"]))], True, 4, 4),
    ("bf16", [("arrays", "weights.safetensors", ("exotic", 2, "BF16"))], True, 4, 4),
    ("nan-weight", [("arrays", "weights.safetensors", ("poke", 1, 7, np.nan))], True, 6, 4),
    ("transposed-weight", [("arrays", "weights.safetensors", ("reshape", 5, "transpose"))], True, 6, 4),
    ("loss-sum-text", [("state", ["epoch_totals", "loss_sum"], "1.0", False)], True, 0, 4),
    ("rng-int64", [("arrays", "rng.safetensors", ("astype", 1, "int64"))], True, 0, 4),
]


@pytest.fixture(scope="module")
def mutated_runs(base, real_run, tmp_path_factory):
    """Per case, a copy of the real run whose one checkpoint is mutated."""
    root = tmp_path_factory.mktemp("e2e")
    runs = {}
    for name, ops, resign, _, _ in E2E_CASES:
        run = root / name
        shutil.copytree(real_run, run)
        checkpoint = run / "checkpoints" / "epoch-0001"
        shutil.rmtree(checkpoint)
        plan = {"content": ops, "resign_files": resign, "manifest": [], "resign_manifest": resign}
        build_checkpoint(base, {**plan, "manifest_bytes": [], "layout": []}, checkpoint)
        runs[name] = run
    return runs


def assert_one_clean_error(proc, status):
    assert proc.returncode == status, proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr
    errors = [line for line in error_lines(proc) if not line.startswith("reprocube: warning:")]
    if status in (0, 6):
        assert errors == [], proc.stderr
    else:
        assert len(errors) == 1 and errors[0].startswith("reprocube: error: "), proc.stderr


@pytest.mark.parametrize("case", [c[0] for c in E2E_CASES])
def test_compare_on_a_mutated_checkpoint(real_run, mutated_runs, tmp_path, case):
    status = next(c[3] for c in E2E_CASES if c[0] == case)
    proc = reprocube(
        "compare", str(real_run), str(mutated_runs[case]), "--out", str(tmp_path), cwd=tmp_path, check=False
    )
    assert_one_clean_error(proc, status)
    # an unreadable checkpoint is named once, as a warning, before the error
    warnings = [line for line in error_lines(proc) if line.startswith("reprocube: warning:")]
    assert len(warnings) == (1 if status == 4 else 0), proc.stderr


@pytest.mark.parametrize("case", [c[0] for c in E2E_CASES])
def test_train_resume_from_a_mutated_checkpoint(generated, mutated_runs, tmp_path, case):
    status = next(c[4] for c in E2E_CASES if c[0] == case)
    checkpoint = mutated_runs[case] / "checkpoints" / "epoch-0001"
    proc = reprocube(
        "train",
        "framework=pytorch",
        *generated.overrides(),
        "epochs=2",
        "log.every_steps=5",
        f"resume={checkpoint}",
        "run_name=resumed",
        cwd=tmp_path,
        check=False,
    )
    assert_one_clean_error(proc, status)
    assert error_lines(proc) == [line for line in error_lines(proc) if line.startswith("reprocube: error: ")]
    assert not (tmp_path / "runs" / "resumed").exists()  # a refused resume leaves no run behind
