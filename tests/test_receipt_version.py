"""The receipt's version: reprocube writes version 2 (every key required) and reads version 1 through one
upgrade (receipt._upgraded), in memory: each key a version-1 writer could leave out (sessions,
reprocube.source_files) as what its absence meant. The file's bytes, which a signature signs, stay as
they are. A version-2 receipt missing a key, or a version this reprocube does not know, is one line
naming it."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from forge import write_forged
from reprocube.analysis.receipt_comparison import compare_receipts
from reprocube.errors import CheckpointError
from reprocube.training.receipt import RECEIPT, RECEIPT_KEYS, RECEIPT_VERSION, SELF_DIGEST, read_receipt

RECEIPTS = Path(__file__).parent / "receipts"


@pytest.fixture(scope="module")
def written(real_run) -> dict:
    """A receipt as this reprocube writes it (a real run's)."""
    return json.loads((real_run / RECEIPT).read_bytes())


def as_version_1(receipt: dict) -> dict:
    """The receipt as a version-1 writer could have written it: without the keys version 1 may lack."""
    old = copy.deepcopy(receipt)
    old["version"] = 1
    del old["sessions"]
    del old["reprocube"]["source_files"]
    return old


@pytest.mark.process
def test_this_reprocube_writes_version_2_with_every_key(written):
    assert RECEIPT_VERSION == 2 and written["version"] == 2
    assert set(written) == RECEIPT_KEYS
    assert set(written["reprocube"]) == {"version", "source_sha256", "source_files"}


@pytest.mark.process
def test_a_version_1_receipt_reads_as_the_version_2_one(written, tmp_path):
    fresh = read_receipt(write_forged(written, tmp_path / "v2"))
    old_dir = write_forged(as_version_1(written), tmp_path / "v1")
    raw = (old_dir / RECEIPT).read_bytes()
    old = read_receipt(old_dir)
    assert (old_dir / RECEIPT).read_bytes() == raw == old.raw  # in memory only: the signed bytes stay
    assert json.loads(raw)["version"] == 1 and "sessions" not in json.loads(raw)
    # Equal to the version-2 receipt but for what version 1 could not say: its source files (null: not
    # recorded) and its own digest (of other bytes).
    expected = {**written, "reprocube": {**written["reprocube"], "source_files": None}}
    assert {k: v for k, v in old.value.items() if k != SELF_DIGEST} == {
        k: v for k, v in expected.items() if k != SELF_DIGEST
    }
    assert old.value["version"] == 2 and old.value["sessions"] == written["sessions"]
    assert (
        old.sessions == fresh.sessions and old.config == fresh.config and old.trace.last_step == fresh.trace.last_step
    )
    assert compare_receipts(old, fresh)["verdict"] == "bit-identical"


@pytest.mark.process
def test_a_version_1_receipt_with_its_source_files_keeps_them(written, tmp_path):
    old_value = as_version_1(written)
    old_value["reprocube"]["source_files"] = written["reprocube"]["source_files"]
    old = read_receipt(write_forged(old_value, tmp_path / "v1"))
    assert old.value["reprocube"] == written["reprocube"]


@pytest.mark.process
@pytest.mark.parametrize("key", sorted(RECEIPT_KEYS - {"format", "version", SELF_DIGEST}))
def test_a_version_2_receipt_missing_a_key_is_refused_naming_it(written, tmp_path, key):
    value = copy.deepcopy(written)
    del value[key]
    keep = ("config_hash",) if key in ("config", "config_hash") else ()
    with pytest.raises(CheckpointError, match=rf"receipt.json: {key} is missing$") as caught:
        read_receipt(write_forged(value, tmp_path / "v2", keep))
    assert "\n" not in str(caught.value)


@pytest.mark.process
@pytest.mark.parametrize("key", ["version", "source_sha256", "source_files"])
def test_a_version_2_receipt_missing_a_key_of_reprocube_is_refused_naming_it(written, tmp_path, key):
    value = copy.deepcopy(written)
    del value["reprocube"][key]
    with pytest.raises(CheckpointError, match=rf"receipt.json: reprocube: {key} is missing$"):
        read_receipt(write_forged(value, tmp_path / "v2"))


@pytest.mark.process
@pytest.mark.parametrize("version", [0, 3, 10])
def test_a_version_this_reprocube_does_not_know_is_refused(written, tmp_path, version):
    value = {**written, "version": version}
    with pytest.raises(CheckpointError, match=rf"receipt version {version} is not one this reprocube reads \(1, 2\)"):
        read_receipt(write_forged(value, tmp_path / "v"))


@pytest.mark.process
def test_a_version_1_receipt_with_null_sessions_is_refused(written, tmp_path):
    """Version 1 wrote a list of sessions or none: a null is no receipt any reprocube wrote."""
    value = {**as_version_1(written), "sessions": None}
    with pytest.raises(CheckpointError, match="sessions must be a list"):
        read_receipt(write_forged(value, tmp_path / "v1"))


def test_the_committed_version_1_receipts_read_as_version_2():
    found = sorted(RECEIPTS.glob(f"*/*/{RECEIPT}"))
    assert found
    for path in found:
        raw = path.read_bytes()
        receipt = read_receipt(path.parent)
        assert json.loads(raw)["version"] == 1 and receipt.value["version"] == 2
        assert path.read_bytes() == raw == receipt.raw
