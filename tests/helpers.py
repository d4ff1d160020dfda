"""What the tests share besides fixtures: the CLI runner in fresh processes, one polling helper, small
generated IDX datasets, and readers of what a run wrote. Tests import these (`from helpers import ...`);
the fixtures that use them are in conftest.py."""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import struct
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import numpy as np

from reprocube.data.idx import UNSIGNED_BYTE

T = TypeVar("T")

FILE_KEYS = {
    "train_images": "train-images-idx3-ubyte",
    "train_labels": "train-labels-idx1-ubyte",
    "test_images": "t10k-images-idx3-ubyte",
    "test_labels": "t10k-labels-idx1-ubyte",
}


def reprocube(
    *args: str,
    cwd: Path,
    check: bool = True,
    timeout: float = 300,
    env_extra: dict | None = None,
    cpu: str | None = None,
) -> subprocess.CompletedProcess:
    """Run the CLI in a fresh Python process (what bit-exact resume must survive); `env_extra` is added to
    its environment (a None value removes the variable); `cpu`: on that emulated CPU model
    (reprocube.runtime.cpu_emulation)."""
    env = {**os.environ, "PYTHONHASHSEED": "0", **(env_extra or {})}
    env = {name: value for name, value in env.items() if value is not None}
    command = [sys.executable, "-m", "reprocube", *args]
    if cpu is not None:
        from reprocube.runtime.cpu_emulation import emulated_command

        command = emulated_command(command, cpu)
    proc = subprocess.run(command, cwd=cwd, capture_output=True, text=True, timeout=timeout, env=env)
    if check and proc.returncode != 0:
        raise AssertionError(
            f"reprocube {' '.join(args)} exited {proc.returncode}\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
        )
    return proc


def reproduce_receipt(receipt: Path, out: Path, data_dir: Path, cwd: Path) -> subprocess.CompletedProcess:
    """`reprocube reproduce RECEIPT --out OUT data_dir=DATA`, as a user runs it; its exit status unchecked."""
    return reprocube("reproduce", str(receipt), "--out", str(out), f"data_dir={data_dir}", cwd=cwd, check=False)


class ProcessEnded(AssertionError):
    """wait_until's process ended before the condition held."""


def wait_until(
    condition: Callable[[], T],
    *,
    timeout: float,
    what: str,
    process: subprocess.Popen | None = None,
    interval: float = 0.01,
    detail: Callable[[], str] = lambda: "",
) -> T:
    """The one polling loop of the tests: call `condition` until it returns something true, and return
    that. An AssertionError naming `what` (and `detail()`, e.g. a job's log) when `timeout` seconds pass
    first; ProcessEnded when `process` is given and has ended (checked before each call of `condition`).
    Tests wait for progress (a file, a logged step, a process gone), never for a wall-clock moment."""
    deadline = time.monotonic() + timeout
    while True:
        # The process first: a caller waits for a moment to act on a process still running.
        if process is not None and process.poll() is not None:
            raise ProcessEnded(f"the process ended (exit {process.returncode}) before {what}")
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what}{detail()}")
        time.sleep(interval)


def wait_for_global_step(metrics_path: Path, step: int, proc: subprocess.Popen, timeout: float = 120) -> None:
    """Until a running training has logged `step` (log.every_steps=1) in its metrics.jsonl, which it is
    still appending to; an error if it ends first or not in time."""

    def reached() -> bool:
        if not metrics_path.exists():
            return False
        lines = [json.loads(line) for line in metrics_path.read_text().splitlines() if line.endswith("}")]
        return any(r["global_step"] >= step for r in lines)

    wait_until(reached, timeout=timeout, what=f"training to log global step {step}", process=proc, interval=0.005)


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


def manifest(checkpoint_dir: Path) -> dict:
    return json.loads((checkpoint_dir / "manifest.json").read_text())


def rewrite_checkpoint_file(checkpoint_dir: Path, name: str, blob: bytes, **manifest_changes) -> None:
    """Replace one file of a checkpoint with `blob` and reseal its manifest (the file's sha256 and size,
    `manifest_changes`, the manifest's own digest): the checkpoint then reads as whole and consistent."""
    from reprocube.training.checkpoint import manifest_self_digest

    (checkpoint_dir / name).write_bytes(blob)
    edited = {**manifest(checkpoint_dir), **manifest_changes}
    edited["files"][name] = hashlib.sha256(blob).hexdigest()
    edited["file_bytes"][name] = len(blob)
    edited["manifest_sha256"] = manifest_self_digest(edited)
    (checkpoint_dir / "manifest.json").write_text(json.dumps(edited, sort_keys=True, indent=1))


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
        "import sys, time, reprocube.training.loop as loop\n"
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
