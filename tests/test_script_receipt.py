"""Receipts for scripts that are not ours (issue 36): `reprocube check` writes one for the uninterrupted run
(the command, its inputs and the files it names by sha256, the outputs' digests, the probe trace, the
environment), and `reprocube reproduce RECEIPT -- CMD` runs the command again and says whether, where
(first update, tensors) and why it differs. Real example scripts, real processes."""

from __future__ import annotations

import hashlib
import json
import shutil
import sys
from pathlib import Path

import pytest

from reprocube.errors import CheckpointError
from reprocube.script_receipt import _self_digest, read_script_receipt
from reprocube.signing import generate_key

from conftest import error_lines, reprocube

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
NUMPY = [sys.executable, str(EXAMPLES / "numpy_sgd.py"), "--epochs", "4", "--sleep", "0.1", "--save-rng"]
OUTPUTS = ["--output", "final.npz", "--output", "metrics.csv"]


@pytest.fixture(scope="module")
def numpy_receipt(tmp_path_factory) -> Path:
    """A check of the NumPy example (its script named by an absolute path) and the receipt it wrote."""
    where = tmp_path_factory.mktemp("numpy")
    reprocube("check", "--out", "chk", *OUTPUTS, "--seed-env", "SEED", "--at-line", "saved", "--", *NUMPY,
              cwd=where)  # fmt: skip
    return where / "chk" / "receipt"


def reproduce(tmp_path: Path, receipt: Path, *args: str, command=NUMPY, out: str = "rep", env_extra=None):
    proc = reprocube("reproduce", str(receipt), "--out", out, *args, "--", *command, cwd=tmp_path, check=False,
                     env_extra=env_extra)  # fmt: skip
    path = tmp_path / out / "script-reproduce.json"
    return proc, json.loads(path.read_text()) if path.exists() else {}


def test_the_receipt_records_the_command_its_source_outputs_and_trace(numpy_receipt):
    receipt = read_script_receipt(numpy_receipt)
    assert receipt.command == NUMPY
    script = hashlib.sha256((EXAMPLES / "numpy_sgd.py").read_bytes()).hexdigest()
    assert receipt.command_files == {1: script}  # the script named by its path; the interpreter is not a source
    assert set(receipt.outputs) == {"final.npz", "metrics.csv"} and receipt.seed == {"variable": "SEED", "value": "0"}
    assert receipt.trace == hashlib.sha256(receipt.trace_path.read_bytes()).hexdigest()
    assert receipt.env["cpu"]["isa"] and receipt.seconds > 0


def test_a_receipt_reproduces_here_bit_for_bit(numpy_receipt, tmp_path):
    proc, result = reproduce(tmp_path, numpy_receipt, env_extra={"SEED": "0"})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert result["verdict"] == "bit-identical" and result["not_checked"] == []
    assert (
        result["trace"]["compared_steps"] == result["trace"]["a_steps"] == 64 and not result["trace"]["missing_steps"]
    )
    assert result["outputs"]["compared"] == ["final.npz", "metrics.csv"] and result["outputs"]["differ"] == []
    assert "everything A's receipt records reproduced (64 updates of 64, 2 outputs)" in proc.stdout


def test_an_edited_script_differs_at_its_first_update_and_the_source_is_named(numpy_receipt, tmp_path):
    edited = tmp_path / "numpy_sgd.py"
    edited.write_text((EXAMPLES / "numpy_sgd.py").read_text().replace("np.float32(0.5)", "np.float32(0.5000001)"))
    proc, result = reproduce(tmp_path, numpy_receipt, command=[*NUMPY[:1], str(edited), *NUMPY[2:]])
    assert proc.returncode == 6, proc.stdout + proc.stderr
    first = result["trace"]["first_difference"]
    assert result["verdict"] == "differs" and first["step"] == 1 and first["tensors"] == ["w"]
    assert not result["command"]["same"] and result["inputs"]["differ"] == ["argument 1"]
    # The likeliest causes first: the command, the script's sha256, then the seed variable A's run had.
    assert [c["key"] for c in result["causes"][:3]] == ["command", "input argument 1", "seed variable SEED"]


def test_match_restores_a_pytorch_receipt_made_under_other_isa_caps(tmp_path):
    """A made under oneDNN, ATen and MKL ISA caps (another machine, emulated): B here differs at the first
    update, the caps are named as causes, and --match, setting them, reproduces A bit for bit."""
    caps = {"ONEDNN_MAX_CPU_ISA": "SSE41", "ATEN_CPU_CAPABILITY": "default", "MKL_ENABLE_INSTRUCTIONS": "SSE4_2"}
    shutil.copy(EXAMPLES / "pytorch_mlp.py", tmp_path / "pytorch_mlp.py")
    command = [sys.executable, "pytorch_mlp.py", "--save-rng", "--epochs", "2"]
    reprocube("check", "--out", "chk", "--copy", "pytorch_mlp.py", "--output", "model.pt", "--at-line", "saved",
              "--stops", "1", "--", *command, cwd=tmp_path, env_extra=caps)  # fmt: skip
    proc, result = reproduce(tmp_path, tmp_path / "chk" / "receipt", "--match", "--copy", "pytorch_mlp.py",
                             command=command)  # fmt: skip
    assert proc.returncode == 6, proc.stdout + proc.stderr
    assert result["trace"]["first_difference"]["step"] == 1 and result["inputs"]["differ"] == []
    assert {c["key"] for c in result["causes"]} >= {f"env.env_vars.{name}" for name in caps}
    assert result["match"]["bit_identical"] is True and result["match"]["settings"] == caps, result["match"]


def test_a_damaged_receipt_or_trace_is_one_line_and_exit_4(numpy_receipt, tmp_path):
    value = json.loads((numpy_receipt / "receipt.json").read_text())
    cases = {
        "edited": ({**value, "command": ["python", "other.py"]}, "was modified"),
        "unknown key": ({**value, "extra": 1}, "'extra' is not a key of a script receipt"),
        "path outside": ({**value, "outputs": {"../x": "0" * 64}}, "is not a path inside a work directory"),
        "seed": ({**value, "seed": {"variable": "LD_PRELOAD=x", "value": "0"}}, "seed must name a variable"),
    }
    for name, (changed, message) in cases.items():
        damaged = tmp_path / name.replace(" ", "-")
        shutil.copytree(numpy_receipt, damaged)
        if name != "edited":
            changed["receipt_sha256"] = _self_digest(changed)  # a careful forger's consistent edit
        (damaged / "receipt.json").write_text(json.dumps(changed))
        with pytest.raises(CheckpointError, match=message):
            read_script_receipt(damaged)
    traced = tmp_path / "trace-changed"
    shutil.copytree(numpy_receipt, traced)
    with open(traced / "trace.jsonl", "a") as stream:
        stream.write("\n")
    proc, _ = reproduce(tmp_path, traced, out="t")
    assert proc.returncode == 4 and "its sha256 is not the one its receipt records" in error_lines(proc)[-1]
    assert not (tmp_path / "t").exists()  # refused before anything was written


def test_a_script_receipt_refuses_a_run_receipts_options(numpy_receipt, tmp_path):
    proc, _ = reproduce(tmp_path, numpy_receipt, "--seeds", "2")
    assert proc.returncode == 2 and "--seeds is for a run's receipt" in error_lines(proc)[-1]


def test_a_signed_script_receipt_is_verified_before_anything_runs(numpy_receipt, tmp_path):
    signed = tmp_path / "signed"
    shutil.copytree(numpy_receipt, signed)
    reprocube("sign", str(signed / "receipt.json"), "--key", str(tmp_path / "a.pem"), "--new-key", cwd=tmp_path)
    generate_key(tmp_path / "other.pem")  # another key pair
    proc, _ = reproduce(tmp_path, signed, "--public-key", str(tmp_path / "other.pem.pub"), out="wrong")
    assert proc.returncode == 4 and "not by the given key" in error_lines(proc)[-1]
    assert not (tmp_path / "wrong").exists()
    proc, result = reproduce(tmp_path, signed, "--public-key", str(tmp_path / "a.pem.pub"), env_extra={"SEED": "0"})
    assert proc.returncode == 0 and result["verdict"] == "bit-identical", proc.stdout + proc.stderr
