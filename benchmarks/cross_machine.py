"""Every committed reference receipt (tests/receipts/<isa>/<framework>/) reproduced on this machine with
--match, as a user would, beside one plain training run of the same config (alternating, in one process
tree: this VM drifts 10-30%). Per receipt: the direction (A's machine kind -> this one), the verdict, the
first differing update and its tensors, the top cause, whether --match restored bit-identity, the first
differing operation, and reproduce's wall time against one run.

    .venv/bin/python benchmarks/cross_machine.py --data-dir DATA [--rounds 3] [--out benchmarks/cpu/cross-machine.json]

DATA holds fashion_mnist (`reprocube download dataset=fashion_mnist data_dir=DATA ...`)."""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RECEIPTS = REPO / "tests" / "receipts"


def this_isa() -> str:
    flags = Path("/proc/cpuinfo").read_text().split()
    return "avx512" if "avx512f" in flags else "avx2"


def timed(command: list[str], expect=(0, 6, 7)) -> tuple[float, int]:
    started = time.perf_counter()
    proc = subprocess.run(command, capture_output=True, text=True)
    if proc.returncode not in expect:
        sys.exit(f"{' '.join(command)} exited {proc.returncode}:\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")
    return time.perf_counter() - started, proc.returncode


def answer(result: dict) -> dict:
    first = result["first_divergence"] or {}
    likely = [c for c in result["causes"] if c["kind"] != "not-numeric"]
    match = result["match"] or {}
    return {
        "verdict": result["verdict"],
        "first_step": first.get("step"),
        "first_update": first.get("first_weight_step"),
        "tensors": first.get("weight_tensors") or first.get("initial_tensors") or first.get("tensors"),
        "top_cause": likely[0]["key"] if likely else None,
        "match": match.get("summary"),
        "match_bit_identical": match.get("bit_identical"),
        "first_operation": (result.get("first_operation") or {}).get("text"),
        "claims": result["claims"]["totals"],
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", required=True)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    reprocube = [sys.executable, "-m", "reprocube"]
    here = this_isa()
    rows = []
    with tempfile.TemporaryDirectory(prefix="reprocube-cross-machine-") as scratch:
        scratch = Path(scratch)
        for receipt in sorted(RECEIPTS.glob("*/*/receipt.json")):
            isa, framework = receipt.parent.parent.name, receipt.parent.name
            config = json.loads(receipt.read_text())["config"]
            train = [
                *reprocube,
                "train",
                f"framework={framework}",
                "dataset=fashion_mnist",
                f"data_dir={args.data_dir}",
                f"data.train_limit={config['data']['train_limit']}",
                f"data.test_limit={config['data']['test_limit']}",
                f"epochs={config['epochs']}",
                f"seed={config['seed']}",
                "log.progress=false",
            ]
            run_s, reproduce_s, result = [], [], None
            for i in range(args.rounds):  # alternating: one run, then reproduce
                seconds, _ = timed([*train, f"output_dir={scratch / f'run-{isa}-{framework}-{i}'}"])
                run_s.append(seconds)
                out = scratch / f"reproduce-{isa}-{framework}-{i}"
                seconds, status = timed(
                    [
                        *reprocube,
                        "reproduce",
                        str(receipt),
                        "--match",
                        "--public-key",
                        str(receipt.parent.parent / "signing-key.pub"),
                        "--out",
                        str(out),
                        f"data_dir={args.data_dir}",
                    ]
                )
                reproduce_s.append(seconds)
                result = json.loads((out / "reproduce.json").read_text())
            row = {
                "receipt": str(receipt.relative_to(REPO)),
                "direction": f"{isa} -> {here}",
                "framework": framework,
                "exit": status,
                **answer(result),
                "run_s": run_s,
                "reproduce_s": reproduce_s,
                "ratio": statistics.median(reproduce_s) / statistics.median(run_s),
            }
            rows.append(row)
            print(
                f"{row['direction']} {framework}: {row['verdict']}, first step {row['first_step']}, "
                f"top cause {row['top_cause']}, reproduce {statistics.median(reproduce_s):.1f} s = "
                f"{row['ratio']:.2f}x one run ({statistics.median(run_s):.1f} s)",
                flush=True,
            )
    report = {
        "machine": {"isa": here, "cpu": _cpu_model(), "python": platform.python_version()},
        "rounds": args.rounds,
        "rows": rows,
    }
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(report, indent=1) + "\n")
    return 0


def _cpu_model() -> str | None:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return None


if __name__ == "__main__":
    raise SystemExit(main())
