"""TensorFlow's inter-op thread pool runs independent kernels of a step side by side (the two towers of
framework.towers, the backward pass's convolution gradients, the dropout masks) but never splits a kernel,
so the weights do not depend on its size: `framework.inter_op_threads` is not a result key, and a run may
resume with another value. Digests are compared between runs made here, in fresh processes (never
recorded ones)."""

from __future__ import annotations

import json
import shutil

import pytest

from helpers import GeneratedDataset, epoch_digests, make_payloads, manifest, reprocube

pytestmark = pytest.mark.process  # every test here starts a process: not in make test-quick

DEFAULT_INTER_OP = 2  # conf/framework/tensorflow.yaml
OTHER_INTER_OP = 1


@pytest.fixture(scope="module")
def train(tmp_path_factory):
    """2048 examples: 64 steps per epoch, 2 epochs."""
    data = GeneratedDataset(tmp_path_factory.mktemp("tf-threads-data"), make_payloads(train=2048, test=512))
    data.write_raw()
    workdir = tmp_path_factory.mktemp("tf-threads")

    def run(run_name, *overrides, check=True):
        args = ("train", "framework=tensorflow", *data.overrides(), "epochs=2", f"run_name={run_name}", *overrides)
        proc = reprocube(*args, cwd=workdir, check=check)
        return workdir / "runs" / run_name if check else proc

    return run


@pytest.fixture(scope="module")
def default_run(train):
    return train("default")


@pytest.fixture(scope="module")
def other_pool_run(train):
    return train("inter-op-other", f"framework.inter_op_threads={OTHER_INTER_OP}", "checkpoint.every_steps=40")


def test_the_default_inter_op_pool_gives_the_same_weights_in_fresh_processes(default_run, train):
    env = json.loads((default_run / "env.json").read_text())["framework"]
    # threads=2 over 2 towers: one intra-op thread for each tower's kernels
    expected = {"inter_op_threads": DEFAULT_INTER_OP, "intra_op_threads": 1, "op_determinism": True, "onednn": True}
    assert {key: env[key] for key in expected} == expected
    assert epoch_digests(train("default-again")) == epoch_digests(default_run)
    assert len(set(epoch_digests(default_run).values())) == 2  # the weights did change each epoch


def test_another_inter_op_pool_gives_the_same_weights_as_the_default(default_run, other_pool_run):
    assert epoch_digests(other_pool_run) == epoch_digests(default_run)


def test_a_run_resumes_mid_epoch_with_another_inter_op_pool_bit_exactly(default_run, other_pool_run, train):
    resumed = train("switched", f"resume={other_pool_run}/checkpoints/step-000040")  # epoch 1, step 40 of 64
    assert epoch_digests(resumed) == epoch_digests(default_run)
    sessions = [json.loads(line) for line in (resumed / "sessions.jsonl").read_text().splitlines()]
    assert [s["env"]["framework"]["inter_op_threads"] for s in sessions] == [DEFAULT_INTER_OP]


def test_a_checkpoint_hashed_with_the_inter_op_pool_as_a_result_key_still_resumes(default_run, train, tmp_path):
    """Checkpoints written before framework.inter_op_threads left the result keys hold a config_hash
    that includes it: make one (recompute the hash that way, re-sign the manifest) and resume from it."""
    from reprocube.config import FORMER_RESULT_KEYS, config_hash
    from reprocube.training.checkpoint import manifest_self_digest

    checkpoint = shutil.copytree(default_run / "checkpoints" / "epoch-0001", tmp_path / "epoch-0001")
    edited = manifest(checkpoint)
    config = json.loads((checkpoint / "config.json").read_text())
    edited["config_hash"] = config_hash(config, keep=FORMER_RESULT_KEYS)
    assert edited["config_hash"] != manifest(checkpoint)["config_hash"]
    edited["manifest_sha256"] = manifest_self_digest(edited)
    (checkpoint / "manifest.json").write_text(json.dumps(edited))
    resumed = train("from-before", f"resume={checkpoint}")
    assert epoch_digests(resumed) == {"epoch-0002": epoch_digests(default_run)["epoch-0002"]}


def test_a_batch_smaller_than_the_towers_is_refused_in_one_line(train):
    """oneDNN's convolution refuses an empty batch: 7 examples at batch 3 leave a last batch of 1, which 2
    towers cannot share; it is refused before training, naming the key and the ways out, in the only line on
    stderr (TensorFlow's start-up chatter dropped: reprocube.runtime.tensorflow_import)."""
    refused = train("one-example-batch", "data.train_limit=7", "batch_size=3", check=False)
    assert refused.returncode == 2
    [line] = refused.stderr.splitlines()
    assert line.startswith("reprocube: error: framework.towers=2 needs at least 2 examples in every batch")
    assert "holds 1" in line and "data.drop_last=true" in line
    kept = train("one-example-batch-dropped", "data.train_limit=7", "batch_size=3", "data.drop_last=true")
    assert len(set(epoch_digests(kept).values())) == 2  # trained: 2 steps an epoch, the last example dropped
