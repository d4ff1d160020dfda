"""What the trace's per-step weight fingerprint costs: one epoch of training steps, timed as the loop runs
them (groups of up to 100 steps, each group's losses, and fingerprints where the code has them, fetched
and added to a trace), with this checkout's reprocube against a baseline commit without fingerprints,
in fresh processes, alternating (this VM's speed drifts), side by side. Optionally also the receipt of a
1-epoch run with each (--receipts).

    python benchmarks/trace_cost.py --data-dir data --baseline 4aa2ac9 --repeats 3 \\
        --out benchmarks/cpu/trace-fingerprint.json

The baseline's source comes from `git archive` into a temporary directory; the JSON holds no absolute path.
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

    framework, data_dir, steps, threads = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
    cfg = load_config([f"framework={framework}", "dataset=fashion_mnist", f"data_dir={data_dir}",
                       f"threads={threads}", "device=cpu"])
    dataset = load_dataset(cfg)
    sampler = EpochSampler(cfg.seed, len(dataset.train), cfg.batch_size, cfg.data.drop_last)
    seed_host_rng(cfg.seed)
    backend = create_backend(cfg, dataset)
    fingerprints = hasattr(backend, "group_fingerprints")
    trace = StepTrace(0, first_step=0, tensor_names=sorted(backend.export_state().weights))

    def run(first, end):
        step = first
        while step < end:
            group = min(end, step + STEPS_PER_CALL)
            backend.train_steps(sampler.steps_bounds(step, group), step)
            losses = backend.group_losses()
            if fingerprints:
                trace.add_losses(losses, backend.group_fingerprints())
            else:
                trace.add_losses(losses)
            step = group
        backend.epoch_totals()  # a host sync

    backend.begin_epoch(sampler.epoch_order(0))
    run(0, 21)  # the first (compiling) step and 20 more, untimed
    backend.begin_epoch(sampler.epoch_order(1))
    started = time.perf_counter()
    run(0, min(steps, sampler.steps_per_epoch))
    seconds = time.perf_counter() - started
    print(json.dumps({"seconds": seconds, "fingerprints": fingerprints, "steps": min(steps, sampler.steps_per_epoch)}))
    """
)


def child(src: Path, framework: str, data_dir: Path, steps: int, threads: int) -> dict:
    env = {**os.environ, "PYTHONPATH": str(src), "PYTHONHASHSEED": "0"}
    proc = subprocess.run(
        [sys.executable, "-c", CHILD, framework, str(data_dir), str(steps), str(threads)],
        capture_output=True, text=True, env=env, timeout=3600,
    )  # fmt: skip
    if proc.returncode != 0:
        raise SystemExit(f"{framework} ({src.name}) failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def receipt_bytes(src: Path, framework: str, data_dir: Path, work: Path, threads: int) -> dict:
    """The receipt of a 1-epoch run (and its trace's share), trained with `src`'s reprocube."""
    run_name = f"{framework}-{src.name}"
    env = {**os.environ, "PYTHONPATH": str(src), "PYTHONHASHSEED": "0"}
    subprocess.run(
        [sys.executable, "-m", "reprocube", "train", f"framework={framework}", "epochs=1", f"threads={threads}",
         f"data_dir={data_dir}", f"output_dir={work}", f"run_name={run_name}", "log.progress=false", "device=cpu"],
        check=True, capture_output=True, env=env, cwd=work, timeout=3600,
    )  # fmt: skip
    raw = (work / run_name / "receipt.json").read_bytes()
    receipt = json.loads(raw)
    trace = receipt["trace"]
    fingerprint_keys = [k for k in trace if "fingerprint" in k]
    return {
        "receipt_bytes": len(raw),
        "trace_bytes": len(json.dumps(trace, separators=(",", ":"))),
        "fingerprint_bytes": sum(len(json.dumps({k: trace[k]}, separators=(",", ":"))) - 2 for k in fingerprint_keys),
        "steps": trace["steps"],
    }


def machine() -> dict:
    model = next(
        (line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
         if line.startswith("model name")), platform.processor(),
    )  # fmt: skip
    flags = next((line for line in Path("/proc/cpuinfo").read_text().splitlines() if line.startswith("flags")), "")
    return {
        "cpu": model,
        "cpus": os.cpu_count(),
        "avx512f": " avx512f" in flags,
        "avx2": " avx2" in flags,
        "python": platform.python_version(),
        "load_average_at_start": os.getloadavg(),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data-dir", type=Path, required=True, help="holds fashion_mnist/ (reprocube download)")
    parser.add_argument("--baseline", default="4aa2ac9", help="a commit without the fingerprint")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--steps", type=int, default=1875, help="timed steps (an epoch: 1875)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--frameworks", default=",".join(FRAMEWORKS))
    parser.add_argument("--receipts", action="store_true", help="also train 1 epoch with each for its receipt")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    data_dir = args.data_dir.resolve()
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout
    result = {
        "what": "one epoch of training steps as the loop runs them, this checkout (per-step weight fingerprints) "
        "against the baseline commit (loss bits only), fresh processes, alternating",
        "date": time.strftime("%Y-%m-%d"),
        "commit": head.strip(),
        "baseline": args.baseline,
        "machine": machine(),
        "config": {"dataset": "fashion_mnist", "batch_size": 32, "threads": args.threads, "steps": args.steps},
        "frameworks": {},
    }
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp) / "baseline"
        base.mkdir()
        archive = subprocess.run(["git", "archive", args.baseline, "src"], cwd=ROOT, capture_output=True, check=True)
        subprocess.run(["tar", "-x", "-C", str(base)], input=archive.stdout, check=True)
        sources = {"fingerprint": ROOT / "src", "baseline": base / "src"}
        for framework in args.frameworks.split(","):
            times = {name: [] for name in sources}
            for repeat in range(args.repeats):
                order = list(sources) if repeat % 2 == 0 else list(reversed(sources))
                for name in order:
                    measured = child(sources[name], framework, data_dir, args.steps, args.threads)
                    assert measured["fingerprints"] == (name == "fingerprint"), (name, measured)
                    times[name].append(round(measured["seconds"], 4))
                    print(framework, name, measured["seconds"], file=sys.stderr, flush=True)
            medians = {name: statistics.median(values) for name, values in times.items()}
            entry = {
                "seconds": times,
                "median_s": medians,
                "fingerprint_cost": round(medians["fingerprint"] / medians["baseline"] - 1, 4),
                "min_based_cost": round(min(times["fingerprint"]) / min(times["baseline"]) - 1, 4),
            }
            if args.receipts:
                work = Path(tmp) / "runs"
                work.mkdir(exist_ok=True)
                entry["receipt_1_epoch"] = {
                    name: receipt_bytes(src, framework, data_dir, work, args.threads) for name, src in sources.items()
                }
            result["frameworks"][framework] = entry
            args.out.parent.mkdir(parents=True, exist_ok=True)
            args.out.write_text(json.dumps(result, indent=1) + "\n")  # after each framework: partial results kept
    print(json.dumps({k: v.get("fingerprint_cost") for k, v in result["frameworks"].items()}))


if __name__ == "__main__":
    main()
