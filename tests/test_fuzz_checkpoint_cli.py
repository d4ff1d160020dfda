"""End to end: a few mutated checkpoints through the CLI (compare against the original run, train
resume=PATH): the expected exit status, never a traceback, and at most one error line."""

from __future__ import annotations

import shutil

import numpy as np
import pytest

from fuzz_helpers import build_checkpoint
from helpers import error_lines, reprocube

pytestmark = pytest.mark.process  # every test here starts a process: not in make test-quick

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
