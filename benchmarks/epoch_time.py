"""Times one training epoch of `reprocube train` in fresh processes, per thread count.

Usage: python benchmarks/epoch_time.py --data-dir DIR [--repeats 3] [--threads 1 2] [--framework pytorch]
Prints a Markdown table of epoch wall time and samples/s (min / median / max) and the weights digest
(equal across repeats when training is deterministic). Runs go to a temporary directory."""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", required=True)
    parser.add_argument("--dataset", default="fashion_mnist")
    parser.add_argument("--framework", default="pytorch")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for threads in args.threads:
            epochs = []
            for repeat in range(args.repeats):
                name = f"t{threads}-r{repeat}"
                command = [sys.executable, "-m", "reprocube", "train", f"framework={args.framework}", f"dataset={args.dataset}",
                           f"data_dir={Path(args.data_dir).resolve()}", "epochs=1", f"threads={threads}", f"run_name={name}", "log.progress=false"]
                subprocess.run(command, cwd=tmp, check=True, capture_output=True)
                lines = (Path(tmp) / "runs" / name / "metrics.jsonl").read_text().splitlines()
                epochs.append(next(r for r in map(json.loads, lines) if r["kind"] == "epoch"))
            wall = [e["wall_s"] for e in epochs]
            rate = [e["samples_per_s"] for e in epochs]
            digests = {e["weights_digest"][:12] for e in epochs}
            rows.append((threads, wall, rate, digests, epochs[0]["test_accuracy"]))
    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines() if line.startswith("model name")), platform.processor())
    print(f"{args.framework}, {args.dataset}, one epoch, batch 32, determinism on; {cpu}; Python {platform.python_version()}; {args.repeats} fresh processes each\n")
    print("| threads | epoch s (min / median / max) | samples/s (min / median / max) | test accuracy | weights digest(s) |")
    print("|---|---|---|---|---|")
    for threads, wall, rate, digests, accuracy in rows:
        fmt = lambda xs, p: " / ".join(f"{x:.{p}f}" for x in (min(xs), statistics.median(xs), max(xs)))  # noqa: E731
        print(f"| {threads} | {fmt(wall, 2)} | {fmt(rate, 0)} | {accuracy:.4f} | {', '.join(sorted(digests))} |")


if __name__ == "__main__":
    main()
