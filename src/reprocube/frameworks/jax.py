"""The JAX / Flax (Linen) / Optax trainer: the same CNN (both dropouts), a jitted step on resident data.

Linen rather than NNX: the whole training state is then an explicit pytree (params, optimizer state,
epoch totals) passed through a pure jitted function, and randomness is an explicit key per step:
fold_in(run key, global step), so the position alone determines it. NNX keeps RNG counters inside
the module, which would be one more piece of hidden state to capture.

Determinism: on GPU, XLA_FLAGS=--xla_gpu_deterministic_ops=true (the old TF_CUDNN_DETERMINISTIC no
longer reaches XLA, openxla/xla#14310), set before JAX creates its backends. On CPU, XLA's thread pool
is sized by the CPUs this process may use: it is pinned to `threads` CPUs."""

from __future__ import annotations

import inspect
import os
import re
from collections.abc import Callable

import flax
import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import linen as nn
from flax import traverse_util
from jax.extend import core as jax_core

from reprocube.errors import CheckpointError, ConfigError
from reprocube.formats.ops_format import STEP_INPUT
from reprocube.formats.trace import tensor_digest, text_digest
from reprocube.runtime import compilation_cache
from reprocube.training.backend import STEPS_PER_CALL, check_arrays
from reprocube.training.state import EpochTotals, FrameworkState

RUN_KEY = "jax.run_key"
# The position of the static (shape-setting) batch_size argument of _train_step_fn and of _eval_step_fn.
TRAIN_STEP_BATCH_SIZE = 7
EVAL_STEP_BATCH_SIZE = 4
STEP_LOOP_BATCH_SIZE = 8  # of _step_loop_fn


def _prepare_xla(cfg) -> None:
    """Flags and CPU affinity that XLA reads once, when JAX first creates a backend (importing jax
    does not create one)."""
    flags = os.environ.get("XLA_FLAGS", "").split()
    if cfg.deterministic and not any(f.startswith("--xla_gpu_deterministic_ops") for f in flags):
        flags.append("--xla_gpu_deterministic_ops=true")
    os.environ["XLA_FLAGS"] = " ".join(flags)
    if cfg.device == "cpu":
        # jax reads JAX_PLATFORMS when it is imported, before this runs: the variable is for child
        # processes; the config update is what keeps this one off a GPU (on an H100 host, device=cpu
        # trained on the GPU, 2026-11-25).
        os.environ["JAX_PLATFORMS"] = "cpu"
        jax.config.update("jax_platforms", "cpu")
    if hasattr(os, "sched_setaffinity"):
        # With fewer CPUs than `threads`, XLA's pool is smaller: env.json records the effective count.
        os.sched_setaffinity(0, sorted(os.sched_getaffinity(0))[: cfg.threads])


class Net(nn.Module):
    """conv 1->10 k5, pool, relu, conv 10->20 k5, Dropout2d, pool, relu, dense 320->50, relu, dropout,
    dense 10 (channels-last). `conv2_as_matmul`: conv2 computed as image patches times its kernel (the
    same parameters; other bits)."""

    num_classes: int = 10
    conv2_as_matmul: bool = False

    @nn.compact
    def __call__(self, x, train: bool):
        x = nn.Conv(10, (5, 5), padding="VALID", name="conv1")(x)
        x = nn.relu(_max_pool_2x2(x))
        if self.conv2_as_matmul:
            x = PatchConv(20, (5, 5), name="conv2")(x)
        else:
            x = nn.Conv(20, (5, 5), padding="VALID", name="conv2")(x)
        x = nn.Dropout(0.5, broadcast_dims=(1, 2), deterministic=not train, name="conv2_drop")(x)  # whole channels
        x = nn.relu(_max_pool_2x2(x))
        x = x.reshape((x.shape[0], -1))
        x = nn.relu(nn.Dense(50, name="fc1")(x))
        x = nn.Dropout(0.5, deterministic=not train, name="fc1_drop")(x)
        return nn.Dense(self.num_classes, name="fc2")(x)


class PatchConv(nn.Module):
    """nn.Conv's VALID convolution (the same `kernel` and `bias`, initialised alike) as the input's image
    patches, cut by slicing, times the kernel reshaped to a matrix. On XLA's CPU backend a step is ~15%
    faster with conv2 in this form: its input gradient, a convolution there, becomes a matrix product and
    the sum of sliced windows (benchmarks/README.md). For conv1 (one input channel) it is not faster."""

    features: int
    kernel_size: tuple[int, int]

    @nn.compact
    def __call__(self, x):
        (kh, kw), channels = self.kernel_size, x.shape[-1]
        kernel = self.param("kernel", nn.initializers.lecun_normal(), (kh, kw, channels, self.features))
        bias = self.param("bias", nn.initializers.zeros_init(), (self.features,))
        oh, ow = x.shape[1] - kh + 1, x.shape[2] - kw + 1
        # (n, oh, ow, kh*kw*channels): window position major, channel minor, as the kernel's HWIO rows
        patches = jnp.concatenate([x[:, i : i + oh, j : j + ow, :] for i in range(kh) for j in range(kw)], axis=-1)
        return patches @ kernel.reshape(-1, self.features) + bias


def _max_pool_2x2(x):
    """2x2 max pooling, stride 2, as a reshape and a max: the same forward values as nn.max_pool, and on
    XLA's CPU backend a much cheaper gradient than reduce_window's select-and-scatter (about 15% of the
    whole step here). A tie sends the gradient to every maximum instead of the first."""
    n, h, w, c = x.shape
    return x.reshape(n, h // 2, 2, w // 2, 2, c).max(axis=(2, 4))


def _fingerprint(params):
    """Each weight's float32 bits summed as uint32 (wrapping: modulo 2**32), in sorted name order, inside
    the jitted step (reprocube.formats.trace.fingerprint)."""
    flat = _flat_params(params)
    leaves = [flat[path] for path in sorted(flat, key=".".join)]
    return jnp.stack([_mix(jax.lax.bitcast_convert_type(leaf, jnp.uint32)).sum(dtype=jnp.uint32) for leaf in leaves])


def _mix(x):
    """reprocube.formats.trace.mix on uint32 (the product wraps modulo 2**32)."""
    return x ^ (x * x)


def _nll_sum(logits, one_hot):
    return -jnp.sum(jax.nn.log_softmax(logits) * one_hot)


def _count_correct(logits, one_hot):
    return jnp.sum(jnp.argmax(logits, axis=1) == jnp.argmax(one_hot, axis=1), dtype=jnp.int32)


class JaxBackend:
    def __init__(self, cfg, dataset):
        _prepare_xla(cfg)
        self.compilation_cache = compilation_cache.enable(jax)
        jax.config.update("jax_default_prng_impl", cfg.framework.prng_impl)
        if cfg.device == "cuda" and jax.default_backend() != "gpu":
            raise ConfigError("device=cuda but JAX sees no GPU")
        if cfg.device == "cpu" and jax.default_backend() != "cpu":
            raise ConfigError(f"device=cpu but JAX's backend is {jax.default_backend()} (JAX started before reprocube)")
        self.cfg = cfg
        self.model = Net(dataset.num_classes, conv2_as_matmul=cfg.framework.conv2 == "matmul")
        self.tx = optax.sgd(cfg.optimizer.lr, momentum=cfg.optimizer.momentum)
        self.run_key = jax.random.key(cfg.seed)
        init_key, self.dropout_key = jax.random.split(self.run_key)
        to_nhwc = lambda images: jnp.asarray(images.transpose(0, 2, 3, 1))  # copied to the device once
        self.x_train, self.x_test = to_nhwc(dataset.train.images), to_nhwc(dataset.test.images)
        self.y_train = jax.nn.one_hot(dataset.train.labels, dataset.num_classes, dtype=jnp.float32)
        self.y_test = jax.nn.one_hot(dataset.test.labels, dataset.num_classes, dtype=jnp.float32)
        self.params = self.model.init(init_key, self.x_train[:1], train=False)["params"]
        self.opt_state = self.tx.init(self.params)
        self._order = None
        self._group_losses: list[jax.Array] = []
        self._group_fingerprints: list[jax.Array] = []
        self.set_epoch_totals(EpochTotals())
        # The resident data are arguments, not constants of the compiled steps: as constants they made the
        # training step's executable 39 MB (the whole training set), slow to compile and to cache.
        self._train_step = jax.jit(self._train_step_fn, static_argnums=(TRAIN_STEP_BATCH_SIZE,))
        self._eval_step = jax.jit(self._eval_step_fn, static_argnums=(EVAL_STEP_BATCH_SIZE,))
        self._train_batch = jax.jit(self._batch_step)
        self._step_loop = jax.jit(self._step_loop_fn, static_argnums=(STEP_LOOP_BATCH_SIZE,))
        # framework.device_loop: on a GPU, where a call per step is launch-bound (0.63 s an epoch on an H100),
        # a group's steps of batch_size examples in one compiled call. Not on a CPU: the loop ran slower there.
        self._device_loop = bool(cfg.framework.device_loop) and jax.default_backend() == "gpu"
        self._recording = False

    def info(self) -> dict:
        device = jax.devices()[0]
        info = {
            "name": "jax",
            "jax": jax.__version__,
            "jaxlib": jax.lib.__version__ if hasattr(jax.lib, "__version__") else None,
            "flax": flax.__version__,
            "optax": optax.__version__,
            "backend": jax.default_backend(),
            "device": device.device_kind,
            "prng_impl": jax.config.jax_default_prng_impl,
            "threefry_partitionable": bool(jax.config.jax_threefry_partitionable),
            "xla_flags": os.environ.get("XLA_FLAGS", ""),
            "default_matmul_precision": jax.config.jax_default_matmul_precision,  # None: the backend's (TF32 on GPU)
            "cpu_affinity": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
            "compilation_cache": "on" if self.compilation_cache else "off",
        }
        if jax.default_backend() == "gpu":
            info.update(
                gpu=device.device_kind,
                gpu_count=jax.device_count(),
                gpu_capability=getattr(device, "compute_capability", None),
                gpu_sm_count=getattr(device, "core_count", None),
            )
        return info

    # --- training -------------------------------------------------------------------------------
    def _train_step_fn(self, params, opt_state, totals, x_train, y_train, order, lo, batch_size, global_step):
        index = jax.lax.dynamic_slice(order, (lo,), (batch_size,))
        return self._batch_step(params, opt_state, totals, x_train[index], y_train[index], global_step)

    def _batch_step(self, params, opt_state, totals, images, one_hot, global_step):
        batch_size = one_hot.shape[0]
        step_key = jax.random.fold_in(self.dropout_key, global_step)  # the position alone sets the masks

        def loss_fn(p):
            logits = self.model.apply({"params": p}, images, train=True, rngs={"dropout": step_key})
            return _nll_sum(logits, one_hot) / batch_size, logits

        (loss, logits), grads = jax.value_and_grad(loss_fn, has_aux=True)(params)
        updates, opt_state = self.tx.update(grads, opt_state, params)
        params = optax.apply_updates(params, updates)
        loss_sum, correct = totals
        totals = (loss_sum + loss * batch_size, correct + _count_correct(logits, one_hot))
        return params, opt_state, totals, loss, _fingerprint(params)

    def _step_loop_fn(self, params, opt_state, totals, x_train, y_train, order, starts, count, batch_size, first_step):
        """_train_step_fn for the first `count` of `starts` (STEPS_PER_CALL long, the rest unused), in one
        loop on the device: the losses and fingerprints come back STEPS_PER_CALL long, `count` of them set."""
        losses = jnp.zeros((STEPS_PER_CALL,), jnp.float32)
        fingerprints = jnp.zeros((STEPS_PER_CALL, len(_flat_params(params))), jnp.uint32)

        def step(i, carry):
            params, opt_state, totals, losses, fingerprints = carry
            params, opt_state, totals, loss, fingerprint = self._train_step_fn(
                params, opt_state, totals, x_train, y_train, order, starts[i], batch_size, first_step + i
            )
            return params, opt_state, totals, losses.at[i].set(loss), fingerprints.at[i].set(fingerprint)

        return jax.lax.fori_loop(0, count, step, (params, opt_state, totals, losses, fingerprints))

    def _eval_step_fn(self, params, x_test, y_test, lo, batch_size):
        images = jax.lax.dynamic_slice_in_dim(x_test, lo, batch_size)
        one_hot = jax.lax.dynamic_slice_in_dim(y_test, lo, batch_size)
        logits = self.model.apply({"params": params}, images, train=False)
        return _nll_sum(logits, one_hot), _count_correct(logits, one_hot)

    def begin_epoch(self, order: np.ndarray) -> None:
        self._order = jnp.asarray(order.astype(np.int32))

    def train_steps(self, bounds, first_global_step: int) -> None:
        self._group_losses, self._group_fingerprints = [], []
        rows = bounds.tolist()
        if self._device_loop and not self._recording:
            full = 0  # the leading steps of batch_size examples (a group ends the epoch with the partial batch)
            while full < len(rows) and rows[full][1] - rows[full][0] == self.cfg.batch_size:
                full += 1
            if full:
                starts = np.zeros(STEPS_PER_CALL, np.int32)
                starts[:full] = [lo for lo, _ in rows[:full]]
                self.params, self.opt_state, self._totals, losses, fingerprints = self._step_loop(
                    self.params, self.opt_state, self._totals, self.x_train, self.y_train, self._order,
                    starts, full, self.cfg.batch_size, first_global_step,
                )  # fmt: skip
                self._group_losses.append((losses, full))
                self._group_fingerprints.append((fingerprints, full))
            rows, first_global_step = rows[full:], first_global_step + full
        # One jitted call per step: on XLA's CPU backend a loop of steps inside one computation (scan,
        # fori_loop) runs its convolutions several times slower than separate calls.
        for i, (lo, hi) in enumerate(rows):
            self.params, self.opt_state, self._totals, loss, fingerprint = self._train_step(
                self.params,
                self.opt_state,
                self._totals,
                self.x_train,
                self.y_train,
                self._order,
                lo,
                hi - lo,
                first_global_step + i,
            )
            self._group_losses.append((loss, None))
            self._group_fingerprints.append((fingerprint, None))

    def train_batches(self, batches, first_global_step: int) -> None:
        self._group_losses, self._group_fingerprints = [], []
        for i, (images, labels) in enumerate(batches):
            one_hot = jax.nn.one_hot(labels, self.y_train.shape[1], dtype=jnp.float32)
            self.params, self.opt_state, self._totals, loss, fingerprint = self._train_batch(
                self.params,
                self.opt_state,
                self._totals,
                jnp.asarray(images.transpose(0, 2, 3, 1)),
                one_hot,
                first_global_step + i,
            )
            self._group_losses.append((loss, None))
            self._group_fingerprints.append((fingerprint, None))

    def group_losses(self) -> np.ndarray:
        return _rows(self._group_losses, np.float32).reshape(-1)

    def group_fingerprints(self) -> np.ndarray:
        return _rows(self._group_fingerprints, np.uint32)

    def epoch_totals(self) -> EpochTotals:
        return EpochTotals(float(self._totals[0]), int(self._totals[1]))

    def set_epoch_totals(self, totals: EpochTotals) -> None:
        self._totals = (jnp.asarray(totals.loss_sum, jnp.float32), jnp.asarray(totals.correct, jnp.int32))

    def evaluate(self) -> dict:
        n, batch = int(self.y_test.shape[0]), self.cfg.test_batch_size
        loss_sum, correct = jnp.zeros((), jnp.float32), jnp.zeros((), jnp.int32)
        for lo in range(0, n, batch):
            batch_loss, batch_correct = self._eval_step(self.params, self.x_test, self.y_test, lo, min(batch, n - lo))
            loss_sum, correct = loss_sum + batch_loss, correct + batch_correct
        return {"test_loss": float(loss_sum) / n, "test_accuracy": int(correct) / n}

    # --- state ----------------------------------------------------------------------------------
    def export_state(self) -> FrameworkState:
        weights = {".".join(path): np.asarray(leaf) for path, leaf in _flat_params(self.params).items()}
        optimizer = {
            _path_name(path): np.asarray(leaf) for path, leaf in jax.tree_util.tree_flatten_with_path(self.opt_state)[0]
        }
        return FrameworkState(weights, optimizer, {RUN_KEY: np.asarray(jax.random.key_data(self.run_key))})

    def import_state(self, state: FrameworkState) -> None:
        run_key = np.asarray(jax.random.key_data(self.run_key))
        check_arrays("generator states", state.rng, {RUN_KEY: (run_key.shape, run_key.dtype)})
        if not np.array_equal(state.rng[RUN_KEY], run_key):
            raise CheckpointError(
                "checkpoint's JAX run key differs from the one this seed and PRNG implementation give"
            )
        params = _flat_params(self.params)
        check_arrays(
            "weights", state.weights, {".".join(path): (leaf.shape, leaf.dtype) for path, leaf in params.items()}
        )
        self.params = traverse_util.unflatten_dict(
            {path: jnp.asarray(state.weights[".".join(path)]) for path in params}
        )
        leaves, treedef = jax.tree_util.tree_flatten_with_path(self.opt_state)
        names = [_path_name(path) for path, _ in leaves]
        check_arrays(
            "optimizer tensors",
            state.optimizer,
            {name: (leaf.shape, leaf.dtype) for name, (_, leaf) in zip(names, leaves, strict=True)},
        )
        self.opt_state = jax.tree_util.tree_unflatten(treedef, [jnp.asarray(state.optimizer[name]) for name in names])

    def record_ops(self, run_step: Callable[[], None]) -> list[dict]:
        """Run `run_step` (one optimizer step through train_steps or train_batches) with its inputs and
        its kernels recorded (reprocube.training.replay): first each of the step's inputs (weights, optimizer state,
        totals, batch, step number) as an entry named after it, then each convolution and matrix product
        of the step's jaxpr, forward and backward, with where it ran and a digest of each input and output.
        The step stays one compiled XLA program that also returns those values. Only the kernels:
        returning every intermediate value made XLA fuse the step differently and changed its loss bits
        (2 ULP at step 3 on an AVX-512 CPU); each kernel's outputs come from a second evaluation of it on
        the same inputs (_evaluated_apart), since returning the step's own changed its weights on an AVX2
        CPU. The replay checks each time that recording changed nothing."""
        recorder = _JaxprRecorder()
        compiled = self._train_step, self._train_batch
        self._train_step = recorder.recording(self._train_step_fn, static_argnums=(TRAIN_STEP_BATCH_SIZE,))
        self._train_batch = recorder.recording(self._batch_step)
        self._recording = True  # one call per step, each recorded
        try:
            run_step()
        finally:
            self._train_step, self._train_batch = compiled
            self._recording = False
        return recorder.ops


def _rows(parts: list[tuple[jax.Array, int | None]], dtype) -> np.ndarray:
    """One host transfer of a group's per-step values: a step's value (count None) or the first `count`
    rows of a device loop's, in order, stacked."""
    values = jax.device_get([value for value, _ in parts])
    rows = [
        np.asarray(v)[None] if count is None else np.asarray(v)[:count]
        for v, (_, count) in zip(values, parts, strict=True)
    ]
    return np.concatenate(rows).astype(dtype, copy=False) if rows else np.zeros((0,), dtype)


# --- recording one step's operations (reprocube.training.replay) -------------------------------------------------
_CALLS = ("pjit", "jit", "closed_call", "core_call", "remat", "checkpoint", "custom_jvp_call", "custom_vjp_call")
_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")  # a function's repr: not the same in two processes


RECORDED_KERNELS = ("conv_general_dilated", "dot_general")  # XLA runs them as library calls, unfused


class _JaxprRecorder:
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
            sites[:0] = [(STEP_INPUT, f"step input {_path_name(path)}", text_digest("")) for path, _ in leaves]
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


def _flat_params(params) -> dict[tuple[str, ...], jax.Array]:
    return traverse_util.flatten_dict(flax.core.unfreeze(params))


def _path_name(path) -> str:
    return ".".join(str(getattr(p, "name", getattr(p, "key", getattr(p, "idx", p)))) for p in path)
