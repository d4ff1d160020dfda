"""SGD with momentum as torch.optim.SGD computes it, for the PyTorch trainer, without torch.optim.

Why not torch.optim.SGD: its constructor, zero_grad and step are wrapped by torch._disable_dynamo, and its
step imports torch._dynamo unconditionally (`_use_grad_for_differentiable`): 1-1.5 s of every PyTorch
process on this project's CPU, for a compiler reprocube never runs.

What is computed is torch 2.13's `_single_tensor_sgd` and `_multi_tensor_sgd` for what the trainer
configures (momentum, no dampening, weight decay, Nesterov or maximize): the same ATen kernels in the same
order, so the same bits. Like torch, the foreach kernels on CUDA (its default there), one tensor at a time
elsewhere; the op recorder (reprocube.training.replay) then names each parameter's update. tests/test_torch_sgd.py
compares both paths with torch's own SGD, bytes-equal.

The state has torch's layout (`state[param]["momentum_buffer"]`), and the two step hooks the op recorder
uses are torch's (`register_step_pre_hook`, `register_step_post_hook`)."""

from __future__ import annotations

from collections import OrderedDict, defaultdict
from collections.abc import Callable, Iterable

import torch
from torch.utils.hooks import RemovableHandle

# torch's `_default_to_fused_or_foreach`: the foreach kernels where every parameter is on one of these.
FOREACH_DEVICES = ("cuda", "xpu")


class MomentumSGD:
    def __init__(self, params: Iterable[torch.nn.Parameter], lr: float, momentum: float):
        self.params = list(params)
        self.lr, self.momentum = float(lr), float(momentum)
        self.state: defaultdict[torch.Tensor, dict[str, torch.Tensor]] = defaultdict(dict)
        self._pre_hooks: OrderedDict[int, Callable] = OrderedDict()
        self._post_hooks: OrderedDict[int, Callable] = OrderedDict()

    def zero_grad(self) -> None:
        """set_to_none=True, torch's default: the next backward pass writes fresh gradients."""
        for param in self.params:
            param.grad = None

    def register_step_pre_hook(self, hook: Callable) -> RemovableHandle:
        """hook(optimizer, args, kwargs) before each step, as torch.optim.Optimizer calls it."""
        handle = RemovableHandle(self._pre_hooks)
        self._pre_hooks[handle.id] = hook
        return handle

    def register_step_post_hook(self, hook: Callable) -> RemovableHandle:
        handle = RemovableHandle(self._post_hooks)
        self._post_hooks[handle.id] = hook
        return handle

    @torch.no_grad()
    def step(self) -> None:
        for hook in list(self._pre_hooks.values()):
            hook(self, (), {})
        params = [p for p in self.params if p.grad is not None]
        if params:
            foreach = all(p.device.type in FOREACH_DEVICES for p in params)
            (self._foreach_step if foreach else self._single_tensor_step)(params)
        for hook in list(self._post_hooks.values()):
            hook(self, (), {})

    def _single_tensor_step(self, params: list[torch.Tensor]) -> None:
        for param in params:
            update = self._momentum_step(param) if self.momentum != 0 else param.grad
            param.add_(update, alpha=-self.lr)

    def _momentum_step(self, param: torch.Tensor) -> torch.Tensor:
        """One parameter's momentum buffer updated with its gradient (the first step's is a copy of it)."""
        buffer = self.state[param].get("momentum_buffer")
        if buffer is None:
            buffer = self.state[param]["momentum_buffer"] = param.grad.detach().clone()
        else:
            buffer.mul_(self.momentum).add_(param.grad, alpha=1)
        return buffer

    def _foreach_step(self, params: list[torch.Tensor]) -> None:
        """One device and dtype (the trainer's model): torch groups by both and finds one group."""
        updates = [p.grad for p in params]
        if self.momentum != 0:
            buffers = [self.state[p].get("momentum_buffer") for p in params]
            if all(b is not None for b in buffers):
                torch._foreach_mul_(buffers, self.momentum)
                torch._foreach_add_(buffers, updates, alpha=1)
            else:  # the first step, or a state where some parameters have no buffer: one at a time
                buffers = [self._momentum_step(p) for p in params]
            updates = buffers
        torch._foreach_add_(params, updates, alpha=-self.lr)
