"""A JAX process's start-up with reprocube's compilation cache (on by default) against without it, in
alternating rounds on this machine: `reprocube train framework=jax` on a tiny slice of the data (almost all
of it is start-up: imports, data, compiling the steps) and on two whole epochs, with the cache off (every
process compiles), cold (an empty cache: compiles and writes) and warm (loads every step). The weights of
every run must be bit-identical (the script fails otherwise).

    .venv/bin/python benchmarks/jax_startup.py --data-dir data [--rounds 3] [--out benchmarks/cpu/jax-startup.json]"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from startup_rounds import final_weights_digest, write_result

from reprocube.runtime import compilation_cache

SETTINGS = ("off", "cold", "warm")
WORKLOADS = {
    "start-up (640 examples, 1 epoch)": ["epochs=1", "data.train_limit=640", "data.test_limit=640"],
    "2 epochs of Fashion-MNIST": ["epochs=2"],
}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", type=Path, required=True)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    rows, digests = [], set()
    with tempfile.TemporaryDirectory(prefix="reprocube-jax-startup-") as scratch:
        for workload, overrides in WORKLOADS.items():
            walls = {setting: [] for setting in SETTINGS}
            for round_number in range(args.rounds):
                cache = Path(scratch) / f"cache-{len(rows)}-{round_number}"
                for setting in SETTINGS:
                    run = f"{len(rows)}-{round_number}-{setting}"
                    env = {**os.environ, compilation_cache.VARIABLE: "off" if setting == "off" else str(cache)}
                    started = time.perf_counter()
                    subprocess.run(
                        [
                            sys.executable,
                            "-m",
                            "reprocube",
                            "train",
                            "framework=jax",
                            *overrides,
                            f"data_dir={args.data_dir.resolve()}",
                            f"output_dir={scratch}/runs",
                            f"run_name={run}",
                            "log.progress=false",
                        ],
                        cwd=scratch,
                        env=env,
                        check=True,
                        capture_output=True,
                    )
                    walls[setting].append(round(time.perf_counter() - started, 2))
                    digests.add((workload, final_weights_digest(Path(scratch) / "runs", run)))
            medians = {setting: statistics.median(values) for setting, values in walls.items()}
            rows.append(
                {
                    "workload": workload,
                    "wall_s": walls,
                    "median_s": medians,
                    "warm_vs_off": round(medians["off"] / medians["warm"], 2),
                }
            )
            print(f"{workload}: " + ", ".join(f"{s} {medians[s]:.2f} s {walls[s]}" for s in SETTINGS), flush=True)
    if len(digests) != len(WORKLOADS):
        print(f"FAILED: the settings gave different weights: {sorted(digests)}", file=sys.stderr)
        return 1
    write_result(args.out, args.rounds, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
