"""Where a TensorFlow training step's time goes: a tf.profiler trace of reprocube's trainer (its graph of
up to 100 steps per call, after 100 warm steps), summarised per kernel (ms per step, and the part spent in
a ParallelFor over the intra-op pool), per inter-op thread (ms per step running kernels), and the time
with no, one or two kernels running at once. The unprofiled ms per step of the same steps is printed first.

    python benchmarks/tf_step_profile.py [--steps 300] [--data-dir DATA] [KEY=VALUE ...]
    TF_ENABLE_ONEDNN_OPTS=0 python benchmarks/tf_step_profile.py framework.inter_op_threads=1   # Eigen's kernels
"""

from __future__ import annotations

import argparse
import collections
import os
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from reprocube.config import load_config
from reprocube.data.sampler import EpochSampler
from reprocube.data.store import load_dataset
from reprocube.training.backend import STEPS_PER_CALL, create_backend
from reprocube.training.state import EpochTotals

GRAPH_PREFIXES = {
    "while/body/_1/gradient_tape/while/net_1/": "grad/",
    "while/body/_1/while/net_1/": "",
    "while/body/_1/": "",
}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--data-dir", default="data")
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args()
    cfg = load_config(["framework=tensorflow", f"data_dir={args.data_dir}", *args.overrides])
    dataset = load_dataset(cfg)
    sampler = EpochSampler(cfg.seed, len(dataset.train), cfg.batch_size, cfg.data.drop_last)
    backend = create_backend(cfg, dataset)
    backend.set_epoch_totals(EpochTotals())
    backend.begin_epoch(sampler.epoch_order(0))

    if 100 + 2 * args.steps > sampler.steps_per_epoch:
        parser.error(f"--steps: at most {(sampler.steps_per_epoch - 100) // 2} (one epoch holds both runs)")

    def steps(first: int, count: int) -> float:
        return ms_per_step(backend, sampler, first, count)

    steps(0, 100)
    info = backend.info()
    print(f"oneDNN {info['onednn']}, intra-op {info['intra_op_threads']}, inter-op {info['inter_op_threads']}")
    print(f"unprofiled: {steps(100, args.steps):.3f} ms per step")

    import tensorflow as tf

    with tempfile.TemporaryDirectory(prefix="tf-step-profile-") as logdir:
        tf.profiler.experimental.start(logdir)
        print(f"profiled:   {steps(100 + args.steps, args.steps):.3f} ms per step")
        tf.profiler.experimental.stop()
        [path] = Path(logdir).rglob("*.xplane.pb")
        summarise(path.read_bytes(), args.steps)
    return 0


def ms_per_step(backend, sampler, first: int, count: int) -> float:
    """Steps [first, first + count) of the epoch begun, in the trainer's groups: ms per step."""
    started = time.perf_counter()
    for lo in range(first, first + count, STEPS_PER_CALL):
        backend.train_steps(sampler.steps_bounds(lo, min(lo + STEPS_PER_CALL, first + count)), lo)
        backend.group_losses()
    return (time.perf_counter() - started) / count * 1000


def summarise(xplane: bytes, steps: int) -> None:
    from tensorflow.tsl.profiler.protobuf import xplane_pb2

    space = xplane_pb2.XSpace()
    space.ParseFromString(xplane)
    [plane] = [p for p in space.planes if p.name == "/host:CPU"]
    names = {k: v.name for k, v in plane.event_metadata.items()}
    per_kernel, in_parallel_for, edges = collections.Counter(), collections.Counter(), []
    ms = 1e9 * steps  # picoseconds -> ms per step
    for line in plane.lines:
        if not line.name.startswith("tf_Compute"):  # the inter-op pool's threads run the graph's kernels
            continue
        busy, kernel = 0, None
        for event in sorted(line.events, key=lambda e: e.offset_ps):
            name, start, end = names[event.metadata_id], event.offset_ps, event.offset_ps + event.duration_ps
            if ":" in name and name.startswith("while/"):  # "node/name:OpType"
                kernel = (start, end, short(name))
                per_kernel[kernel[2]] += end - start
                busy += end - start
                edges += [(start + line.timestamp_ns * 1000, 1), (end + line.timestamp_ns * 1000, -1)]
            elif name == "ParallelFor" and kernel and kernel[0] <= start and end <= kernel[1]:
                in_parallel_for[kernel[2]] += end - start
        print(f"thread {line.name}: kernels {busy / ms:.3f} ms per step")
    at_once, depth, last = collections.Counter(), 0, None
    for when, change in sorted(edges):
        if last is not None:
            at_once[depth] += when - last
        depth, last = depth + change, when
    print("ms per step with N kernels running at once:", {n: round(t / ms, 3) for n, t in sorted(at_once.items())})
    print(f"{'kernel':72s} ms/step  of it in ParallelFor")
    for kernel, total in per_kernel.most_common(14):
        print(f"{kernel:72s} {total / ms:7.3f}  {in_parallel_for[kernel] / ms:7.3f}")
    rest = sum(per_kernel.values()) - sum(t for _, t in per_kernel.most_common(14))
    print(f"{'everything else (' + str(len(per_kernel) - 14) + ' kernels)':72s} {rest / ms:7.3f}")


def short(name: str) -> str:
    for prefix, short_prefix in GRAPH_PREFIXES.items():
        name = name.replace(prefix, short_prefix)
    return name


if __name__ == "__main__":
    sys.exit(main())
