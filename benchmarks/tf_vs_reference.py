"""TensorFlow against the reference tutorial, measured alternately: each round runs the reference's
mnist_tensorflow.py (benchmarks/reference_tutorial.py, its own venv) and then `reprocube bench` once per
setting, all with determinism on, so that this VM's drift (10-30% over minutes, and other work on
the machine) falls on every contender alike. The reference's figure is the median of its epochs after the
first, ours the one warm epoch `reprocube bench` times; the ratio is reference median / reprocube median.
A setting is a list of config overrides and environment variables (upper-case names, e.g.
TF_ENABLE_ONEDNN_OPTS=0) for that reprocube process.

    .venv/bin/python benchmarks/tf_vs_reference.py --tutorial-git GITDIR --data-dir DATA [--rounds 3] \
        [--setting NAME=OVERRIDES ...] [--out benchmarks/cpu/tf-vs-reference]   # writes .json and .md
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
# TensorFlow's Eigen kernels (its default on CPUs without AVX512_VNNI/BF16 or AMX) and its oneDNN ones (the
# trainer's default since 2026-11-23), each with 1 inter-op thread (the default) and 2.
DEFAULT_SETTINGS = [
    "eigen_inter_op_1=TF_ENABLE_ONEDNN_OPTS=0 framework.inter_op_threads=1",
    "eigen_inter_op_2=TF_ENABLE_ONEDNN_OPTS=0 framework.inter_op_threads=2",
    "onednn_inter_op_1=TF_ENABLE_ONEDNN_OPTS=1 framework.inter_op_threads=1",
    "onednn_inter_op_2=TF_ENABLE_ONEDNN_OPTS=1 framework.inter_op_threads=2",
]
ENV_NAME = re.compile(r"[A-Z][A-Z0-9_]*=")


def run(command: list[str], env: dict) -> None:
    proc = subprocess.run(command, capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        sys.exit(f"{' '.join(command)} exited {proc.returncode}:\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")


def reference_epochs(args, scratch: Path, round_: int) -> dict:
    out = scratch / f"reference-{round_}.json"
    command = [
        sys.executable,
        str(HERE / "reference_tutorial.py"),
        "--tutorial-git",
        str(args.tutorial_git),
        "--frameworks",
        "tensorflow",
        "--epochs",
        str(args.epochs),
        "--out",
        str(out),
    ]
    run(command, {k: v for k, v in os.environ.items() if k != "TF_ENABLE_ONEDNN_OPTS"})  # as published: TF's default
    result = json.loads(out.read_text())["results"]["tensorflow"]
    return {"epochs_s": result["train_epoch_s"], "epoch_s": result["median_train_s_after_first_epoch"]}


def reprocube_epoch(args, scratch: Path, round_: int, name: str, setting: list[str]) -> dict:
    out = scratch / f"{name}-{round_}"
    env = dict(token.split("=", 1) for token in setting if ENV_NAME.match(token))
    overrides = [token for token in setting if not ENV_NAME.match(token)]
    run(
        [
            sys.executable,
            "-m",
            "reprocube",
            "bench",
            "framework=tensorflow",
            "bench.repeats=1",
            "bench.deterministic=[true]",
            "bench.verify_epochs=0",
            f"data_dir={args.data_dir}",
            f"bench.out={out}",
            *overrides,
        ],
        {**os.environ, **env},
    )
    [record] = json.loads((out / "bench.json").read_text())["frameworks"]["tensorflow"]["runs"]
    return {k: record[k] for k in ("epoch_s", "traced_epoch_s", "first_step_s")}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tutorial-git", type=Path, required=True, help="git directory of reproduc-ml-tutorial")
    parser.add_argument("--data-dir", required=True, help="reprocube's data_dir (holding fashion_mnist/)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--epochs", type=int, default=3, help="the reference's epochs per round")
    parser.add_argument(
        "--setting", action="append", help="NAME=OVERRIDES and VARIABLE=VALUE (space-separated), in round order"
    )
    parser.add_argument("--out", type=Path, default=HERE / "cpu" / "tf-vs-reference")
    args = parser.parse_args()
    settings = {
        name: overrides.split() for name, overrides in (s.split("=", 1) for s in args.setting or DEFAULT_SETTINGS)
    }

    rounds = []
    with tempfile.TemporaryDirectory(prefix="tf-vs-reference-") as scratch:
        for round_ in range(1, args.rounds + 1):
            row = {"round": round_, "load_avg_before": os.getloadavg()[0]}
            row["reference"] = reference_epochs(args, Path(scratch), round_)
            for name, overrides in settings.items():
                row[name] = reprocube_epoch(args, Path(scratch), round_, name, overrides)
            rounds.append(row)
            print(json.dumps(row), flush=True)

    reference = statistics.median(r["reference"]["epoch_s"] for r in rounds)
    summary = {"reference_epoch_s": reference}
    for name in settings:
        ours = statistics.median(r[name]["epoch_s"] for r in rounds)
        summary[name] = {"epoch_s": ours, "speedup": reference / ours}
    results = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "machine": {"platform": platform.platform(), "cpus": os.cpu_count()},
        "reference_epochs": args.epochs,
        "settings": {name: " ".join(overrides) for name, overrides in settings.items()},
        "rounds": rounds,
        "summary": summary,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.with_suffix(".json").write_text(json.dumps(results, indent=1) + "\n")
    args.out.with_suffix(".md").write_text(markdown(results))
    print(markdown(results))
    return 0


def markdown(results: dict) -> str:
    names = list(results["settings"])
    lines = [
        f"# TensorFlow against the reference tutorial, alternating ({results['date']})",
        "",
        f"{results['machine']['platform']}, {results['machine']['cpus']} CPUs; determinism on in both. Each round: the "
        f"reference's mnist_tensorflow.py ({results['reference_epochs']} epochs, median of epochs 2-), then "
        "`reprocube bench framework=tensorflow bench.repeats=1` per setting: "
        + "; ".join(f"{n}: `{o}`" for n, o in results["settings"].items())
        + ".",
        "",
        "| round | load avg | reference epochs s | reference median | "
        + " | ".join(f"{n} epoch s (ratio)" for n in names)
        + " |",
        "|---|---|---|---|" + "---|" * len(names),
    ]
    for r in results["rounds"]:
        epochs = " / ".join(f"{e:.2f}" for e in r["reference"]["epochs_s"])
        ours = " | ".join(f"{r[n]['epoch_s']:.2f} ({r['reference']['epoch_s'] / r[n]['epoch_s']:.2f}x)" for n in names)
        lines.append(
            f"| {r['round']} | {r['load_avg_before']:.2f} | {epochs} | {r['reference']['epoch_s']:.2f} | {ours} |"
        )
    summary = results["summary"]
    lines += [
        "",
        f"Medians: reference {summary['reference_epoch_s']:.2f} s; "
        + "; ".join(f"{n} {summary[n]['epoch_s']:.2f} s (**{summary[n]['speedup']:.2f}x**)" for n in names)
        + ".",
    ]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
