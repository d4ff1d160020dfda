"""scripts/gpu-check.sh, run as on a GPU host but with --device cpu on the small generated dataset, so that
the script cannot rot between the GPU machines it is meant for: every check runs and passes, the
results and the CPU receipt are written, and a setting known not to resume exactly makes it fail."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from reprocube.training.receipt import read_receipt

pytestmark = pytest.mark.process  # every test here starts a process: not in make test-quick

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "gpu-check.sh"


def run_script(tmp_path: Path, generated, *args: str, data_dir: Path | None = None) -> subprocess.CompletedProcess:
    overrides = [f"data_dir={data_dir}" if data_dir and o.startswith("data_dir=") else o for o in generated.overrides()]
    return subprocess.run(
        [
            str(SCRIPT),
            "--device",
            "cpu",
            "--frameworks",
            "pytorch",
            "--out",
            str(tmp_path / "out"),
            *args,
            *overrides,
            "log.every_steps=5",
        ],
        capture_output=True,
        text=True,
        timeout=900,
        cwd=tmp_path,
    )


def test_the_gpu_check_runs_every_check_on_the_cpu_and_passes(generated, tmp_path):
    proc = run_script(tmp_path, generated, "--bench-repeats", "1")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    results = json.loads((tmp_path / "out" / "gpu-check.json").read_text())
    pytorch = results["frameworks"]["pytorch"]
    assert [c["check"] for c in pytorch["checks"]] == [
        "restart",
        "resume-epoch",
        "resume-sigterm",
        "verify",
        "fingerprint",
        "reproduce",
    ]
    assert all(c["passed"] for c in pytorch["checks"]) and results["passed"] is True
    assert pytorch["framework_env"]["device"] == "cpu" and pytorch["final_weights_digest"]
    assert isinstance(pytorch["without_determinism"]["identical"], bool)
    assert {batch: figures["status"] for batch, figures in pytorch["bench"].items()} == {"32": 0, "64": 0}
    receipt = read_receipt(tmp_path / "out" / "cpu-receipt" / "receipt.json")
    assert receipt.config["device"] == "cpu" and receipt.complete
    text = (tmp_path / "out" / "gpu-check.md").read_text()
    assert "Verdict: **passed**" in text and "| resume-sigterm | yes |" in text


def test_the_gpu_check_fails_when_a_resume_is_not_exact(generated, tmp_path):
    """data.augment_rng=stateful (the known negative control) resumes differently: exit 1, named."""
    proc = run_script(
        tmp_path,
        generated,
        "--no-bench",
        "--checks",
        "resume-epoch,resume-sigterm",
        "data.pipeline=loader",
        "data.augment=true",
        "data.augment_rng=stateful",
        "data.workers=1",
    )
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-2000:]
    results = json.loads((tmp_path / "out" / "gpu-check.json").read_text())
    checks = results["frameworks"]["pytorch"]["checks"]
    assert [c["check"] for c in checks] == ["resume-epoch", "resume-sigterm"]  # only those asked for
    failed = [c["check"] for c in checks if not c["passed"]]
    assert "resume-sigterm" in failed or "resume-epoch" in failed, results["frameworks"]["pytorch"]["checks"]
    assert "Verdict: **FAILED**" in (tmp_path / "out" / "gpu-check.md").read_text()


def test_the_gpu_check_refuses_an_out_directory_that_holds_something(generated, tmp_path):
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "mine.txt").write_text("not the script's")
    proc = run_script(tmp_path, generated)
    assert proc.returncode == 2 and "must be a new or empty directory" in proc.stderr
    assert (tmp_path / "out" / "mine.txt").read_text() == "not the script's"


def test_a_failed_training_is_reported_with_its_reason(generated, tmp_path):
    """A GPU host's first run failed on Fashion-MNIST still gzipped, and the results said only "training
    failed": each failed check now carries the training's exit status and its own last line."""
    still_gzipped = tmp_path / "gz"
    generated.write_gz(still_gzipped / "generated")
    proc = run_script(tmp_path, generated, "--no-bench", "--checks", "restart", data_dir=still_gzipped)
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-2000:]
    results = json.loads((tmp_path / "out" / "gpu-check.json").read_text())
    restart = results["frameworks"]["pytorch"]["checks"][0]
    assert restart["check"] == "restart" and not restart["passed"]
    assert restart["summary"].startswith("training first exited "), restart
    assert "reprocube:" in restart["summary"] and "train-images-idx3-ubyte.gz is there" in restart["summary"], restart
