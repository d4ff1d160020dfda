"""What the probe costs a step of a small PyTorch loop, with the streams of issue 67 and without.

Side by side in one process, in alternating blocks of `--steps` steps (this VM drifts 10-30%; blocks of a
few hundred milliseconds cancel it better than separate processes): a plain step (forward, backward, SGD on
a 2-layer MLP of about 100k weights, a batch of 64), the same step with `probe.step(loss, model)` as it was
before issue 67 (the weights' fingerprints and the loss), as it is (and the generators the probe sees by
itself: torch's, NumPy's, Python's), and with
`probe.step(loss, model, batch=..., lr=...)` too. Also the streams alone: `seen_generators()` and the
batch's digest, timed by themselves. Per step: the median of the blocks' means.

    .venv/bin/python benchmarks/probe_streams_cost.py --out benchmarks/cpu/probe-streams-cost.json

The JSON holds no absolute path.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import tempfile
import time
from pathlib import Path


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=200, help="steps per block")
    parser.add_argument("--rounds", type=int, default=7, help="blocks of each kind, alternating")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()

    import numpy as np
    import torch

    from reprocube import probe
    from reprocube.probe_streams import batch_digest, seen_generators

    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(784, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(64, 784), torch.randint(0, 10, (64,))

    def step():
        optimizer.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
        return loss

    scratch = Path(tempfile.mkdtemp(prefix="probe-cost-"))
    recorder = probe._Recorder(str(scratch / "trace.jsonl"))

    seen = probe.seen_generators

    def without_streams():  # the probe as it was before issue 67: weights and loss only
        probe.seen_generators = dict
        try:
            recorder.step(step(), model, None)
        finally:
            probe.seen_generators = seen

    kinds = {
        "plain step": lambda: step(),
        "step + probe.step(loss, model), streams left out (the probe before issue 67)": without_streams,
        "step + probe.step(loss, model)": lambda: recorder.step(step(), model, None),
        "step + probe.step(loss, model, batch=, lr=)": lambda: recorder.step(
            step(), model, None, {"batch": batch_digest((x, y))}, [0.01]
        ),
        "seen_generators() alone": seen_generators,
        "batch digest alone (64x784 float32 + 64 int64)": lambda: batch_digest((x, y)),
    }
    means: dict[str, list[float]] = {name: [] for name in kinds}
    for _ in range(args.rounds):
        for name, call in kinds.items():
            start = time.perf_counter()
            for _ in range(args.steps):
                call()
            recorder.flush()  # each block's records written within it (the probe writes every GROUP steps)
            means[name].append((time.perf_counter() - start) / args.steps)
    per_step = {name: statistics.median(values) * 1e6 for name, values in means.items()}
    plain = per_step["plain step"]
    rows = [
        {"kind": name, "us_per_step": round(us, 1), "over_plain": round(us / plain, 3) if "step" in name else None}
        for name, us in per_step.items()
    ]
    for row in rows:
        ratio = f"  {row['over_plain']:.3f}x the plain step" if row["over_plain"] else ""
        print(f"{row['us_per_step']:9.1f} us  {row['kind']}{ratio}")
    if args.out:
        machine = {"cpu": platform.processor() or platform.machine(), "cpus": os.cpu_count()}
        result = {"steps": args.steps, "rounds": args.rounds, "machine": machine, "torch": torch.__version__}
        result |= {"numpy": np.__version__, "rows": rows}
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
