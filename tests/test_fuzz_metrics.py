"""Fuzzing of a run's metrics.jsonl readers, untrusted.iter_json_lines and metrics.read_epoch_records, on
line and byte mutations of a real run's metrics."""

from __future__ import annotations

import json
import math

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from reprocube.training.metrics import DETERMINISTIC_EPOCH_FIELDS, read_epoch_records
from reprocube.untrusted import iter_json_lines

from fuzz_helpers import (
    UNIQUE,
    FuzzError,
    apply_byte_op,
    assert_strict_json,
    byte_ops,
    expect_value_or_error,
    fuzz_settings,
    raw_json_texts,
    state_values,
)

pytestmark = pytest.mark.process  # every test here starts a process: not in make test-quick

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
