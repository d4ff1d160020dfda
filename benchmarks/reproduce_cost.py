"""What `reprocube reproduce` costs, per framework: receipt size, and the wall time of reproduce against one
plain training run of the same config, side by side in one process tree (this VM drifts 10-15%).

For each framework: train run A (timed: one plain run), then `reproduce A` (the same machine: bit-identical,
about one run), then `reproduce A --match` with a variable that really changes CPU numerics here set (a
simulated other machine: B, the self-check up to the first divergence, and the --match re-run).

    .venv/bin/python benchmarks/reproduce_cost.py --data-dir DATA [--epochs 4] [--out benchmarks/cpu/reproduce.json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

FRAMEWORKS = ("pytorch", "tensorflow", "jax")
PERTURBATIONS = {
    "pytorch": ("ONEDNN_MAX_CPU_ISA", "SSE41"),
    "tensorflow": ("ONEDNN_MAX_CPU_ISA", "SSE41"),
    "jax": ("XLA_FLAGS", "--xla_cpu_max_isa=AVX"),
}


def timed(command: list[str], env: dict | None = None, expect=(0,)) -> float:
    started = time.perf_counter()
    proc = subprocess.run(command, env={**os.environ, **(env or {})}, capture_output=True, text=True)
    if proc.returncode not in expect:
        sys.exit(f"{' '.join(command)} exited {proc.returncode}:\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")
    return time.perf_counter() - started


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", required=True)
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    reprocube = [sys.executable, "-m", "reprocube"]
    rows = []
    with tempfile.TemporaryDirectory(prefix="reprocube-reproduce-cost-") as scratch:
        scratch = Path(scratch)
        for framework in FRAMEWORKS:
            common = [f"framework={framework}", f"data_dir={args.data_dir}", f"epochs={args.epochs}"]
            train_s = timed([*reprocube, "train", *common, f"output_dir={scratch / 'a'}", "log.progress=false"])
            run = scratch / "a" / f"{framework}-seed0"
            same_s = timed(
                [
                    *reprocube,
                    "reproduce",
                    str(run),
                    "--out",
                    str(scratch / f"same-{framework}"),
                    f"data_dir={args.data_dir}",
                ]
            )
            variable, value = PERTURBATIONS[framework]
            other_s = timed(
                [
                    *reprocube,
                    "reproduce",
                    str(run),
                    "--match",
                    "--out",
                    str(scratch / f"other-{framework}"),
                    f"data_dir={args.data_dir}",
                ],
                env={variable: value},
                expect=(6,),
            )
            other = json.loads((scratch / f"other-{framework}" / "reproduce.json").read_text())
            row = {
                "framework": framework,
                "epochs": args.epochs,
                "receipt_bytes": (run / "receipt.json").stat().st_size,
                "train_s": round(train_s, 1),
                "reproduce_same_machine_s": round(same_s, 1),
                "reproduce_same_ratio": round(same_s / train_s, 2),
                "reproduce_other_machine_match_s": round(other_s, 1),
                "reproduce_other_ratio": round(other_s / train_s, 2),
                "simulated_by": f"{variable}={value}",
                "first_divergence_step": (other["first_divergence"] or {}).get("step"),
                "top_cause": other["causes"][0]["key"] if other["causes"] else None,
                "self_consistent": other["self_consistent"],
                "match_restores_bit_identity": (other["match"] or {}).get("bit_identical"),
            }
            rows.append(row)
            print(json.dumps(row), flush=True)
    print()
    print(
        "| framework | receipt KB | one run s | reproduce, same machine | reproduce --match, simulated other machine |"
    )
    print("|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['framework']} | {r['receipt_bytes'] / 1000:.1f} | {r['train_s']} "
            f"| {r['reproduce_same_machine_s']} s ({r['reproduce_same_ratio']}x) "
            f"| {r['reproduce_other_machine_match_s']} s ({r['reproduce_other_ratio']}x; "
            f"{r['simulated_by']}: step {r['first_divergence_step']}, {r['top_cause']}, "
            f"match {r['match_restores_bit_identity']}) |"
        )
    if args.out:
        args.out.write_text(json.dumps({"machine": platform.processor() or platform.machine(), "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
