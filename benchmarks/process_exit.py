"""What Python's teardown of the imported modules costs a process, per framework: a process that imports
the framework (and runs one operation) and then ends as Python ends it, against the same process ended by
reprocube.runtime.process_exit (the program's end since 2026-11-27). Alternating rounds; wall time of each process.

    python benchmarks/process_exit.py [--rounds 5] [--out benchmarks/cpu/process-exit.json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

from reprocube.formats.env import _cpu_info

WORK = {
    "tensorflow": "import reprocube.runtime.tensorflow_import as t; t.tf.constant(1.0) + 1",
    "pytorch": "import torch; torch.ones(3) + 1",
    "jax": "import jax.numpy as jnp; (jnp.ones(3) + 1).block_until_ready()",
}
PYTHONS_EXIT = "python's exit"
# (before the work, after it): the program arms its end first (reprocube.__main__)
ENDS = {
    PYTHONS_EXIT: ("", ""),
    "process_exit": (
        "from reprocube.runtime.process_exit import arm, exit_process; arm(); ",
        "; exit_process(0)",
    ),
}


def wall_s(code: str) -> float:
    started = time.perf_counter()
    subprocess.run([sys.executable, "-c", code], check=True, capture_output=True)
    return time.perf_counter() - started


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    rows = {}
    for framework, work in WORK.items():
        times = {end: [] for end in ENDS}
        wall_s(work)  # the first process reads the libraries from disk: not counted
        for _ in range(args.rounds):
            for end, (before, after) in ENDS.items():
                times[end].append(wall_s(before + work + after))
        medians = {end: statistics.median(values) for end, values in times.items()}
        rows[framework] = {
            "s": {end: [round(v, 3) for v in values] for end, values in times.items()},
            "median_s": {end: round(m, 3) for end, m in medians.items()},
            "saved_s": round(medians[PYTHONS_EXIT] - medians["process_exit"], 3),
        }
        print(
            f"{framework}: {PYTHONS_EXIT} {medians[PYTHONS_EXIT]:.2f} s, "
            f"process_exit {medians['process_exit']:.2f} s (medians of {args.rounds})",
            flush=True,
        )
    if args.out:
        report = {
            "machine": {"cpu": _cpu_info(), "python": platform.python_version()},
            "load_1min": os.getloadavg()[0],
            "rounds": args.rounds,
            "frameworks": rows,
        }
        args.out.write_text(json.dumps(report, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
