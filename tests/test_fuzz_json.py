"""Fuzzing of reprocube.untrusted.parse_json and its Fields accessors: arbitrary and mutated bytes are read
(strict JSON) or refused with the caller's one-line error; what strict JSON writes reads back equal."""

from __future__ import annotations

import functools
import json
import math

from hypothesis import example, given
from hypothesis import strategies as st

from reprocube.untrusted import MAX_INT_DIGITS, Fields, parse_json

from fuzz_helpers import (
    FuzzError,
    apply_byte_op,
    assert_strict_json,
    byte_ops,
    expect_value_or_error,
    fuzz_settings,
    json_values,
    raw_json_texts,
    walk,
)


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
