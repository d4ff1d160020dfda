"""Shared fixtures: small generated IDX datasets, Fashion-MNIST, and the session's JAX compilation
cache. What tests import (the CLI runner, polling, dataset writers) is in helpers.py."""

from __future__ import annotations

import json
import os
import resource
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import pytest
from hypothesis.configuration import set_hypothesis_home_dir

from reprocube.runtime import compilation_cache
from reprocube.training.checkpoint import FILE_NAMES, MANIFEST

from fuzz_helpers import Baseline
from helpers import GeneratedDataset, make_payloads, reprocube


def pytest_configure(config):
    """JAX's compiled steps shared by every process the tests start, through reprocube's compilation cache
    (on by default; here one for the session, not the user's): a JAX process takes ~3.5 s instead of ~10 s
    here (the JAX tests took 350 s instead of 619 s in CI). tests/test_compilation_cache.py proves a cached
    run bit-identical to an uncached one; verify's fresh checks compile anew (test_verify_compare_report)."""
    # Hypothesis keeps what it finds in the source under .hypothesis/: outside the work tree.
    set_hypothesis_home_dir(Path(tempfile.gettempdir()) / "reprocube-hypothesis")
    # make test runs test files three at a time (pytest-xdist): the workers inherit the controller's
    # environment, so they share its cache, and only the controller removes it.
    if "PYTEST_XDIST_WORKER" not in os.environ:
        cache = tempfile.mkdtemp(prefix="reprocube-tests-jax-cache-")
        config.jax_cache = cache
        os.environ[compilation_cache.VARIABLE] = cache
    if os.environ.get("REPROCUBE_TEST_QUICK") == "1":  # make test-quick (-m "not process")
        subprocess.Popen.__init__ = _no_process_unmarked


# make test runs test files three at a time (pytest-xdist, `--dist loadfile --no-loadscope-reorder`), each
# file on one worker, handed out in collection order as workers free up. The longest files go first so
# that none of them starts last and runs alone (seconds: the files' slowest tests in the suite of
# 2026-11-26 run two files at a time); the rest keep their order. test_repository.py checks the names.
LONGEST_FILES_FIRST = (
    "test_apptainer.py",  # the SIF's build (minutes, once per image digest), then MLCube tasks in three runtimes
    "test_frameworks.py",  # ~340, docs/frameworks.md's 12 rows: each a check beside its own truth's runs
    "test_cpu_emulation.py",  # ~330 (alone), training on QEMU's emulated CPU
    "test_slurm.py",  # ~250 s, most of it waiting on SLURM
    "test_reproduce.py",  # ~300
    "test_loader_pipeline.py",  # ~270
    "test_container.py",  # ~230
    "test_training.py",  # ~230
    "test_gpu_check.py",  # ~220
    "test_verify_compare_report.py",  # ~210
    "test_real_data.py",  # ~130
    "test_ground_truth.py",  # ~150-250, check's ground-truth matrix (a PyTorch cell pays import torch 8 times)
    "test_check_command.py",  # ~110
    "test_stops_and_resume_findings.py",  # each finding of an adversary, one check
    "test_children.py",  # ~110
    "test_trust.py",  # ~100
)


# REPROCUBE_TEST_CPU=FILE (make test PYTEST_ARGS=... or the environment): one JSON line per test appended to
# FILE: its id, the CPU seconds of its worker and of the children it waited for (not Docker's or SLURM's
# processes), and its wall seconds; benchmarks/test_suite_cpu.py sums them per file (benchmarks/test-suite.md).
TEST_CPU_RECORD = os.environ.get("REPROCUBE_TEST_CPU")


def _cpu_seconds() -> float:
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def _record_cost(nodeid: str, cpu: float, wall: float) -> None:
    record = {"id": nodeid, "cpu_s": round(_cpu_seconds() - cpu, 2), "wall_s": round(time.monotonic() - wall, 2)}
    with open(TEST_CPU_RECORD, "a") as out:  # one short line per write: the workers' lines never interleave
        out.write(json.dumps(record) + "\n")


def pytest_collection_modifyitems(session, config, items):
    rank = {name: i for i, name in enumerate(LONGEST_FILES_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: the rest keep their order


# make test-quick runs the tests not marked `process` (pyproject.toml) and guards that marking: a test, or a
# fixture it needs, that starts a process there fails, naming the command. Imports at collection may start one
# (ctypes.util.find_library runs ldconfig): only a test's setup, call and teardown are guarded.
_RUNNING: list[str] = []  # the node id of the test being run
_UNMARKED: set[str] = set()  # tests that started a process under make test-quick
_popen_init = subprocess.Popen.__init__


def _no_process_unmarked(self, *args, **kwargs):
    if not _RUNNING:
        return _popen_init(self, *args, **kwargs)
    _UNMARKED.add(_RUNNING[-1])
    command = args[0] if args else kwargs.get("args")
    pytest.fail(f"starts a process ({command!r:.200}): mark the test @pytest.mark.process", pytrace=False)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    _RUNNING.append(item.nodeid)
    cpu, wall = _cpu_seconds(), time.monotonic()
    try:
        yield
    finally:
        _RUNNING.pop()
        if TEST_CPU_RECORD:
            _record_cost(item.nodeid, cpu, wall)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """A test that caught the guard's failure still fails (the marking must stay true)."""
    report = (yield).get_result()
    if item.nodeid in _UNMARKED and report.when == "call" and not report.failed:
        report.outcome = "failed"
        report.longrepr = "it started a process and caught the failure that said so: mark it @pytest.mark.process"


def pytest_unconfigure(config):
    if getattr(config, "jax_cache", None):
        shutil.rmtree(config.jax_cache, ignore_errors=True)


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


@pytest.fixture(scope="session")
def real_run(generated, tmp_path_factory):
    """One real PyTorch run of one epoch (a checkpoint the trainer itself wrote): what the readers' fuzz
    suites (tests/test_fuzz_*.py) mutate, in copies."""
    cwd = tmp_path_factory.mktemp("fuzz-run")
    reprocube(
        "train", "framework=pytorch", *generated.overrides(), "epochs=1", "log.every_steps=5", "run_name=r", cwd=cwd
    )
    return cwd / "runs" / "r"


@pytest.fixture(scope="session")
def base(real_run):
    checkpoint = real_run / "checkpoints" / "epoch-0001"
    files = {name: (checkpoint / name).read_bytes() for name in FILE_NAMES}
    return Baseline(files=files, manifest=json.loads((checkpoint / MANIFEST).read_bytes()))


@pytest.fixture(scope="module")
def scratch(tmp_path_factory):
    return tmp_path_factory.mktemp("fuzz-checkpoints")
