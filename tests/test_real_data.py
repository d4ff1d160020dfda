"""Training on real Fashion-MNIST (Debian's dataset-fashion-mnist): the model actually learns."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from reprocube.training.backend import FRAMEWORKS

from helpers import reprocube

pytestmark = pytest.mark.process  # every test here starts a process: not in make test-quick

DEBIAN_FASHION_MNIST = Path("/usr/share/datasets/fashion-mnist")


def train_one_epoch(tmp_path: Path, framework: str, *extra: str) -> dict:
    """One epoch on Debian's Fashion-MNIST in a fresh process; its epoch record."""
    if not DEBIAN_FASHION_MNIST.is_dir():
        pytest.fail(f"{DEBIAN_FASHION_MNIST} is missing: apt-get install dataset-fashion-mnist")
    reprocube(
        "download", "dataset=fashion_mnist", "data_dir=data", f"data.source_dir={DEBIAN_FASHION_MNIST}", cwd=tmp_path
    )
    reprocube(
        "train",
        f"framework={framework}",
        "dataset=fashion_mnist",
        "data_dir=data",
        "epochs=1",
        "threads=1",  # learning does not depend on it; PyTorch's 2 threads cost 2-3x the CPU on a busy machine
        *extra,
        cwd=tmp_path,
        timeout=600,
    )
    metrics = (tmp_path / f"runs/{framework}-seed0/metrics.jsonl").read_text().splitlines()
    [epoch] = [r for r in map(json.loads, metrics) if r["kind"] == "epoch"]
    return epoch


@pytest.mark.slow
@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_one_epoch_of_fashion_mnist_learns(tmp_path, framework):
    epoch = train_one_epoch(tmp_path, framework)
    assert epoch["test_accuracy"] > 0.65  # chance is 0.10; one epoch of this CNN reaches about 0.77
    assert epoch["train_loss"] < 1.5  # starts at ln(10) = 2.30


@pytest.mark.slow
@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_fashion_mnist_learns_with_the_loader_and_augmentation(tmp_path, framework):
    """Flips and shifts on, through the framework's own loader with 2 workers: still learning, far above chance."""
    loader = ["data.pipeline=loader", "data.augment=true", "data.workers=2", "data.train_limit=20000"]
    assert train_one_epoch(tmp_path, framework, *loader)["test_accuracy"] > 0.6  # chance is 0.10
