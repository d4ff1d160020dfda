"""Which parts of a TensorFlow training step cost time: the trainer's step as it is, beside variants that
leave out or fuse one part, in alternating processes. Each process builds the trainer, runs 100 warm steps,
then --windows windows of 250 steps (ms per step each); a variant's figure is the median over its
processes of their median window.

    as-is           the trainer unchanged
    fused-sgd       Keras' SGD replaced by one ResourceApplyKerasMomentum kernel per variable (same bits)
    pregathered     a group's examples gathered once before its loop, not per step (same bits)
    no-update       no optimizer, no fingerprint, no epoch totals: forward and backward only (other bits)

The same-bits variants must end with the trainer's weights (the script fails otherwise).

    .venv/bin/python benchmarks/tf_step_variants.py --data-dir data [--rounds 4] [--out benchmarks/cpu/NAME.json]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

from startup_rounds import write_result
from tf_step_profile import ms_per_step

VARIANTS = ("as-is", "fused-sgd", "pregathered", "no-update")
SAME_BITS = ("as-is", "fused-sgd", "pregathered")
WARM_STEPS, WINDOW_STEPS = 100, 250


def _fused_sgd(backend, grads) -> None:
    import tensorflow as tf

    optimizer = backend.optimizer
    lr, momentum = tf.cast(optimizer.learning_rate, tf.float32), tf.constant(optimizer.momentum, tf.float32)
    for grad, variable in zip(grads, backend.model.trainable_variables, strict=True):
        slot = optimizer.momentums[optimizer._get_variable_index(variable)]
        tf.raw_ops.ResourceApplyKerasMomentum(
            var=variable.value.handle, accum=slot.value.handle, lr=lr, grad=grad, momentum=momentum, use_nesterov=False
        )
    optimizer.iterations.assign_add(1)


def _install(variant: str, backend_class) -> None:
    """Replace the one method the variant changes (the trainer's own code otherwise)."""
    import tensorflow as tf

    original_step = backend_class._batch_step

    def forward_backward(self, images, one_hot, update):
        size = tf.shape(one_hot)[0]
        batch = tf.cast(size, tf.float32)
        logits, sums = [], []
        with tf.GradientTape() as tape:
            for part_images, part_one_hot in self._towers(size, images, one_hot):
                logits.append(self.model(part_images, training=True))
                sums.append(self._nll_sum(logits[-1], part_one_hot))
            loss = (sums[0] if len(sums) == 1 else tf.add_n(sums)) / batch
        grads = tape.gradient(loss, self.model.trainable_variables)
        if update:
            _fused_sgd(self, grads)
            self._loss_sum.assign_add(loss * batch)
            self._correct.assign_add(self._count_correct(tf.concat(logits, 0), one_hot))
        else:  # keep the gradients computed: their sum is written where the step's loss goes
            self._losses[0].assign(tf.add_n([tf.reduce_sum(g) for g in grads]))
        return loss

    if variant == "fused-sgd":
        backend_class._batch_step = lambda self, images, one_hot: forward_backward(self, images, one_hot, True)
    elif variant == "no-update":
        backend_class._batch_step = lambda self, images, one_hot: forward_backward(self, images, one_hot, False)
        backend_class._fingerprint_graph = lambda self: tf.zeros([len(self._fingerprint_variables)], tf.uint32)
    elif variant == "pregathered":

        def steps_graph(self, bounds):
            first = bounds[0, 0]
            index = self._order[first : bounds[-1, 1]]
            images, one_hot = tf.gather(self.x_train, index), tf.gather(self.y_train, index)
            for i in tf.range(tf.shape(bounds)[0]):
                lo, hi = bounds[i, 0] - first, bounds[i, 1] - first
                self._losses[i].assign(original_step(self, images[lo:hi], one_hot[lo:hi]))
                self._fingerprints[i].assign(self._fingerprint_graph())

        backend_class._train_steps_graph = steps_graph


def _child(variant: str, data_dir: str, windows: int) -> None:
    from reprocube.config import load_config
    from reprocube.data.sampler import EpochSampler
    from reprocube.data.store import load_dataset
    from reprocube.frameworks.tensorflow import TensorflowBackend
    from reprocube.training.backend import create_backend
    from reprocube.training.state import EpochTotals

    cfg = load_config(["framework=tensorflow", f"data_dir={data_dir}"])
    _install(variant, TensorflowBackend)
    dataset = load_dataset(cfg)
    sampler = EpochSampler(cfg.seed, len(dataset.train), cfg.batch_size, cfg.data.drop_last)
    if WARM_STEPS + windows * WINDOW_STEPS > sampler.steps_per_epoch:
        raise SystemExit(f"--windows: at most {(sampler.steps_per_epoch - WARM_STEPS) // WINDOW_STEPS}")
    backend = create_backend(cfg, dataset)
    backend.set_epoch_totals(EpochTotals())
    backend.begin_epoch(sampler.epoch_order(0))

    ms_per_step(backend, sampler, 0, WARM_STEPS)
    ms = [round(ms_per_step(backend, sampler, WARM_STEPS + w * WINDOW_STEPS, WINDOW_STEPS), 4) for w in range(windows)]
    weights = hashlib.sha256(b"".join(v.numpy().tobytes() for v in backend.model.weights)).hexdigest()
    print(json.dumps({"ms_per_step": ms, "weights_sha256": weights}))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data-dir", type=Path, required=True)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--windows", type=int, default=6)
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--out", type=Path)
    parser.add_argument("--child", choices=VARIANTS, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        _child(args.child, str(args.data_dir.resolve()), args.windows)
        return 0
    variants = args.variants.split(",")
    runs: dict[str, list[dict]] = {v: [] for v in variants}
    for number in range(1, args.rounds + 1):
        for variant in variants:
            command = [sys.executable, __file__, "--child", variant, "--data-dir", str(args.data_dir)]
            command += ["--windows", str(args.windows)]
            done = subprocess.run(command, capture_output=True, text=True, env=os.environ)
            if done.returncode != 0:
                raise SystemExit(f"{variant} failed: {done.stderr[-2000:]}")
            runs[variant].append(json.loads(done.stdout.splitlines()[-1]))
            print(f"round {number} {variant:12s} ms/step {runs[variant][-1]['ms_per_step']}", flush=True)
    same = {r["weights_sha256"] for v in variants if v in SAME_BITS for r in runs[v]}
    if len(same) > 1:
        raise SystemExit(f"the same-bits variants ended with different weights: {sorted(same)}")
    rows = []
    for variant in variants:
        medians = [round(statistics.median(r["ms_per_step"]), 4) for r in runs[variant]]
        rows.append(
            {
                "variant": variant,
                "ms_per_step_median": round(statistics.median(medians), 3),
                "ms_per_step_process_medians": medians,
                "ms_per_step_min": min(min(r["ms_per_step"]) for r in runs[variant]),
                "same_bits_as_the_trainer": variant in SAME_BITS,
            }
        )
        print(f"{variant:12s} median {rows[-1]['ms_per_step_median']:.3f} ms/step (process medians {medians})")
    write_result(args.out, args.rounds, rows, bit_identical=len(same) == 1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
