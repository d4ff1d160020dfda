"""Result keys added to change what a trainer computes, each to a faster form: PyTorch's
`framework.memory_format` (channels_last by default, contiguous before), JAX's `framework.conv2`
(matmul by default, convolution before) and TensorFlow's `framework.towers` (2 by default, 1 before),
each with other bits; PyTorch's `framework.cuda_graph` and JAX's `framework.device_loop` (true by
default, false before), which act on a GPU only (on a CPU the same bits; on a GPU, scripts/gpu-host.sh
speed compares them). A config written before such a key existed holds none, and is read with the value
it computed (config.ADDED_RESULT_KEYS): an old run resumes, and an old receipt is reproduced
(tests/test_cross_machine.py), as it was computed. Digests are compared between runs made here, in fresh
processes (never recorded ones)."""

from __future__ import annotations

import json
import shutil

import pytest

from reprocube.config import ADDED_RESULT_KEYS, config_hash

from helpers import GeneratedDataset, epoch_digests, make_payloads, reprocube, rewrite_checkpoint_file

# (framework, key) -> (its default now, the value configs written before it computed, other bits on a CPU)
ADDED = {
    ("pytorch", "memory_format"): ("channels_last", "contiguous", True),
    ("pytorch", "cuda_graph"): (True, False, False),
    ("jax", "conv2"): ("matmul", "convolution", True),
    ("jax", "device_loop"): (True, False, False),
    ("tensorflow", "towers"): (2, 1, True),
}
FRAMEWORKS = sorted({fw for fw, _ in ADDED})


def test_every_added_key_is_tested_here():
    tested = {fw: {f"framework.{key}": old for (f, key), (_, old, _) in ADDED.items() if f == fw} for fw in FRAMEWORKS}
    assert tested == ADDED_RESULT_KEYS


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


def _overrides(framework: str, values: dict) -> list[str]:
    return [f"framework.{key}={json.dumps(value)}" for (fw, key), value in values.items() if fw == framework]


@pytest.fixture(scope="module")
def former_runs(train):
    """Each framework trained with the values configs written before its keys computed."""
    former = {k: old for k, (_, old, _) in ADDED.items()}
    return {fw: train(fw, f"{fw}-former", *_overrides(fw, former)) for fw in FRAMEWORKS}


@pytest.fixture(scope="module")
def default_runs(train):
    return {fw: train(fw, f"{fw}-default") for fw in FRAMEWORKS}


@pytest.mark.process
@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_the_default_is_the_new_form_and_computes_other_bits(default_runs, former_runs, framework):
    """Every key of the framework new (the default) against every key old: other bits where a key changes
    them on a CPU, the same bits where none does."""
    default_run = default_runs[framework]
    config = json.loads((default_run / "checkpoints" / "epoch-0002" / "config.json").read_text())
    keys = {key: (default, other_bits) for (fw, key), (default, _, other_bits) in ADDED.items() if fw == framework}
    assert {key: config["framework"][key] for key in keys} == {key: default for key, (default, _) in keys.items()}
    new, former = epoch_digests(default_run), epoch_digests(former_runs[framework])
    assert new.keys() == former.keys() == {"epoch-0001", "epoch-0002"}
    if any(other_bits for _, other_bits in keys.values()):
        assert all(new[name] != former[name] for name in new)
    else:
        assert new == former


@pytest.mark.process
@pytest.mark.parametrize("key", [k for k, (_, _, other_bits) in ADDED.items() if not other_bits], ids="-".join)
def test_a_key_for_the_gpu_alone_changes_no_bit_on_a_cpu(train, default_runs, key):
    framework, name = key
    _, old, _ = ADDED[key]
    only_this_old = train(framework, f"{framework}-{name}-old", f"framework.{name}={json.dumps(old)}")
    assert epoch_digests(only_this_old) == epoch_digests(default_runs[framework])


def as_written_before_the_key(checkpoint, key: str, old: str):
    """A checkpoint as reprocube wrote it before the key existed: its config.json without the key, the
    manifest's config_hash of that config and the file's sha256, the manifest re-sealed."""
    config = json.loads((checkpoint / "config.json").read_text())
    assert config["framework"].pop(key) == old
    blob = json.dumps(config, indent=1, sort_keys=True).encode()
    rewrite_checkpoint_file(checkpoint, "config.json", blob, config_hash=config_hash(config))


@pytest.mark.process
@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_a_checkpoint_from_before_the_key_resumes_as_it_was_computed(train, former_runs, framework, tmp_path):
    keys = {key: (default, old) for (fw, key), (default, old, _) in ADDED.items() if fw == framework}
    former = former_runs[framework]
    checkpoint = shutil.copytree(former / "checkpoints" / "epoch-0001", tmp_path / "epoch-0001")
    for key, (_, old) in keys.items():
        as_written_before_the_key(checkpoint, key, old)
    # The new defaults are not what it computed: resuming under them is refused, naming the keys.
    refused = train(framework, f"{framework}-old-default", f"resume={checkpoint}", check=False)
    assert refused.returncode == 4, refused.stderr
    for key, (default, old) in keys.items():
        assert f"framework.{key}: {json.dumps(old)} -> {json.dumps(default)}" in refused.stderr
    assert len(refused.stderr.strip().splitlines()) == 1 and "Traceback" not in refused.stderr
    olds = {(framework, key): old for key, (_, old) in keys.items()}
    resumed = train(framework, f"{framework}-old-resumed", f"resume={checkpoint}", *_overrides(framework, olds))
    assert epoch_digests(resumed) == {"epoch-0002": epoch_digests(former)["epoch-0002"]}
