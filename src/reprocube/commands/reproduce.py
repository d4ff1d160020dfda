"""`reprocube reproduce SOURCE [--out DIR] [KEY=VALUE ...]`: retrain a published run here from its receipt
alone, and say whether it reproduces bit for bit. If it does not: the first diverging step and the
tensors that differ there, whether this machine agrees with itself (a second, independent computation of
the same steps), the likely causes ranked (config, code, then the environment), optionally confirmed by
intervention (--match: re-run with A's emulatable settings), and whether the difference matters in units
of the seed-to-seed spread. SOURCE is read only: nothing is ever written under it.

Run A is the published run (its receipt), run B is this machine's retraining of A's config. This module
reads the options and hands over once: a run's receipt to reprocube.orchestration.run_reproduction, a
script's (written by `reprocube check`) to reprocube.orchestration.script_reproduction."""

from __future__ import annotations

from pathlib import Path

from reprocube.errors import EXIT_DIFFERENT, EXIT_LOSSES_ONLY, EXIT_OK, ConfigError
from reprocube.files import safe_name
from reprocube.orchestration.run_reproduction import reproduce_run
from reprocube.orchestration.script_reproduction import reproduce_script
from reprocube.receipt import RECEIPT_FORMAT
from reprocube.results.script_reproduce_result import VERDICTS as SCRIPT_VERDICTS
from reprocube.script_receipt import is_script_receipt, read_script_receipt, receipt_format

HELP = "retrain a published run here from its receipt; verdict, first diverging step, causes: reprocube reproduce RUN"


def add_arguments(parser) -> None:
    parser.add_argument("source", type=Path, help="a receipt (receipt.json) or a run directory holding one")
    parser.add_argument(
        "--out", type=Path, help="directory for the runs, reproduce.json and reproduce.md (default: ./reproduce-RUN)"
    )
    parser.add_argument(
        "--match", action="store_true", help="if B differs, re-run with A's emulatable settings (ISA caps, threads)"
    )
    parser.add_argument("--study", type=Path, help="a study.json giving the seed-to-seed spread")
    parser.add_argument(
        "--seeds", type=int, default=0, help="without a study: train N other seeds here to estimate the spread"
    )
    parser.add_argument("--public-key", type=Path, help="refuse a receipt whose Ed25519 signature does not verify")
    parser.add_argument(
        "--allow-config-change",
        action="store_true",
        help="accept overrides of result keys (reported as config differences) besides the place keys",
    )
    parser.add_argument(
        "--allow-oversubscribe",
        action="store_true",
        help="train even where A's threads exceed this machine's usable CPUs (slower; JAX's result differs)",
    )
    parser.add_argument("--ulp", type=int, default=16, help="the 'within N ULP' tier's N (default 16)")
    parser.add_argument(
        "--stall-timeout",
        type=float,
        metavar="SECONDS",
        help="end a training child that makes no progress for this long (default: warn every 120 s, never end it)",
    )
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
    # A script that is not ours (`reprocube check` wrote its receipt): given -- CMD, the source must be one.
    if args.script_command or is_script_receipt(args.source):
        return _run_script(args)
    if args.copy:
        raise ConfigError("--copy is for a script receipt (written by reprocube check), with -- CMD")
    result = reproduce(
        args.source,
        args.out,
        list(args.overrides),
        match=args.match,
        study=args.study,
        seeds=args.seeds,
        public_key=args.public_key,
        allow_config_change=args.allow_config_change,
        ulp=args.ulp,
        stall_timeout=args.stall_timeout,
        allow_oversubscribe=args.allow_oversubscribe,
    )
    return {"bit-identical": EXIT_OK, "losses-only": EXIT_LOSSES_ONLY}.get(result["verdict"], EXIT_DIFFERENT)


def _run_script(args) -> int:
    for option, given in (
        ("--study", args.study),
        ("--seeds", args.seeds),
        ("--allow-config-change", args.allow_config_change),
        ("--allow-oversubscribe", args.allow_oversubscribe),
        ("--ulp", args.ulp != 16),
        ("--stall-timeout", args.stall_timeout),
    ):
        if given:
            raise ConfigError(f"{option} is for a run's receipt, not a script's (written by reprocube check)")
    if receipt_format(args.source) == RECEIPT_FORMAT:
        raise ConfigError(
            f"{args.source}: a run's receipt, reproduced without -- CMD; -- CMD is for a script's "
            "receipt (from reprocube check)"
        )
    receipt = read_script_receipt(args.source)
    if args.public_key is not None:
        from reprocube.signing import verify_receipt_signature  # cryptography: only when asked

        verify_receipt_signature(receipt.raw, receipt.directory / "receipt.json", args.public_key)
        print(f"  signature: verified by {args.public_key}")
    out = args.out or Path(f"reproduce-{safe_name(Path(receipt.command[-1]).stem or 'script')}")
    if args.overrides:
        raise ConfigError(f"{args.overrides[0]}: a script receipt takes no overrides; its command follows --")
    result = reproduce_script(receipt, list(args.script_command), list(args.copy), out, args.match)
    return SCRIPT_VERDICTS[result["verdict"]]


def reproduce(*args, **kwargs) -> dict:
    """reprocube.orchestration.run_reproduction.reproduce_run, its page drawn by reprocube.pages."""
    from reprocube.pages.reproduction_page import write_reproduce_report  # matplotlib: imported only when drawn

    return reproduce_run(*args, report=write_reproduce_report, **kwargs)
