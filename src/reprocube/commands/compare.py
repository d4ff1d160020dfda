"""`reprocube compare RUN_A RUN_B`: are two runs bit-identical, and if not, where do they first differ and
what in their environments most likely explains it (the work: reprocube.analysis.run_comparison)."""

from __future__ import annotations

import math
from pathlib import Path

from reprocube.analysis.run_comparison import compare_runs, load_run, summary_line
from reprocube.analysis.tensors import difference_size, worst_tensor
from reprocube.errors import EXIT_DIFFERENT, EXIT_OK, ConfigError
from reprocube.files import refuse_inside_checkpoints, safe_name
from reprocube.results.compare_result import COMPARE_RESULT, write_compare

HELP = "compare two runs checkpoint by checkpoint: reprocube compare RUN_A RUN_B"


def add_arguments(parser) -> None:
    parser.add_argument("run_a", type=Path)
    parser.add_argument("run_b", type=Path)
    parser.add_argument(
        "--tolerance", type=float, default=0.0,
        help="pass when every weight differs by at most this (default 0: bit-exact)",
    )  # fmt: skip
    parser.add_argument(
        "--out", type=Path, help="directory for compare.json and compare.md (default: ./compare-A-vs-B)"
    )


def run(args) -> int:
    if not (args.tolerance >= 0 and math.isfinite(args.tolerance)):
        raise ConfigError(f"--tolerance must be a finite number >= 0, got {args.tolerance}")
    names = (safe_name(Path(run).resolve().name) for run in (args.run_a, args.run_b))
    out = args.out or Path("compare-{}-vs-{}".format(*names))
    refuse_inside_checkpoints(out)
    result = compare_runs(load_run(args.run_a), load_run(args.run_b), args.tolerance)
    out.mkdir(parents=True, exist_ok=True)
    write_compare(result, out)
    print(f"{args.run_a} vs {args.run_b}: {summary_line(result)}")
    for row in result["checkpoints"]:
        worst = worst_tensor(row["tensors"])
        detail = "" if row["identical"] else f"  {worst['tensor']}: {difference_size(worst)}"
        print(f"  {row['checkpoint']}: {'identical' if row['identical'] else 'DIFFERENT'}{detail}")
    if result["max_abs"]:
        print(f"  largest difference over all weights: {result['max_abs']:.3g}")
    for diff in result["config_differences"]:
        print(f"  config {diff['key']}: {diff['a']} -> {diff['b']}")
    for diff in result["env_differences"][:8]:
        print(f"  env {diff['key']}: {diff['a']} -> {diff['b']}")
    print(f"written: {out / COMPARE_RESULT.name}, {out / COMPARE_RESULT.markdown_name}")
    return EXIT_OK if result["passed"] else EXIT_DIFFERENT
