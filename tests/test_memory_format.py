"""PyTorch's `framework.memory_format` (channels_last by default, contiguous before the key existed): a
result key, since the two layouts run other convolution kernels and give other bits. A config written
before the key existed holds none, and is read as contiguous (config.ADDED_RESULT_KEYS): an old run
resumes, and an old receipt is reproduced (tests/test_cross_machine.py), as it was computed.
Digests are compared between runs made here, in fresh processes (never recorded ones)."""

from __future__ import annotations

import hashlib
import json
import shutil

import pytest

from reprocube.checkpoint import manifest_self_digest
from reprocube.config import config_hash

from helpers import GeneratedDataset, epoch_digests, make_payloads, manifest, reprocube


@pytest.fixture(scope="module")
def train(tmp_path_factory):
    """1024 examples: 32 steps per epoch, 2 epochs."""
    data = GeneratedDataset(tmp_path_factory.mktemp("memory-format-data"), make_payloads(train=1024, test=256))
    data.write_raw()
    workdir = tmp_path_factory.mktemp("memory-format")

    def run(run_name, *overrides, check=True):
        proc = reprocube(
            "train", "framework=pytorch", *data.overrides(), "epochs=2", f"run_name={run_name}", *overrides,
            cwd=workdir, check=check,
        )  # fmt: skip
        return proc if not check else workdir / "runs" / run_name

    return run


@pytest.fixture(scope="module")
def contiguous_run(train):
    return train("contiguous", "framework.memory_format=contiguous")


def test_the_default_layout_is_channels_last_and_computes_other_bits(train, contiguous_run):
    default_run = train("default")
    config = json.loads((default_run / "checkpoints" / "epoch-0002" / "config.json").read_text())
    assert config["framework"]["memory_format"] == "channels_last"
    default, contiguous = epoch_digests(default_run), epoch_digests(contiguous_run)
    assert default.keys() == contiguous.keys() == {"epoch-0001", "epoch-0002"}
    assert all(default[name] != contiguous[name] for name in default)


def as_written_before_the_key(checkpoint):
    """A checkpoint as reprocube wrote it before framework.memory_format existed: its config.json without
    the key, the manifest's config_hash of that config and the file's sha256, the manifest re-sealed."""
    config = json.loads((checkpoint / "config.json").read_text())
    assert config["framework"].pop("memory_format") == "contiguous"
    blob = json.dumps(config, indent=1, sort_keys=True).encode()
    (checkpoint / "config.json").write_bytes(blob)
    edited = manifest(checkpoint)
    edited["config_hash"] = config_hash(config)
    edited["files"]["config.json"] = hashlib.sha256(blob).hexdigest()
    edited["file_bytes"]["config.json"] = len(blob)
    edited["manifest_sha256"] = manifest_self_digest(edited)
    (checkpoint / "manifest.json").write_text(json.dumps(edited))


def test_a_checkpoint_from_before_the_key_resumes_as_contiguous_bit_exactly(train, contiguous_run, tmp_path):
    checkpoint = shutil.copytree(contiguous_run / "checkpoints" / "epoch-0001", tmp_path / "epoch-0001")
    as_written_before_the_key(checkpoint)
    # The default layout is not what it computed: resuming it under channels_last is refused, naming the key.
    refused = train("old-default", f"resume={checkpoint}", check=False)
    assert refused.returncode == 4, refused.stderr
    assert 'framework.memory_format: "contiguous" -> "channels_last"' in refused.stderr
    assert len(refused.stderr.strip().splitlines()) == 1 and "Traceback" not in refused.stderr
    resumed = train("old-contiguous", f"resume={checkpoint}", "framework.memory_format=contiguous")
    assert epoch_digests(resumed) == {"epoch-0002": epoch_digests(contiguous_run)["epoch-0002"]}
