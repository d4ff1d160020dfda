"""What the trace's per-step weight fingerprint costs, per framework, on one epoch of Fashion-MNIST.

Side by side in one process: the epoch's steps run in blocks of 100 (one group each, as the loop runs
them), alternately with the fingerprint (the trainer as it is: computed in the step, fetched with the
group's losses and added to a trace) and without it (the same trainer with its fingerprint work replaced
by nothing: PyTorch's per-step copy skipped, TensorFlow's graph and JAX's jitted step traced again with a
constant), each block ending in the group's host sync. Alternating blocks of a few hundred milliseconds
cancel this VM's drift better than separate processes do (which gave -60% to +170% here under load).
With --receipts, also one real 1-epoch run per framework, for its receipt's bytes and their parts.

    python benchmarks/trace_cost.py --data-dir data --repeats 2 --receipts --out benchmarks/cpu/trace-fingerprint.json

--tensorflow-fingerprint model_sum|reads_only times a measured alternative in TensorFlow's step graph
instead of the trainer's fingerprint (the model's sum alone; only reading the weights, a lower bound).

The JSON holds no absolute path.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FRAMEWORKS = ("pytorch", "tensorflow", "jax")

CHILD = textwrap.dedent(
    """
    import json, sys, time
    import numpy as np
    from reprocube.training.backend import STEPS_PER_CALL, create_backend
    from reprocube.config import load_config
    from reprocube.data.sampler import EpochSampler
    from reprocube.data.store import load_dataset
    from reprocube.training.loop import seed_host_rng
    from reprocube.formats.trace import StepTrace

    framework, data_dir, threads, epochs, tf_variant = sys.argv[1:6]
    epochs = int(epochs)
    cfg = load_config([f"framework={framework}", "dataset=fashion_mnist", f"data_dir={data_dir}",
                       f"threads={threads}", "device=cpu"])
    dataset = load_dataset(cfg)
    sampler = EpochSampler(cfg.seed, len(dataset.train), cfg.batch_size, cfg.data.drop_last)
    steps_per_epoch = sampler.steps_per_epoch
    seed_host_rng(cfg.seed)
    backend = create_backend(cfg, dataset)
    trace = StepTrace(0, first_step=0, tensor_names=sorted(backend.export_state().weights))
    width = len(trace.tensor_names)

    def block(epoch, first, end, fingerprints):
        # As the loop runs a group of the epoch (from the second epoch on).
        started = time.perf_counter()
        backend.train_steps(sampler.steps_bounds(first, end), epoch * steps_per_epoch + first)
        losses = backend.group_losses()  # the host sync
        if fingerprints:
            trace.add_losses(losses, backend.group_fingerprints())
        return time.perf_counter() - started

    if framework == "tensorflow" and tf_variant != "tensors":
        # Measured alternatives, not what the trainer computes (its per-tensor rows are then wrong): the
        # model's sum alone (one concat, the mix, one sum), or the variables' reads alone (a lower bound).
        import tensorflow as tf
        variables, count = backend._fingerprint_variables, len(backend._fingerprint_variables)
        def model_sum():
            bits = tf.bitcast(tf.concat([tf.reshape(v.value, [-1]) for v in variables], axis=0), tf.uint32)
            return tf.fill([count], tf.reduce_sum(tf.bitwise.bitwise_xor(bits, bits * bits)))
        def reads_only():
            return tf.stack([tf.bitcast(tf.reshape(v.value, [-1])[0], tf.uint32) for v in variables])
        variant_graph = {"model_sum": model_sum, "reads_only": reads_only}[tf_variant]
        backend._fingerprint_graph = variant_graph
    backend.begin_epoch(sampler.epoch_order(0))
    block(0, 0, 21, True)  # the first step (and compilation) and 20 more, untimed
    # The same trainer without its fingerprint work, traced and compiled now.
    if framework == "pytorch":
        SWAPPED = "_record_fingerprint"
        with_fingerprints = backend._record_fingerprint
        backend._record_fingerprint = lambda row: None
    elif framework == "tensorflow":
        import tensorflow as tf
        SWAPPED = "_train_steps"
        with_fingerprints = backend._train_steps
        zeros = tf.zeros([width], tf.uint32)
        backend._fingerprint_graph = lambda: zeros  # still written to its row: one tiny op
        backend._train_steps = tf.function(
            backend._train_steps_graph, input_signature=[tf.TensorSpec([None, 2], tf.int32)], jit_compile=False
        )
    else:
        import jax, jax.numpy as jnp
        import reprocube.frameworks.jax as module
        SWAPPED = "_train_step"
        with_fingerprints = backend._train_step
        original, zeros = module._fingerprint, jnp.zeros(width, jnp.uint32)
        module._fingerprint = lambda params: zeros
        backend._train_step = jax.jit(backend._train_step_fn, static_argnums=(5,))
    block(0, 21, 42, False)
    if framework == "jax":
        module._fingerprint = original
    elif framework == "tensorflow":
        if tf_variant == "tensors":
            del backend._fingerprint_graph  # the method again (the graph is traced)
        else:
            backend._fingerprint_graph = variant_graph
    without_fingerprints = getattr(backend, SWAPPED)
    trace = StepTrace(0, first_step=steps_per_epoch, tensor_names=trace.tensor_names)  # the timed blocks' only

    # The fingerprint's own work for 100 steps, timed alone between the blocks (so in the same state of
    # the process as the steps it is compared with). PyTorch: its per-step copy and the group's sums,
    # exactly. TensorFlow: a graph loop computing it and writing its row, minus the same loop writing a
    # constant (the loop's own cost); beside it, two ways it is not computed: int64 sums (before 8a64ed5)
    # and the model's sum alone (cheaper, but per-tensor rows for the first steps would need a second
    # step graph, traced once for about half a second). JAX: jitted calls computing it, minus jitted
    # calls returning a constant.
    probes = {}
    if framework == "pytorch":
        def pytorch_group():
            for row in range(STEPS_PER_CALL):
                with_fingerprints(row)
            backend._group_losses = [None] * STEPS_PER_CALL
            backend.group_fingerprints()
        probes["fingerprint"] = (pytorch_group, None)
    elif framework == "tensorflow":
        def loop(body, rows):
            def step(i):
                rows[i].assign(body())
                return (i + 1,)
            graph = tf.function(lambda: tf.while_loop(lambda i: i < STEPS_PER_CALL, step, (tf.constant(0),)))
            return lambda: (graph(), rows.numpy())
        probes["fingerprint"] = (loop(backend._fingerprint_graph, backend._fingerprints),
                                 loop(lambda: zeros, backend._fingerprints))
        variables = backend._fingerprint_variables
        def int64_sums():
            sums = []
            for v in variables:
                bits = tf.bitcast(v.value, tf.int32)
                sums.append(tf.reduce_sum(tf.cast(tf.bitwise.bitwise_xor(bits, bits * bits), tf.int64)))
            return tf.bitwise.bitwise_and(tf.stack(sums), tf.constant(0xFFFFFFFF, tf.int64))
        int64_rows = tf.Variable(tf.zeros([STEPS_PER_CALL, width], tf.int64))
        zeros64 = tf.zeros([width], tf.int64)
        probes["int64_sums_before"] = (loop(int64_sums, int64_rows), loop(lambda: zeros64, int64_rows))
        def model_sum():
            bits = tf.bitcast(tf.concat([tf.reshape(v.value, [-1]) for v in variables], axis=0), tf.uint32)
            return tf.reduce_sum(tf.bitwise.bitwise_xor(bits, bits * bits))
        model_rows, zero = tf.Variable(tf.zeros([STEPS_PER_CALL], tf.uint32)), tf.zeros([], tf.uint32)
        probes["model_sum_alternative"] = (loop(model_sum, model_rows), loop(lambda: zero, model_rows))
    else:
        fingerprint_jit = jax.jit(module._fingerprint)
        constant_jit = jax.jit(lambda params: zeros)
        probes["fingerprint"] = (
            lambda: jax.device_get([fingerprint_jit(backend.params) for _ in range(STEPS_PER_CALL)]),
            lambda: jax.device_get([constant_jit(backend.params) for _ in range(STEPS_PER_CALL)]),
        )
    for measured, baseline in probes.values():  # traced and compiled
        measured()
        baseline and baseline()

    def probe(measured, baseline):
        started = time.perf_counter()
        measured()
        took = time.perf_counter() - started
        if baseline is not None:
            started = time.perf_counter()
            baseline()
            took -= time.perf_counter() - started
        return took

    rows, alone = [], {name: [] for name in probes}
    for epoch in range(1, epochs + 1):
        backend.begin_epoch(sampler.epoch_order(epoch))
        for i, first in enumerate(range(0, steps_per_epoch, STEPS_PER_CALL)):
            end = min(first + STEPS_PER_CALL, steps_per_epoch)
            order = (True, False) if (i + epoch) % 2 == 0 else (False, True)
            pair = {}
            for fingerprints in order:
                setattr(backend, SWAPPED, with_fingerprints if fingerprints else without_fingerprints)
                pair["with" if fingerprints else "without"] = block(epoch, first, end, fingerprints)
            rows.append({"steps": end - first, **pair})
            for name, (measured, baseline) in probes.items():
                alone[name].append(probe(measured, baseline))
    print(json.dumps({"blocks": rows, "alone_100_steps_s": alone}))
    """
)


def child(framework: str, data_dir: Path, threads: int, epochs: int, tf_variant: str = "tensors") -> dict:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "PYTHONHASHSEED": "0"}
    proc = subprocess.run(
        [sys.executable, "-c", CHILD, framework, str(data_dir), str(threads), str(epochs), tf_variant],
        capture_output=True,
        text=True,
        env=env,
        timeout=3600,
    )
    if proc.returncode != 0:
        raise SystemExit(f"{framework} failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def receipt_bytes(framework: str, data_dir: Path, work: Path, threads: int) -> dict:
    """The receipt of a real 1-epoch Fashion-MNIST run (1875 steps, the default trace settings), in bytes as
    written, and its parts: the trace's keys and the rest (config, environment, source digests, epochs)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "PYTHONHASHSEED": "0"}
    subprocess.run(
        [
            sys.executable,
            "-m",
            "reprocube",
            "train",
            f"framework={framework}",
            "epochs=1",
            f"threads={threads}",
            f"data_dir={data_dir}",
            f"output_dir={work}",
            f"run_name={framework}",
            "log.progress=false",
            "device=cpu",
        ],
        check=True,
        capture_output=True,
        env=env,
        cwd=work,
        timeout=3600,
    )
    raw = (work / framework / "receipt.json").read_bytes()
    receipt = json.loads(raw)
    compact = lambda value: len(json.dumps(value, separators=(",", ":")))  # as written
    trace = receipt["trace"]
    return {
        "steps": trace["steps"],
        "receipt_bytes": len(raw),
        "trace_bytes": {key: compact(value) for key, value in trace.items()},
        "rest_of_receipt_bytes": compact({k: v for k, v in receipt.items() if k != "trace"}),
        "source_files": len(receipt["reprocube"]["source_files"]),
    }


def machine() -> dict:
    lines = Path("/proc/cpuinfo").read_text().splitlines()
    model = next((line.split(":", 1)[1].strip() for line in lines if line.startswith("model name")), "")
    flags = next((line for line in lines if line.startswith("flags")), "")
    return {
        "cpu": model,
        "cpus": os.cpu_count(),
        "avx512f": " avx512f" in flags,
        "avx2": " avx2" in flags,
        "python": platform.python_version(),
        "load_average_at_start": [round(x, 2) for x in os.getloadavg()],
    }


def summarize(blocks: list[dict], alone: dict[str, list[float]]) -> dict:
    with_s, without_s = sum(b["with"] for b in blocks), sum(b["without"] for b in blocks)
    ratios = [b["with"] / b["without"] - 1 for b in blocks]
    steps = sum(b["steps"] for b in blocks)
    fastest = {k: min(b[k] / b["steps"] for b in blocks) for k in ("with", "without")}
    step_median = statistics.median(b["without"] / b["steps"] for b in blocks)
    mean = statistics.fmean(ratios)
    half_width = 1.96 * statistics.stdev(ratios) / len(ratios) ** 0.5
    # The fingerprint's work alone, per step: the median of its timings between the blocks, against the
    # median step without it (both in the same state of the process).
    per_step = {k: statistics.median(v) / 100 for k, v in alone.items()}
    return {
        "alone_us_per_step_median": {k: round(1e6 * v, 1) for k, v in per_step.items()},
        "alone_us_per_step_p25_p75": {
            k: [round(1e4 * q, 1) for q in statistics.quantiles(v, n=4)[::2]] for k, v in alone.items()
        },
        "alone_share_of_median_step": {k: round(v / step_median, 4) for k, v in per_step.items()},
        "step_ms_median_without": round(1000 * step_median, 3),
        "step_ms_fastest_without": round(1000 * fastest["without"], 3),
        # The blocks: with / without, per pair, with the mean's 95% interval.
        "cost_mean_of_pairs": round(mean, 4),
        "cost_mean_of_pairs_95ci": [round(mean - half_width, 4), round(mean + half_width, 4)],
        "cost_median_of_pairs": round(statistics.median(ratios), 4),
        "cost_pairs_p25_p75": [round(q, 4) for q in statistics.quantiles(ratios, n=4)[::2]],
        "cost_fastest_blocks": round(fastest["with"] / fastest["without"] - 1, 4),
        "cost_total": round(with_s / without_s - 1, 4),  # the blocks' time with / without, minus one
        "blocks": len(blocks),
        "steps": steps,
        "with_s": round(with_s, 4),
        "without_s": round(without_s, 4),
        "added_us_per_step": round(1e6 * (with_s - without_s) / steps, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data-dir", type=Path, required=True, help="holds fashion_mnist/ (reprocube download)")
    parser.add_argument("--repeats", type=int, default=2, help="epochs of alternating blocks per framework")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--frameworks", default=",".join(FRAMEWORKS))
    parser.add_argument("--receipts", action="store_true", help="also train 1 epoch with each for its receipt")
    parser.add_argument(
        "--tensorflow-fingerprint",
        choices=("tensors", "model_sum", "reads_only"),
        default="tensors",
        help="TensorFlow's fingerprint as the trainer computes it (default), or a measured alternative",
    )
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    data_dir = args.data_dir.resolve()
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout
    result = {
        "what": "the per-step weight fingerprint's cost: an epoch's steps in blocks of 100 (one group each), "
        "alternately with and without the fingerprint in one process, each block ending in its host sync",
        "date": time.strftime("%Y-%m-%d"),
        "commit": head.strip(),
        "machine": machine(),
        "config": {
            "dataset": "fashion_mnist",
            "batch_size": 32,
            "threads": args.threads,
            "epochs": args.repeats,
            "tensorflow_fingerprint": args.tensorflow_fingerprint,
        },
        "frameworks": {},
    }
    with tempfile.TemporaryDirectory() as tmp:
        for framework in args.frameworks.split(","):
            measured = child(framework, data_dir, args.threads, args.repeats, args.tensorflow_fingerprint)
            blocks = measured["blocks"]
            entry = {**summarize(blocks, measured["alone_100_steps_s"]), "raw_blocks": blocks}
            print(framework, {k: v for k, v in entry.items() if k != "raw_blocks"}, file=sys.stderr, flush=True)
            if args.receipts:
                entry["receipt_1_epoch"] = receipt_bytes(framework, data_dir, Path(tmp), args.threads)
                print(framework, entry["receipt_1_epoch"], file=sys.stderr, flush=True)
            result["frameworks"][framework] = entry
            args.out.parent.mkdir(parents=True, exist_ok=True)
            args.out.write_text(json.dumps(result, indent=1) + "\n")  # after each framework: partial results kept


if __name__ == "__main__":
    main()
