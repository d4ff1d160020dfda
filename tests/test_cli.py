"""The command line: entry points, one-line errors with documented exit statuses."""

from __future__ import annotations

import shutil
import subprocess
import sys

import pytest

from helpers import reprocube

pytestmark = pytest.mark.process  # every test here starts a process: not in make test-quick


def test_console_script_and_module_entry_points(tmp_path):
    script = shutil.which("reprocube", path=str(__import__("pathlib").Path(sys.executable).parent))
    assert script, "the reprocube console script is not installed beside this Python"
    for command in ([script, "--help"], [sys.executable, "-m", "reprocube", "--help"]):
        proc = subprocess.run(command, capture_output=True, text=True, cwd=tmp_path)
        assert proc.returncode == 0 and "train" in proc.stdout and "download" in proc.stdout


def test_print_config_shows_the_resolved_config(tmp_path):
    user = tmp_path / "train.yaml"
    user.write_text("epochs: 2\n")
    proc = reprocube("train", "--config-file", str(user), "--print-config", "seed=4", cwd=tmp_path)
    assert "epochs: 2" in proc.stdout and "seed: 4" in proc.stdout and "name: fashion_mnist" in proc.stdout


@pytest.mark.parametrize(
    "args, status, message",
    [
        (["bogus"], 2, "reprocube: error: argument COMMAND: invalid choice: 'bogus'"),
        (["train", "--no-such-flag"], 2, "reprocube: error: unrecognized arguments: --no-such-flag"),
        (["train", "epochs=zero"], 2, "reprocube: error: epochs must be an integer >= 1, got 'zero'"),
        (["train", "no_such_key=1"], 2, "reprocube: error: invalid configuration: Could not override 'no_such_key'."),
        (
            ["train", "framework=caffe"],
            2,
            "reprocube: error: invalid configuration: In 'config': Could not find 'framework/caffe'",
        ),
        (
            ["train", "data_dir=nowhere"],
            3,
            (
                "reprocube: error: dataset fashion_mnist not found in nowhere/fashion_mnist; "
                "fetch it first with `reprocube download dataset=fashion_mnist data_dir=nowhere`"
            ),
        ),
        (
            ["train", "resume=latest"],
            4,
            "reprocube: error: resume=latest: no checkpoint in runs/pytorch-seed0/checkpoints",
        ),
        (
            ["train", "resume=/no/such/checkpoint"],
            4,
            (
                "reprocube: error: resume=/no/such/checkpoint: "
                "not a checkpoint directory (no manifest.json) nor a run directory"
            ),
        ),
        (
            ["download", "data.source_dir=/no/such/dir"],
            3,
            "reprocube: error: data.source_dir /no/such/dir is not a directory",
        ),
    ],
)
def test_bad_input_ends_in_one_line_and_a_status(tmp_path, args, status, message):
    proc = reprocube(*args, cwd=tmp_path, check=False)
    assert proc.returncode == status
    assert proc.stderr.strip().splitlines() == [proc.stderr.strip()]  # exactly one line
    assert proc.stderr.strip().startswith(message), proc.stderr


def test_a_config_file_with_a_typo_is_refused(tmp_path):
    user = tmp_path / "train.yaml"
    user.write_text("optimizer:\n  lr: 0.1\n  momentun: 0.9\n")
    proc = reprocube("train", "--config-file", str(user), cwd=tmp_path, check=False)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        (
            "reprocube: error: invalid configuration: Could not override 'optimizer.momentun'. "
            "There is no such key (see --print-config for every key)."
        )
    ]
