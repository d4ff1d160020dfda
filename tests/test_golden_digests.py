"""The final weights_digest of each framework on a fixed small Fashion-MNIST config, checked against
digests recorded before a refactoring (issue 14: "not one bit changes").

CPU kernels give different bits on different ISAs (../shared/notes/numerics.md), and a lock bump may
change them too, so the recorded digests are keyed by the CPU's ISA flags and the frameworks' versions:
on a machine with no record the test skips and says how to add one, except in CI (.ci/run sets
REPROCUBE_REQUIRE_GOLDEN=1), where a missing record fails: both machine kinds are recorded, so a missing
key there means a lock bump or a new kind of machine, and the digests must be recorded before the change
lands. To record on this machine:
    REPROCUBE_RECORD_GOLDEN=1 .venv/bin/python -m pytest tests/test_golden_digests.py
"""

from __future__ import annotations

import json
import os
from importlib import metadata
from pathlib import Path

import pytest

from reprocube.backend import FRAMEWORKS

from helpers import reprocube

GOLDEN = Path(__file__).with_name("golden_digests.json")
CONFIG = (
    "dataset=fashion_mnist",
    "data.train_limit=2048",
    "data.test_limit=512",
    "epochs=2",
    "seed=0",
    "log.progress=false",
)
RECORD_COMMAND = "REPROCUBE_RECORD_GOLDEN=1 .venv/bin/python -m pytest tests/test_golden_digests.py"
VERSIONED = {
    "pytorch": ("torch",),
    "tensorflow": ("tensorflow", "tensorflow-cpu", "keras"),
    "jax": ("jax", "jaxlib", "flax", "optax"),
}


def machine_key(framework: str) -> str:
    from reprocube.env import collect_env

    isa = ",".join(collect_env({})["cpu"]["isa"])
    versions = ",".join(f"{p}={_version(p)}" for p in ("numpy", *VERSIONED[framework]))
    return f"isa={isa};{versions}"


@pytest.fixture(scope="module")
def fashion_data(fashion_mnist, tmp_path_factory) -> Path:
    """A working directory whose data/ is the session's Fashion-MNIST."""
    cwd = tmp_path_factory.mktemp("golden")
    (cwd / "data").symlink_to(fashion_mnist)
    return cwd


@pytest.mark.slow
@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_final_digest_matches_the_recorded_one(fashion_data, framework):
    key = machine_key(framework)
    recorded = json.loads(GOLDEN.read_text()) if GOLDEN.exists() else {}
    if key not in recorded.get(framework, {}) and not os.environ.get("REPROCUBE_RECORD_GOLDEN"):
        missing = f"no digest recorded for {framework} on {key}; record it with {RECORD_COMMAND}"
        if os.environ.get("REPROCUBE_REQUIRE_GOLDEN"):
            pytest.fail(missing)
        pytest.skip(missing)
    run_name = f"golden-{framework}"
    reprocube("train", f"framework={framework}", *CONFIG, "data_dir=data", f"run_name={run_name}", cwd=fashion_data)
    manifest = json.loads(
        (fashion_data / "runs" / run_name / "checkpoints" / "epoch-0002" / "manifest.json").read_text()
    )
    digest = manifest["weights_digest"]
    if os.environ.get("REPROCUBE_RECORD_GOLDEN"):
        recorded = json.loads(GOLDEN.read_text()) if GOLDEN.exists() else {}  # the other frameworks' records
        recorded.setdefault(framework, {})[key] = digest
        GOLDEN.write_text(json.dumps(recorded, indent=1, sort_keys=True) + "\n")
    assert digest == recorded[framework][key]


def _version(package: str) -> str | None:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:  # tensorflow-cpu here, tensorflow in the GPU image
        return None
