"""Result keys added to change what a trainer computes, each to a faster form with other bits: PyTorch's
`framework.memory_format` (channels_last by default, contiguous before), JAX's `framework.conv2`
(matmul by default, convolution before) and TensorFlow's `framework.towers` (2 by default, 1 before). A
config written before such a key existed holds none, and is read with the value it computed
(config.ADDED_RESULT_KEYS): an old run resumes, and an old receipt is reproduced
(tests/test_cross_machine.py), as it was computed. Digests are compared between runs made here, in fresh
processes (never recorded ones)."""

from __future__ import annotations

import json
import shutil

import pytest

from reprocube.config import ADDED_RESULT_KEYS, config_hash

from helpers import GeneratedDataset, epoch_digests, make_payloads, reprocube, rewrite_checkpoint_file

# framework -> (the key, its default now, the value configs written before it computed)
ADDED = {
    "pytorch": ("memory_format", "channels_last", "contiguous"),
    "jax": ("conv2", "matmul", "convolution"),
    "tensorflow": ("towers", 2, 1),
}


def test_every_added_key_is_tested_here():
    assert {fw: {f"framework.{key}": old} for fw, (key, _, old) in ADDED.items()} == ADDED_RESULT_KEYS


@pytest.fixture(scope="module")
def train(tmp_path_factory):
    """1024 examples: 32 steps per epoch, 2 epochs."""
    data = GeneratedDataset(tmp_path_factory.mktemp("added-keys-data"), make_payloads(train=1024, test=256))
    data.write_raw()
    workdir = tmp_path_factory.mktemp("added-keys")

    def run(framework, run_name, *overrides, check=True):
        args = ("train", f"framework={framework}", *data.overrides(), "epochs=2", f"run_name={run_name}", *overrides)
        proc = reprocube(*args, cwd=workdir, check=check)
        return proc if not check else workdir / "runs" / run_name

    return run


@pytest.fixture(scope="module")
def former_runs(train):
    """Each framework trained with the value configs written before its key computed."""
    return {fw: train(fw, f"{fw}-former", f"framework.{key}={old}") for fw, (key, _, old) in ADDED.items()}


@pytest.mark.process
@pytest.mark.parametrize("framework", ADDED)
def test_the_default_is_the_new_form_and_computes_other_bits(train, former_runs, framework):
    key, default, _ = ADDED[framework]
    default_run = train(framework, f"{framework}-default")
    config = json.loads((default_run / "checkpoints" / "epoch-0002" / "config.json").read_text())
    assert config["framework"][key] == default
    new, former = epoch_digests(default_run), epoch_digests(former_runs[framework])
    assert new.keys() == former.keys() == {"epoch-0001", "epoch-0002"}
    assert all(new[name] != former[name] for name in new)


def as_written_before_the_key(checkpoint, key: str, old: str):
    """A checkpoint as reprocube wrote it before the key existed: its config.json without the key, the
    manifest's config_hash of that config and the file's sha256, the manifest re-sealed."""
    config = json.loads((checkpoint / "config.json").read_text())
    assert config["framework"].pop(key) == old
    blob = json.dumps(config, indent=1, sort_keys=True).encode()
    rewrite_checkpoint_file(checkpoint, "config.json", blob, config_hash=config_hash(config))


@pytest.mark.process
@pytest.mark.parametrize("framework", ADDED)
def test_a_checkpoint_from_before_the_key_resumes_as_it_was_computed(train, former_runs, framework, tmp_path):
    key, default, old = ADDED[framework]
    former = former_runs[framework]
    checkpoint = shutil.copytree(former / "checkpoints" / "epoch-0001", tmp_path / "epoch-0001")
    as_written_before_the_key(checkpoint, key, old)
    # The new default is not what it computed: resuming under it is refused, naming the key.
    refused = train(framework, f"{framework}-old-default", f"resume={checkpoint}", check=False)
    assert refused.returncode == 4, refused.stderr
    assert f"framework.{key}: {json.dumps(old)} -> {json.dumps(default)}" in refused.stderr
    assert len(refused.stderr.strip().splitlines()) == 1 and "Traceback" not in refused.stderr
    resumed = train(framework, f"{framework}-old-resumed", f"resume={checkpoint}", f"framework.{key}={old}")
    assert epoch_digests(resumed) == {"epoch-0002": epoch_digests(former)["epoch-0002"]}
