"""Command line: `reprocube COMMAND [--config-file PATH] [KEY=VALUE ...]` (Hydra override grammar)."""

from __future__ import annotations

import argparse
import sys

from omegaconf import OmegaConf

from reprocube.errors import EXIT_CONFIG, ReprocubeError

COMMANDS = {
    "train": "train (or resume) a model: reprocube train framework=pytorch epochs=4 seed=1",
    "download": "fetch and verify a dataset: reprocube download dataset=fashion_mnist data_dir=data",
}


class _OneLineErrorParser(argparse.ArgumentParser):
    def error(self, message: str):
        self.exit(EXIT_CONFIG, f"reprocube: error: {message} (see reprocube --help)\n")


def _parser() -> argparse.ArgumentParser:
    parser = _OneLineErrorParser(
        prog="reprocube",
        description="Bit-exact restart and resume of deep-learning training.",
        epilog="Overrides use Hydra's grammar (key=value, nested.key=value); see README.md for every key.",
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, help_text in COMMANDS.items():
        sub = commands.add_parser(name, help=help_text, description=help_text)
        sub.add_argument("--config-file", metavar="PATH", help="user yaml merged under the command-line overrides (e.g. workspace/train.yaml)")
        sub.add_argument("--print-config", action="store_true", help="print the resolved config and exit")
        sub.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="Hydra overrides")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        return _run(args)
    except ReprocubeError as exc:
        print(f"reprocube: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except OSError as exc:  # disk full, permissions, ...: one line, not a traceback
        print(f"reprocube: error: {exc.strerror or exc}: {exc.filename or ''}".rstrip(": "), file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("reprocube: interrupted", file=sys.stderr)
        return 130


def _run(args) -> int:
    from reprocube.config import load_config  # imports Hydra: keep `--help` fast

    cfg = load_config(args.overrides, args.config_file)
    if args.print_config:
        print(OmegaConf.to_yaml(cfg), end="")
        return 0
    if args.command == "download":
        from reprocube.data.download import download_dataset

        download_dataset(cfg)
        return 0
    if args.command == "train":
        from reprocube.loop import train

        return train(cfg)
    return EXIT_CONFIG  # unreachable: argparse restricts the command


if __name__ == "__main__":
    sys.exit(main())
