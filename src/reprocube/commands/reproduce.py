"""`reprocube reproduce SOURCE [--out DIR] [KEY=VALUE ...]`: retrain a published run here from its receipt
alone, and say whether it reproduces bit for bit. If it does not: the first diverging step and the
tensors that differ there, whether this machine agrees with itself (a second, independent computation of
the same steps), the likely causes ranked (config, code, then the environment), optionally confirmed by
intervention (--match: re-run with A's emulatable settings), and whether the difference matters in units
of the seed-to-seed spread. SOURCE is read only: nothing is ever written under it.

Run A is the published run (its receipt), run B is this machine's retraining of A's config. This module
reads the options and hands over once: a run's receipt to reprocube.orchestration.run_reproduction, a
script's (written by `reprocube check`) to reprocube.check.reproduction."""

from __future__ import annotations

from pathlib import Path

from reprocube.check.reproduction import reproduce_script
from reprocube.errors import EXIT_DIFFERENT, EXIT_LOSSES_ONLY, EXIT_OK, ConfigError
from reprocube.files import safe_name
from reprocube.formats.script_receipt import is_script_receipt, read_script_receipt, receipt_format
from reprocube.orchestration.children import print_now
from reprocube.orchestration.options import add_options
from reprocube.orchestration.reproduce_options import OPTIONS, SCRIPT_OPTIONS, ReproduceOptions
from reprocube.orchestration.run_reproduction import reproduce_run
from reprocube.results.script_reproduce_result import VERDICTS as SCRIPT_VERDICTS
from reprocube.training.receipt import RECEIPT_FORMAT

HELP = "retrain a published run here from its receipt; verdict, first diverging step, causes: reprocube reproduce RUN"


def add_arguments(parser) -> None:
    parser.add_argument("source", type=Path, help="a receipt (receipt.json) or a run directory holding one")
    parser.add_argument(
        "--out", type=Path, help="directory for the runs, reproduce.json and reproduce.md (default: ./reproduce-RUN)"
    )
    add_options(parser, OPTIONS)
    parser.add_argument(
        "--copy",
        action="append",
        default=[],
        type=Path,
        metavar="PATH",
        help="a script receipt's inputs: copied into the work directory (reprocube reproduce RECEIPT --copy "
        "train.py -- python train.py)",
    )
    parser.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="place keys: data_dir=, device=, ...")
    parser.set_defaults(script_command=[])  # a script receipt's: -- CMD [ARG ...] (reprocube.cli splits it off)


def run(args) -> int:
    options = ReproduceOptions.of(**{option.name: getattr(args, option.name) for option in OPTIONS})
    # A script that is not ours (`reprocube check` wrote its receipt): given -- CMD, the source must be one.
    if args.script_command or is_script_receipt(args.source):
        return _run_script(args, options)
    if args.copy:
        raise ConfigError("--copy is for a script receipt (written by reprocube check), with -- CMD")
    result = reproduce_run(args.source, args.out, list(args.overrides), options, report=_page())
    return {"bit-identical": EXIT_OK, "losses-only": EXIT_LOSSES_ONLY}.get(result["verdict"], EXIT_DIFFERENT)


def _run_script(args, options: ReproduceOptions) -> int:
    for option in options.given():
        if option.name not in SCRIPT_OPTIONS:
            raise ConfigError(f"{option.flag} is for a run's receipt, not a script's (written by reprocube check)")
    if receipt_format(args.source) == RECEIPT_FORMAT:
        raise ConfigError(
            f"{args.source}: a run's receipt, reproduced without -- CMD; -- CMD is for a script's "
            "receipt (from reprocube check)"
        )
    receipt = read_script_receipt(args.source)
    if args.public_key is not None:
        from reprocube.training.signing import verify_receipt_signature  # cryptography: only when asked

        verify_receipt_signature(receipt.raw, receipt.directory / "receipt.json", args.public_key)
        print(f"  signature: verified by {args.public_key}")
    out = args.out or Path(f"reproduce-{safe_name(Path(receipt.command[-1]).stem or 'script')}")
    if args.overrides:
        raise ConfigError(f"{args.overrides[0]}: a script receipt takes no overrides; its command follows --")
    result = reproduce_script(receipt, list(args.script_command), list(args.copy), out, options.match)
    return SCRIPT_VERDICTS[result["verdict"]]


def reproduce(source: Path, out: Path | None, overrides: list[str], echo=print_now, **values) -> dict:
    """run_reproduction.reproduce_run with its options as keywords (match=True, seeds=2, ...), its page drawn."""
    return reproduce_run(source, out, overrides, ReproduceOptions.of(**values), echo=echo, report=_page())


def _page():
    from reprocube.pages.reproduction_page import write_reproduce_report  # matplotlib: imported only when drawn

    return write_reproduce_report
