"""The environment fingerprint written to env.json: what can make two runs of the same config differ."""

from __future__ import annotations

import hashlib
import os
import platform
import re
import sys
from importlib import metadata
from pathlib import Path

from reprocube.errors import ReprocubeError
from reprocube.untrusted import parse_json, read_bytes

PACKAGES = (
    "reprocube",
    "numpy",
    "hydra-core",
    "omegaconf",
    "safetensors",
    "torch",
    "tensorflow",
    "tensorflow-cpu",
    "keras",
    "jax",
    "jaxlib",
    "flax",
    "optax",
)
# Variables that can change which kernels run or how they round (recorded whenever set). TensorFlow's are
# named one by one: a `TF_` prefix also catches Terraform's (TF_CLI_CONFIG_FILE, ...).
ENV_VARS = (
    "PYTHONHASHSEED",
    "CUBLAS_WORKSPACE_CONFIG",
    "CUDA_VISIBLE_DEVICES",
    "NVIDIA_TF32_OVERRIDE",
    "TF_ENABLE_ONEDNN_OPTS",
    "TF_DETERMINISTIC_OPS",
    "TF_CUDNN_DETERMINISTIC",
    "TF_XLA_FLAGS",
    "TF_NUM_INTRAOP_THREADS",
    "TF_NUM_INTEROP_THREADS",
    "TF_ENABLE_XLA",
    "TF_FORCE_GPU_ALLOW_GROWTH",
)
ENV_PREFIXES = ("ONEDNN_", "DNNL_", "ATEN_", "OMP_", "KMP_", "MKL_", "XLA_", "JAX_", "KERAS_")
# The only variables `reproduce --match` sets on this machine, each with the values it accepts: the ISA caps
# and thread counts that select kernels and so change rounding. A receipt is someone else's file: any other
# variable it records (PYTHONPATH, LD_PRELOAD, XLA_FLAGS=--xla_dump_to=...) could run code or write files
# here, so it is reported, never applied (docs/security.md, "What a receipt can do").
_ISA_NAME = r"[A-Za-z0-9_]{1,32}"
_COUNT = r"[1-9][0-9]{0,2}|10[01][0-9]|102[0-4]"  # 1..1024 threads (config_validation.MAX_THREADS)
_XLA_FLAG = r"--xla_cpu_[a-z0-9_]{1,60}=[A-Za-z0-9_.]{1,32}|--xla_gpu_deterministic_ops=(true|false)"
MATCHABLE_ENV_VARS = {
    "ONEDNN_MAX_CPU_ISA": _ISA_NAME,
    "DNNL_MAX_CPU_ISA": _ISA_NAME,
    "ONEDNN_DEFAULT_FPMATH_MODE": _ISA_NAME,
    "ATEN_CPU_CAPABILITY": _ISA_NAME,
    "MKL_CBWR": r"[A-Za-z0-9_]{1,32}(,[A-Za-z0-9_]{1,32})?",
    "MKL_ENABLE_INSTRUCTIONS": _ISA_NAME,
    "MKL_NUM_THREADS": _COUNT,
    "OMP_NUM_THREADS": _COUNT,
    "OMP_DYNAMIC": r"(?i:true|false)",
    "TF_NUM_INTRAOP_THREADS": _COUNT,
    "TF_NUM_INTEROP_THREADS": _COUNT,
    "TF_ENABLE_ONEDNN_OPTS": r"[01]",
    "TF_DETERMINISTIC_OPS": r"[01]|(?i:true|false)",
    "TF_CUDNN_DETERMINISTIC": r"[01]|(?i:true|false)",
    "NVIDIA_TF32_OVERRIDE": r"[01]",
    "CUBLAS_WORKSPACE_CONFIG": r":[0-9]{1,6}:[0-9]{1,6}",
    "JAX_ENABLE_X64": r"[01]|(?i:true|false)",
    "JAX_DEFAULT_MATMUL_PRECISION": r"[a-z0-9_]{1,32}",
    "XLA_FLAGS": rf"({_XLA_FLAG})( ({_XLA_FLAG})){{0,15}}",
}


def refused_match_setting(name: str, value: str | None) -> str | None:
    """Why `reproduce --match` will not set `name` to `value` here (None: it may; a None value unsets it)."""
    if name not in MATCHABLE_ENV_VARS:
        return "not one of the documented ISA and thread variables --match sets"
    if value is not None and not re.fullmatch(MATCHABLE_ENV_VARS[name], value):
        return "its value is not of the form this variable takes"
    return None


# ISA extensions that change which CPU kernels run (and so the rounding of reductions).
ISA_FLAGS = (
    "sse4_2",
    "avx",
    "avx2",
    "fma",
    "avx512f",
    "avx512bw",
    "avx512vl",
    "avx512_bf16",
    "avx512_vnni",
    "amx_tile",
    "amx_bf16",
)


def known_hang(omp_thread_limit: str | None) -> str | None:
    """A setting known to make training hang here, named when a child makes no progress (shared notes:
    OMP_THREAD_LIMIT=1 makes PyTorch's oneDNN convolution backward spin forever, plain torch too)."""
    if omp_thread_limit is not None and omp_thread_limit.strip() == "1":
        return "OMP_THREAD_LIMIT=1 is set: PyTorch's oneDNN convolution backward is known to spin forever under it"
    return None


def collect_env(framework_info: dict) -> dict:
    return {
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "machine": platform.machine(),
        "hostname": platform.node(),
        "cpu": _cpu_info(),
        "packages": _package_versions(),
        "env_vars": {k: v for k, v in sorted(os.environ.items()) if k in ENV_VARS or k.startswith(ENV_PREFIXES)},
        "container": _container(),
        "framework": framework_info,
    }


def usable_cpus() -> int | None:
    """How many CPUs this process may run on: its affinity (taskset, a SLURM job's CPUs), lowered by a
    cgroup v2 CPU quota (a container's --cpus), where the platform says."""
    affinity = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None
    quota = _cgroup_cpu_quota()
    return min(n for n in (affinity, quota) if n is not None) if affinity or quota else None


def _cgroup_cpu_quota() -> int | None:
    """ceil(quota / period) of /sys/fs/cgroup/cpu.max ("max 100000": none), None where there is none."""
    try:
        quota, period = Path("/sys/fs/cgroup/cpu.max").read_text().split()[:2]
        return max(1, -(-int(quota) // int(period))) if quota != "max" else None
    except (OSError, ValueError):
        return None


def threads_warning(framework: str, threads: int, usable: int | None) -> str | None:
    """What running `threads` intra-op threads on `usable` CPUs means, or None where they fit. Measured
    here: threads=1024 on 2 CPUs trained 80x slower. XLA (JAX) splits its work by the CPUs it may use,
    so there the weights themselves change (PyTorch and TensorFlow split by `threads`: only slower)."""
    if not usable or threads <= usable:
        return None
    text = (
        f"threads={threads} but this process may use {usable} CPUs: expect it to run slower, about "
        f"{threads / usable:.0f}x the threads per CPU (threads=1024 on 2 CPUs trained 80x slower here)"
    )
    if framework == "jax":
        text += (
            f"; and with JAX the result WILL DIFFER from a run with {threads} usable CPUs (XLA splits its work "
            "by the CPUs it may use)"
        )
    return text


def _cpu_info() -> dict:
    info = {
        "count": os.cpu_count(),
        "affinity": usable_cpus(),
        "model": platform.processor() or None,
        "isa": [],
    }
    model, flags = _first_cpu()
    info["model"] = info["model"] or model or None
    offered = cpuid_features()
    if offered is None:
        info["isa"] = [f for f in ISA_FLAGS if f in flags]
        return info
    masked = any(_CPUID_NAMES[f] not in offered for f in _CPUID_NAMES if f in flags)
    # A flag numpy cannot confirm (AMX) is kept only where CPUID offers everything /proc/cpuinfo lists
    info["isa"] = [
        f for f in ISA_FLAGS if f in flags and (_CPUID_NAMES[f] in offered if f in _CPUID_NAMES else not masked)
    ]
    if masked and info["model"]:  # an emulated or masked CPU: the name is the real one's, the ISA is not
        info["model"] += f" ({MASKED_NOTE})"
    return info


# Added to the CPU's name where its CPUID offers fewer features than /proc/cpuinfo lists.
MASKED_NOTE = "CPUID offers fewer features than /proc/cpuinfo: an emulated or masked CPU"


def cpu_signature() -> str:
    """What compiled code depends on: the architecture, the CPU model, its full flag list and what its
    CPUID offers this process (an emulated CPU's code is never another's)."""
    model, flags = _first_cpu()
    offered = " ".join(sorted(cpuid_features() or ()))
    return f"{platform.machine()}\n{model or platform.processor()}\n{' '.join(sorted(flags))}\n{offered}"


# ISA_FLAGS as numpy names the CPUID features it detects.
_CPUID_NAMES = {
    "sse4_2": "SSE42",
    "avx": "AVX",
    "avx2": "AVX2",
    "fma": "FMA3",
    "avx512f": "AVX512F",
    "avx512bw": "AVX512BW",
    "avx512vl": "AVX512VL",
    "avx512_bf16": "AVX512BF16",
    "avx512_vnni": "AVX512VNNI",
}


def cpuid_features() -> frozenset[str] | None:
    """The features the CPUID instruction offers this process, as numpy detected them (None: unknown).
    Every kernel library dispatches on CPUID, not on /proc/cpuinfo, and under a CPU emulator
    (reprocube.runtime.cpu_emulation) the two differ: /proc/cpuinfo still describes the real CPU."""
    try:
        from numpy._core._multiarray_umath import __cpu_features__
    except ImportError:
        return None
    return frozenset(name for name, present in __cpu_features__.items() if present)


def _first_cpu() -> tuple[str, set[str]]:
    """The first processor's model name and flags in /proc/cpuinfo ("" and none where it cannot be read)."""
    model = ""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return model, set()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "model name" and not model:
            model = value.strip()
        elif key.strip() == "flags":
            return model, set(value.split())
    return model, set()


def _package_versions() -> dict:
    versions = {}
    for name in PACKAGES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return versions


def _container() -> dict | None:
    """Which container runtime and image this runs in. The image is named by REPROCUBE_IMAGE and
    described by the build record REPROCUBE_IMAGE_INFO points at (variant, base image, lock and installed
    package hashes): an image cannot know its own registry digest."""
    if os.environ.get("SINGULARITY_CONTAINER") or os.environ.get("APPTAINER_CONTAINER"):
        info = _singularity(os.environ.get("APPTAINER_CONTAINER") or os.environ["SINGULARITY_CONTAINER"])
    elif Path("/.dockerenv").exists() or Path("/run/.containerenv").exists():
        info = {"runtime": "docker", "image": os.environ.get("REPROCUBE_IMAGE")}
    else:
        return None
    build = _image_build_record()
    if build is not None:
        info["build"] = build
    return info


# Written into every SIF by its build (org.label-schema.*), beside the recipe's own labels.
SIF_LABELS = Path("/.singularity.d/labels.json")


def _singularity(image: str) -> dict:
    """A Singularity/Apptainer container: the SIF's path and sha256 (where the file is visible inside: the
    MLCube binds its folder read-only), the Apptainer or Singularity version that built it and the Docker
    image it was built from (its name from the image's environment, its id from the SIF's labels; the
    running Apptainer's version is not visible from inside)."""
    info: dict = {"runtime": "singularity", "image": image, "docker_image": os.environ.get("REPROCUBE_IMAGE")}
    try:
        labels = parse_json(
            read_bytes(SIF_LABELS, 1 << 20, ReprocubeError, follow_links=True), str(SIF_LABELS), ReprocubeError
        )
    except ReprocubeError:
        labels = {}
    labels = labels if isinstance(labels, dict) else {}
    for key, label in (
        ("built_with_apptainer", "org.label-schema.usage.apptainer.version"),
        ("built_with_singularity", "org.label-schema.usage.singularity.version"),
        ("docker_image_id", "org.reprocube.docker-image-id"),
    ):
        if isinstance(labels.get(label), str):
            info[key] = labels[label]
    info["sif_sha256"] = _file_sha256(Path(image))
    return info


def _file_sha256(path: Path) -> str | None:
    """sha256 of a (multi-GB) image file, None where it cannot be read from here."""
    try:
        with path.open("rb") as file:
            return hashlib.file_digest(file, "sha256").hexdigest()
    except OSError:
        return None


def _image_build_record() -> dict | None:
    path = os.environ.get("REPROCUBE_IMAGE_INFO")
    if not path:
        return None
    try:
        return parse_json(read_bytes(Path(path), 1 << 20, ReprocubeError, follow_links=True), path, ReprocubeError)
    except ReprocubeError as exc:
        return {"unreadable": str(exc)}
