"""verify's cost against one plain training run of the same N epochs, side by side in one run: linear
verify with 1 and 2 checks at a time, linear verify reusing the plain run (run=PATH), and the exhaustive
verify.full=true (the algorithm verify had before it became linear), for each N. Each figure is one
whole `reprocube` process tree's wall time; the settings alternate within each N, so the VM's drift
(10-30% over minutes) moves them together.

Usage: python benchmarks/verify_cost.py --data-dir DATA [--frameworks pytorch,tensorflow,jax]
           [--epochs 2,4,8] [--full-epochs 2,4] [--jobs 1,2] [--out benchmarks/cpu/verify-cost] [KEY=VALUE ...]
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def timed(args: list[str], log: Path) -> float:
    started = time.perf_counter()
    with open(log, "w") as out:
        status = subprocess.run(
            [sys.executable, "-m", "reprocube", *args], stdout=out, stderr=subprocess.STDOUT
        ).returncode
    if status != 0:
        sys.exit(f"verify_cost: reprocube {' '.join(args)} exited {status}; see {log}")
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", required=True)
    parser.add_argument("--frameworks", default="pytorch,tensorflow,jax")
    parser.add_argument("--epochs", default="2,4,8")
    parser.add_argument("--full-epochs", default="2,4", help="time verify.full=true only for these N (it is quadratic)")
    parser.add_argument("--jobs", default="1,2")
    parser.add_argument("--out", default="benchmarks/cpu/verify-cost")
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory(prefix="verify-cost-") as scratch:
        for framework in args.frameworks.split(","):
            for n in [int(x) for x in args.epochs.split(",")]:
                common = [
                    f"framework={framework}",
                    f"epochs={n}",
                    f"data_dir={args.data_dir}",
                    "log.progress=false",
                    *args.overrides,
                ]
                where = Path(scratch) / f"{framework}-{n}"
                where.mkdir()
                plain = where / "plain" / "plain"
                row = {"framework": framework, "epochs": n}
                row["train_s"] = timed(
                    ["train", *common, f"output_dir={where}/plain", "run_name=plain"], where / "train.log"
                )
                for jobs in args.jobs.split(","):
                    row[f"linear_jobs{jobs}_s"] = timed(
                        ["verify", *common, f"verify.jobs={jobs}", f"output_dir={where}/l{jobs}"],
                        where / f"l{jobs}.log",
                    )
                    row[f"reused_jobs{jobs}_s"] = timed(
                        ["verify", *common, f"verify.jobs={jobs}", f"run={plain}", f"output_dir={where}/r{jobs}"],
                        where / f"r{jobs}.log",
                    )
                if str(n) in args.full_epochs.split(","):
                    row["full_jobs1_s"] = timed(
                        ["verify", *common, "verify.full=true", "verify.jobs=1", f"output_dir={where}/full"],
                        where / "full.log",
                    )
                for key in [k for k in row if k.endswith("_s") and k != "train_s"]:
                    row[key.replace("_s", "_ratio")] = round(row[key] / row["train_s"], 2)
                print(json.dumps(row), flush=True)
                rows.append(row)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    machine = f"{platform.processor() or platform.machine()}, {len(__import__('os').sched_getaffinity(0))} CPUs"
    result = {
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": machine,
        "overrides": args.overrides,
        "rows": rows,
    }
    out.with_suffix(".json").write_text(json.dumps(result, indent=2) + "\n")
    keys = [k for k in rows[0] if k.endswith("_ratio")]
    lines = [
        f"# verify / one plain run, {result['date']} ({machine})",
        "",
        f"overrides: {' '.join(args.overrides) or '(none)'}",
        "",
        "| framework | N | plain run s | " + " | ".join(k.replace("_ratio", "") for k in keys) + " |",
        "|---|---|---|" + "---|" * len(keys),
    ]
    for row in rows:
        cells = [f"{row[k]:.2f}x ({row[k.replace('_ratio', '_s')]:.0f} s)" if k in row else "n/a" for k in keys]
        lines.append(f"| {row['framework']} | {row['epochs']} | {row['train_s']:.1f} | " + " | ".join(cells) + " |")
    out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
