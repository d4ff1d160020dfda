"""Shared by the tests/test_fuzz_*.py suites: property-based fuzzing (Hypothesis) of the readers of
untrusted files, in-process. The contract under test is the one untrusted.py states: whatever the bytes, a
reader returns a value or raises the caller's ReprocubeError (one line), never another exception, and
quickly. Checkpoints are mutated both naively (the sha256s then refuse them) and RE-SIGNED (every sha256 in
the manifest, the weights_digest and manifest_sha256 recomputed, as anyone can), so that the content checks
behind the digests are reached too.

The suites, one per reader: test_fuzz_json.py (reprocube.untrusted parse_json, Fields), test_fuzz_checkpoint.py
(checkpoint.read_checkpoint followed by TrainState.from_checkpoint), test_fuzz_metrics.py (iter_json_lines,
metrics.read_epoch_records), test_fuzz_receipt.py (receipt.read_receipt), test_fuzz_yaml.py (parse_yaml) and
test_fuzz_checkpoint_cli.py (a few mutated checkpoints through the CLI, compare and train resume=PATH, end to
end).

Examples are derandomized (the same ones each run: a failure reproduces); REPROCUBE_FUZZ_EXAMPLES=N
runs N times as many.

Here: the settings, error class and checks of every suite, the JSON and byte strategies and the builder of
mutated checkpoints; the real run and checkpoint they mutate are conftest.py's fixtures (real_run, base,
scratch), one run for every suite."""

from __future__ import annotations

import hashlib
import itertools
import json
import math
import os
import sys
from pathlib import Path

import numpy as np
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from safetensors.numpy import load as load_safetensors
from safetensors.numpy import save as save_safetensors

from reprocube.errors import ReprocubeError
from reprocube.training.checkpoint import MANIFEST, manifest_self_digest, weights_digest
from reprocube.untrusted import MAX_INT_DIGITS

SCALE = int(os.environ.get("REPROCUBE_FUZZ_EXAMPLES", "1"))
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


# --- checkpoints: the real run, its checkpoint, and mutated copies of it ------------------------------------


class Baseline(dict):
    """The real checkpoint's files and manifest (a short repr: Hypothesis prints its arguments)."""

    def __repr__(self) -> str:
        return "<the real epoch-0001 checkpoint>"


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
DTYPE_SIZE = {"BF16": 2, "F8_E4M3": 1, "F8_E5M2": 1, "F8_E8M0": 1, "C64": 8}
state_values = st.one_of(json_values, st.sampled_from([0.0, 1.5, -1, 2**63, "0", [], {}, True, None]))


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
        except Exception:
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
        except Exception:  # the test's own loader refused it: leave the old digest
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
