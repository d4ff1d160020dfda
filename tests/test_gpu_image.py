"""The GPU image (Dockerfile's default variant), checked on whatever machine has it built, a CPU-only one
included: it imports and runs everything on the CPU, its torchvision reads Fashion-MNIST exactly as
reprocube's own IDX reader does, and its trainers give the CPU image's weights, bit for bit.

It skips where the GPU image is not built: CI builds only the CPU image (scripts/container-setup.sh).
The image is built rarely (12.6 GB, from an offline wheelhouse) and the code changes often, so the tests
run this checkout's source layered onto it (CHECKOUT_IMAGE): an image built from older code would
otherwise be compared with a CPU image built from today's (it happened: TensorFlow's oneDNN switch).
Build it with `docker build --build-arg BASE_IMAGE=reprocube-base:bookworm -t reprocube/reprocube:VERSION-gpu .`
(benchmarks/gpu-image.md); REPROCUBE_GPU_IMAGE names another tag. Where the image is present nothing
else skips: a broken image, a missing CPU image or missing Fashion-MNIST fail."""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import shutil
import subprocess
import tomllib
from pathlib import Path

import numpy as np
import pytest
import yaml

from reprocube.data.idx import parse_idx
from reprocube.training.backend import FRAMEWORKS

from helpers import epoch_digests, reprocube

pytestmark = pytest.mark.process  # every test here starts a process: not in make test-quick

REPO = Path(__file__).resolve().parents[1]
VERSION = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
GPU_IMAGE = os.environ.get("REPROCUBE_GPU_IMAGE", f"reprocube/reprocube:{VERSION}-gpu")
CPU_IMAGE = f"reprocube/reprocube:{VERSION}-cpu"
CHECKOUT_IMAGE = f"reprocube/reprocube:{VERSION}-gpu-checkout"
# The GPU image's dependencies with this checkout's reprocube, installed as the Dockerfile installs it.
CHECKOUT_LAYER = f"""FROM {GPU_IMAGE}
USER root
COPY pyproject.toml README.md /src/
COPY src/ /src/src/
RUN /opt/venv/bin/pip install --quiet --no-cache-dir --no-deps --no-build-isolation --no-index /src && rm -rf /src
USER reprocube
"""
FASHION_MNIST = Path("/usr/share/datasets/fashion-mnist")
PINS = yaml.safe_load((REPO / "src" / "reprocube" / "conf" / "dataset" / "fashion_mnist.yaml").read_text())["files"]
SPLITS = {"train": ("train_images", "train_labels"), "test": ("test_images", "test_labels")}
TRAIN = {
    "dataset": "fashion_mnist",
    "seed": 0,
    "epochs": 2,
    "threads": 1,
    "log": {"progress": False},
    "data": {"train_limit": 640, "test_limit": 320},
}


def _image_present(image: str) -> bool:
    return subprocess.run(["docker", "image", "inspect", image], capture_output=True).returncode == 0


def _absent() -> str | None:
    if shutil.which("docker") is None:
        return "docker is not installed"
    if subprocess.run(["docker", "info"], capture_output=True).returncode != 0:
        return "dockerd is not reachable"
    if not _image_present(GPU_IMAGE):
        return f"image {GPU_IMAGE} is not built (CI builds only the CPU image)"
    return None


@pytest.fixture(scope="module", autouse=True)
def gpu_image(tmp_path_factory):
    reason = _absent()
    if reason:
        pytest.skip(f"{reason}: benchmarks/gpu-image.md says how to build it")
    if not FASHION_MNIST.is_dir():
        pytest.fail(f"{FASHION_MNIST} is missing: apt-get install dataset-fashion-mnist")
    context = tmp_path_factory.mktemp("gpu-checkout")
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(REPO / name, context / name)
    shutil.copytree(REPO / "src", context / "src", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    (context / "Dockerfile").write_text(CHECKOUT_LAYER)
    build = subprocess.run(
        ["docker", "build", "--quiet", "--network=none", "-t", CHECKOUT_IMAGE, str(context)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert build.returncode == 0, f"layering this checkout onto {GPU_IMAGE} failed:\n{build.stderr[-4000:]}"


def docker_run(
    image: str, *args: str, mounts: dict[Path, str] | None = None, python: bool = False, timeout: float = 900
):
    """`docker run` as MLCube does it: no network, as the invoking user. mounts: host path -> container
    path (read-only, unless the container path ends in ':rw'). python=True runs `python -c ARGS[0]`."""
    command = ["docker", "run", "--rm", "--network=none", f"--user={os.getuid()}:{os.getgid()}"]
    for host, inside in (mounts or {}).items():
        command += ["-v", f"{host}:{inside}" if inside.endswith(":rw") else f"{host}:{inside}:ro"]
    if python:
        command += ["--entrypoint", "python", image, "-c", *args]
    else:
        command += [image, *args]
    result = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
    assert result.returncode == 0, f"{' '.join(command)} exited {result.returncode}:\n{result.stderr[-4000:]}"
    return result


IMPORTS = """
import importlib, json, re
from importlib import metadata
names = ["torch", "torchvision", "tensorflow", "jax", "flax", "optax", "grain", "torchdata", "reprocube"]
modules = {name: importlib.import_module(name) for name in names}
import jax, torch, torchvision
devices = jax.devices()
boxes = torch.tensor([[0.0, 0.0, 1.0, 1.0], [0.0, 0.0, 1.0, 1.0], [2.0, 2.0, 3.0, 3.0]])
installed = {d.metadata["Name"].lower() for d in metadata.distributions()}
print(json.dumps({
    "jax_platforms": sorted({d.platform for d in devices}),
    "jax_sum": float(jax.numpy.arange(4.0).sum()),
    "torch_cuda": torch.version.cuda,
    "torchvision_requires": [
        re.sub(r"[ ()]", "", r) for r in metadata.requires("torchvision") if r.startswith("torch")
    ],
    "torch": metadata.version("torch"),
    "nms": torchvision.ops.nms(boxes, torch.tensor([1.0, 0.9, 0.8]), 0.5).tolist(),
    "jax_cuda_plugins": sorted(n for n in installed if n.startswith("jax-cuda")),
    "image": json.load(open("/opt/reprocube/image.json")),
}))
"""


def test_everything_imports_and_jax_runs_on_the_cpu_despite_its_cuda_plugin():
    found = json.loads(docker_run(CHECKOUT_IMAGE, IMPORTS, python=True).stdout.splitlines()[-1])
    # Built from this checkout's lock (else rebuild the image).
    assert found["image"]["lock"] == "requirements.txt"
    assert found["image"]["lock_sha256"] == hashlib.sha256((REPO / "requirements.txt").read_bytes()).hexdigest()
    # No GPU here: JAX falls back to the CPU instead of failing on its CUDA plugin.
    assert found["jax_platforms"] == ["cpu"] and found["jax_sum"] == 6.0
    # JAX shares torch's CUDA 13 wheels (requirements.in: jax[cuda13]).
    assert found["jax_cuda_plugins"] == ["jax-cuda13-pjrt", "jax-cuda13-plugin"]
    assert found["torch_cuda"].split(".")[0] == "13"
    # torchvision is built for this torch and its compiled ops load.
    assert found["torchvision_requires"] == [f"torch=={found['torch']}"]
    assert found["nms"] == [0, 2]


def _sha(array: np.ndarray) -> list:
    return [str(array.dtype), list(array.shape), hashlib.sha256(np.ascontiguousarray(array).tobytes()).hexdigest()]


TORCHVISION_READ = """
import hashlib, json
import numpy as np
from torchvision.datasets import FashionMNIST
def sha(a):
    return [str(a.dtype), list(a.shape), hashlib.sha256(np.ascontiguousarray(a).tobytes()).hexdigest()]
out = {}
for split in ("train", "test"):
    ds = FashionMNIST("/data", train=split == "train", download=False)
    items = [ds[i] for i in range(len(ds))]  # (PIL image, int label): what a training loop receives
    out[split] = {
        "data": sha(ds.data.numpy()),
        "targets": sha(ds.targets.numpy()),
        "items": sha(np.stack([np.asarray(image) for image, _ in items])),
        "item_labels": sha(np.array([label for _, label in items], dtype=np.int64)),
        "modes": sorted({image.mode for image, _ in items}),
    }
print(json.dumps(out))
"""


def test_torchvision_reads_fashion_mnist_as_reprocubes_idx_reader_does(tmp_path):
    raw = tmp_path / "FashionMNIST" / "raw"  # torchvision's layout: ROOT/FashionMNIST/raw/<uncompressed IDX>
    raw.mkdir(parents=True)
    expected = {}
    for split, (images_key, labels_key) in SPLITS.items():
        arrays = []
        for key in (images_key, labels_key):
            name = PINS[key]["name"]
            payload = gzip.decompress((FASHION_MNIST / f"{name}.gz").read_bytes())
            assert hashlib.sha256(payload).hexdigest() == PINS[key]["sha256"], f"{name}: not the pinned file"
            (raw / name).write_bytes(payload)
            arrays.append(parse_idx(payload, name))
        images, labels = arrays
        assert images.shape == ({"train": 60000, "test": 10000}[split], 28, 28)
        as_int64 = labels.astype(np.int64)  # torchvision's targets are int64; the values are reprocube's bytes
        expected[split] = {
            "data": _sha(images),
            "targets": _sha(as_int64),
            "items": _sha(images),
            "item_labels": _sha(as_int64),
            "modes": ["L"],
        }
    found = json.loads(docker_run(CHECKOUT_IMAGE, TORCHVISION_READ, mounts={tmp_path: "/data"}, python=True).stdout)
    assert found == expected


@pytest.fixture(scope="module")
def fashion_data(tmp_path_factory) -> Path:
    work = tmp_path_factory.mktemp("gpu-image")
    reprocube("download", "dataset=fashion_mnist", "data_dir=data", f"data.source_dir={FASHION_MNIST}", cwd=work)
    (work / "train.yaml").write_text(yaml.safe_dump(TRAIN))
    return work


@pytest.mark.slow
@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_the_gpu_images_trainers_give_the_cpu_images_weights(fashion_data, framework):
    if not _image_present(CPU_IMAGE):
        pytest.fail(f"{CPU_IMAGE} is missing (scripts/container-setup.sh builds it): the reference for this test")
    runs = {}
    for variant, image in (("cpu", CPU_IMAGE), ("gpu", CHECKOUT_IMAGE)):
        out = fashion_data / "runs" / variant
        out.mkdir(parents=True, exist_ok=True)
        docker_run(
            image,
            framework,
            "--parameters_file=/work/train.yaml",
            "--data_dir=/work/data",
            f"--runs_dir=/work/runs/{variant}",
            mounts={
                fashion_data / "train.yaml": "/work/train.yaml",
                fashion_data / "data": "/work/data",
                out: f"/work/runs/{variant}:rw",
            },
        )
        runs[variant] = out / f"{framework}-seed0"
    gpu_env = json.loads((runs["gpu"] / "env.json").read_text())
    assert gpu_env["container"]["image"] == f"reprocube/reprocube:{VERSION}-gpu"
    assert gpu_env["container"]["build"]["lock"] == "requirements.txt"
    # Both images ran this checkout's code (else the comparison says nothing about it).
    sources = {
        v: json.loads((run / "receipt.json").read_text())["reprocube"]["source_sha256"] for v, run in runs.items()
    }
    assert sources["gpu"] == sources["cpu"], f"{CPU_IMAGE} was built from other code: scripts/container-setup.sh"
    digests = epoch_digests(runs["cpu"])
    assert list(digests) == ["epoch-0001", "epoch-0002"]
    assert epoch_digests(runs["gpu"]) == digests
