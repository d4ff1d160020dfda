"""Command line: `reprocube COMMAND ...`. The commands and their one-line summaries are listed in
reprocube.commands; only the chosen command's module is imported, and it adds its own options. train,
download, verify, bench and study take Hydra overrides (KEY=VALUE, reprocube.orchestration.invocation);
compare, report, reproduce and sign take paths."""

from __future__ import annotations

import argparse
import importlib
import sys
from pathlib import Path
from typing import NoReturn

from reprocube.commands import COMMANDS
from reprocube.errors import EXIT_CONFIG, EXIT_OK, EXIT_OUTPUT_LOST, EXIT_UNEXPECTED, ConfigError, exit_status_of
from reprocube.runtime.process_exit import exit_process
from reprocube.terminal import escaped_output, standard_streams_opened


class _OneLineErrorParser(argparse.ArgumentParser):
    def error(self, message: str):
        self.exit(EXIT_CONFIG, f"reprocube: error: {message} (see reprocube --help)\n")


def _parser(chosen: str | None) -> argparse.ArgumentParser:
    """The parser, with the options of the command `chosen` (its module's add_arguments)."""
    parser = _OneLineErrorParser(
        prog="reprocube",
        description="Bit-exact restart and resume of deep-learning training.",
        epilog="Overrides use Hydra's grammar (key=value, nested.key=value); see docs/configuration.md for every key.",
    )
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, info in COMMANDS.items():
        sub = subparsers.add_parser(name, help=info.summary, description=info.summary)
        if name == chosen:
            module = importlib.import_module(info.module)
            sub.description = module.HELP
            module.add_arguments(sub)
            sub.set_defaults(handler=module.run)
    return parser


def _chosen_command(argv: list[str]) -> str | None:
    first = next((arg for arg in argv if not arg.startswith("-")), None)
    return first if first in COMMANDS else None


def parser_for(argv: list[str]) -> argparse.ArgumentParser:
    """The parser for this command line: every command's name, the chosen command's options."""
    return _parser(_chosen_command(argv))


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    # Everything printed, argparse's help and errors too, is escaped (values from files: never terminal
    # control, reprocube.terminal), and a stream that cannot be written never ends the command.
    with escaped_output() as (stdout, _):
        try:
            status = _parsed_and_run(argv)
        except SystemExit as done:  # argparse: --help, a bad command line
            if stdout.lost and not done.code:
                raise SystemExit(EXIT_OUTPUT_LOST) from None
            raise
    # The work is done whatever became of the output; a stdout lost on the way (its reader went away) is
    # said by the status where nothing else is (README.md's exit statuses). A lost stderr changes nothing.
    return EXIT_OUTPUT_LOST if status == EXIT_OK and stdout.lost else status


def _parsed_and_run(argv: list[str]) -> int:
    parser = parser_for(argv)
    # Overrides may follow options (`reproduce RUN --out DIR data_dir=...`), which argparse's positional
    # matching alone refuses.
    args, extra = parser.parse_known_args(argv)
    if "--" in extra and hasattr(args, "script_command"):  # reproduce SCRIPT_RECEIPT ... -- CMD [ARG ...]
        at = extra.index("--")
        args.script_command, extra = extra[at + 1 :], extra[:at]
    if extra:
        if not hasattr(args, "overrides") or any(e.startswith("-") for e in extra):
            parser.error(f"unrecognized arguments: {' '.join(extra)}")
        args.overrides += extra
    return exit_status_of(lambda: _dispatch(_unicode_arguments(args)))


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


def _dispatch(args: argparse.Namespace) -> int:
    """A config command gets its resolved config as args.invocation (or, with --print-config, it is shown
    and the command does not run); then every command's handler is called the same way."""
    if getattr(args, "config_options", None) is not None:
        from reprocube.orchestration.invocation import invocation_of

        args.invocation = invocation_of(args)
        if args.print_config:
            from omegaconf import OmegaConf

            print(OmegaConf.to_yaml(args.invocation.cfg, resolve=True), end="")
            return EXIT_OK
    return args.handler(args)


def run() -> NoReturn:
    """The program (`python -m reprocube`, the `reprocube` script: reprocube.__main__.run, which arms the
    end first): main, then the process ends through Python's exit but without its teardown of the modules
    it imported (reprocube.runtime.process_exit), argparse's exits (--help, a bad command line) too, so that a
    stdout that cannot be written gives the same status everywhere."""
    standard_streams_opened()  # started with stdout or stderr closed: /dev/null, not the next file opened
    try:
        status = main()
    except SystemExit as done:  # argparse's --help and usage errors, their lines printed (never a text)
        status = done.code if isinstance(done.code, int) else EXIT_OK if done.code is None else EXIT_UNEXPECTED
    exit_process(status)


if __name__ == "__main__":
    run()
