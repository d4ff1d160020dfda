"""Two values of one config key, side by side: `reprocube train` with each, in alternating rounds on this
machine, timing the second epoch (`wall_s` in metrics.jsonl: its steps, evaluation and checkpoint) and
the whole process. Made for deliberate numeric changes, where each value computes other bits: each
value's final weights must be the same in every round (the script fails otherwise), and whether the two
values agree is reported (`bit_identical` in the result file).

    .venv/bin/python benchmarks/config_ab.py --data-dir data --key framework.memory_format \
        --values contiguous channels_last [--framework pytorch] [--rounds 5] [--out benchmarks/cpu/NAME.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from startup_rounds import final_weights_digest, write_result

EPOCHS = 2  # the second epoch is timed: the first compiles (JAX, TensorFlow) and warms the caches


def _train(framework: str, setting: str, data_dir: Path, scratch: str, run: str) -> tuple[float, float, str]:
    command = [
        "train",
        f"framework={framework}",
        setting,
        f"epochs={EPOCHS}",
        f"data_dir={data_dir}",
        f"output_dir={scratch}/runs",
        f"run_name={run}",
        "log.progress=false",
    ]
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "reprocube", *command], cwd=scratch, capture_output=True, text=True)
    whole = round(time.perf_counter() - started, 2)
    if done.returncode != 0:
        raise SystemExit(f"{setting} {run} failed: {done.stderr[-2000:]}")
    records = [json.loads(line) for line in (Path(scratch) / "runs" / run / "metrics.jsonl").read_text().splitlines()]
    epoch = [r for r in records if r.get("kind") == "epoch" and r["epoch"] == EPOCHS][-1]["wall_s"]
    return epoch, whole, final_weights_digest(Path(scratch) / "runs", run)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data-dir", type=Path, required=True)
    parser.add_argument("--framework", default="pytorch")
    parser.add_argument("--key", required=True)
    parser.add_argument("--values", nargs=2, required=True)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    settings = [f"{args.key}={value}" for value in args.values]
    times: dict[str, dict[str, list[float]]] = {s: {"epoch_s": [], "whole_s": []} for s in settings}
    digests: dict[str, set[str]] = {s: set() for s in settings}
    with tempfile.TemporaryDirectory() as scratch:
        for index in range(args.rounds):
            order = settings if index % 2 == 0 else settings[::-1]  # alternate which value runs first
            for setting in order:
                run = f"r{index}-{settings.index(setting)}"
                epoch, whole, digest = _train(args.framework, setting, args.data_dir.resolve(), scratch, run)
                times[setting]["epoch_s"].append(epoch)
                times[setting]["whole_s"].append(whole)
                digests[setting].add(digest)
                print(f"round {index + 1} {setting}: epoch {epoch:.2f} s, whole {whole:.2f} s", flush=True)
    for setting, found in digests.items():
        if len(found) != 1:
            raise SystemExit(f"{setting}: the rounds' final weights differ: {sorted(found)}")
    rows = []
    for setting in settings:
        medians = {kind: statistics.median(values) for kind, values in times[setting].items()}
        rows.append({"setting": setting, **times[setting], "median": medians, "weights_digest": digests[setting].pop()})
        print(f"{setting}: median epoch {medians['epoch_s']:.2f} s, whole {medians['whole_s']:.2f} s")
    a, b = (row["median"] for row in rows)
    ratio = {kind: round(a[kind] / b[kind], 2) for kind in a}
    print(f"{settings[0]} / {settings[1]}: epoch {ratio['epoch_s']}x, whole {ratio['whole_s']}x")
    same = rows[0]["weights_digest"] == rows[1]["weights_digest"]
    print("the two values give " + ("the same weights" if same else "different weights (a numeric change)"))
    rows = [{"framework": args.framework, **row} for row in rows] + [{"ratio_first_over_second": ratio}]
    write_result(args.out, args.rounds, rows, bit_identical=same)


if __name__ == "__main__":
    main()
