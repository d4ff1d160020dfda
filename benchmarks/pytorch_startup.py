"""A PyTorch process with the trainer's own SGD (frameworks/torch_sgd.py) against the same process with
torch.optim.SGD swapped in, in alternating rounds on this machine: `reprocube train framework=pytorch` on a
tiny slice of the data (almost all of it start-up) and on one whole epoch. torch.optim.SGD imports
torch._dynamo; the trainer's SGD does not. The weights of every run must be bit-identical (the script
fails otherwise), and each process reports whether torch._dynamo was loaded.

    .venv/bin/python benchmarks/pytorch_startup.py --data-dir data [--rounds 5] \
        [--out benchmarks/cpu/pytorch-startup.json]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from startup_rounds import final_weights_digest, write_result

# The training command in a child: with `torch` as argv[1], torch.optim.SGD replaces the trainer's SGD
# (a drop-in: the same constructor arguments, zero_grad, step, state and step hooks).
DRIVER = """
import sys
optimizer, args = sys.argv[1], sys.argv[2:]
if optimizer == "torch":
    import torch
    import reprocube.frameworks.pytorch as trainer
    trainer.MomentumSGD = torch.optim.SGD
from reprocube.cli import main
code = main(args)
print("DYNAMO", "torch._dynamo" in sys.modules, file=sys.stderr)
sys.exit(code)
"""
OPTIMIZERS = ("ours", "torch")
WORKLOADS = {
    "start-up (640 examples, 1 epoch)": ["epochs=1", "data.train_limit=640", "data.test_limit=640"],
    "1 epoch of Fashion-MNIST": ["epochs=1"],
}


def _train(optimizer: str, overrides: list[str], data_dir: Path, scratch: str, run: str) -> tuple[float, bool, str]:
    command = [
        "train",
        "framework=pytorch",
        *overrides,
        f"data_dir={data_dir}",
        f"output_dir={scratch}/runs",
        f"run_name={run}",
        "log.progress=false",
    ]
    started = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-c", DRIVER, optimizer, *command], cwd=scratch, capture_output=True, text=True
    )
    wall = round(time.perf_counter() - started, 2)
    if done.returncode != 0 or "DYNAMO" not in done.stderr:
        raise SystemExit(f"{optimizer} {run} failed: {done.stderr[-2000:]}")
    return wall, "DYNAMO True" in done.stderr, final_weights_digest(Path(scratch) / "runs", run)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", type=Path, required=True)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    rows, digests = [], set()
    with tempfile.TemporaryDirectory(prefix="reprocube-pytorch-startup-") as scratch:
        for workload, overrides in WORKLOADS.items():
            walls, dynamo = {o: [] for o in OPTIMIZERS}, {o: set() for o in OPTIMIZERS}
            for round_number in range(args.rounds):
                for optimizer in OPTIMIZERS if round_number % 2 == 0 else reversed(OPTIMIZERS):
                    run = f"{len(rows)}-{round_number}-{optimizer}"
                    wall, loaded, digest = _train(optimizer, overrides, args.data_dir.resolve(), scratch, run)
                    walls[optimizer].append(wall)
                    dynamo[optimizer].add(loaded)
                    digests.add((workload, digest))
            medians = {o: statistics.median(values) for o, values in walls.items()}
            rows.append(
                {
                    "workload": workload,
                    "wall_s": walls,
                    "median_s": medians,
                    "saved_s": round(medians["torch"] - medians["ours"], 2),
                    "dynamo_loaded": {o: sorted(v) for o, v in dynamo.items()},
                }
            )
            print(
                f"{workload}: "
                + ", ".join(f"{o} {medians[o]:.2f} s {walls[o]}" for o in OPTIMIZERS)
                + f", torch._dynamo loaded: {rows[-1]['dynamo_loaded']}",
                flush=True,
            )
    if len(digests) != len(WORKLOADS):
        print(f"FAILED: the two optimizers gave different weights: {sorted(digests)}", file=sys.stderr)
        return 1
    write_result(args.out, args.rounds, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
