"""What the trace's per-step weight fingerprint costs, per framework, on one epoch of Fashion-MNIST.

Side by side in one process: the epoch's steps run in blocks of 100 (one group each, as the loop runs
them), alternately with the fingerprint (the trainer as it is: computed in the step, fetched with the
group's losses and added to a trace) and without it (the same trainer with its fingerprint work replaced
by nothing: PyTorch's per-step copy skipped, TensorFlow's graph and JAX's jitted step traced again with a
constant), each block ending in the group's host sync. Alternating blocks of a few hundred milliseconds
cancel this VM's drift better than separate processes do (which gave -60% to +170% here under load).
With --receipts, also one real 1-epoch run per framework, for the receipt's bytes with and without the
fingerprint keys.

    python benchmarks/trace_cost.py --data-dir data --repeats 2 --receipts --out benchmarks/cpu/trace-fingerprint.json

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
    from reprocube.backend import STEPS_PER_CALL, create_backend
    from reprocube.config import load_config
    from reprocube.data.sampler import EpochSampler
    from reprocube.data.store import load_dataset
    from reprocube.loop import seed_host_rng
    from reprocube.trace import StepTrace

    framework, data_dir, threads, epochs = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    cfg = load_config([f"framework={framework}", "dataset=fashion_mnist", f"data_dir={data_dir}",
                       f"threads={threads}", "device=cpu"])
    dataset = load_dataset(cfg)
    sampler = EpochSampler(cfg.seed, len(dataset.train), cfg.batch_size, cfg.data.drop_last)
    seed_host_rng(cfg.seed)
    backend = create_backend(cfg, dataset)
    trace = StepTrace(0, first_step=0, tensor_names=sorted(backend.export_state().weights))

    SWAPPED = {"pytorch": "_record_fingerprint", "tensorflow": "_train_steps", "jax": "_train_step"}[framework]

    def block(first, end, fingerprints):
        started = time.perf_counter()
        backend.train_steps(sampler.steps_bounds(first, end), first)
        losses = backend.group_losses()  # the host sync
        if fingerprints:
            trace.add_losses(losses, backend.group_fingerprints())
        return time.perf_counter() - started

    backend.begin_epoch(sampler.epoch_order(0))
    block(0, 21, True)  # the first step (and compilation) and 20 more, untimed
    with_fingerprints = getattr(backend, SWAPPED)
    # The same trainer without its fingerprint work, traced and compiled now.
    if framework == "pytorch":
        backend._record_fingerprint = lambda row: None
    elif framework == "tensorflow":
        import tensorflow as tf
        zeros = tf.zeros([len(trace.tensor_names)], tf.int64)
        backend._fingerprint_graph = lambda: zeros  # the graph still writes these zeros to its slot: one tiny op
        backend._train_steps = tf.function(
            backend._train_steps_graph, input_signature=[tf.TensorSpec([None, 2], tf.int32)], jit_compile=False
        )
    else:
        import jax, jax.numpy as jnp
        import reprocube.frameworks.jax as module
        original, zeros = module._fingerprint, jnp.zeros(len(trace.tensor_names), jnp.uint32)
        module._fingerprint = lambda params: zeros
        backend._train_step = jax.jit(backend._train_step_fn, static_argnums=(5,))
    block(21, 42, False)
    if framework == "jax":
        module._fingerprint = original
    elif framework == "tensorflow":
        del backend._fingerprint_graph  # the method again (the graphs are traced)
    without_fingerprints = getattr(backend, SWAPPED)
    trace = StepTrace(0, first_step=0, tensor_names=trace.tensor_names)  # the timed blocks' only

    rows = []
    for epoch in range(epochs):
        backend.begin_epoch(sampler.epoch_order(1 + epoch))
        for i, first in enumerate(range(0, sampler.steps_per_epoch, STEPS_PER_CALL)):
            end = min(first + STEPS_PER_CALL, sampler.steps_per_epoch)
            order = (True, False) if (i + epoch) % 2 == 0 else (False, True)
            pair = {}
            for fingerprints in order:
                setattr(backend, SWAPPED, with_fingerprints if fingerprints else without_fingerprints)
                pair["with" if fingerprints else "without"] = block(first, end, fingerprints)
            rows.append({"steps": end - first, **pair})
    # The fingerprint's work alone, for 100 steps, where it can be run alone (the minimum of 20: what it
    # costs when no other process holds the cores): PyTorch's per-step copy and per-group sums exactly;
    # JAX's and TensorFlow's as a separate call (jitted / a graph loop), which also pays a dispatch.
    alone = []
    for _ in range(20):
        started = time.perf_counter()
        if framework == "pytorch":
            for row in range(STEPS_PER_CALL):
                backend._record_fingerprint(row)
            backend._group_losses = [None] * STEPS_PER_CALL
            backend.group_fingerprints()
        elif framework == "tensorflow":
            import tensorflow as tf
            if "loop" not in globals():
                def body(i):
                    backend._fingerprints[i].assign(backend._fingerprint_graph())
                    return (i + 1,)
                loop = tf.function(lambda: tf.while_loop(lambda i: i < STEPS_PER_CALL, body, (tf.constant(0),)))
                loop()
            loop()
            backend._fingerprints.numpy()
        else:
            import jax
            import reprocube.frameworks.jax as module
            if "alone_jit" not in globals():
                alone_jit = jax.jit(module._fingerprint)
                alone_jit(backend.params).block_until_ready()
            jax.device_get([alone_jit(backend.params) for _ in range(STEPS_PER_CALL)])
        alone.append(time.perf_counter() - started)
    print(json.dumps({"blocks": rows, "alone_100_steps_s": alone}))
    """
)


def child(framework: str, data_dir: Path, threads: int, epochs: int) -> dict:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "PYTHONHASHSEED": "0"}
    proc = subprocess.run(
        [sys.executable, "-c", CHILD, framework, str(data_dir), str(threads), str(epochs)],
        capture_output=True, text=True, env=env, timeout=3600,
    )  # fmt: skip
    if proc.returncode != 0:
        raise SystemExit(f"{framework} failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def receipt_bytes(framework: str, data_dir: Path, work: Path, threads: int) -> dict:
    """A 1-epoch Fashion-MNIST receipt (1875 steps), with and without the fingerprint keys: the real receipt
    of a 1-step run of the framework (config, environment, epoch record as written) with its trace replaced
    by one of 1875 steps in the same format (boundaries every 100 steps and at the end; the trace's bytes
    do not depend on the values in it). Training a whole epoch here for it took minutes under load."""
    import numpy as np

    sys.path.insert(0, str(ROOT / "src"))
    from reprocube.trace import StepTrace

    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "PYTHONHASHSEED": "0"}
    subprocess.run(
        [sys.executable, "-m", "reprocube", "train", f"framework={framework}", "epochs=1", f"threads={threads}",
         f"data_dir={data_dir}", f"output_dir={work}", f"run_name={framework}", "log.progress=false", "device=cpu",
         "data.train_limit=32", "data.test_limit=64"],
        check=True, capture_output=True, env=env, cwd=work, timeout=3600,
    )  # fmt: skip
    receipt = json.loads((work / framework / "receipt.json").read_bytes())
    names = receipt["trace"]["tensor_names"]
    rng = np.random.default_rng(0)
    sizes = {}
    for fingerprints in (False, True):
        trace = StepTrace(100, 0, tensor_names=list(names))
        for step in range(1, 1876):
            values = rng.integers(0, 2**32, size=(1, len(names)), dtype=np.uint64).astype(np.uint32)
            trace.add_losses(rng.random(1, dtype=np.float32), values if fingerprints else None)
            if step % 100 == 0 or step == 1875:
                trace.add_boundary(step, {n: rng.random(3, dtype=np.float32) for n in names})
        body = {**receipt, "trace": trace.to_json()}
        sizes[fingerprints] = len(json.dumps(body, separators=(",", ":"), sort_keys=True))  # as written
    return {
        "steps": 1875,
        "receipt_bytes": sizes[True],
        "receipt_bytes_without_fingerprints": sizes[False],
        "fingerprint_bytes": sizes[True] - sizes[False],
        "rest_of_receipt_bytes": len(json.dumps({k: v for k, v in receipt.items() if k != "trace"},
                                                separators=(",", ":"), sort_keys=True)),
    }  # fmt: skip


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


def summarize(blocks: list[dict], alone: list[float]) -> dict:
    with_s, without_s = sum(b["with"] for b in blocks), sum(b["without"] for b in blocks)
    ratios = [b["with"] / b["without"] - 1 for b in blocks]
    steps = sum(b["steps"] for b in blocks)
    fastest = {k: min(b[k] / b["steps"] for b in blocks) for k in ("with", "without")}
    return {
        # The least contended blocks: the fastest step time of each kind (this VM is shared).
        "cost_fastest_blocks": round(fastest["with"] / fastest["without"] - 1, 4),
        "step_ms_fastest_without": round(1000 * fastest["without"], 3),
        "alone_us_per_step_min": round(1e6 * min(alone) / 100, 1),
        "alone_share_of_fastest_step": round(min(alone) / 100 / fastest["without"], 4),
        "blocks": len(blocks),
        "steps": steps,
        "with_s": round(with_s, 4),
        "without_s": round(without_s, 4),
        "cost_total": round(with_s / without_s - 1, 4),  # the epoch's time with / without, minus one
        "cost_median_of_pairs": round(statistics.median(ratios), 4),
        "cost_pairs_p25_p75": [round(q, 4) for q in statistics.quantiles(ratios, n=4)[::2]],
        "step_ms_without": round(1000 * without_s / steps, 3),
        "added_us_per_step": round(1e6 * (with_s - without_s) / steps, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data-dir", type=Path, required=True, help="holds fashion_mnist/ (reprocube download)")
    parser.add_argument("--repeats", type=int, default=2, help="epochs of alternating blocks per framework")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--frameworks", default=",".join(FRAMEWORKS))
    parser.add_argument("--receipts", action="store_true", help="also train 1 epoch with each for its receipt")
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
        "config": {"dataset": "fashion_mnist", "batch_size": 32, "threads": args.threads, "epochs": args.repeats},
        "frameworks": {},
    }
    with tempfile.TemporaryDirectory() as tmp:
        for framework in args.frameworks.split(","):
            measured = child(framework, data_dir, args.threads, args.repeats)
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
