"""TensorFlow and Keras, imported the one way reprocube imports them: their environment set first, and
their start-up chatter kept off stderr.

TensorFlow 2.21 logs through absl before anything can initialise absl's logging, so TF_CPP_MIN_LOG_LEVEL
does not reach its start-up lines: each of its two libraries prints "WARNING: All log messages before
absl::InitializeLog() is called are written to STDERR" and an INFO line that oneDNN is on. A refusal of
ours must be the only line on stderr, so exactly those lines are dropped (reprocube.runtime.stderr_filter).

Nor does it import JAX on the way: TensorFlow's import runs tensorflow/lite/python/util.py, whose
`from jax import jit` (for TFLite's JAX converter, which reprocube never uses) imports JAX wherever it is
installed, as it is beside TensorFlow in reprocube's environments: 0.4-0.5 s and 340 modules of every
TensorFlow process on this project's CPU. util.py takes an ImportError as "no JAX", so for the duration of
the import JAX is not found; after it, `import jax` works as ever."""

from __future__ import annotations

import contextlib
import importlib.abc
import os
import sys

from reprocube.runtime.stderr_filter import lines_dropped

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # TF's C++ chatter that does honour it, not errors
# TensorFlow turns its oneDNN kernels on by itself only on CPUs with AVX512_VNNI/BF16 or AMX; on an AVX2 CPU
# its Eigen kernels made an epoch 2x as long (benchmarks/README.md). Read once, when TensorFlow is imported.
os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "1")

START_UP_CHATTER = (
    r"WARNING: All log messages before absl::InitializeLog\(\) is called are written to STDERR\n",
    r"I\d{4} [0-9:.]+ +\d+ port\.cc:\d+\] oneDNN custom operations are on\. [^\n]*\n",
    r"I\d{4} [0-9:.]+ +\d+ cpu_feature_guard\.cc:\d+\] This TensorFlow binary is optimized [^\n]*\n",
    r"To enable the following instructions: [A-Z0-9_ ]+, in other operations, rebuild TensorFlow [^\n]*\n",
)


class _NoJax(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name == "jax" or name.startswith("jax."):
            raise ImportError(f"{name} is not imported while TensorFlow is (reprocube.runtime.tensorflow_import)")
        return None


@contextlib.contextmanager
def _jax_not_found():
    finder = _NoJax()
    sys.meta_path.insert(0, finder)
    try:
        yield
    finally:
        sys.meta_path.remove(finder)


with lines_dropped(START_UP_CHATTER), _jax_not_found():
    import keras
    import tensorflow as tf

__all__ = ["keras", "tf"]
