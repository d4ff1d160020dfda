"""The JAX trainer's recording of one step's operations (reprocube.training.replay): the step's inputs and
each convolution and matrix product of its jaxpr, with where it ran and a digest of each input and output."""

from __future__ import annotations

import inspect
import re

import jax
import numpy as np
from jax.extend import core as jax_core

from reprocube.formats.ops_format import STEP_INPUT
from reprocube.formats.trace import tensor_digest, text_digest
from reprocube.frameworks.jax_model import path_name

_CALLS = ("pjit", "jit", "closed_call", "core_call", "remat", "checkpoint", "custom_jvp_call", "custom_vjp_call")
_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")  # a function's repr: not the same in two processes


RECORDED_KERNELS = ("conv_general_dilated", "dot_general")  # XLA runs them as library calls, unfused


class JaxprRecorder:
    """A function's jaxpr re-traced equation by equation, nested calls (jit, custom derivatives) inlined,
    into one jitted program that also returns its inputs and each kernel's inputs and outputs; where each
    ran comes from its name stack (`transpose(...)`: the backward pass; Flax's module names)."""

    def __init__(self):
        self.ops: list[dict] = []

    def recording(self, fn, static_argnums: tuple[int, ...] = ()):
        def call(*args):
            closed, shapes = jax.make_jaxpr(fn, static_argnums=static_argnums, return_shape=True)(*args)
            dynamic = jax.tree_util.tree_leaves([a for i, a in enumerate(args) if i not in static_argnums])
            sites: list[tuple[str, str, str]] = []  # each primitive's name, where and parameters, in order

            def instrumented(consts, flat):
                values: list[tuple[list, list]] = []
                return _evaluate(closed.jaxpr, consts, flat, "", sites, values), values

            outputs, values = jax.jit(instrumented)(closed.consts, dynamic)
            # The step's inputs first, one entry each, named: where the state entering the step differs.
            names = [n for n in inspect.signature(fn).parameters][: len(args)]
            named = {n: a for i, (n, a) in enumerate(zip(names, args, strict=True)) if i not in static_argnums}
            leaves = jax.tree_util.tree_flatten_with_path(named)[0]
            sites[:0] = [(STEP_INPUT, f"step input {path_name(path)}", text_digest("")) for path, _ in leaves]
            values[:0] = [([leaf], []) for _, leaf in leaves]
            for (op, where, params), (inputs, results) in zip(sites, values, strict=True):
                self.ops.append(
                    {
                        "index": len(self.ops),
                        "op": op,
                        "where": where,
                        "params": params,
                        "inputs": [_op_digest(value) for value in inputs],
                        "outputs": [_op_digest(value) for value in results],
                    }
                )
            return jax.tree_util.tree_unflatten(jax.tree_util.tree_structure(shapes), outputs)

        return call


def _evaluate(jaxpr, consts, args, stack: str, sites: list, values: list) -> list:
    """jax.core.eval_jaxpr, keeping each kernel's inputs and outputs (in `values`) and, once, its name,
    place and parameters (in `sites`)."""
    env = {}

    def read(var):
        return var.val if isinstance(var, jax_core.Literal) else env[var]

    for var, value in zip(jaxpr.constvars, consts, strict=True):
        env[var] = value
    for var, value in zip(jaxpr.invars, args, strict=True):
        env[var] = value
    for eqn in jaxpr.eqns:
        inputs = [read(var) for var in eqn.invars]
        where = "/".join(part for part in (stack, str(eqn.source_info.name_stack)) if part)
        inner = _inner_jaxpr(eqn)
        if inner is not None:
            outputs = _evaluate(inner.jaxpr, inner.consts, inputs, where, sites, values)
        else:
            with eqn.ctx.manager:  # as jax.core.eval_jaxpr binds it
                result = eqn.primitive.bind(*inputs, **eqn.primitive.get_bind_params(eqn.params))
            outputs = list(result) if eqn.primitive.multiple_results else [result]
            if eqn.primitive.name in RECORDED_KERNELS:
                sites.append(
                    (
                        f"jax.{eqn.primitive.name}",
                        _where(where),
                        text_digest(_ADDRESS.sub("", repr(sorted(eqn.params.items())))),
                    )
                )
                values.append((inputs, _evaluated_apart(eqn, inputs)))
        for var, value in zip(eqn.outvars, outputs, strict=True):
            if not isinstance(var, jax_core.DropVar):
                env[var] = value
    return [read(var) for var in jaxpr.outvars]


def _evaluated_apart(eqn, inputs: list) -> list:
    """A kernel's outputs as the recording returns them: the same kernel evaluated a second time on the
    same inputs, behind an optimization barrier (so that XLA neither merges it with the step's own nor
    fuses it). Returning the step's own output gives it a second user, and XLA then stops fusing a
    weight gradient's matrix product into the optimizer's update: on an AVX2 CPU that changed the
    updated weights (the replay's check caught it); the step's own kernels keep their users."""
    apart = jax.lax.optimization_barrier(list(inputs))
    with eqn.ctx.manager:
        result = eqn.primitive.bind(*apart, **eqn.primitive.get_bind_params(eqn.params))
    return list(result) if eqn.primitive.multiple_results else [result]


def _inner_jaxpr(eqn):
    """A call's own jaxpr (closed), to evaluate inline; None for a primitive."""
    if eqn.primitive.name not in _CALLS:
        return None
    for key in ("jaxpr", "call_jaxpr", "fun_jaxpr"):
        inner = eqn.params.get(key)
        if isinstance(inner, jax_core.ClosedJaxpr):
            return inner
        if isinstance(inner, jax_core.Jaxpr):
            return jax_core.ClosedJaxpr(inner, ())
    return None


def _where(stack: str) -> str:
    """`forward, conv1`, `backward, fc2`, `step` (the optimizer, the totals), from a name stack."""
    phase = "backward" if "transpose(" in stack else "forward" if "jvp(" in stack else "step"
    scopes = [part for part in re.sub(r"\w+\(|\)", "", stack).split("/") if part and part != "Net"]
    return f"{phase}, {scopes[-1]}" if scopes else phase


def _op_digest(value) -> str:
    array = value
    if hasattr(array, "dtype") and jax.dtypes.issubdtype(array.dtype, jax.dtypes.extended):
        array = jax.random.key_data(array)  # a typed PRNG key: its bits
    return tensor_digest(np.asarray(array))
