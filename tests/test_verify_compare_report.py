"""verify, compare and report: verdicts that can fail, on generated data, in fresh processes."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from reprocube.commands.reproduce import reproduce
from reprocube.training.backend import FRAMEWORKS

from helpers import error_lines, reprocube

SMALL = ["epochs=3", "log.every_steps=5"]


@pytest.mark.process
def test_verify_all_frameworks_passes(generated, tmp_path):
    proc = reprocube(
        "verify", "framework=all", *generated.overrides(), *SMALL, "verify.mid_epoch=true", cwd=tmp_path, timeout=900
    )
    assert "verdict: all bit-identical" in proc.stdout
    for framework in FRAMEWORKS:
        base = tmp_path / "runs" / f"verify-{framework}"
        result = json.loads((base / "reference" / "verify.json").read_text())
        assert result["passed"] is True and result["mode"] == "linear"
        checks = {c["name"]: c for c in result["checks"]}
        # One link per epoch (21 steps each), each a fresh process from the reference's previous checkpoint.
        assert sorted(checks) == ["control-other-seed", "link-epoch-1", "link-epoch-2", "link-epoch-3", "reference"]
        for epoch in (1, 2, 3):
            link = checks[f"link-epoch-{epoch}"]
            assert link["detail"]["identical"] and link["detail"]["compared_checkpoints"] == [f"epoch-{epoch:04d}"]
        assert checks["control-other-seed"]["detail"]["first_differing_step"] == 1
        # The SIGTERM link: stopped in the middle of epoch 2 (step 31), resumed from its own step checkpoint.
        assert "stopped by SIGTERM at step 31" in checks["link-epoch-2"]["check"]
        assert (base / "link-epoch-2" / "checkpoints" / "step-000031").is_dir()
        assert not (base / "link-epoch-2" / "checkpoints" / "epoch-0003").exists()  # a link stops at its epoch
        processes = {p["name"]: p["statuses"] for p in result["processes"]}
        # The control's stop falls on the run's last step (63 < 100 steps): it ends the run there, exit 0.
        assert processes["link-epoch-2"] == [75, 0] and processes["control-other-seed"] == [0]
        assert (base / "reference" / "verify.md").read_text().startswith(f"# reprocube verify: {framework}")
        assert "by induction" in (base / "reference" / "verify.md").read_text()
        if (
            framework == "jax"
        ):  # the resumes load the compiled steps from verify's cache; the fresh process compiles anew
            caches = {
                run: json.loads((base / run / "env.json").read_text())["framework"]["compilation_cache"]
                for run in ("link-epoch-1", "link-epoch-3")
            }
            assert caches == {"link-epoch-1": "off", "link-epoch-3": "on"}
            assert any(entry.iterdir() for entry in (base / "jax-cache").iterdir())  # its cpu-<machine> directory


SITECUSTOMIZE = """
import os, sys
if (
    os.environ.get("REPROCUBE_TEST_PERTURB_RESUME")
    and "resume=" in " ".join(sys.argv)
    and "resume=latest" not in sys.argv
):
    import torch
    torch.set_rng_state = lambda state: None  # a resumed run keeps its freshly seeded dropout generator
"""


@pytest.mark.process
@pytest.mark.parametrize("mode", ["linear", "full"])
def test_verify_names_the_first_divergence_of_a_perturbed_resume(mode, generated, tmp_path, monkeypatch):
    hook = tmp_path / "hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(SITECUSTOMIZE)
    monkeypatch.setenv("PYTHONPATH", f"{hook}")
    monkeypatch.setenv("REPROCUBE_TEST_PERTURB_RESUME", "1")
    args = [*generated.overrides(), *SMALL, "verify.mid_epoch=false", f"verify.full={str(mode == 'full').lower()}"]
    proc = reprocube("verify", "framework=pytorch", *args, cwd=tmp_path, check=False, timeout=600)
    assert proc.returncode == 6, proc.stdout + proc.stderr
    result = json.loads((tmp_path / "runs" / "verify-pytorch" / "reference" / "verify.json").read_text())
    checks = {c["name"]: c for c in result["checks"]}
    # The perturbation touches resumes only: the fresh process from scratch still agrees.
    fresh, resumed = ("link-epoch-1", "link-epoch-2") if mode == "linear" else ("restart", "resume-epoch-1")
    assert checks[fresh]["passed"] and not checks[resumed]["passed"]
    first = checks[resumed]["detail"]["first_difference"]
    assert first["checkpoint"] == "epoch-0002" and first["max_ulp"] > 0
    assert f"differs from epoch-0002: {first['tensor']}" in proc.stdout and "<-- FAIL" in proc.stdout
    if mode == "linear":
        assert "RNG state" in checks[resumed]["detail"]["state_differences"]


@pytest.mark.process
def test_verify_jobs_do_not_change_the_result(generated, tmp_path):
    """Two checks at once (here the reference and the links overlap) leave the same bits as one at a time."""
    digests = {}
    for jobs in (1, 2):
        cwd = tmp_path / f"jobs{jobs}"
        cwd.mkdir()
        proc = reprocube("verify", "framework=pytorch", *generated.overrides(), *SMALL, f"verify.jobs={jobs}", cwd=cwd)
        assert "verdict: all bit-identical" in proc.stdout
        base = cwd / "runs" / "verify-pytorch"
        result = json.loads((base / "reference" / "verify.json").read_text())
        assert result["jobs"] == jobs
        digests[jobs] = {
            (run.name, checkpoint.name): json.loads((checkpoint / "manifest.json").read_text())["weights_digest"]
            for run in base.iterdir()
            if (run / "checkpoints").is_dir()
            for checkpoint in (run / "checkpoints").iterdir()
        }
        digests[jobs]["summaries"] = [(c["name"], c["passed"], c["summary"]) for c in result["checks"]]
    assert digests[1] == digests[2]
    assert len(digests[1]) > 6  # reference 3 + links 3 + step checkpoints


@pytest.mark.process
def test_verify_refuses_a_sigterm_step_past_the_run(generated, tmp_path):
    proc = reprocube(
        "verify",
        "framework=pytorch",
        *generated.overrides(),
        *SMALL,
        "verify.mid_epoch_step=63",
        cwd=tmp_path,
        check=False,
    )
    assert proc.returncode == 2
    assert error_lines(proc) == [
        "reprocube: error: verify.mid_epoch_step=63 is not before the run's last step (63); choose an earlier step"
    ]
    assert not (tmp_path / "runs" / "verify-pytorch" / "reference").exists()


@pytest.fixture(scope="module")
def runs(generated, tmp_path_factory):
    cwd = tmp_path_factory.mktemp("compare")
    for name, extra in (("a", []), ("b", []), ("threads1", ["threads=1"])):
        reprocube("train", *generated.overrides(), "epochs=2", f"run_name={name}", *extra, cwd=cwd)
    return cwd / "runs"


@pytest.mark.process
def test_compare_identical_runs(runs, tmp_path):
    proc = reprocube("compare", str(runs / "a"), str(runs / "b"), "--out", str(tmp_path), cwd=tmp_path)
    assert "identical (2 checkpoints)" in proc.stdout
    result = json.loads((tmp_path / "compare.json").read_text())
    assert result["identical"] and result["first_difference"] is None
    assert (tmp_path / "compare.md").exists()
    # The result binds what it read of each run: every checkpoint by its manifest's own digest, the records
    # and the environment by their bytes' (issue 35).
    for name, run in (("a", runs / "a"), ("b", runs / "b")):
        inputs = result["inputs"][name]
        assert inputs["checkpoints"] == {
            c.name: json.loads((c / "manifest.json").read_text())["manifest_sha256"]
            for c in sorted((run / "checkpoints").iterdir())
        }
        assert inputs["metrics.jsonl"] == hashlib.sha256((run / "metrics.jsonl").read_bytes()).hexdigest()
        assert inputs["env.json"] == hashlib.sha256((run / "env.json").read_bytes()).hexdigest()


@pytest.mark.process
def test_compare_different_thread_counts_names_the_env_difference(runs, tmp_path):
    proc = reprocube(
        "compare", str(runs / "a"), str(runs / "threads1"), "--out", str(tmp_path), cwd=tmp_path, check=False
    )
    assert proc.returncode == 6
    result = json.loads((tmp_path / "compare.json").read_text())
    assert not result["identical"] and result["first_difference"]["checkpoint"] == "epoch-0001"
    assert result["env_differences"][0]["key"] == "framework.num_threads"  # the likeliest cause comes first
    assert "env framework.num_threads: 2 -> 1" in proc.stdout


@pytest.mark.process
def test_compare_of_two_receipts_names_the_first_update_and_cause_as_reproduce_does(runs, generated, tmp_path):
    """Issue 39: two published receipts (no checkpoints) compared from their traces: the first differing
    update, its tensors and the likeliest cause, no training; the same answer reproduce gives by training
    B again. Run directories that hold receipts get it beside the checkpoint comparison."""
    published = tmp_path / "published"
    published.mkdir()
    for name in ("a", "threads1"):
        shutil.copy(runs / name / "receipt.json", published / f"{name}.json")
    proc = reprocube(
        "compare", str(published / "a.json"), str(published / "threads1.json"), "--out", "c", cwd=tmp_path, check=False
    )
    assert proc.returncode == 6, proc.stdout + proc.stderr
    receipts = json.loads((tmp_path / "c" / "compare.json").read_text())["receipts"]
    assert receipts["verdict"] == "differs" and receipts["first_divergence"]["first_weight_step"] == 1
    assert receipts["causes"][0]["key"] == "config.threads", receipts["causes"][:3]
    assert "(their receipts' traces, no checkpoints): differs from global step 1" in proc.stdout
    # reproduce, training B with threads=1, names the same first update, tensors and cause.
    reproduced = reproduce(
        published / "a.json",
        tmp_path / "r",
        [f"data_dir={generated.data_dir}", "threads=1"],
        allow_config_change=True,
        echo=lambda line: None,
    )
    for key in ("step", "first_weight_step", "weight_tensors"):
        assert reproduced["first_divergence"][key] == receipts["first_divergence"][key], key
    assert reproduced["causes"][0]["key"] == receipts["causes"][0]["key"]
    # Two run directories: the checkpoints as before, and their receipts' answer beside.
    proc = reprocube("compare", str(runs / "a"), str(runs / "threads1"), "--out", "d", cwd=tmp_path, check=False)
    result = json.loads((tmp_path / "d" / "compare.json").read_text())
    assert result["receipts"]["first_divergence"] == receipts["first_divergence"]
    assert (
        result["inputs"]["a"]["receipt.json"] == hashlib.sha256((runs / "a" / "receipt.json").read_bytes()).hexdigest()
    )
    assert "from their receipts' traces: differs from global step 1" in proc.stdout
    same = reprocube("compare", str(published / "a.json"), str(runs / "a"), "--out", "e", cwd=tmp_path, check=False)
    assert same.returncode == 0 and "bit-identical" in same.stdout, same.stdout + same.stderr


@pytest.mark.process
def test_compare_refuses_a_tampered_run_in_one_line(runs, tmp_path):
    tampered = tmp_path / "tampered"
    shutil.copytree(runs / "a", tampered)
    weights = tampered / "checkpoints" / "epoch-0002" / "weights.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 1
    weights.write_bytes(bytes(data))
    proc = reprocube("compare", str(runs / "a"), str(tampered), cwd=tmp_path, check=False)
    assert proc.returncode == 6  # the tampered checkpoint is named and left out: not verified
    [warning] = error_lines(proc)
    assert warning.startswith("reprocube: warning:") and "weights.safetensors does not match its sha256" in warning
    assert "not verified: unreadable checkpoints B:epoch-0002" in proc.stdout
    proc = reprocube("compare", str(runs / "a"), str(tmp_path / "nothing"), cwd=tmp_path, check=False)
    assert proc.returncode == 4 and "is not a reprocube run directory" in proc.stderr


@pytest.mark.process
def test_report_has_its_plots(runs, tmp_path):
    reprocube(
        "report",
        str(runs / "a"),
        str(runs / "b"),
        str(runs / "threads1"),
        "--out",
        str(tmp_path / "report"),
        cwd=tmp_path,
    )
    page = (tmp_path / "report" / "report.html").read_text()
    assert page.startswith("<!doctype html>") and page.rstrip().endswith("</html>")
    assert page.count("data:image/png;base64,") == 2 and "framework.num_threads" in page
    for name in ("curves.png", "divergence.png"):
        png = (tmp_path / "report" / name).read_bytes()
        assert png.startswith(b"\x89PNG\r\n\x1a\n") and len(png) > 10_000


@pytest.mark.process
@pytest.mark.parametrize(
    "breakage, message",
    [
        (lambda run: (run / "metrics.jsonl").write_text("{not json\n"), "metrics.jsonl:1 is not valid JSON"),
        (
            lambda run: (run / "metrics.jsonl").write_text('{"kind": "epoch", "epoch": 1}\n'),
            "metrics.jsonl:1: global_step must be an integer",
        ),
        (lambda run: (run / "env.json").write_text("[1,"), "env.json is not valid JSON"),
        (lambda run: shutil.rmtree(run / "checkpoints"), "is not a reprocube run directory"),
    ],
)
def test_a_malformed_run_directory_is_a_clear_error(runs, tmp_path, breakage, message):
    from reprocube.analysis.run_comparison import load_run
    from reprocube.errors import CheckpointError

    broken = tmp_path / "broken"
    shutil.copytree(runs / "a", broken)
    breakage(broken)
    with pytest.raises(CheckpointError, match=message):
        load_run(broken)


@pytest.mark.process
def test_a_checkpoint_without_its_manifest_is_named_and_left_out(runs, tmp_path, capsys):
    from reprocube.analysis.run_comparison import load_run

    broken = tmp_path / "broken"
    shutil.copytree(runs / "a", broken)
    (broken / "checkpoints" / "epoch-0001" / "manifest.json").unlink()
    loaded = load_run(broken)
    assert sorted(loaded["checkpoints"]) == ["epoch-0002"] and list(loaded["unreadable"]) == ["epoch-0001"]
    assert "manifest.json is missing; left out of the comparison" in capsys.readouterr().err


@pytest.mark.process
def test_compare_with_an_explicit_tolerance_passes_and_says_so(runs):
    from reprocube.analysis.run_comparison import compare_runs, load_run
    from reprocube.results.compare_result import summary_line

    result = compare_runs(load_run(runs / "a"), load_run(runs / "threads1"), tolerance=1.0)
    assert result["passed"] and not result["identical"]
    assert summary_line(result).endswith("(within tolerance)")
    assert not compare_runs(load_run(runs / "a"), load_run(runs / "threads1"), tolerance=1e-12)["passed"]


def tree_digest(root: Path) -> dict[str, str]:
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


@pytest.mark.process
def test_verify_reuses_a_completed_run_and_never_writes_into_it(generated, runs, tmp_path):
    before = tree_digest(runs / "a")
    args = [*generated.overrides(), "epochs=2"]
    proc = reprocube("verify", "framework=pytorch", *args, f"run={runs / 'a'}", cwd=tmp_path)
    assert "verdict: all bit-identical" in proc.stdout
    assert not (tmp_path / "runs" / "verify-pytorch" / "reference").exists()  # not retrained
    assert json.loads((tmp_path / "runs" / "verify-pytorch" / "verify.json").read_text())["passed"] is True
    assert tree_digest(runs / "a") == before  # someone's published run: read, never written


@pytest.mark.process
def test_compare_of_a_run_that_stopped_early_is_not_identical(generated, runs, tmp_path):
    reprocube("train", *generated.overrides(), "epochs=1", "run_name=short", cwd=tmp_path)
    before = tree_digest(runs / "a")
    proc = reprocube("compare", str(runs / "a"), str(tmp_path / "runs" / "short"), cwd=tmp_path, check=False)
    assert proc.returncode == 6
    assert "not identical: B lacks epoch-0002" in proc.stdout
    assert (tmp_path / "compare-a-vs-short" / "compare.json").exists()  # a new directory by default
    assert tree_digest(runs / "a") == before


@pytest.mark.process
def test_compare_names_a_config_difference_before_the_environment(runs, tmp_path):
    proc = reprocube(
        "compare", str(runs / "a"), str(runs / "threads1"), "--out", str(tmp_path), cwd=tmp_path, check=False
    )
    result = json.loads((tmp_path / "compare.json").read_text())
    assert result["config_differences"] == [{"key": "threads", "a": "2", "b": "1"}]
    lines = proc.stdout.splitlines()
    config_line = next(i for i, line in enumerate(lines) if line.strip().startswith("config threads: 2 -> 1"))
    assert all(i > config_line for i, line in enumerate(lines) if line.strip().startswith("env "))
    overall = max(t.get("max_abs", 0) for c in result["checkpoints"] for t in c["tensors"])
    assert result["max_abs"] == overall > 0


def test_ulp_statistics_of_bfloat16_and_float8_count_adjacent_values_as_one_ulp():
    """Round 7's F10: ml_dtypes' floats (NumPy kind "V") were taken as integers, truncated: adjacent bfloat16
    values were 'max 0 ULP' apart."""
    import ml_dtypes

    from reprocube.analysis.tensors import ulp_statistics

    for dtype, step in ((ml_dtypes.bfloat16, 2**-7), (ml_dtypes.float8_e4m3fn, 2**-3)):
        a, b = np.array([0.0, 1.0], dtype), np.array([0.0, 1.0 + step], dtype)
        assert ulp_statistics(a, b)["max_ulp"] == 1, dtype


def test_ulp_statistics_count_sign_flips_apart():
    from reprocube.analysis.tensors import ulp_statistics

    a = np.array([1.0, 2.0, 1e-30, 5.0], np.float32)
    b = np.array([1.0, np.nextafter(np.float32(2.0), np.float32(3.0)), -1e-30, 5.0], np.float32)
    stats = ulp_statistics(a, b)
    assert (stats["values_differing"], stats["sign_flips"], stats["max_ulp"]) == (2, 1, 1)


def test_env_records_numerics_variables_by_name_and_ranks_them_before_irrelevant_ones(monkeypatch):
    from reprocube.formats.env import collect_env
    from reprocube.formats.env_comparison import env_differences

    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "SSE41")
    monkeypatch.setenv("TF_CLI_CONFIG_FILE", "/terraform.rc")  # Terraform's, not TensorFlow's
    recorded = collect_env({})["env_vars"]
    assert recorded["ONEDNN_MAX_CPU_ISA"] == "SSE41" and "TF_CLI_CONFIG_FILE" not in recorded
    a = {"env_vars": {"PYTHONHASHSEED": "0"}}
    b = {"env_vars": {"PYTHONHASHSEED": "1", "ONEDNN_MAX_CPU_ISA": "SSE41"}}
    ranked = env_differences(a, b)
    assert [r["key"] for r in ranked] == ["env_vars.ONEDNN_MAX_CPU_ISA", "env_vars.PYTHONHASHSEED"]
    assert "seeded explicitly" in ranked[-1]["not_a_cause"]


@pytest.mark.process
def test_verify_never_reuses_an_earlier_verify_directory(generated, tmp_path):
    earlier = tmp_path / "runs" / "verify-pytorch" / "reference"
    earlier.mkdir(parents=True)
    proc = reprocube("verify", "framework=pytorch", *generated.overrides(), cwd=tmp_path, check=False)
    assert proc.returncode == 2
    assert error_lines(proc) == [
        "reprocube: error: runs/verify-pytorch holds an earlier verify's runs; remove it or choose another output_dir="
    ]
