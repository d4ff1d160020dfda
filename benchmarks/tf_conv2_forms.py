"""TensorFlow's conv2 (10 -> 20 channels, 5x5, on the 12x12 maps of a batch of 32; forward and both
gradients, under op determinism, oneDNN on) in three forms: oneDNN's Conv2D (the trainer's), 25 slices
concatenated times the kernel reshaped (what made JAX's step faster, framework.conv2=matmul), and
tf.image.extract_patches times the kernel. Each form runs 500 steps in one graph, 5 rounds; the minimum
and the median ms per step are printed and written.

    python benchmarks/tf_conv2_forms.py [--out benchmarks/cpu/tf-conv2-forms.json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from pathlib import Path

os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "1")  # as the trainer sets it
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np
import tensorflow as tf

STEPS, ROUNDS = 500, 5


def onednn_conv(x, k):
    return tf.nn.conv2d(x, k, 1, "VALID")


def sliced_matmul(x, k):
    cols = tf.concat([x[:, i : i + 8, j : j + 8, :] for i in range(5) for j in range(5)], axis=-1)
    return tf.reshape(tf.reshape(cols, (-1, 250)) @ tf.reshape(k, (250, 20)), (-1, 8, 8, 20))


def extract_patches_matmul(x, k):
    cols = tf.image.extract_patches(x, [1, 5, 5, 1], [1, 1, 1, 1], [1, 1, 1, 1], "VALID")
    return tf.reshape(tf.reshape(cols, (-1, 250)) @ tf.reshape(k, (250, 20)), (-1, 8, 8, 20))


FORMS = {
    "Conv2D (oneDNN)": onednn_conv,
    "slices @ kernel": sliced_matmul,
    "extract_patches @ kernel": extract_patches_matmul,
}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    tf.config.threading.set_intra_op_parallelism_threads(2)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    tf.config.experimental.enable_op_determinism()
    rng = np.random.default_rng(0)
    x = tf.constant(rng.standard_normal((32, 12, 12, 10), dtype=np.float32))
    k = tf.Variable(rng.standard_normal((5, 5, 10, 20), dtype=np.float32) * 0.1)
    g = tf.constant(rng.standard_normal((32, 8, 8, 20), dtype=np.float32))
    rows = {}
    for name, form in FORMS.items():

        @tf.function(jit_compile=False)
        def steps(n, form=form):
            total = tf.constant(0.0)
            for _ in tf.range(n):
                with tf.GradientTape() as tape:
                    tape.watch(x)
                    loss = tf.reduce_sum(form(x, k) * g)
                dx, dk = tape.gradient(loss, [x, k])
                total += tf.reduce_sum(dx) + tf.reduce_sum(dk)
            return total

        steps(tf.constant(10))  # traced and warm
        ms = []
        for _ in range(ROUNDS):
            started = time.perf_counter()
            steps(tf.constant(STEPS))
            ms.append((time.perf_counter() - started) / STEPS * 1e3)
        rows[name] = {"ms_min": round(min(ms), 3), "ms_median": round(statistics.median(ms), 3)}
        print(f"{name}: {min(ms):.3f} ms a step (min of {ROUNDS}), median {statistics.median(ms):.3f}", flush=True)
    if args.out:
        flags = Path("/proc/cpuinfo").read_text().split()
        report = {
            "machine": {"isa": "avx512" if "avx512f" in flags else "avx2", "python": platform.python_version()},
            "tensorflow": tf.__version__,
            "load_1min": os.getloadavg()[0],
            "forms": rows,
        }
        args.out.write_text(json.dumps(report, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
