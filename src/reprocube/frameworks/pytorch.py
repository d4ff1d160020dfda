"""The PyTorch trainer: the reference tutorial's CNN, deterministic kernels, data resident on the device."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Callable

# cuBLAS reads this when CUDA initialises: it must be set before torch touches the GPU.
os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from reprocube.errors import CheckpointError, ConfigError
from reprocube.frameworks.torch_op_recorder import OpRecorder
from reprocube.frameworks.torch_sgd import MomentumSGD
from reprocube.training.backend import STEPS_PER_CALL, check_arrays
from reprocube.training.state import EpochTotals, FrameworkState

MOMENTUM_PREFIX = "momentum_buffer."
CPU_GENERATOR = "torch.cpu"
MEMORY_FORMATS = {"channels_last": torch.channels_last, "contiguous": torch.contiguous_format}
CUDA_GENERATOR_PREFIX = "torch.cuda."


class Net(nn.Module):
    """conv 1->10 k5, pool, relu, conv 10->20 k5, Dropout2d, pool, relu, dense 320->50, relu, dropout, dense 10."""

    def __init__(self, num_classes: int = 10):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 10, kernel_size=5)
        self.conv2 = nn.Conv2d(10, 20, kernel_size=5)
        self.conv2_drop = nn.Dropout2d()
        self.fc1 = nn.Linear(320, 50)
        self.fc2 = nn.Linear(50, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu(F.max_pool2d(self.conv1(x), 2))
        x = F.relu(F.max_pool2d(self.conv2_drop(self.conv2(x)), 2))
        x = x.flatten(1)
        x = F.relu(self.fc1(x))
        x = F.dropout(x, training=self.training)
        return F.log_softmax(self.fc2(x), dim=1)


def _select_device(requested: str) -> torch.device:
    if requested == "cuda" and not torch.cuda.is_available():
        raise ConfigError("device=cuda but torch sees no CUDA device")
    if requested == "auto":
        requested = "cuda" if torch.cuda.is_available() else "cpu"
    return torch.device(requested)


def _use_deterministic_algorithms(mode: bool) -> None:
    """torch.use_deterministic_algorithms(mode) without its import of torch._inductor, which it makes only to
    set torch.compile's own flag (reprocube compiles nothing): 1.5-6 s of every PyTorch process here, more
    than a whole epoch of the tests' runs. The eager flag is set where torch keeps it; where torch has no
    such function, or inductor is loaded anyway, the public call does it all."""
    setter = getattr(torch._C, "_set_deterministic_algorithms", None)
    if setter is None or "torch._inductor.config" in sys.modules:
        torch.use_deterministic_algorithms(mode)
    else:
        setter(mode, warn_only=False)


class PytorchBackend:
    def __init__(self, cfg, dataset):
        self.cfg = cfg
        self.device = _select_device(cfg.device)
        _use_deterministic_algorithms(cfg.deterministic)  # no warn_only: a nondeterministic op is an error
        # Deterministic mode also fills every new tensor's memory with NaN, a guard against kernels that
        # read memory they did not write. None of ours does (the tests compare the bits), and the fill
        # cost ~15% of a CPU epoch here.
        torch.utils.deterministic.fill_uninitialized_memory = False
        torch.backends.cudnn.deterministic = cfg.deterministic
        torch.backends.cudnn.benchmark = not cfg.deterministic
        torch.set_num_threads(cfg.threads)
        torch.manual_seed(cfg.seed)  # seeds the CPU generator (init) and every CUDA generator (dropout on GPU)

        # channels_last: oneDNN's NHWC convolutions and ATen's vectorised channels-last max pooling, ~20% of
        # a CPU step faster than the contiguous layout's blocked-format reorders (other bits: a result key).
        memory_format = MEMORY_FORMATS[cfg.framework.memory_format]
        self.model = Net(dataset.num_classes).to(self.device, memory_format=memory_format)
        self.optimizer = MomentumSGD(self.model.parameters(), lr=cfg.optimizer.lr, momentum=cfg.optimizer.momentum)
        self.x_train = torch.from_numpy(dataset.train.images).to(self.device)
        self.y_train = torch.from_numpy(dataset.train.labels).to(self.device)
        self.x_test = torch.from_numpy(dataset.test.images).to(self.device)
        self.y_test = torch.from_numpy(dataset.test.labels).to(self.device)
        self._classes = torch.arange(dataset.num_classes, device=self.device)
        self._order: torch.Tensor | None = None
        self._group_losses: list[torch.Tensor] = []
        self._init_fingerprints()
        # The epoch totals live in two tensors updated in place (a captured step graph adds to them).
        self._loss_sum = torch.zeros((), dtype=torch.float32, device=self.device)
        self._correct = torch.zeros((), dtype=torch.int64, device=self.device)
        # framework.cuda_graph: a whole training step of batch_size examples replayed as one CUDA graph,
        # captured at the first step it can run (_StepGraph); a step that is not its shape runs eagerly.
        self._use_step_graph = self.device.type == "cuda" and bool(cfg.framework.cuda_graph)
        self._step_graph: _StepGraph | None = None
        self._recording = False

    def _init_fingerprints(self) -> None:
        """The weight fingerprint (reprocube.formats.trace.fingerprint) of every step, on the device: each step copies
        the weights (flat views of the parameters, which the optimizer updates in place) into one row of a
        group buffer with a single cat; group_fingerprints sums each tensor's columns as int32 once per
        group. Summing each tensor after each step (8 reductions) cost 3.5% of a CPU epoch, int64 sums
        20x what int32 ones do here; an int32 sum wraps modulo 2**32 (two's complement adds on CPU and
        GPU), which is the fingerprint: tests/test_trace_fingerprint.py checks it against the NumPy
        reference on sums that overflow many times."""
        named = sorted(self.model.state_dict().items())
        self._fingerprint_views = [_memory_order_view(t) for _, t in named]  # they share the parameters' storage
        sizes = [t.numel() for t in self._fingerprint_views]
        self._fingerprint_offsets = np.concatenate([[0], np.cumsum(sizes)]).tolist()
        # Zeros, not empty: the row a step writes is an input of its recorded operations (the replay).
        self._fingerprint_rows = torch.zeros((STEPS_PER_CALL, sum(sizes)), dtype=torch.float32, device=self.device)

    def info(self) -> dict:
        info = {
            "name": "pytorch",
            "torch": torch.__version__,
            "device": str(self.device),
            "deterministic_algorithms": torch.are_deterministic_algorithms_enabled(),
            "fill_uninitialized_memory": torch.utils.deterministic.fill_uninitialized_memory,
            "cudnn_deterministic": torch.backends.cudnn.deterministic,
            "cudnn_benchmark": torch.backends.cudnn.benchmark,
            "num_threads": torch.get_num_threads(),
            "num_interop_threads": torch.get_num_interop_threads(),
            "cpu_capability": torch.backends.cpu.get_cpu_capability(),  # the ISA ATen dispatches to
            "mkldnn": torch.backends.mkldnn.is_available(),
            "onednn": _onednn_version(),
            "float32_matmul_precision": torch.get_float32_matmul_precision(),
        }
        if self.device.type == "cuda":
            props = torch.cuda.get_device_properties(self.device)
            info.update(
                gpu=props.name,
                gpu_capability=f"{props.major}.{props.minor}",
                gpu_sm_count=props.multi_processor_count,
                gpu_count=torch.cuda.device_count(),
                cuda=torch.version.cuda,
                cudnn=torch.backends.cudnn.version(),
                cublas=_cublas_version(),
                driver=_nvidia_driver(),
                tf32_matmul=torch.backends.cuda.matmul.allow_tf32,
                tf32_cudnn=torch.backends.cudnn.allow_tf32,
            )
        return info

    def begin_epoch(self, order: np.ndarray) -> None:
        self._order = torch.from_numpy(order).to(self.device)

    def train_steps(self, bounds, first_global_step: int) -> None:
        self._group_losses = []
        for lo, hi in bounds.tolist():
            self._train_step(lo, hi)

    def train_batches(self, batches, first_global_step: int) -> None:
        self._group_losses = []
        for images, labels in batches:
            self._batch_step(torch.from_numpy(images).to(self.device), torch.from_numpy(labels).to(self.device))

    def _train_step(self, lo: int, hi: int) -> None:
        index = self._order[lo:hi]
        graph = self._graph_for(hi - lo)
        if graph is not None:
            graph.run(index, row=len(self._group_losses))
            return
        self._batch_step(self.x_train.index_select(0, index), self.y_train.index_select(0, index))

    def _graph_for(self, batch: int) -> _StepGraph | None:
        """The captured step for a batch of `batch` examples, captured now if it can be: from the second
        step of a run (the first makes the momentum buffers, a copy of the gradient, which later steps
        update in place), at the configured batch size, never while operations are recorded (a graph's
        kernels pass by the recorder)."""
        if not self._use_step_graph or self._recording or batch != self.cfg.batch_size:
            return None
        if self._step_graph is None:
            if any(self.optimizer.state[p].get("momentum_buffer") is None for p in self.optimizer.params):
                return None
            self._step_graph = _StepGraph(self, batch)
        return self._step_graph

    def _batch_step(self, images: torch.Tensor, labels: torch.Tensor) -> None:
        self.optimizer.zero_grad()
        row = len(self._group_losses)
        self._group_losses.append(self._step_body(images, labels, lambda: self._fingerprint_rows[row]))

    def _step_body(
        self, images: torch.Tensor, labels: torch.Tensor, fingerprint_row: Callable[[], torch.Tensor]
    ) -> torch.Tensor:
        """One step from gradients that are None: forward, backward, update, then the weight fingerprint into
        `fingerprint_row()` and the epoch totals; the step's mean loss. The eager step and the captured one.
        The row is taken after the update, where the recorder names it (reprocube.training.replay): taken
        first, its buffer's earlier contents were the step's first input, and the replay of two runs that
        differ blamed them."""
        batch = len(labels)
        log_probs = self.model(images)
        loss = self._nll_sum(log_probs, labels) / batch
        loss.backward()
        self.optimizer.step()
        with torch.no_grad():
            loss = loss.detach()
            torch.cat(self._fingerprint_views, out=fingerprint_row())
            self._loss_sum += loss * batch
            self._correct += (log_probs.argmax(dim=1) == labels).sum()
        return loss

    def _nll_sum(self, log_probs: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """Summed negative log-likelihood, written with a one-hot mask: torch's NLLLoss raises on CUDA
        under use_deterministic_algorithms, and this form is deterministic on every device (no
        atomics, no host sync)."""
        one_hot = (labels[:, None] == self._classes).to(log_probs.dtype)
        return -(log_probs * one_hot).sum()

    def group_losses(self) -> np.ndarray:
        return torch.stack(self._group_losses).cpu().numpy()

    def group_fingerprints(self) -> np.ndarray:
        bits = _mix(self._fingerprint_rows[: len(self._group_losses)].view(torch.int32))
        offsets = self._fingerprint_offsets
        sums = [bits[:, lo:hi].sum(dim=1, dtype=torch.int32) for lo, hi in zip(offsets, offsets[1:], strict=False)]
        return torch.stack(sums, dim=1).cpu().numpy().view(np.uint32)

    def epoch_totals(self) -> EpochTotals:
        return EpochTotals(float(self._loss_sum), int(self._correct))

    def set_epoch_totals(self, totals: EpochTotals) -> None:
        self._loss_sum.copy_(torch.tensor(totals.loss_sum, dtype=torch.float32))
        self._correct.copy_(torch.tensor(totals.correct, dtype=torch.int64))

    @torch.no_grad()
    def evaluate(self) -> dict:
        self.model.eval()
        loss_sum = torch.zeros((), dtype=torch.float32, device=self.device)
        correct = torch.zeros((), dtype=torch.int64, device=self.device)
        batch = self.cfg.test_batch_size
        for lo in range(0, len(self.y_test), batch):
            log_probs = self.model(self.x_test[lo : lo + batch])
            labels = self.y_test[lo : lo + batch]
            loss_sum += self._nll_sum(log_probs, labels)
            correct += (log_probs.argmax(dim=1) == labels).sum()
        self.model.train()
        n = len(self.y_test)
        return {"test_loss": float(loss_sum) / n, "test_accuracy": int(correct) / n}

    def export_state(self) -> FrameworkState:
        weights = {name: t.detach().cpu().numpy().copy() for name, t in self.model.state_dict().items()}
        names = {p: name for name, p in self.model.named_parameters()}
        optimizer = {}
        for param, state in self.optimizer.state.items():
            buffer = state.get("momentum_buffer")
            if buffer is not None:
                optimizer[MOMENTUM_PREFIX + names[param]] = buffer.detach().cpu().numpy().copy()
        rng = {CPU_GENERATOR: torch.get_rng_state().numpy().copy()}
        if torch.cuda.is_available():
            for i, state in enumerate(torch.cuda.get_rng_state_all()):
                rng[f"{CUDA_GENERATOR_PREFIX}{i}"] = state.numpy().copy()
        return FrameworkState(weights, optimizer, rng)

    def import_state(self, state: FrameworkState) -> None:
        check_arrays("weights", state.weights, {name: _spec(t) for name, t in self.model.state_dict().items()})
        params = dict(self.model.named_parameters())
        # Momentum buffers exist for every parameter once a step ran with momentum > 0, else for none.
        momentum = {MOMENTUM_PREFIX + name: _spec(p) for name, p in params.items()} if state.optimizer else {}
        check_arrays("optimizer tensors", state.optimizer, momentum)
        self.model.load_state_dict({k: torch.from_numpy(v.copy()) for k, v in state.weights.items()})
        self.optimizer.state.clear()
        self._step_graph = None  # it updates the momentum buffers replaced here: captured again when needed
        for key, array in state.optimizer.items():
            # The buffer in its parameter's layout, as a step makes it.
            param = params[key.removeprefix(MOMENTUM_PREFIX)]
            self.optimizer.state[param]["momentum_buffer"] = torch.empty_like(param).copy_(torch.from_numpy(array))
        cpu_state = state.rng.get(CPU_GENERATOR)
        if cpu_state is None:
            raise CheckpointError("checkpoint lacks the torch CPU generator state")
        torch.set_rng_state(torch.from_numpy(cpu_state.copy()))
        cuda_keys = sorted(
            (k for k in state.rng if k.startswith(CUDA_GENERATOR_PREFIX)), key=lambda k: int(k.rsplit(".", 1)[1])
        )
        cuda_states = [state.rng[k] for k in cuda_keys]
        if torch.cuda.is_available():
            # A checkpoint made on a CPU (or on fewer GPUs) leaves the other generators as seeded;
            # the loop reports the change of device, since bit-exactness cannot follow it.
            for index, cuda_state in enumerate(cuda_states[: torch.cuda.device_count()]):
                torch.cuda.set_rng_state(torch.from_numpy(cuda_state.copy()), device=index)

    def record_ops(self, run_step: Callable[[], None]) -> list[dict]:
        """Run `run_step` (one optimizer step through train_steps or train_batches) with every ATen
        operation recorded in order (reprocube.training.replay): its name, where it ran, and a digest of each input
        before and each output after it. Nothing is changed: the hooks only read, and each operation runs
        as it would unrecorded (the replay checks the step's loss and state against an unrecorded run)."""
        recorder = OpRecorder(self.model, self.optimizer)
        self._recording = True
        try:
            with recorder.installed():
                run_step()
        finally:
            self._recording = False
        return recorder.ops


class _StepGraph:
    """framework.cuda_graph: one training step of `batch` examples, its ~90 kernels (forward, backward,
    momentum SGD, fingerprint, totals) captured as a CUDA graph and replayed with one launch. PyTorch's
    eager step is launch-bound on a GPU (about 2.5 ms a step on an H100 where the arithmetic takes
    microseconds). What is replayed is what the eager step runs: the same kernels on the same tensors
    (the parameters, momentum buffers and totals are updated in place at the addresses captured), and
    dropout's Philox offsets advance on each replay as the eager kernels advance them (PyTorch registers
    the default CUDA generator with every capture), so the generator saved in a checkpoint is where eager
    steps would have left it. The batch's indices are copied into a fixed buffer before each replay."""

    def __init__(self, backend: PytorchBackend, batch: int):
        self.backend = backend
        self.index = torch.zeros(batch, dtype=torch.int64, device=backend.device)
        self.fingerprint = torch.empty_like(backend._fingerprint_rows[0])
        self._warm_up()
        backend.optimizer.zero_grad()  # the captured backward writes fresh gradients, at fixed addresses
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            self.loss = self._body()

    def _body(self) -> torch.Tensor:
        b = self.backend
        images, labels = b.x_train.index_select(0, self.index), b.y_train.index_select(0, self.index)
        return b._step_body(images, labels, lambda: self.fingerprint)

    def _warm_up(self) -> None:
        """Two steps on a side stream before capturing, as PyTorch asks (libraries set up their handles and
        workspaces outside the capture), then every tensor they changed and the generator put back."""
        b = self.backend
        tensors = [*b.model.parameters(), *b.model.buffers(), b._loss_sum, b._correct]
        tensors += [state["momentum_buffer"] for state in b.optimizer.state.values()]
        saved = [t.detach().clone() for t in tensors]
        generator = torch.cuda.get_rng_state(b.device)
        side = torch.cuda.Stream(b.device)
        side.wait_stream(torch.cuda.current_stream(b.device))
        with torch.cuda.stream(side):
            for _ in range(2):
                b.optimizer.zero_grad()
                self._body()
        torch.cuda.current_stream(b.device).wait_stream(side)
        with torch.no_grad():
            for tensor, value in zip(tensors, saved, strict=True):
                tensor.copy_(value)
        torch.cuda.set_rng_state(generator, b.device)

    def run(self, index: torch.Tensor, row: int) -> None:
        """One step on the examples `index`: its loss joins the group's and its fingerprint the group's rows."""
        b = self.backend
        self.index.copy_(index)
        self.graph.replay()
        b._fingerprint_rows[row].copy_(self.fingerprint)
        b._group_losses.append(self.loss.clone())


def _memory_order_view(tensor: torch.Tensor) -> torch.Tensor:
    """A flat view of a dense tensor's elements in memory order: a fingerprint is a sum over a tensor's
    elements, so their order does not change it (a channels-last weight has no flat view in logical order)."""
    if tensor.dim() == 4 and not tensor.is_contiguous() and tensor.is_contiguous(memory_format=torch.channels_last):
        return tensor.permute(0, 2, 3, 1).view(-1)
    return tensor.view(-1)


def _mix(bits: torch.Tensor) -> torch.Tensor:
    """reprocube.formats.trace.mix on int32 (two's complement: the product wraps modulo 2**32 as a uint32 one)."""
    return bits ^ (bits * bits)


def _spec(tensor: torch.Tensor) -> tuple[tuple[int, ...], np.dtype]:
    return tuple(tensor.shape), torch.empty((), dtype=tensor.dtype).numpy().dtype


def _nvidia_driver() -> str | None:
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=10,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip().splitlines()[0] if out.returncode == 0 and out.stdout.strip() else None


def _onednn_version() -> str | None:
    """oneDNN's version as torch's build configuration names it (it picks the CPU convolution kernels)."""
    match = re.search(r"(?:MKL-DNN|oneDNN) v([0-9.]+)", torch.__config__.show())
    return match.group(1) if match else None


def _cublas_version() -> str | None:
    """The cuBLAS library loaded in this process (its GEMM kernels differ between versions); None where it
    cannot be asked (an untested path on CPU-only machines)."""
    try:
        import ctypes

        torch.cuda.current_blas_handle()  # loads cuBLAS
        with open("/proc/self/maps") as maps:
            path = next(line.split()[-1] for line in maps if "/libcublas.so" in line)
        library, parts = ctypes.CDLL(path), []
        for prop in (0, 1, 2):  # MAJOR_VERSION, MINOR_VERSION, PATCH_LEVEL
            value = ctypes.c_int()
            if library.cublasGetProperty(prop, ctypes.byref(value)) != 0:
                return None
            parts.append(str(value.value))
        return ".".join(parts)
    except (OSError, RuntimeError, StopIteration, AttributeError):
        return None
