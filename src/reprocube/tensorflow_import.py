"""TensorFlow and Keras, imported the one way reprocube imports them: their environment set first, and
their start-up chatter kept off stderr.

TensorFlow 2.21 logs through absl before anything can initialise absl's logging, so TF_CPP_MIN_LOG_LEVEL
does not reach its start-up lines: each of its two libraries prints "WARNING: All log messages before
absl::InitializeLog() is called are written to STDERR" and an INFO line that oneDNN is on. A refusal of
ours must be the only line on stderr, so exactly those lines are dropped (reprocube.stderr_filter)."""

from __future__ import annotations

import os

from reprocube.stderr_filter import lines_dropped

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

with lines_dropped(START_UP_CHATTER):
    import keras  # noqa: E402
    import tensorflow as tf  # noqa: E402

__all__ = ["keras", "tf"]
