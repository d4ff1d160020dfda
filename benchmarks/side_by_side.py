"""Every trainer against the reference tutorial's, side by side: alternating rounds on this machine, each
round per framework one reference process (benchmarks/reference_tutorial.py, its own scripts, offline) and
one `reprocube train` process, 2 epochs of Fashion-MNIST at batch 32, determinism and full checkpoints on
(reprocube's defaults, its compilation cache as a user has it: warm after the first round). Epoch = the
second epoch's training time; whole = the process's wall time. Ratios are reference / reprocube per round,
with their median and spread, never a figure from another day or machine.

    python benchmarks/reference_tutorial.py --setup          # once: the reference's own venv
    .venv/bin/python benchmarks/side_by_side.py --tutorial-git GITDIR --data-dir data [--rounds 3]
        [--frameworks pytorch,tensorflow,jax] [--out benchmarks/cpu/side-by-side.json]"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
EPOCHS = 2


def reference(framework: str, tutorial_git: Path, scratch: Path) -> dict:
    out = scratch / f"reference-{framework}.json"
    subprocess.run(
        [
            sys.executable,
            str(REPO / "benchmarks" / "reference_tutorial.py"),
            "--tutorial-git",
            str(tutorial_git),
            "--frameworks",
            framework,
            "--epochs",
            str(EPOCHS),
            "--out",
            str(out),
        ],
        check=True,
        capture_output=True,
    )
    result = json.loads(out.read_text())["results"][framework]
    if not result["ok"]:
        raise SystemExit(f"the reference's {framework} trainer failed: {result['failure']}")
    return {"epoch_s": result["train_epoch_s"][1], "whole_s": result["process_wall_s"]}


def reprocube(framework: str, data_dir: Path, scratch: Path, run: str) -> dict:
    started = time.perf_counter()
    subprocess.run(
        [
            sys.executable,
            "-m",
            "reprocube",
            "train",
            f"framework={framework}",
            f"epochs={EPOCHS}",
            f"data_dir={data_dir.resolve()}",
            f"output_dir={scratch / 'runs'}",
            f"run_name={run}",
            "log.progress=false",
        ],
        cwd=scratch,
        check=True,
        capture_output=True,
    )
    whole = time.perf_counter() - started
    records = [json.loads(line) for line in (scratch / "runs" / run / "metrics.jsonl").read_text().splitlines()]
    epoch = next(r for r in records if r.get("kind") == "epoch" and r["epoch"] == EPOCHS)
    return {"epoch_s": epoch["wall_s"], "whole_s": round(whole, 2)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tutorial-git", type=Path, required=True)
    parser.add_argument("--data-dir", type=Path, required=True)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--frameworks", default="pytorch,tensorflow,jax")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    frameworks = args.frameworks.split(",")
    rows = {framework: [] for framework in frameworks}
    with tempfile.TemporaryDirectory(prefix="reprocube-side-by-side-") as scratch:
        for number in range(1, args.rounds + 1):
            for framework in frameworks:
                load = os.getloadavg()[0]
                ref = reference(framework, args.tutorial_git, Path(scratch))
                ours = reprocube(framework, args.data_dir, Path(scratch), f"{framework}-{number}")
                row = {
                    "round": number,
                    "load_1min": round(load, 2),
                    "reference": ref,
                    "reprocube": ours,
                    "epoch_ratio": round(ref["epoch_s"] / ours["epoch_s"], 2),
                    "whole_ratio": round(ref["whole_s"] / ours["whole_s"], 2),
                }
                rows[framework].append(row)
                print(
                    f"round {number} {framework}: reference {ref['epoch_s']:.2f} / {ref['whole_s']:.1f} s, reprocube "
                    f"{ours['epoch_s']:.2f} / {ours['whole_s']:.1f} s: {row['epoch_ratio']}x / {row['whole_ratio']}x "
                    f"(load {load:.2f})",
                    flush=True,
                )
    summary = {
        framework: {
            kind: {
                "median": statistics.median(r[kind] for r in framework_rows),
                "min": min(r[kind] for r in framework_rows),
                "max": max(r[kind] for r in framework_rows),
            }
            for kind in ("epoch_ratio", "whole_ratio")
        }
        for framework, framework_rows in rows.items()
    }
    for framework, ratios in summary.items():
        print(
            f"{framework}: epoch {ratios['epoch_ratio']['median']}x ({ratios['epoch_ratio']['min']}-"
            f"{ratios['epoch_ratio']['max']}), whole {ratios['whole_ratio']['median']}x "
            f"({ratios['whole_ratio']['min']}-{ratios['whole_ratio']['max']})"
        )
    if args.out:
        machine = {"platform": platform.platform(), "cpus": os.cpu_count()}
        try:
            from reprocube.formats.env import _cpu_info

            machine["cpu"] = _cpu_info()
        except ImportError:
            pass
        args.out.write_text(
            json.dumps({"machine": machine, "epochs": EPOCHS, "rounds": rows, "summary": summary}, indent=1) + "\n"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
