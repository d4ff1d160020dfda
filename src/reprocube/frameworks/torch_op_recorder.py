"""The PyTorch trainer's recording of one step's operations (reprocube.training.replay): every ATen operation
with where it ran and a digest of each input and output."""

from __future__ import annotations

import contextlib
import hashlib

import torch
from torch import nn
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from reprocube.formats.trace import tensor_digest, text_digest
from reprocube.frameworks.torch_sgd import MomentumSGD


class OpRecorder(TorchDispatchMode):
    """Every ATen operation below autograd (forward, backward and optimizer alike), with where it ran:
    the phase of the step (batch, forward, loss, backward, optimizer, totals), the model's submodule for
    the forward and backward (a backward node is named after the module whose forward created it, which a
    torch-function mode notes during the forward), the parameter for the optimizer."""

    def __init__(self, model: nn.Module, optimizer: MomentumSGD):
        super().__init__()
        self.model, self.optimizer, self.ops = model, optimizer, []
        self.phase = "batch"  # before the model's forward: choosing the batch, zeroing the gradients
        self.module_stack: list[str] = []
        self.node_modules: dict = {}  # autograd node -> module name (holding the node keeps its identity)
        self.param_storages: dict[int, str] = {}  # storage address -> parameter (its grad, its momentum)
        self.param_names = {p: name for name, p in model.named_parameters()}
        self.uninitialized: set[int] = set()  # storages an `empty` operation made and nothing wrote yet

    @contextlib.contextmanager
    def installed(self):
        """Hooks on the model's modules and the optimizer, and the two modes, for the duration."""
        handles = []
        for name, module in self.model.named_modules():
            handles.append(module.register_forward_pre_hook(self._enter(name or "model")))
            handles.append(module.register_forward_hook(self._leave(name or "model")))
        handles.append(self.optimizer.register_step_pre_hook(self._optimizer_starts))
        handles.append(self.optimizer.register_step_post_hook(lambda *_: self._set_phase("totals")))
        try:
            with _NodeNamer(self), self:
                yield
        finally:
            for handle in handles:
                handle.remove()
            self.node_modules.clear()

    def _set_phase(self, phase: str) -> None:
        self.phase = phase

    def _enter(self, name: str):
        def hook(module, args):
            if not self.module_stack:
                self.phase = "forward"
            self.module_stack.append(name)

        return hook

    def _leave(self, name: str):
        def hook(module, args, output):
            self.module_stack.pop()
            if not self.module_stack:
                self.phase = "loss"  # after the model: the loss, up to the backward pass

        return hook

    def _optimizer_starts(self, optimizer, args, kwargs) -> None:
        self.phase = "optimizer"
        for param, name in self.param_names.items():
            tensors = [param, param.grad, optimizer.state.get(param, {}).get("momentum_buffer")]
            for tensor, suffix in zip(tensors, ("", " (grad)", " (momentum)"), strict=True):
                if tensor is not None:
                    self.param_storages[tensor.untyped_storage().data_ptr()] = name + suffix

    def _where(self, tensors: list[torch.Tensor]) -> str:
        node = torch._C._current_autograd_node()
        if node is not None:
            variable = getattr(node, "variable", None)  # AccumulateGrad: the parameter it accumulates into
            module = self.param_names.get(variable) if variable is not None else None
            return f"backward, {module or self.node_modules.get(node, '?')} ({node.name()})"
        if self.phase == "forward":
            return f"forward, {self.module_stack[-1]}"
        if self.phase == "optimizer":
            names = (self.param_storages.get(t.untyped_storage().data_ptr()) for t in tensors)
            return f"optimizer, {next((n for n in names if n), '-')}"
        return self.phase

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func.namespace == "profiler":  # record_function markers (torch.optim has them): no computation
            return func(*args, **kwargs)
        leaves = tree_leaves((args, kwargs))
        tensors = [leaf for leaf in leaves if isinstance(leaf, torch.Tensor)]
        # Inputs before the operation (an in-place one changes them); memory nothing wrote by its shape.
        inputs = [_op_digest(t, t.untyped_storage().data_ptr() in self.uninitialized) for t in tensors]
        params = [leaf for leaf in leaves if not isinstance(leaf, torch.Tensor)]
        where = self._where(tensors)
        out = func(*args, **kwargs)
        fresh = func.overloadpacket in _EMPTY_OPS  # its output holds whatever the allocator's memory held
        outputs = []
        for leaf in tree_leaves(out):
            unwritten = fresh
            if isinstance(leaf, torch.Tensor):
                storage = leaf.untyped_storage().data_ptr()
                if func.is_view:  # a view of memory nothing wrote is no more written
                    unwritten = storage in self.uninitialized
                else:
                    (self.uninitialized.add if fresh else self.uninitialized.discard)(storage)
            outputs.append(_op_digest(leaf, unwritten))
        self.ops.append(
            {
                "index": len(self.ops),
                "op": str(func),
                "where": where,
                "params": text_digest(repr(params)),
                "inputs": inputs,
                "outputs": outputs,
            }
        )
        return out


class _NodeNamer(TorchFunctionMode):
    """During the forward: each new autograd node is named after the module running (for the backward)."""

    def __init__(self, recorder: OpRecorder):
        super().__init__()
        self.recorder = recorder

    def __torch_function__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        recorder = self.recorder
        if recorder.phase in ("forward", "loss"):
            module = recorder.module_stack[-1] if recorder.module_stack else "loss"
            for leaf in tree_leaves(out):
                node = leaf.grad_fn if isinstance(leaf, torch.Tensor) else None
                # The nodes this call created: its output's, and those behind it not yet named (a
                # composite function's inner ones, e.g. linear's transpose); parameters' are named apart.
                pending = [node] if node is not None else []
                while pending:
                    node = pending.pop()
                    if node in recorder.node_modules or hasattr(node, "variable"):
                        continue
                    recorder.node_modules[node] = module
                    pending.extend(fn for fn, _ in node.next_functions if fn is not None)
        return out


_EMPTY_OPS = {
    torch.ops.aten.empty,
    torch.ops.aten.empty_like,
    torch.ops.aten.new_empty,
    torch.ops.aten.empty_strided,
    torch.ops.aten.new_empty_strided,
}


def _op_digest(value, uninitialized: bool = False) -> str:
    """tensor_digest of a tensor's dtype, shape and bytes (read on the host); for memory nothing wrote
    yet, of its dtype and shape only; of any other value, its repr."""
    if not isinstance(value, torch.Tensor):
        return text_digest(repr(value))
    if uninitialized:
        return text_digest(f"uninitialized {value.dtype}{list(value.shape)}")
    tensor = value.detach()
    if tensor.device.type != "cpu":
        tensor = tensor.cpu()
    try:
        return tensor_digest(tensor.numpy())
    except TypeError:  # a dtype NumPy lacks (bfloat16, ...): its bytes, labelled with torch's dtype
        raw = tensor.contiguous().reshape(-1).view(torch.uint8).numpy()
        digest = hashlib.sha256(f"{tensor.dtype}{list(tensor.shape)}".encode())
        digest.update(raw.tobytes())
        return digest.hexdigest()[:16]
