"""What `reprocube check` costs beyond the runs of the script it checks: for each example in examples/, the
check's wall time (as the caller sees it, reprocube's own start-up included) against the sum of the
script's attempts (each timed by check), and the verdict; and what the probe costs a script: each example
run alone with the probe recording (REPROCUBE_PROBE set, as check sets it) and without, in alternating
rounds.

With --against-plain, what issue 53 sets as the goal instead: a check with its default stops and
default --jobs against ONE plain run of the same single-threaded script, alternating in each round (the
VM drifts): a passing check at most 2.5x, a non-deterministic one at most 1.5x. Each row also times the
script's start-up alone (the same script with --epochs 0: imports, data, the final save), because each
stop costs one more start-up: with 2 stops, a control and 2 cores, a script whose start-up is most of
its time cannot check in under 3x (6 start-ups' CPU over 2 cores), one whose training dominates can.

    .venv/bin/python benchmarks/check_cost.py [--rounds 3] [--out benchmarks/cpu/check-cost.json]
    .venv/bin/python benchmarks/check_cost.py --against-plain [--rounds 3] [--out benchmarks/cpu/check-vs-run.json]
    .venv/bin/python benchmarks/check_cost.py --quick [--rounds 3] [--out benchmarks/cpu/check-quick.json]"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PYTHON = sys.executable
PYTORCH = ["--output", "model.pt", "--output", "metrics.csv", "--seed-env", "SEED", "--at-line", "saved"]
NUMPY = ["--output", "final.npz", "--output", "metrics.csv", "--seed-env", "SEED", "--at-line", "saved"]
FLAX = ["--output", "final", "--output", "metrics.csv", "--seed-env", "SEED", "--at-line", "saved"]
EXAMPLES = {
    "pytorch_mlp.py": PYTORCH,
    "pytorch_mlp.py --save-rng": PYTORCH,
    "numpy_sgd.py": NUMPY,
    "numpy_sgd.py --save-rng": NUMPY,
    "numpy_sgd.py --random-seed": NUMPY[:4],
    "flax_orbax.py": FLAX,
    "flax_orbax.py --reseed": FLAX,
}
PROBED = ["pytorch_mlp.py --save-rng", "numpy_sgd.py --save-rng --sleep 0", "flax_orbax.py"]
# --against-plain: (example, check options without a stop placement: the default stops), and the goal
AGAINST_PLAIN = {
    "numpy_sgd.py --save-rng": (NUMPY[:6], 2.5),
    "pytorch_mlp.py --save-rng": (PYTORCH[:6], 2.5),
    "pytorch_mlp.py --save-rng --hidden 4096 --epochs 160": (PYTORCH[:6], 2.5),
    "numpy_sgd.py --random-seed": (NUMPY[:4], 1.5),
}

# --quick: (example, check options without a stop placement); each round one plain run, a quick check and a
# whole check, alternating; issue 66's goal for the quick one: at most about 2.5x one plain run
QUICK = {
    "numpy_sgd.py --save-rng": NUMPY[:6],
    "pytorch_mlp.py --save-rng": PYTORCH[:6],
    "hf_trainer.py --epochs 2": ["--output", "model.safetensors"],  # start-up-heavy: transformers
    "lightning_fit.py --epochs 2 --save-rng": ["--output", "model.safetensors"],  # start-up-heavy: Lightning
}
QUICK_GOAL = 2.5


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--against-plain", action="store_true", help="a check against one plain run (issue 53)")
    parser.add_argument("--quick", action="store_true", help="check --quick and a whole check against one plain run")
    parser.add_argument("--only", help="--against-plain, --quick: only the examples whose name holds this")
    args = parser.parse_args()
    if args.against_plain:
        return against_plain(args.rounds, args.out, args.only)
    if args.quick:
        return quick_against_plain(args.rounds, args.out, args.only)
    rows = []
    with tempfile.TemporaryDirectory(prefix="reprocube-check-cost-") as scratch:
        for number, (example, options) in enumerate(EXAMPLES.items()):
            script, *flags = example.split()
            walls, scripts, verdict = [], [], None
            for i in range(args.rounds):
                out = Path(scratch) / f"{number}-{i}"
                started = time.perf_counter()
                subprocess.run(
                    [
                        PYTHON,
                        "-m",
                        "reprocube",
                        "check",
                        "--out",
                        str(out),
                        *options,
                        "--",
                        PYTHON,
                        str(REPO / "examples" / script),
                        *flags,
                    ],
                    capture_output=True,
                    check=False,
                )
                walls.append(time.perf_counter() - started)
                result = json.loads((out / "check.json").read_text())
                scripts.append(sum(a["seconds"] for run in result["runs"] for a in run["attempts"]))
                verdict = result["verdict"]
            wall, script_s = statistics.median(walls), statistics.median(scripts)
            rows.append(
                {
                    "example": example,
                    "verdict": verdict,
                    "check_s": walls,
                    "script_s": scripts,
                    "overhead": (wall - script_s) / script_s,
                }
            )
            print(
                f"{example}: {verdict}, check {wall:.2f} s, the script's attempts {script_s:.2f} s: overhead "
                f"{100 * rows[-1]['overhead']:.1f}%",
                flush=True,
            )
        probe_rows = [probe_cost(example, args.rounds, Path(scratch)) for example in PROBED]
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({"rounds": args.rounds, "rows": rows, "probe": probe_rows}, indent=1) + "\n")
    return 0


def against_plain(rounds: int, out: Path | None, only: str | None = None) -> int:
    """Per example: one plain run's wall time and a whole check's (default stops, default --jobs),
    alternating; the ratio of the medians against the goal."""
    rows = []
    with tempfile.TemporaryDirectory(prefix="reprocube-check-vs-run-") as scratch:
        for number, (example, (options, goal)) in enumerate(AGAINST_PLAIN.items()):
            if only is not None and only not in example:
                continue
            script, *flags = example.split()
            command = [PYTHON, str(REPO / "examples" / script), *flags]
            plain, check, verdicts, start_up = [], [], [], []
            for i in range(rounds):
                work = Path(scratch) / f"start-up-{number}-{i}"
                work.mkdir()
                started = time.perf_counter()
                subprocess.run([*command, "--epochs", "0"], cwd=work, capture_output=True, check=True)
                start_up.append(time.perf_counter() - started)
                work = Path(scratch) / f"plain-{number}-{i}"
                work.mkdir()
                started = time.perf_counter()
                subprocess.run(command, cwd=work, capture_output=True, check=True)
                plain.append(time.perf_counter() - started)
                checked = Path(scratch) / f"check-{number}-{i}"
                started = time.perf_counter()
                reprocube = [PYTHON, "-m", "reprocube", "check", "--out", str(checked), *options, "--", *command]
                subprocess.run(reprocube, capture_output=True, check=False)
                check.append(time.perf_counter() - started)
                verdicts.append(json.loads((checked / "check.json").read_text())["verdict"])
            ratio = statistics.median(check) / statistics.median(plain)
            rows.append(
                {
                    "example": example,
                    "verdicts": verdicts,
                    "plain_s": plain,
                    "start_up_s": start_up,
                    "check_s": check,
                    "ratio": ratio,
                    "goal": goal,
                }
            )
            print(
                f"{example}: {'/'.join(sorted(set(verdicts)))}; one run {statistics.median(plain):.2f} s (start-up "
                f"{statistics.median(start_up):.2f} s), the check "
                f"{statistics.median(check):.2f} s: {ratio:.2f}x (goal {goal}x: {'met' if ratio <= goal else 'NOT met'})",
                flush=True,
            )
    return write_rows(out, rounds, rows)


def quick_against_plain(rounds: int, out: Path | None, only: str | None) -> int:
    """Per example, each round: one plain run, `check --quick` and a whole check (default stops, default
    --jobs), alternating; the medians' ratios to the plain run, and the CPU seconds of each (user + sys of
    the process and its children)."""
    rows = []
    with tempfile.TemporaryDirectory(prefix="reprocube-check-quick-") as scratch:
        for number, (example, options) in enumerate(QUICK.items()):
            if only is not None and only not in example:
                continue
            script, *flags = example.split()
            command = [PYTHON, str(REPO / "examples" / script), *flags]
            seconds: dict[str, list[float]] = {"plain": [], "quick": [], "whole": []}
            cpu: dict[str, list[float]] = {"plain": [], "quick": [], "whole": []}
            verdicts: dict[str, list[str]] = {"quick": [], "whole": []}
            for i in range(rounds):
                for kind in ("plain", "quick", "whole"):
                    where = Path(scratch) / f"{kind}-{number}-{i}"
                    if kind == "plain":
                        where.mkdir()
                        argv = command
                    else:
                        quick = ["--quick"] if kind == "quick" else []
                        argv = [
                            PYTHON,
                            "-m",
                            "reprocube",
                            "check",
                            *quick,
                            "--out",
                            str(where),
                            *options,
                            "--",
                            *command,
                        ]
                    before = os.times()
                    started = time.perf_counter()
                    subprocess.run(argv, cwd=where if kind == "plain" else scratch, capture_output=True, check=False)
                    seconds[kind].append(time.perf_counter() - started)
                    after = os.times()
                    cpu[kind].append(
                        after.children_user + after.children_system - before.children_user - before.children_system
                    )
                    if kind != "plain":
                        verdicts[kind].append(json.loads((where / "check.json").read_text())["verdict"])
            median = {kind: statistics.median(values) for kind, values in seconds.items()}
            row = {
                "example": example,
                "verdicts": verdicts,
                "seconds": seconds,
                "cpu_s": cpu,
                "quick_ratio": median["quick"] / median["plain"],
                "whole_ratio": median["whole"] / median["plain"],
                "goal": QUICK_GOAL,
            }
            rows.append(row)
            print(
                f"{example}: one run {median['plain']:.2f} s; check --quick {median['quick']:.2f} s "
                f"({row['quick_ratio']:.2f}x, {'/'.join(sorted(set(verdicts['quick'])))}; goal {QUICK_GOAL}x: "
                f"{'met' if row['quick_ratio'] <= QUICK_GOAL else 'NOT met'}); whole check {median['whole']:.2f} s "
                f"({row['whole_ratio']:.2f}x, {'/'.join(sorted(set(verdicts['whole'])))})",
                flush=True,
            )
    return write_rows(out, rounds, rows)


def write_rows(out: Path | None, rounds: int, rows: list[dict]) -> int:
    """The rows of a run against plain runs as JSON at `out` (if given), with the rounds and this machine's CPUs."""
    if out:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps({"rounds": rounds, "cpus": os.cpu_count(), "rows": rows}, indent=1) + "\n")
    return 0


def probe_cost(example: str, rounds: int, scratch: Path) -> dict:
    """The script's wall time with the probe recording and without, alternating (the VM drifts)."""
    script, *flags = example.split()
    times: dict[str, list[float]] = {"probe": [], "none": []}
    for i in range(rounds):
        for kind in ("none", "probe"):
            work = scratch / f"probe-{script}-{kind}-{i}"
            work.mkdir()
            env = {k: v for k, v in os.environ.items() if k != "REPROCUBE_PROBE"}
            if kind == "probe":
                env["REPROCUBE_PROBE"] = str(work / "trace.jsonl")
            started = time.perf_counter()
            subprocess.run(
                [PYTHON, str(REPO / "examples" / script), *flags], cwd=work, env=env, capture_output=True, check=True
            )
            times[kind].append(time.perf_counter() - started)
    none, probe = statistics.median(times["none"]), statistics.median(times["probe"])
    print(
        f"probe in {example}: {probe:.2f} s recording vs {none:.2f} s not: {100 * (probe / none - 1):+.1f}%", flush=True
    )
    return {"example": example, "seconds": times, "overhead": probe / none - 1}


if __name__ == "__main__":
    raise SystemExit(main())
