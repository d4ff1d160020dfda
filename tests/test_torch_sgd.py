"""The PyTorch trainer's SGD (frameworks/torch_sgd.py) against torch.optim.SGD: the same bits after every
step, on torch's single-tensor path (the CPU's) and on its foreach path (CUDA's, run here through the
CPU's foreach kernels), and a trainer that never imports torch._dynamo."""

from __future__ import annotations

import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")

from reprocube.frameworks.pytorch import Net  # noqa: E402
from reprocube.frameworks.torch_sgd import MomentumSGD  # noqa: E402


def _bits(tensors) -> list[bytes]:
    return [t.detach().cpu().contiguous().view(torch.int32).numpy().tobytes() for t in tensors]


def _train(make_optimizer, steps: int, device: str = "cpu"):
    torch.manual_seed(3)
    model = Net().to(device)
    optimizer = make_optimizer(model.parameters())
    generator = torch.Generator().manual_seed(5)
    images = torch.randn(steps, 16, 1, 28, 28, generator=generator).to(device)
    labels = torch.randint(0, 10, (steps, 16), generator=generator).to(device)
    history = []
    for step in range(steps):
        optimizer.zero_grad()
        torch.nn.functional.nll_loss(model(images[step]), labels[step]).backward()
        optimizer.step()
        momentum = [optimizer.state[p]["momentum_buffer"] for p in model.parameters()]
        history.append(_bits(model.parameters()) + _bits(momentum))
    return history


@pytest.fixture
def deterministic_kernels(monkeypatch):
    """As the trainer sets them for deterministic=true (frameworks/pytorch.py), undone after the test."""
    monkeypatch.setattr(torch.backends.cudnn, "deterministic", True)
    monkeypatch.setattr(torch.backends.cudnn, "benchmark", False)
    was = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    yield
    torch.use_deterministic_algorithms(was)


CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device (a lent GPU runs it)")


@pytest.mark.parametrize(
    "device, torch_foreach",
    [("cpu", None), ("cpu-foreach", True), pytest.param("cuda", None, marks=CUDA)],
    ids=["cpu-single-tensor", "cpu-foreach", "cuda-foreach"],
)
def test_every_step_is_bit_identical_to_torch_sgd(device, torch_foreach, monkeypatch, deterministic_kernels):
    """Each against torch's SGD with its defaults on the device (one tensor at a time on the CPU, foreach
    on CUDA), and the foreach path through the CPU's foreach kernels as well."""
    if device == "cpu-foreach":
        monkeypatch.setattr("reprocube.frameworks.torch_sgd.FOREACH_DEVICES", ("cpu",))
        device = "cpu"
    # deterministic_kernels: the trainer's. Without them cuDNN's convolution backward gives other gradients
    # from the same inputs (found on an H100, 2026-11-26): the test compared kernels, not optimizers. The
    # control (torch's SGD twice) shows the kernels are deterministic, so a difference is the optimizer's.
    ours = _train(lambda params: MomentumSGD(params, lr=0.05, momentum=0.9), 6, device)
    theirs = _train(lambda params: torch.optim.SGD(params, lr=0.05, momentum=0.9, foreach=torch_foreach), 6, device)
    assert theirs == _train(
        lambda params: torch.optim.SGD(params, lr=0.05, momentum=0.9, foreach=torch_foreach), 6, device
    )
    assert len(ours) == 6 and all(a == b for a, b in zip(ours, theirs, strict=True))
    assert ours[0] != ours[1]  # the steps changed something


def test_without_momentum_no_buffer_is_kept_and_the_update_is_torchs():
    torch.manual_seed(0)
    ours_model, theirs_model = Net(), Net()
    theirs_model.load_state_dict(ours_model.state_dict())
    ours, theirs = MomentumSGD(ours_model.parameters(), 0.1, 0.0), torch.optim.SGD(theirs_model.parameters(), lr=0.1)
    images, labels = torch.randn(8, 1, 28, 28), torch.arange(8)
    for model, optimizer in ((ours_model, ours), (theirs_model, theirs)):
        torch.manual_seed(1)  # the same dropout masks
        torch.nn.functional.nll_loss(model(images), labels).backward()
        optimizer.step()
    assert not ours.state and _bits(ours_model.parameters()) == _bits(theirs_model.parameters())


def test_step_hooks_run_around_the_update_and_are_removable():
    model = Net()
    optimizer = MomentumSGD(model.parameters(), 0.1, 0.5)
    seen = []
    pre = optimizer.register_step_pre_hook(lambda opt, args, kwargs: seen.append(("pre", opt is optimizer)))
    optimizer.register_step_post_hook(lambda opt, args, kwargs: seen.append(("post", len(opt.state))))
    torch.nn.functional.nll_loss(model(torch.randn(2, 1, 28, 28)), torch.tensor([1, 2])).backward()
    optimizer.step()
    pre.remove()
    optimizer.step()  # gradients are kept until zero_grad: a second update, without the removed hook
    assert seen == [("pre", True), ("post", 8), ("post", 8)]  # a buffer for each of the 8 parameters
    optimizer.zero_grad()
    assert all(p.grad is None for p in model.parameters())


@pytest.mark.process
def test_a_pytorch_training_step_imports_neither_dynamo_nor_inductor(generated):
    """torch.optim.SGD imports torch._dynamo (1-1.5 s a process here); torch.use_deterministic_algorithms
    imports torch._inductor. A trainer's whole step, deterministic, loads neither."""
    overrides = ["framework=pytorch", *generated.overrides()]
    script = (
        "import sys\n"
        "import numpy as np\n"
        "from reprocube.training.backend import create_backend\n"
        "from reprocube.config import load_config\n"
        "from reprocube.data.store import load_dataset\n"
        f"cfg = load_config({overrides!r})\n"
        "backend = create_backend(cfg, load_dataset(cfg))\n"
        "backend.begin_epoch(np.arange(64))\n"
        "backend.train_steps(np.array([[0, 32], [32, 64]]), 0)\n"
        "print(len(backend.group_losses()), 'torch._dynamo' in sys.modules, 'torch._inductor' in sys.modules)\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split("\n")[0] == "2 False False", done.stdout + done.stderr
