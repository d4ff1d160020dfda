"""What the GPU path does that a CPU can check: the determinism settings that CUDA libraries read once are
set before they are read, and every CUDA generator is saved and restored (torch.cuda faked here)."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

FRAMEWORKS = Path(__file__).resolve().parents[1] / "src" / "reprocube" / "frameworks"


def _first_line(tree: ast.Module, predicate) -> int:
    return min(node.lineno for node in ast.walk(tree) if predicate(node))


@pytest.mark.process
def test_the_cublas_workspace_is_set_before_torch_is_imported():
    tree = ast.parse((FRAMEWORKS / "pytorch.py").read_text())
    sets = _first_line(tree, lambda n: isinstance(n, ast.Constant) and n.value == "CUBLAS_WORKSPACE_CONFIG")
    imports = _first_line(
        tree,
        lambda n: (
            isinstance(n, (ast.Import, ast.ImportFrom))
            and any(a.name.split(".")[0] == "torch" for a in n.names)
            or isinstance(n, ast.ImportFrom)
            and (n.module or "").split(".")[0] == "torch"
        ),
    )
    assert sets < imports
    script = "import os, sys; import reprocube.frameworks.pytorch; print(os.environ['CUBLAS_WORKSPACE_CONFIG'])"
    shown = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    assert shown.stdout.strip() == ":4096:8"
    kept = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        check=True,
        env={**__import__("os").environ, "CUBLAS_WORKSPACE_CONFIG": ":16:8"},
    )
    assert kept.stdout.strip() == ":16:8", "a user's own setting is kept"


@pytest.mark.process
def test_xla_gets_the_gpu_determinism_flag_before_jax_creates_a_backend():
    tree = ast.parse((FRAMEWORKS / "jax.py").read_text())
    init = next(
        f
        for c in tree.body
        if isinstance(c, ast.ClassDef) and c.name == "JaxBackend"
        for f in c.body
        if isinstance(f, ast.FunctionDef) and f.name == "__init__"
    )
    first = init.body[0]
    assert isinstance(first, ast.Expr) and ast.unparse(first) == "_prepare_xla(cfg)", "XLA is prepared first"
    script = """
import os
from types import SimpleNamespace
os.environ["XLA_FLAGS"] = "--xla_cpu_enable_fast_math=false"
import jax
import jax._src.xla_bridge as xb
import reprocube.frameworks.jax as trainer
assert not xb._backends, "importing the trainer created a backend"
trainer._prepare_xla(SimpleNamespace(deterministic=True, device="cpu", threads=1))
assert not xb._backends
# device=cpu keeps this process off a GPU: jax read JAX_PLATFORMS at its import, before the trainer ran
# (an H100 host trained device=cpu on the GPU); the config is what decides.
assert jax.config.jax_platforms == "cpu", jax.config.jax_platforms
print(os.environ["XLA_FLAGS"])
"""
    env = {k: v for k, v in os.environ.items() if k != "JAX_PLATFORMS"}  # as on a host with a GPU
    shown = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env)
    assert shown.returncode == 0, shown.stderr[-2000:]
    assert shown.stdout.split() == ["--xla_cpu_enable_fast_math=false", "--xla_gpu_deterministic_ops=true"]


def test_every_cuda_generator_is_saved_and_restored(monkeypatch):
    torch = pytest.importorskip("torch")
    from reprocube.frameworks.pytorch import CUDA_GENERATOR_PREFIX, Net, PytorchBackend
    from reprocube.frameworks.torch_sgd import MomentumSGD

    states = [torch.arange(16, dtype=torch.uint8), torch.arange(16, 32, dtype=torch.uint8)]
    restored = {}
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "get_rng_state_all", lambda: states)
    monkeypatch.setattr(torch.cuda, "set_rng_state", lambda state, device: restored.__setitem__(device, state))
    backend = object.__new__(PytorchBackend)  # the trainer's state code, without a device to train on
    backend.device = torch.device("cpu")
    backend.model = Net()
    backend.optimizer = MomentumSGD(backend.model.parameters(), lr=0.01, momentum=0.5)
    exported = backend.export_state()
    assert sorted(k for k in exported.rng if k.startswith(CUDA_GENERATOR_PREFIX)) == ["torch.cuda.0", "torch.cuda.1"]
    assert np.array_equal(exported.rng["torch.cuda.1"], states[1].numpy())
    backend.import_state(exported)
    assert sorted(restored) == [0, 1] and all(torch.equal(restored[i], states[i]) for i in (0, 1))
