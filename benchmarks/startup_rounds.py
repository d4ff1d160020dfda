"""What the start-up benchmarks (jax_startup.py, pytorch_startup.py) share: the weights digest of a run
they trained, which every setting must reproduce, and their result file."""

from __future__ import annotations

import json
import os
import platform
from pathlib import Path

from reprocube.formats.env import _cpu_info


def final_weights_digest(runs: Path, run: str) -> str:
    """The weights digest in the manifest of the run's last epoch checkpoint."""
    last = sorted((runs / run / "checkpoints").glob("epoch-*"))[-1]
    return json.loads((last / "manifest.json").read_text())["weights_digest"]


def write_result(out: Path | None, rounds: int, rows: list[dict], bit_identical: bool = True) -> None:
    """The machine, the rounds and each row; `bit_identical`: whether every row's weights are the same (the
    start-up benchmarks fail before they write anything where they are not)."""
    if out is None:
        return
    result = {
        "machine": {"cpu": _cpu_info(), "python": platform.python_version()},
        "rounds": rounds,
        "load_1min": os.getloadavg()[0],
        "rows": rows,
        "bit_identical": bit_identical,
    }
    out.write_text(json.dumps(result, indent=1) + "\n")
