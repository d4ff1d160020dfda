"""Fuzzing of receipt.read_receipt on mutations of a real run's receipt.json, re-hashed (as anyone can: the
checks behind its own sha256 are reached) or not."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from reprocube.training.metrics import DETERMINISTIC_EPOCH_FIELDS

from fuzz_helpers import TRACE_PATHS, UNIQUE, FuzzError, expect_value_or_error, fuzz_settings, set_path, state_values

pytestmark = pytest.mark.process  # every test here starts a process: not in make test-quick

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
    from reprocube.training.receipt import read_receipt

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
    from reprocube.training.receipt import read_receipt
    from reprocube.training.receipt import self_digest as receipt_digest

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
