"""The TensorFlow / Keras 3 trainer: the same CNN (both dropouts), a tf.function step on resident data.

Why resuming works here when the reference tutorial's did not: each Keras Dropout draws its masks from
a SeedGenerator whose state variable is in model.variables but in no Keras save path (not in
model.weights, tf.train.Checkpoint or .weights.h5; keras-team/keras#19796). We save those states
explicitly, with the optimizer variables (including its iteration count).

Execution path: tf.function without XLA on every device. With op determinism on, XLA refuses the
MaxPool gradient ("no deterministic XLA implementation", even on CPU), and on this project's CPU the
non-XLA step was also the faster (see benchmarks/README.md)."""

from __future__ import annotations

import os
import re
from collections.abc import Callable

import numpy as np

from reprocube.data.store import ALIGNMENT
from reprocube.errors import ConfigError
from reprocube.formats.ops_format import STEP_INPUT
from reprocube.formats.trace import tensor_digest, text_digest
from reprocube.runtime.tensorflow_import import keras, tf  # TensorFlow's environment set, its start-up quiet
from reprocube.training.backend import STEPS_PER_CALL, check_arrays
from reprocube.training.state import EpochTotals, FrameworkState

layers = keras.layers

SEED_STATE_PREFIX = "keras.seed_generator."


def build_model(num_classes: int, dropout_seeds: tuple[int, int]) -> keras.Model:
    """conv 1->10 k5, pool, relu, conv 10->20 k5, SpatialDropout2D, pool, relu, dense 320->50, relu,
    dropout, dense 10 (channels-last: TensorFlow's CPU convolutions need NHWC)."""
    inputs = keras.Input((28, 28, 1), name="image")
    x = layers.Conv2D(10, 5, name="conv1")(inputs)
    x = layers.ReLU()(layers.MaxPooling2D(2)(x))
    x = layers.Conv2D(20, 5, name="conv2")(x)
    x = layers.SpatialDropout2D(0.5, seed=dropout_seeds[0], name="conv2_drop")(x)  # torch's Dropout2d
    x = layers.ReLU()(layers.MaxPooling2D(2)(x))
    x = layers.Flatten()(x)
    x = layers.Dense(50, activation="relu", name="fc1")(x)
    x = layers.Dropout(0.5, seed=dropout_seeds[1], name="fc1_drop")(x)
    return keras.Model(inputs, layers.Dense(num_classes, name="fc2")(x), name="net")


def _check_towers(cfg, examples: int) -> None:
    """Every batch must give each tower an example: oneDNN's convolution refuses an empty batch. A batch_size
    below the towers is the config's to refuse (reprocube.config); the last batch is known only here."""
    towers, last = cfg.framework.towers, examples % cfg.batch_size
    smallest = last if last and not cfg.data.drop_last else cfg.batch_size
    if smallest < towers:
        raise ConfigError(
            f"framework.towers={towers} needs at least {towers} examples in every batch, and a batch of this "
            f"training set holds {smallest}: set data.drop_last=true, another batch_size or framework.towers=1"
        )


def _resident(images: np.ndarray, device: str):
    """The images as an NHWC tensor. With one channel NCHW is NHWC in memory, and the data store's arrays
    are 64-byte aligned (reprocube.data.store), so on the CPU TensorFlow shares them (DLPack): tf.constant
    would copy the training set, 0.4 s of each process. Unaligned memory would abort a TensorFlow kernel, and
    a GPU needs its own copy: tf.constant there."""
    nhwc = np.ascontiguousarray(images.transpose(0, 2, 3, 1))
    if device == "cpu" and nhwc.ctypes.data % ALIGNMENT == 0:
        return tf.experimental.dlpack.from_dlpack(nhwc.__dlpack__())
    return tf.constant(nhwc)


def _configure_runtime(cfg) -> str:
    """Threads, visible devices and op determinism: all must be set before TensorFlow initialises."""
    gpus = tf.config.list_physical_devices("GPU")
    if cfg.device == "cuda" and not gpus:
        raise ConfigError("device=cuda but TensorFlow sees no GPU")
    try:
        if cfg.device == "cpu":
            tf.config.set_visible_devices([], "GPU")
        # Each tower's kernels on their own threads: the towers run side by side on the inter-op pool.
        tf.config.threading.set_intra_op_parallelism_threads(max(1, cfg.threads // cfg.framework.towers))
        tf.config.threading.set_inter_op_parallelism_threads(cfg.framework.inter_op_threads)
    except RuntimeError as exc:  # only possible if TensorFlow ran before the trainer was built
        raise ConfigError(f"TensorFlow was initialised before its thread settings could apply: {exc}") from None
    if cfg.deterministic:
        tf.config.experimental.enable_op_determinism()
    return "gpu" if gpus and cfg.device != "cpu" else "cpu"


class TensorflowBackend:
    def __init__(self, cfg, dataset):
        self.cfg = cfg
        self.device = _configure_runtime(cfg)
        _check_towers(cfg, len(dataset.train))
        keras.utils.set_random_seed(cfg.seed)  # Python, NumPy, TF and Keras' global generator: the init
        seeds = np.random.SeedSequence([cfg.seed, 0x44524F50]).generate_state(2)  # independent per layer
        self.model = build_model(dataset.num_classes, (int(seeds[0]), int(seeds[1])))
        self.optimizer = keras.optimizers.SGD(learning_rate=cfg.optimizer.lr, momentum=cfg.optimizer.momentum)
        self.optimizer.build(self.model.trainable_variables)
        self.seed_generators = {
            layer.name: layer.seed_generator for layer in self.model.layers if hasattr(layer, "seed_generator")
        }

        self.x_train, self.x_test = (_resident(split.images, self.device) for split in (dataset.train, dataset.test))
        self.y_train = tf.one_hot(dataset.train.labels, dataset.num_classes, dtype=tf.float32)
        self.y_test = tf.one_hot(dataset.test.labels, dataset.num_classes, dtype=tf.float32)
        self._order = tf.Variable(tf.zeros([len(dataset.train)], tf.int64), trainable=False)
        self._loss_sum = tf.Variable(0.0, dtype=tf.float32, trainable=False)
        self._correct = tf.Variable(0, dtype=tf.int64, trainable=False)
        # Each step of a group writes its loss here, as the step used to write the last loss into a variable:
        # returning them from the graph's loop (a TensorArray) cost ~30% of an epoch on this CPU.
        self._losses = tf.Variable(tf.zeros([STEPS_PER_CALL], tf.float32), trainable=False)
        # ... and its weight fingerprint (reprocube.formats.trace.fingerprint), computed in the graph after the update.
        self._fingerprint_variables = [v for _, v in sorted((_name(v), v) for v in self.model.weights)]
        self._fingerprints = tf.Variable(
            tf.zeros([STEPS_PER_CALL, len(self._fingerprint_variables)], tf.uint32), trainable=False
        )
        self._group_size = 0
        # One graph runs a whole group of steps (a while loop over their bounds): calling a tf.function
        # per step costs about as much as the step itself here. No graph needs AutoGraph (the loop is a
        # tf.while_loop, every other branch is on Python values), and converting the code cost each
        # process 0.35 s of its first group (same graphs, same bits).
        self._train_steps = tf.function(
            self._train_steps_graph,
            input_signature=[tf.TensorSpec([None, 2], tf.int32)],
            jit_compile=False,
            autograph=False,
        )
        # The whole test set in one call too: a call per batch of 64 was half of an evaluation's time.
        self._evaluate = tf.function(self._evaluate_graph, input_signature=[], jit_compile=False, autograph=False)
        batch_spec = [
            tf.TensorSpec([None, 28, 28, 1], tf.float32),
            tf.TensorSpec([None, dataset.num_classes], tf.float32),
        ]
        self._train_batch = tf.function(
            self._batch_graph, input_signature=batch_spec, jit_compile=False, autograph=False
        )

    def info(self) -> dict:
        build = tf.sysconfig.get_build_info()
        info = {
            "name": "tensorflow",
            "tensorflow": tf.__version__,
            "keras": keras.__version__,
            "device": self.device,
            "op_determinism": _op_determinism_enabled(),
            "intra_op_threads": tf.config.threading.get_intra_op_parallelism_threads(),
            "inter_op_threads": tf.config.threading.get_inter_op_parallelism_threads(),
            "onednn_opts": os.environ.get("TF_ENABLE_ONEDNN_OPTS"),
            "onednn": _onednn_enabled(),
            "jit_compile": False,
            "tf32": tf.config.experimental.tensor_float_32_execution_enabled(),
            "cuda_build": build.get("cuda_version"),
            "cudnn_build": build.get("cudnn_version"),
        }
        if self.device == "gpu":
            gpus = tf.config.list_physical_devices("GPU")
            info.update(gpu=tf.config.experimental.get_device_details(gpus[0]).get("device_name"), gpu_count=len(gpus))
        return info

    # --- training -------------------------------------------------------------------------------
    def _nll_sum(self, logits, one_hot):
        return -tf.reduce_sum(tf.nn.log_softmax(logits) * one_hot)

    def _train_steps_graph(self, bounds):
        def step(i):
            self._losses[i].assign(self._train_step_graph(bounds[i, 0], bounds[i, 1]))
            self._fingerprints[i].assign(self._fingerprint_graph())
            return (i + 1,)

        tf.while_loop(lambda i: i < tf.shape(bounds)[0], step, (tf.constant(0),))

    def _batch_graph(self, images, one_hot):
        """One step of the loader pipeline: its loss and fingerprint."""
        return self._batch_step(images, one_hot), self._fingerprint_graph()

    def _train_step_graph(self, lo, hi):
        index = self._order[lo:hi]
        return self._batch_step(tf.gather(self.x_train, index), tf.gather(self.y_train, index))

    def _batch_step(self, images, one_hot):
        size = tf.shape(one_hot)[0]
        batch = tf.cast(size, tf.float32)
        parts = self._towers(size, images, one_hot)
        logits, sums = [], []
        with tf.GradientTape() as tape:
            for part_images, part_one_hot in parts:
                logits.append(self.model(part_images, training=True))
                sums.append(self._nll_sum(logits[-1], part_one_hot))
            # One tower builds the graph it built before towers existed (no add_n, no concat): older runs' bits.
            loss = (sums[0] if len(sums) == 1 else tf.add_n(sums)) / batch
        grads = tape.gradient(loss, self.model.trainable_variables)
        self.optimizer.apply_gradients(zip(grads, self.model.trainable_variables, strict=True))
        self._loss_sum.assign_add(loss * batch)
        self._correct.assign_add(self._count_correct(logits[0] if len(logits) == 1 else tf.concat(logits, 0), one_hot))
        return loss

    def _towers(self, size, images, one_hot) -> list[tuple]:
        """The batch in framework.towers consecutive parts (sizes differing by at most one), each run through
        the model on its own: at batch 32 oneDNN's kernels barely use a second thread, so two half-batch
        towers, each a single-threaded kernel at a time, run side by side and a step takes 0.65-0.85x as long
        (benchmarks/README.md). The loss is the same sum over the batch, in other rounding (a result key)."""
        count = self.cfg.framework.towers
        if count == 1:
            return [(images, one_hot)]
        edges = [size * i // count for i in range(count + 1)]
        return [(images[lo:hi], one_hot[lo:hi]) for lo, hi in zip(edges, edges[1:], strict=False)]

    def _fingerprint_graph(self):
        """Each weight's float32 bits, mixed (reprocube.formats.trace.mix), summed modulo 2**32, in sorted name order:
        read after the update (tf.function orders the reads of a variable after its writes). uint32
        throughout: its products and sums wrap modulo 2**32 by definition, and a sum in uint32 costs a third
        less than the int64 cast and sum it replaced (benchmarks/README.md). One sum per variable: a concat
        and one segment_sum took longer; the model's sum alone (one concat, the mix, one sum) is cheaper
        per step but needs a second traced step graph for the per-tensor steps (half a second once)."""
        return tf.stack([tf.reduce_sum(_mix(tf.bitcast(v.value, tf.uint32))) for v in self._fingerprint_variables])

    def _eval_step_graph(self, lo, hi):
        logits = self.model(self.x_test[lo:hi], training=False)
        one_hot = self.y_test[lo:hi]
        return self._nll_sum(logits, one_hot), self._count_correct(logits, one_hot)

    @staticmethod
    def _count_correct(logits, one_hot):
        return tf.reduce_sum(tf.cast(tf.argmax(logits, axis=1) == tf.argmax(one_hot, axis=1), tf.int64))

    def begin_epoch(self, order: np.ndarray) -> None:
        self._order.assign(order)

    def train_steps(self, bounds, first_global_step: int) -> None:
        self._train_steps(tf.constant(bounds))
        self._group_size = len(bounds)

    def train_batches(self, batches, first_global_step: int) -> None:
        for i, (images, labels) in enumerate(batches):
            one_hot = tf.one_hot(labels, self.y_train.shape[1], dtype=tf.float32)
            loss, fingerprint = self._train_batch(tf.constant(images.transpose(0, 2, 3, 1)), one_hot)
            self._losses[i].assign(loss)
            self._fingerprints[i].assign(fingerprint)
        self._group_size = len(batches)

    def group_losses(self) -> np.ndarray:
        return self._losses.numpy()[: self._group_size]

    def group_fingerprints(self) -> np.ndarray:
        return self._fingerprints.numpy()[: self._group_size]

    def epoch_totals(self) -> EpochTotals:
        return EpochTotals(float(self._loss_sum.numpy()), int(self._correct.numpy()))

    def set_epoch_totals(self, totals: EpochTotals) -> None:
        self._loss_sum.assign(totals.loss_sum)
        self._correct.assign(totals.correct)

    def evaluate(self) -> dict:
        loss_sum, correct = self._evaluate()
        n = int(self.y_test.shape[0])
        return {"test_loss": float(loss_sum.numpy()) / n, "test_accuracy": int(correct.numpy()) / n}

    def _evaluate_graph(self):
        """The test set's loss sum and correct count, batch after batch, summed in batch order."""
        n, batch = int(self.y_test.shape[0]), self.cfg.test_batch_size

        def add_batch(lo, loss_sum, correct):
            batch_loss, batch_correct = self._eval_step_graph(lo, tf.minimum(lo + batch, n))
            return lo + batch, loss_sum + batch_loss, correct + batch_correct

        start = (tf.constant(0), tf.zeros([], tf.float32), tf.zeros([], tf.int64))
        _, loss_sum, correct = tf.while_loop(lambda lo, *_: lo < n, add_batch, start)
        return loss_sum, correct

    # --- state ----------------------------------------------------------------------------------
    def export_state(self) -> FrameworkState:
        weights = {_name(v): v.numpy() for v in self.model.weights}
        optimizer = {_name(v): v.numpy() for v in self.optimizer.variables}
        return FrameworkState(
            weights, optimizer, {name: variable.numpy() for name, variable in self._seed_states().items()}
        )

    def import_state(self, state: FrameworkState) -> None:
        _assign_checked("weights", state.weights, {_name(v): v for v in self.model.weights})
        _assign_checked("optimizer tensors", state.optimizer, {_name(v): v for v in self.optimizer.variables})
        self._restore_seed_generators(state.rng)

    def _restore_seed_generators(self, rng: dict[str, np.ndarray]) -> None:
        """The Dropout masks' state: without it a resumed run draws different masks (see the tests)."""
        _assign_checked("generator states", rng, self._seed_states())

    def _seed_states(self) -> dict:
        return {SEED_STATE_PREFIX + layer: generator.state for layer, generator in self.seed_generators.items()}

    def record_ops(self, run_step: Callable[[], None]) -> list[dict]:
        """Run `run_step` (one optimizer step through train_steps or train_batches) with its inputs and
        its kernels recorded (reprocube.training.replay), as the JAX trainer does: first each variable the step
        reads (weights, optimizer slots, dropout seed states) as an entry named after it, then each
        convolution and matrix product of the step's graph, forward and backward (gradient_tape/...),
        with a digest of each input and output, returned by the traced step as extra outputs. Whether
        that changed the step (oneDNN fuses a convolution with what follows it) is checked by the
        replay, not assumed."""
        recorder = _GraphRecorder({layer.name for layer in self.model.layers})
        compiled, variables = (self._train_steps, self._train_batch), self._step_variables()
        self._train_steps = recorder.recording(self._record_steps_graph, variables)
        self._train_batch = recorder.recording(self._batch_graph, variables)
        try:
            run_step()
        finally:
            self._train_steps, self._train_batch = compiled
        return recorder.ops

    def _record_steps_graph(self, bounds):
        """_train_steps_graph for the one step a replay records, without the graph's loop."""
        self._losses[0].assign(self._train_step_graph(bounds[0, 0], bounds[0, 1]))
        self._fingerprints[0].assign(self._fingerprint_graph())

    def _step_variables(self) -> dict:
        variables = {_name(v): v for v in self.model.variables}
        variables.update({f"optimizer.{_name(v)}": v for v in self.optimizer.variables})
        return dict(sorted(variables.items()))


# --- recording one step's operations (reprocube.training.replay) -------------------------------------------------
RECORDED_KERNELS = ("Conv2D", "Conv2DBackpropInput", "Conv2DBackpropFilter", "MatMul")


class _GraphRecorder:
    """A step traced anew as a tf.function that also returns each kernel's inputs and outputs (found in
    its graph when traced); the step's variables are read before it runs."""

    def __init__(self, layers: set[str]):
        self.layers, self.ops = layers, []

    def recording(self, body, variables: dict):
        sites: list[tuple[str, str]] = []

        def traced(*args):
            result = body(*args)
            kernels = [op for op in tf.compat.v1.get_default_graph().get_operations() if op.type in RECORDED_KERNELS]
            sites[:] = [(op.type, op.name) for op in kernels]
            return result, [list(op.inputs) for op in kernels], [list(op.outputs) for op in kernels]

        step = tf.function(traced, jit_compile=False)

        def call(*args):
            for name, variable in variables.items():
                self._append(STEP_INPUT, f"step input {name}", [variable.numpy()], [])
            result, inputs, outputs = step(*args)
            for (kind, name), ins, outs in zip(sites, inputs, outputs, strict=True):
                self._append(
                    f"tf.{kind}", _where(name, self.layers), [t.numpy() for t in ins], [t.numpy() for t in outs]
                )
            return result

        return call

    def _append(self, op: str, where: str, inputs: list, outputs: list) -> None:
        self.ops.append(
            {
                "index": len(self.ops),
                "op": op,
                "where": where,
                "params": text_digest(""),
                "inputs": [tensor_digest(a) for a in inputs],
                "outputs": [tensor_digest(a) for a in outputs],
            }
        )


def _where(op_name: str, layers: set[str]) -> str:
    """`forward, conv1` or `backward, fc2`, from a graph op's name (Keras' layer scopes, which it makes
    unique with a suffix: net_1/conv1_1/convolution)."""
    parts = op_name.split("/")
    layer = next((base for p in parts if (base := re.sub(r"_\d+$", "", p)) in layers), None)
    phase = "backward" if parts[0].startswith("gradient_tape") else "forward"
    return f"{phase}, {layer}" if layer else phase


def _mix(bits):
    """reprocube.formats.trace.mix on int32 bit patterns (two's complement: the product wraps modulo 2**32)."""
    return tf.bitwise.bitwise_xor(bits, bits * bits)


def _op_determinism_enabled() -> bool:
    # Read back from TensorFlow itself (not our config); there is no public getter in 2.21.
    from tensorflow.python.framework import config as tf_config

    return bool(tf_config.is_op_determinism_enabled())


def _onednn_enabled() -> bool:
    # Whether TensorFlow runs its oneDNN kernels (TF_ENABLE_ONEDNN_OPTS, else its CPU-dependent default).
    from tensorflow.python.util import _pywrap_util_port

    return bool(_pywrap_util_port.IsMklEnabled())


def _name(variable) -> str:
    return variable.path.replace("/", ".")


def _assign_checked(what: str, arrays: dict[str, np.ndarray], variables: dict) -> None:
    check_arrays(what, arrays, {name: (tuple(v.shape), v.dtype) for name, v in variables.items()})
    for name, variable in variables.items():
        variable.assign(arrays[name])
