"""`reprocube compare A B`: are two runs bit-identical, and if not, where do they first differ and what in
their environments most likely explains it. Run directories are compared checkpoint by checkpoint
(reprocube.analysis.run_comparison) and, where both hold a receipt, also from their traces; a receipt
given alone (published, without checkpoints) is compared from its trace (reprocube.analysis.receipt_pair):
the first differing update and its tensors, no training."""

from __future__ import annotations

import hashlib
import math
from pathlib import Path

from reprocube.analysis.receipt_pair import compare_published
from reprocube.analysis.run_comparison import compare_runs, load_run
from reprocube.errors import EXIT_DIFFERENT, EXIT_LOSSES_ONLY, EXIT_OK, ConfigError
from reprocube.files import refuse_inside_checkpoints, safe_name
from reprocube.formats.script_receipt import is_script_receipt
from reprocube.results.compare_result import COMPARE_RESULT, receipts_line, summary_line, write_compare
from reprocube.results.wording import difference_size, worst_tensor
from reprocube.terminal import one_line, shown_value
from reprocube.training.receipt import find_receipt, read_receipt

HELP = "compare two runs checkpoint by checkpoint: reprocube compare RUN_A RUN_B"


def add_arguments(parser) -> None:
    parser.add_argument("run_a", type=Path, help="a run directory, or a receipt (receipt.json: its trace only)")
    parser.add_argument("run_b", type=Path, help="a run directory, or a receipt")
    parser.add_argument(
        "--tolerance",
        type=float,
        default=0.0,
        help="pass when every weight differs by at most this (default 0: bit-exact)",
    )
    parser.add_argument(
        "--out", type=Path, help="directory for compare.json and compare.md (default: ./compare-A-vs-B)"
    )


def run(args) -> int:
    if not (args.tolerance >= 0 and math.isfinite(args.tolerance)):
        raise ConfigError(f"--tolerance must be a finite number >= 0, got {args.tolerance}")
    for given in (args.run_a, args.run_b):
        if is_script_receipt(given):
            raise ConfigError(
                f"{given}: a script's receipt (from reprocube check): reproduce it with "
                "reprocube reproduce RECEIPT -- CMD"
            )
    names = (safe_name(_name(Path(run))) for run in (args.run_a, args.run_b))
    out = args.out or Path("compare-{}-vs-{}".format(*names))
    _check_out(out)
    if _is_receipt(args.run_a) or _is_receipt(args.run_b):  # a published receipt: its trace is what there is
        return _compare_receipts(args, out)
    a, b = load_run(args.run_a), load_run(args.run_b)
    result = compare_runs(a, b, args.tolerance)
    result["receipts"] = None
    receipts = [find_receipt(Path(run)) for run in (args.run_a, args.run_b)]
    if all(r.is_file() and not r.is_symlink() for r in receipts):  # (a linked receipt is no run file)
        receipt_a, receipt_b = read_receipt(args.run_a), read_receipt(args.run_b)
        result["receipts"] = compare_published(receipt_a, receipt_b)
        for run, receipt in (("a", receipt_a), ("b", receipt_b)):
            result["inputs"][run]["receipt.json"] = hashlib.sha256(receipt.raw).hexdigest()
    out.mkdir(parents=True, exist_ok=True)
    write_compare(result, out)
    # Tensor names, keys and values come from the runs' files: each is kept on its line (one_line).
    print(f"{one_line(str(args.run_a))} vs {one_line(str(args.run_b))}: {one_line(summary_line(result))}")
    if result["receipts"]:
        print(f"  {one_line(receipts_line(result['receipts']))}")
    for row in result["checkpoints"]:
        worst = worst_tensor(row["tensors"])
        detail = "" if row["identical"] else f"  {one_line(worst['tensor'])}: {one_line(difference_size(worst))}"
        print(f"  {row['checkpoint']}: {'identical' if row['identical'] else 'DIFFERENT'}{detail}")
    if result["max_abs"]:
        print(f"  largest difference over all weights: {result['max_abs']:.3g}")
    for diff in result["config_differences"]:
        print(f"  config {one_line(diff['key'])}: {one_line(str(diff['a']))} -> {one_line(str(diff['b']))}")
    for diff in result["env_differences"][:8]:
        print(f"  env {one_line(diff['key'])}: {one_line(str(diff['a']))} -> {one_line(str(diff['b']))}")
    print(f"written: {out / COMPARE_RESULT.name}, {out / COMPARE_RESULT.markdown_name}")
    return EXIT_OK if result["passed"] else EXIT_DIFFERENT


def _is_receipt(path: Path) -> bool:
    """A receipt given alone: a file (receipt.json), or a directory that holds one and no checkpoints/."""
    path = Path(path)
    if path.is_dir():
        return not (path / "checkpoints").is_dir() and (path / "receipt.json").exists()
    return path.exists() or path.is_symlink()


def _compare_receipts(args, out: Path) -> int:
    """Two receipts (a receipt.json, or a directory holding one), from their traces alone."""
    a, b = read_receipt(args.run_a), read_receipt(args.run_b)
    if args.tolerance:
        raise ConfigError("--tolerance compares checkpoints' weights; a receipt holds none (give run directories)")
    published = compare_published(a, b)
    nothing = {"a": [], "b": []}
    result = {
        "subject": {"a": None, "b": None},  # a run's subject is its final checkpoint: none was read
        "inputs": {
            run: {
                "checkpoints": {},
                "env.json": None,
                "metrics.jsonl": None,
                "receipt.json": hashlib.sha256(r.raw).hexdigest(),
            }
            for run, r in (("a", a), ("b", b))
        },
        "run_a": str(args.run_a),
        "run_b": str(args.run_b),
        "compared_checkpoints": [],
        "identical": published["identical"],
        "passed": published["identical"],
        "tolerance": 0.0,
        "first_difference": None,
        "checkpoints": [],
        "metric_differences": [],
        "config_differences": [],
        "env_differences": [],
        "unreadable_checkpoints": nothing,
        "missing_epoch_checkpoints": nothing,
        "not_compared_checkpoints": nothing,
        "max_abs": None,
        "receipts": published,
    }
    out.mkdir(parents=True, exist_ok=True)
    write_compare(result, out)
    pair = f"{one_line(str(args.run_a))} vs {one_line(str(args.run_b))}"
    print(f"{pair} (their receipts' traces, no checkpoints): {one_line(published['summary'])}")
    for cause in [c for c in published["causes"] if c["kind"] != "not-numeric"][:6]:
        print(f"  likely cause: {one_line(cause['key'])}: {shown_value(cause['a'])} -> {shown_value(cause['b'])}")
    print(f"written: {out / COMPARE_RESULT.name}, {out / COMPARE_RESULT.markdown_name}")
    return {"bit-identical": EXIT_OK, "losses-only": EXIT_LOSSES_ONLY}.get(published["verdict"], EXIT_DIFFERENT)


def _name(run: Path) -> str:
    """A run's name for the default --out: the directory's, or a receipt file's directory's."""
    resolved = run.resolve()
    return resolved.parent.name if resolved.name == "receipt.json" else resolved.name.removesuffix(".json")


def _check_out(out: Path) -> None:
    """--out: never a link (nothing is written through one), never inside a run's checkpoints, and never
    one that holds a compare.json or compare.md already (an earlier compare's, or not ours)."""
    refuse_inside_checkpoints(out)
    if out.is_symlink() or (out.exists() and not out.is_dir()):
        raise ConfigError(f"--out {out} is a symbolic link or not a directory; compare writes into a directory")
    held = [
        name
        for name in (COMPARE_RESULT.name, COMPARE_RESULT.markdown_name)
        if (out / name).exists() or (out / name).is_symlink()
    ]
    if held:
        raise ConfigError(
            f"--out {out} holds {held[0]} already (an earlier compare?); remove it or choose another --out"
        )
