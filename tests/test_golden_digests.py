"""The final weights_digest of each framework on a fixed small Fashion-MNIST config, checked against
digests recorded before a refactoring (issue 14: "not one bit changes").

CPU kernels give different bits on different ISAs (../shared/notes/numerics.md), and a lock bump may
change them too, so the recorded digests are keyed by the CPU's ISA flags and the frameworks' versions:
on a machine with no record the test skips and says how to add one, except in CI (.ci/run sets
REPROCUBE_REQUIRE_GOLDEN=1), where a missing record fails: both machine kinds are recorded, so a missing
key there means a lock bump or a new kind of machine, and the digests must be recorded before the change
lands. To record on this machine:
    REPROCUBE_RECORD_GOLDEN=1 .venv/bin/python -m pytest tests/test_golden_digests.py

A deliberate numeric change re-records its variant; where it was made on one machine kind only, the other
kind's record is listed in AWAITING_RECORD and skips there (even in CI) with what to run, until it is
recorded. The variants pin the former numerics too (pytorch-contiguous: PyTorch before channels_last
became its default; jax-convolution: JAX before conv2 became a matrix product; tensorflow-one-tower:
TensorFlow before its batch ran as two towers), which every run and receipt made before the change still
reproduces with.

On an AVX-512 machine the AVX2 caps of `reproduce --match` are tried against the AVX2 machine's records:
TensorFlow's and PyTorch's digests under the caps are the AVX2 machine's, bit for bit (PyTorch's only
since MKL_CBWR=AVX2 left the caps); JAX's are not (established 2026-11-26, benchmarks/cross-machine.md).
CAPS_EMULATE_AVX2 holds that finding, and the test fails if either side of it changes. QEMU's model of the
AVX2 machine's CPU gives every one of its records, JAX's too (tests/test_cpu_emulation.py): JAX's dots run
in YNNPACK, which picks its kernels from the CPU itself, and no variable caps it.
"""

from __future__ import annotations

import json
import os
from importlib import metadata
from pathlib import Path

import pytest

from reprocube.analysis.match_plan import AVX2_CAPS

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
# Each recorded variant: its framework and the overrides it adds to CONFIG.
VARIANTS = {
    "pytorch": ("pytorch", ()),
    "pytorch-contiguous": ("pytorch", ("framework.memory_format=contiguous",)),
    "tensorflow": ("tensorflow", ()),
    "tensorflow-one-tower": ("tensorflow", ("framework.towers=1",)),
    "jax": ("jax", ()),
    "jax-convolution": ("jax", ("framework.conv2=convolution",)),
}
# Records not yet made on one machine kind, and why: these skip there, in CI too, naming the command.
# The predictions come from QEMU's model of the AVX2 machine's CPU (tests/test_cpu_emulation.py), which
# gives that machine's recorded digests for every other variant; once recorded, that test compares them.
AWAITING_RECORD = {
    ("pytorch", "avx2"): "framework.memory_format=channels_last became PyTorch's default on an AVX-512 machine "
    "(2026-11-26); no AVX2 machine has recorded its digest yet (issue 37). QEMU's EPYC-Milan-v1 and the AVX2 "
    "caps both predict ab7186ef523e728fee06df536d8799f22f05f08ef8b98fcc49fd29a77feb6e9b",
    ("jax", "avx2"): "framework.conv2=matmul became JAX's default on an AVX-512 machine (2026-11-26); no AVX2 "
    "machine has recorded its digest yet (issue 37). QEMU's EPYC-Milan-v1 predicts 9d82cf380c1381e05ec317329410"
    "fc739362028a058675cb835d3c7f97cb52a2",
    ("tensorflow", "avx2"): "framework.towers=2 became TensorFlow's default on an AVX-512 machine (2026-11-26); no "
    "AVX2 machine has recorded its digest yet (issue 37). QEMU's EPYC-Milan-v1 and the AVX2 caps both predict "
    "075812c74ab96305c5a5850210f5bc96f645e6ecef69233b65ac1b9962844535",
}
# Whether the AVX2 caps, on an AVX-512 machine, give the AVX2 machine's recorded digest (established).
CAPS_EMULATE_AVX2 = {"tensorflow-one-tower": True, "pytorch-contiguous": True, "jax-convolution": False}
VERSIONED = {
    "pytorch": ("torch",),
    "tensorflow": ("tensorflow", "tensorflow-cpu", "keras"),
    "jax": ("jax", "jaxlib", "flax", "optax"),
}


def machine_key(framework: str, isa: list[str] | None = None) -> str:
    """The record's key: the CPU's ISA flags (this machine's unless given) and the versions that pick kernels."""
    from reprocube.formats.env import collect_env

    isa = ",".join(collect_env({})["cpu"]["isa"] if isa is None else isa)
    versions = ",".join(f"{p}={_version(p)}" for p in ("numpy", *VERSIONED[framework]))
    return f"isa={isa};{versions}"


def machine_kind() -> str:
    from reprocube.formats.env import collect_env

    return "avx512" if "avx512f" in collect_env({})["cpu"]["isa"] else "avx2"


def train_digest(cwd: Path, variant: str, env_extra: dict | None = None, cpu: str | None = None) -> str:
    """The variant's final weights_digest, trained here (under `env_extra`, on the emulated CPU `cpu`)."""
    framework, overrides = VARIANTS[variant]
    run_name = f"golden-{variant}" + ("-caps" if env_extra else "") + (f"-{cpu}" if cpu else "")
    args = ("train", f"framework={framework}", *CONFIG, *overrides, "data_dir=data", f"run_name={run_name}")
    reprocube(*args, cwd=cwd, env_extra=env_extra, cpu=cpu, timeout=900)
    manifest = json.loads((cwd / "runs" / run_name / "checkpoints" / "epoch-0002" / "manifest.json").read_text())
    return manifest["weights_digest"]


@pytest.fixture(scope="module")
def fashion_data(fashion_mnist, tmp_path_factory) -> Path:
    """A working directory whose data/ is the session's Fashion-MNIST."""
    cwd = tmp_path_factory.mktemp("golden")
    (cwd / "data").symlink_to(fashion_mnist)
    return cwd


@pytest.mark.process
@pytest.mark.slow
@pytest.mark.parametrize("variant", VARIANTS)
def test_final_digest_matches_the_recorded_one(fashion_data, variant):
    key = machine_key(VARIANTS[variant][0])
    recorded = json.loads(GOLDEN.read_text()) if GOLDEN.exists() else {}
    if key not in recorded.get(variant, {}) and not os.environ.get("REPROCUBE_RECORD_GOLDEN"):
        missing = f"no digest recorded for {variant} on {key}; record it with {RECORD_COMMAND}"
        awaiting = AWAITING_RECORD.get((variant, machine_kind()))
        if awaiting:
            pytest.skip(f"{awaiting}: {missing}")
        if os.environ.get("REPROCUBE_REQUIRE_GOLDEN"):
            pytest.fail(missing)
        pytest.skip(missing)
    digest = train_digest(fashion_data, variant)
    if os.environ.get("REPROCUBE_RECORD_GOLDEN"):
        recorded = json.loads(GOLDEN.read_text()) if GOLDEN.exists() else {}  # the other variants' records
        recorded.setdefault(variant, {})[key] = digest
        GOLDEN.write_text(json.dumps(recorded, indent=1, sort_keys=True) + "\n")
    assert digest == recorded[variant][key]


def test_every_variant_awaiting_a_record_lacks_it():
    """An AWAITING_RECORD entry whose record exists would hide a digest check: remove the entry."""
    recorded = json.loads(GOLDEN.read_text())
    for variant, kind in AWAITING_RECORD:
        isas = [key.split(";")[0] for key in recorded.get(variant, {})]
        assert not any(("avx512f" in isa) == (kind == "avx512") for isa in isas), (variant, kind)


@pytest.mark.process
@pytest.mark.slow
@pytest.mark.parametrize("variant", CAPS_EMULATE_AVX2)
def test_avx2_caps_give_the_avx2_machines_digest_as_established(fashion_data, variant):
    """The caps `reproduce --match` sets for an AVX2 receipt, tried against the real AVX2 machine's record."""
    if machine_kind() != "avx512":
        pytest.skip("the AVX2 caps emulate an AVX2 machine on an AVX-512 one; this is an AVX2 machine")
    from reprocube.formats.env import collect_env

    avx2_isa = [flag for flag in collect_env({})["cpu"]["isa"] if not flag.startswith("avx512")]
    key = machine_key(VARIANTS[variant][0], avx2_isa)
    recorded = json.loads(GOLDEN.read_text()).get(variant, {})
    if key not in recorded:
        pytest.skip(f"no AVX2 machine's digest recorded for {variant} on {key}")
    digest = train_digest(fashion_data, variant, env_extra=AVX2_CAPS)
    assert (digest == recorded[key]) is CAPS_EMULATE_AVX2[variant], (
        f"{variant} under the AVX2 caps: {digest}, the AVX2 machine's record {recorded[key]}; the established "
        f"finding (CAPS_EMULATE_AVX2[{variant!r}] = {CAPS_EMULATE_AVX2[variant]}) no longer holds: update it and "
        "benchmarks/cross-machine.md"
    )


def _version(package: str) -> str | None:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:  # tensorflow-cpu here, tensorflow in the GPU image
        return None
