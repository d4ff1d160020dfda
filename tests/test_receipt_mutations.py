"""The property that no verdict says more than was compared, over the whole receipt: every leaf of a real
receipt of each framework changed (every number, string and boolean; numbers by one ULP or one unit),
every list's first and last element dropped and one added, and the trace's encoded losses and weight
fingerprints changed by one bit, with the hashes recomputed (tests/forge.py). Each mutated receipt, as
A, is judged by the analysis engine in-process against the genuine receipt as B (no training): it must
be refused by the reader or found to differ, never `bit-identical` or `losses-only`, unless the leaf is
declared not evidence in the receipt's schema (reprocube.training.receipt.NOT_EVIDENCE, with its reason). A changed
loss (a step's loss bits) may be found `losses-only`, which says exactly that: the trained model is
bit-identical and only the reported losses differ; never `bit-identical`.

The receipts are the committed reference receipts (tests/receipts/), made by reprocube itself."""

from __future__ import annotations

import copy
import json
import time
from pathlib import Path

import pytest

from forge import LOSS_KEY, losses, mutations, write_forged
from reprocube.analysis.receipt_comparison import compare_receipts
from reprocube.errors import CheckpointError
from reprocube.training.backend import FRAMEWORKS
from reprocube.training.receipt import RECEIPT, not_evidence, read_receipt

RECEIPTS = Path(__file__).parent / "receipts"


def reference_receipt(framework: str) -> Path:
    found = sorted(RECEIPTS.glob(f"*/{framework}/{RECEIPT}"))
    assert found, f"no committed reference receipt of {framework} under {RECEIPTS}"
    return found[0].parent


def judge(a: Path, b) -> str:
    try:
        return compare_receipts(read_receipt(a), b)["verdict"]
    except CheckpointError:
        return "refused"


def same_losses(a: dict, b: dict) -> bool:
    return losses(a).tobytes() == losses(b).tobytes()


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_no_mutation_of_a_receipt_passes_unless_its_leaf_is_not_evidence(framework, tmp_path):
    source = reference_receipt(framework)
    genuine = json.loads((source / RECEIPT).read_bytes())
    b = read_receipt(source)
    assert compare_receipts(read_receipt(source), b)["verdict"] == "bit-identical"  # the genuine pair
    started, judged, false_passes, exempt, losses_only = time.perf_counter(), 0, [], 0, 0
    for description, path, change in mutations(genuine):
        mutated = copy.deepcopy(genuine)
        change(mutated)
        keep = tuple(k for k in ("config_hash", "receipt_sha256") if path[:1] == (k,))
        verdict = judge(write_forged(mutated, tmp_path / "a", keep), b)
        judged += 1
        reason = not_evidence(path)
        if verdict != "refused" and path == ("trace", LOSS_KEY) and same_losses(mutated, genuine):
            reason = "deflate's padding bits past the stream's end: the text changed, not one loss bit"
        if reason is not None:
            exempt += 1
        elif verdict == "bit-identical" or verdict == "losses-only" and path != ("trace", LOSS_KEY):
            false_passes.append(f"{description}: {verdict}")
        elif path == ("trace", LOSS_KEY) and description.startswith("loss of step"):
            losses_only += verdict == "losses-only"
    seconds = time.perf_counter() - started
    print(f"{framework}: {judged} mutations ({exempt} of leaves declared not evidence) in {seconds:.1f} s")
    assert not false_passes, "\n".join(false_passes[:40])
    assert judged > 1000, judged
    assert losses_only == b.trace.last_step, "every changed loss bit with the same weights is losses-only"


def test_every_not_evidence_entry_names_its_reason():
    from reprocube.training.receipt import NOT_EVIDENCE

    assert all(isinstance(reason, str) and len(reason) > 20 for reason in NOT_EVIDENCE.values())
    assert not_evidence(("env", "cpu", "isa", 3)) and not_evidence(("config", "data_dir"))
    assert not_evidence(("config", "seed")) is None and not_evidence(("trace", "boundaries", 1, 1, 0)) is None


@pytest.mark.parametrize("run_name", [7, ["a"], {"a": 1}, True])
def test_a_run_name_that_is_not_text_is_refused_by_name(run_name, tmp_path):
    """config.run_name names the run in every result: a receipt's must be text (or null, or absent)."""
    genuine = json.loads((reference_receipt("pytorch") / RECEIPT).read_bytes())
    forged = copy.deepcopy(genuine)
    forged["config"]["run_name"] = run_name
    with pytest.raises(CheckpointError, match=r"config: run_name .*string"):
        read_receipt(write_forged(forged, tmp_path / "a"))
    for accepted in ({}, {"run_name": None}, {"run_name": "mine"}):
        forged = copy.deepcopy(genuine)
        forged["config"].pop("run_name", None)
        forged["config"].update(accepted)
        expected = accepted.get("run_name") or f"{forged['config']['framework']['name']}-seed{forged['config']['seed']}"
        assert read_receipt(write_forged(forged, tmp_path / "b")).run_name == expected
