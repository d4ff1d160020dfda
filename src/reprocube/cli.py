"""Command line: `reprocube COMMAND ...`, a table from each command's name to the function that runs it
(reprocube.commands.*). train, download, verify, bench and study take Hydra overrides (KEY=VALUE);
compare and report take run directories."""

from __future__ import annotations

import argparse
import importlib
import sys
from dataclasses import dataclass, field
from pathlib import Path

from reprocube.errors import EXIT_CONFIG, EXIT_OK, ConfigError, exit_status_of
from reprocube.terminal import escaped_output


@dataclass(frozen=True)
class Command:
    help: str
    handler: str  # "module:function", imported only when the command runs (keeps --help fast)
    takes_config: bool = True  # Hydra overrides and --config-file; the handler gets an Invocation
    all_frameworks_default: str | None = None  # `framework=all` allowed; the default framework
    aliases: dict[str, str] = field(default_factory=dict)  # a command's own short override names


COMMANDS = {
    "train": Command(
        "train (or resume) a model: reprocube train framework=pytorch epochs=4 seed=1", "reprocube.commands.train:run"
    ),
    "download": Command(
        "fetch and verify a dataset: reprocube download dataset=fashion_mnist data_dir=data",
        "reprocube.commands.download:run",
    ),
    "verify": Command(
        "prove bit-exact restart and resume: reprocube verify framework=all epochs=3",
        "reprocube.commands.verify:run",
        all_frameworks_default="pytorch",
    ),
    "bench": Command(
        "time each trainer, determinism on/off, checkpoints, verify: reprocube bench bench.repeats=3",
        "reprocube.commands.bench:run",
        all_frameworks_default="all",
    ),
    "study": Command(
        "same seed vs different seeds, through Hydra multirun: reprocube study framework=jax runs=5 epochs=3",
        "reprocube.commands.study:run",
        aliases={"runs": "study.runs"},
    ),
    "compare": Command(
        "compare two runs checkpoint by checkpoint: reprocube compare RUN_A RUN_B",
        "reprocube.commands.compare:run",
        takes_config=False,
    ),
    "report": Command(
        "HTML report with curves, divergence map, verdicts: reprocube report RUN...",
        "reprocube.commands.report:run",
        takes_config=False,
    ),
    "reproduce": Command(
        "retrain a published run here from its receipt; verdict, first diverging step, causes: reprocube reproduce RUN",
        "reprocube.commands.reproduce:run",
        takes_config=False,
    ),
    "sign": Command(
        "sign a run's receipt with an Ed25519 key: reprocube sign RUN --key KEY.pem",
        "reprocube.commands.sign:run",
        takes_config=False,
    ),
}


class _OneLineErrorParser(argparse.ArgumentParser):
    def error(self, message: str):
        self.exit(EXIT_CONFIG, f"reprocube: error: {message} (see reprocube --help)\n")


def _parser() -> argparse.ArgumentParser:
    parser = _OneLineErrorParser(
        prog="reprocube",
        description="Bit-exact restart and resume of deep-learning training.",
        epilog="Overrides use Hydra's grammar (key=value, nested.key=value); see docs/configuration.md for every key.",
    )
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, command in COMMANDS.items():
        sub = subparsers.add_parser(name, help=command.help, description=command.help)
        if command.takes_config:
            sub.add_argument(
                "--config-file", metavar="PATH", action="append", default=[],
                help="user yaml merged under the command-line overrides (e.g. workspace/train.yaml); repeatable, later files win",
            )  # fmt: skip
            sub.add_argument("--print-config", action="store_true", help="print the resolved config and exit")
            sub.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="Hydra overrides")
    compare = subparsers.choices["compare"]
    compare.add_argument("run_a", type=Path)
    compare.add_argument("run_b", type=Path)
    compare.add_argument(
        "--tolerance",
        type=float,
        default=0.0,
        help="pass when every weight differs by at most this (default 0: bit-exact)",
    )
    compare.add_argument(
        "--out", type=Path, help="directory for compare.json and compare.md (default: ./compare-A-vs-B)"
    )
    report = subparsers.choices["report"]
    report.add_argument("runs", type=Path, nargs="+")
    report.add_argument("--out", type=Path, default=Path("report"), help="output directory (default: report/)")
    reproduce = subparsers.choices["reproduce"]
    reproduce.add_argument("source", type=Path, help="a receipt (receipt.json) or a run directory holding one")
    reproduce.add_argument(
        "--out", type=Path, help="directory for the runs, reproduce.json and reproduce.md (default: ./reproduce-RUN)"
    )
    reproduce.add_argument(
        "--match", action="store_true", help="if B differs, re-run with A's emulatable settings (ISA caps, threads)"
    )
    reproduce.add_argument("--study", type=Path, help="a study.json giving the seed-to-seed spread")
    reproduce.add_argument(
        "--seeds", type=int, default=0, help="without a study: train N other seeds here to estimate the spread"
    )
    reproduce.add_argument("--public-key", type=Path, help="refuse a receipt whose Ed25519 signature does not verify")
    reproduce.add_argument(
        "--allow-config-change",
        action="store_true",
        help="accept overrides of result keys (reported as config differences) besides the place keys",
    )
    reproduce.add_argument("--ulp", type=int, default=16, help="the 'within N ULP' tier's N (default 16)")
    reproduce.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="place keys: data_dir=, device=, ...")
    sign = subparsers.choices["sign"]
    sign.add_argument("source", type=Path, help="a run directory or its receipt.json")
    sign.add_argument("--key", type=Path, required=True, help="an Ed25519 private key (PEM, PKCS#8, unencrypted)")
    sign.add_argument("--new-key", action="store_true", help="first make a key pair: KEY and KEY.pub (never replaced)")
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    # Overrides may follow options (`reproduce RUN --out DIR data_dir=...`), which argparse's positional
    # matching alone refuses.
    args, extra = parser.parse_known_args(argv)
    if extra:
        if not hasattr(args, "overrides") or any(e.startswith("-") for e in extra):
            parser.error(f"unrecognized arguments: {' '.join(extra)}")
        args.overrides += extra
    with escaped_output():  # values from files are printed: never as terminal control (reprocube.terminal)
        return exit_status_of(lambda: _dispatch(COMMANDS[args.command], _unicode_arguments(args)))


def _unicode_arguments(args: argparse.Namespace) -> argparse.Namespace:
    """Every argument must be Unicode text: a path holding bytes that are not UTF-8 (Python keeps them as
    lone surrogates) could be neither written into a report nor shown; refused at once, in one line."""
    for value in vars(args).values():
        for item in value if isinstance(value, list) else [value]:
            if isinstance(item, (str, Path)):
                try:
                    str(item).encode("utf-8")
                except UnicodeEncodeError:
                    raise ConfigError(
                        f"{ascii(str(item))[1:-1]}: not UTF-8 text (a name reprocube cannot show)"
                    ) from None
    return args


def _dispatch(command: Command, args: argparse.Namespace) -> int:
    module_name, function_name = command.handler.split(":")
    if not command.takes_config:
        return getattr(importlib.import_module(module_name), function_name)(args)
    from omegaconf import OmegaConf

    from reprocube.commands.invocation import load_invocation  # imports Hydra: keep `--help` fast

    overrides = [_expand_alias(o, command.aliases) for o in args.overrides]
    invocation = load_invocation(overrides, args.config_file, command.all_frameworks_default)
    if args.print_config:
        print(OmegaConf.to_yaml(invocation.cfg, resolve=True), end="")
        return EXIT_OK
    return getattr(importlib.import_module(module_name), function_name)(invocation)


def _expand_alias(override: str, aliases: dict[str, str]) -> str:
    key, sep, value = override.partition("=")
    return f"{aliases[key]}={value}" if sep and key in aliases else override


if __name__ == "__main__":
    sys.exit(main())
