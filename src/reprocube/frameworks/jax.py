"""The JAX / Flax (Linen) / Optax trainer: the same CNN (both dropouts), a jitted step on resident data.

Linen rather than NNX: the whole training state is then an explicit pytree (params, optimizer state,
epoch totals) passed through a pure jitted function, and randomness is an explicit key per step:
fold_in(run key, global step), so the position alone determines it. NNX keeps RNG counters inside
the module, which would be one more piece of hidden state to capture.

Determinism: on GPU, XLA_FLAGS=--xla_gpu_deterministic_ops=true (the old TF_CUDNN_DETERMINISTIC no
longer reaches XLA, openxla/xla#14310), set before JAX creates its backends. On CPU, XLA's thread pool
is sized by the CPUs this process may use: it is pinned to `threads` CPUs."""

from __future__ import annotations

import os
from collections.abc import Callable

import flax
import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import traverse_util

from reprocube.errors import CheckpointError, ConfigError
from reprocube.frameworks.jax_model import Net, count_correct, flat_params, nll_sum, path_name, weights_fingerprint
from reprocube.frameworks.jax_op_recorder import JaxprRecorder
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
            return nll_sum(logits, one_hot) / batch_size, logits

        (loss, logits), grads = jax.value_and_grad(loss_fn, has_aux=True)(params)
        updates, opt_state = self.tx.update(grads, opt_state, params)
        params = optax.apply_updates(params, updates)
        loss_sum, correct = totals
        totals = (loss_sum + loss * batch_size, correct + count_correct(logits, one_hot))
        return params, opt_state, totals, loss, weights_fingerprint(params)

    def _step_loop_fn(self, params, opt_state, totals, x_train, y_train, order, starts, count, batch_size, first_step):
        """_train_step_fn for the first `count` of `starts` (STEPS_PER_CALL long, the rest unused), in one
        loop on the device: the losses and fingerprints come back STEPS_PER_CALL long, `count` of them set."""
        losses = jnp.zeros((STEPS_PER_CALL,), jnp.float32)
        fingerprints = jnp.zeros((STEPS_PER_CALL, len(flat_params(params))), jnp.uint32)

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
        return nll_sum(logits, one_hot), count_correct(logits, one_hot)

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
        weights = {".".join(path): np.asarray(leaf) for path, leaf in flat_params(self.params).items()}
        optimizer = {
            path_name(path): np.asarray(leaf) for path, leaf in jax.tree_util.tree_flatten_with_path(self.opt_state)[0]
        }
        return FrameworkState(weights, optimizer, {RUN_KEY: np.asarray(jax.random.key_data(self.run_key))})

    def import_state(self, state: FrameworkState) -> None:
        run_key = np.asarray(jax.random.key_data(self.run_key))
        check_arrays("generator states", state.rng, {RUN_KEY: (run_key.shape, run_key.dtype)})
        if not np.array_equal(state.rng[RUN_KEY], run_key):
            raise CheckpointError(
                "checkpoint's JAX run key differs from the one this seed and PRNG implementation give"
            )
        params = flat_params(self.params)
        check_arrays(
            "weights", state.weights, {".".join(path): (leaf.shape, leaf.dtype) for path, leaf in params.items()}
        )
        self.params = traverse_util.unflatten_dict(
            {path: jnp.asarray(state.weights[".".join(path)]) for path in params}
        )
        leaves, treedef = jax.tree_util.tree_flatten_with_path(self.opt_state)
        names = [path_name(path) for path, _ in leaves]
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
        recorder = JaxprRecorder()
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
