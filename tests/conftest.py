"""Shared fixtures: small generated IDX datasets and a runner for the CLI in fresh processes."""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from reprocube import compilation_cache
from reprocube.data.idx import UNSIGNED_BYTE

FILE_KEYS = {
    "train_images": "train-images-idx3-ubyte",
    "train_labels": "train-labels-idx1-ubyte",
    "test_images": "t10k-images-idx3-ubyte",
    "test_labels": "t10k-labels-idx1-ubyte",
}


def pytest_configure(config):
    """JAX's compiled steps shared by every process the tests start, through reprocube's compilation cache
    (on by default; here one for the session, not the user's): a JAX process takes ~3.5 s instead of ~10 s
    here (the JAX tests took 350 s instead of 619 s in CI). tests/test_compilation_cache.py proves a cached
    run bit-identical to an uncached one; verify's fresh checks compile anew (test_verify_compare_report)."""
    cache = tempfile.mkdtemp(prefix="reprocube-tests-jax-cache-")
    config.jax_cache = cache
    os.environ[compilation_cache.VARIABLE] = cache
    if os.environ.get("REPROCUBE_TEST_QUICK") == "1":  # make test-quick
        subprocess.Popen.__init__ = _no_processes


def _no_processes(*args, **kwargs):
    """make test-quick: a test, or the fixture it needs, that starts a process is skipped at that moment,
    so the inner loop holds exactly the tests that start no child (nothing trains); `make test` runs all."""
    pytest.skip("starts a process (make test runs it)")


def pytest_unconfigure(config):
    if getattr(config, "jax_cache", None):
        shutil.rmtree(config.jax_cache, ignore_errors=True)


@dataclass
class GeneratedDataset:
    """A small MNIST-shaped dataset written as IDX files, with the overrides that pin it."""

    data_dir: Path
    payloads: dict[str, bytes]  # file key -> raw IDX payload

    @property
    def directory(self) -> Path:
        return self.data_dir / "generated"

    def overrides(self) -> list[str]:
        pins = [
            f"dataset.files.{key}.{field}={value}"
            for key, payload in self.payloads.items()
            for field, value in (("sha256", hashlib.sha256(payload).hexdigest()), ("bytes", len(payload)))
        ]
        return ["dataset.name=generated", f"data_dir={self.data_dir}", "dataset.mirrors=[]", *pins]

    def write_raw(self) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        for key, payload in self.payloads.items():
            (self.directory / FILE_KEYS[key]).write_bytes(payload)

    def write_gz(self, directory: Path) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        for key, payload in self.payloads.items():
            (directory / (FILE_KEYS[key] + ".gz")).write_bytes(gzip.compress(payload))


def make_payloads(train: int, test: int, seed: int = 1234) -> dict[str, bytes]:
    """Images whose label is visible (a bright block at a label-dependent place) plus noise."""
    rng = np.random.default_rng(seed)
    payloads = {}
    for split, n in (("train", train), ("test", test)):
        labels = rng.integers(0, 10, size=n, dtype=np.uint8)
        images = rng.integers(0, 80, size=(n, 28, 28), dtype=np.uint8)
        for i, label in enumerate(labels):
            row, col = divmod(int(label), 5)
            images[i, 4 + 12 * row : 12 + 12 * row, 2 + 5 * col : 6 + 5 * col] = 255
        payloads[f"{split}_images"] = encode_idx(images)
        payloads[f"{split}_labels"] = encode_idx(labels)
    return payloads


@pytest.fixture(scope="session")
def generated(tmp_path_factory) -> GeneratedDataset:
    """650 training examples: 21 steps of batch 32 per epoch, the last one short (10 examples)."""
    dataset = GeneratedDataset(tmp_path_factory.mktemp("data"), make_payloads(train=650, test=200))
    dataset.write_raw()
    return dataset


DEBIAN_FASHION_MNIST = Path("/usr/share/datasets/fashion-mnist")


@pytest.fixture(scope="session")
def fashion_mnist(tmp_path_factory) -> Path:
    """A data_dir holding Debian's Fashion-MNIST, verified by `reprocube download` once per session."""
    if not DEBIAN_FASHION_MNIST.is_dir():
        pytest.fail(f"{DEBIAN_FASHION_MNIST} is missing: apt-get install dataset-fashion-mnist")
    cwd = tmp_path_factory.mktemp("fashion-mnist")
    reprocube("download", "dataset=fashion_mnist", "data_dir=data", f"data.source_dir={DEBIAN_FASHION_MNIST}", cwd=cwd)
    return cwd / "data"


def reprocube(
    *args: str, cwd: Path, check: bool = True, timeout: float = 300, env_extra: dict | None = None
) -> subprocess.CompletedProcess:
    """Run the CLI in a fresh Python process (what bit-exact resume must survive); `env_extra` is added to
    its environment (a None value removes the variable)."""
    env = {**os.environ, "PYTHONHASHSEED": "0", **(env_extra or {})}
    env = {name: value for name, value in env.items() if value is not None}
    proc = subprocess.run(
        [sys.executable, "-m", "reprocube", *args], cwd=cwd, capture_output=True, text=True, timeout=timeout, env=env
    )
    if check and proc.returncode != 0:
        raise AssertionError(
            f"reprocube {' '.join(args)} exited {proc.returncode}\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
        )
    return proc


def wait_for_global_step(metrics_path: Path, step: int, proc: subprocess.Popen, timeout: float = 120) -> None:
    """Until a running training has logged `step` (log.every_steps=1) in its metrics.jsonl, which it is
    still appending to; an error if it ends first or not in time."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"training ended before the signal: {proc.communicate()}")
        if metrics_path.exists():
            lines = [json.loads(line) for line in metrics_path.read_text().splitlines() if line.endswith("}")]
            if any(r["global_step"] >= step for r in lines):
                return
        time.sleep(0.005)
    raise AssertionError("training did not reach the step in time")


def manifest(checkpoint_dir: Path) -> dict:
    return json.loads((checkpoint_dir / "manifest.json").read_text())


def epoch_digests(run_dir: Path) -> dict[str, str]:
    """weights_digest of every epoch checkpoint of a run, by checkpoint name."""
    return {p.name: manifest(p)["weights_digest"] for p in sorted((run_dir / "checkpoints").glob("epoch-*"))}


def read_metrics(path: Path) -> list[dict]:
    """Every record of a metrics.jsonl, step and epoch (the tests compare them all)."""
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]


def error_lines(proc: subprocess.CompletedProcess) -> list[str]:
    """reprocube's own lines on stderr (TensorFlow's C++ runtime adds start-up lines we cannot silence)."""
    return [line for line in proc.stderr.splitlines() if line.startswith("reprocube:")]


def encode_idx(array: np.ndarray) -> bytes:
    """Serialize a uint8 array as IDX (the tests' writer of the format reprocube.data.idx reads)."""
    if array.dtype != np.uint8:
        raise ValueError("only uint8 arrays can be written as IDX here")
    header = bytes([0, 0, UNSIGNED_BYTE, array.ndim]) + struct.pack(f">{array.ndim}I", *array.shape)
    return header + np.ascontiguousarray(array).tobytes()


def slow_steps_pythonpath(
    where: Path, seconds: float, pythonpath: str = "", after_groups: int = 0, only_with_arg: str | None = None
) -> str:
    """A PYTHONPATH whose start-up hook (sitecustomize) sleeps `seconds` before each group of steps, so
    that a signal lands while a child still trains: from the group after the first `after_groups`, and
    only in a process whose command line holds `only_with_arg` (if given)."""
    hook = where / "hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(
        "import sys, time, reprocube.loop as loop\n"
        "original = loop.Schedule.group_end\n"
        "calls = []\n"
        "def slow(self, *args, **kwargs):\n"
        "    calls.append(1)\n"
        f"    if len(calls) > {after_groups} and {only_with_arg!r} in (None, *sys.argv):\n"
        f"        time.sleep({seconds})\n"
        "    return original(self, *args, **kwargs)\n"
        "loop.Schedule.group_end = slow\n"
    )
    return f"{hook}:{pythonpath}"
