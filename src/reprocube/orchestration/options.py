"""A command's option, defined once (name, type, default, help): the command line is made from it
(add_options), and a frozen options object that the conductor is handed whole (check_options,
reproduce_options)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Option:
    """`kind`: int, float, str, bool (a flag: store_true), a Path, or list (a list of strings, repeatable)."""

    name: str  # the attribute, and check.yaml's key; the flag is --NAME with - for _
    kind: Any
    default: Any
    help: str
    metavar: str | None = None
    choices: tuple[str, ...] | None = None

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")


def add_options(parser, options: tuple[Option, ...]) -> None:
    """Each option on an argparse parser, as its Option says."""
    for option in options:
        if option.kind is bool:
            parser.add_argument(option.flag, action="store_true", help=option.help)
        elif option.kind is list:
            parser.add_argument(option.flag, action="append", default=[], metavar=option.metavar, help=option.help)
        else:
            parser.add_argument(
                option.flag,
                type=option.kind,
                default=option.default,
                choices=option.choices,
                metavar=option.metavar,
                help=option.help,
            )
