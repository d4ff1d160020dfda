"""`reprocube check [options] -- CMD [ARG ...]`: a black-box test that any training command resumes bit for
bit from its own checkpoints. CMD runs in fresh, empty work directories under --out: to completion
`--repeat` times (if those differ, it is not deterministic and resume is never blamed), once with another
seed (the negative control: its outputs must differ, else the check is void), and once stopped `--stops`
times by a real signal and started again after each stop until it ends. The declared outputs of the
stopped run are then compared with the first uninterrupted run's: bytes, then tensors, keys or lines.
This module reads the options (the command line or DIR/check.yaml); the check itself is
reprocube.check.session."""

from __future__ import annotations

import argparse
from pathlib import Path

from reprocube.check.copy_inputs import check_copies
from reprocube.check.options import OPTIONS, YAML_TYPES, CheckOptions
from reprocube.check.session import check
from reprocube.errors import ConfigError
from reprocube.orchestration.options import add_options
from reprocube.results.check_result import VERDICTS
from reprocube.untrusted import MAX_YAML_BYTES, parse_yaml, read_bytes

HELP = "prove that any training command resumes bit-exactly from its own checkpoints: reprocube check -- CMD"


def add_arguments(parser) -> None:
    """The command line from check_options.OPTIONS, and the options of the command line only."""
    add = parser.add_argument
    add(
        "--script-dir",
        type=Path,
        metavar="DIR",
        help="everything in DIR is copied into each work directory and DIR/check.yaml gives the command and the "
        "options (the mlcube check task; then give no other option but --out)",
    )
    add_options(parser, OPTIONS)
    add("--copy", action="append", default=[], type=Path, metavar="PATH", help="copied into each work directory")
    add("--out", type=Path, help="where the work directories, logs and check.json go (default ./check-NAME)")
    add("command", nargs=argparse.REMAINDER, help="-- CMD [ARG ...]: the training command")


def run(args) -> int:
    values = {option.name: getattr(args, option.name) for option in OPTIONS}
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    values.update(command=command, copy=args.copy, out=args.out)
    if args.script_dir is not None:
        values.update(_options_from(args.script_dir, values, args.out))
    if not values["output"]:
        raise ConfigError("give at least one --output PATH: what the command writes that is compared")
    if values["slurm_option"] and values["launcher"] != "slurm":
        raise ConfigError("--slurm-option is for --launcher slurm")
    result = check(CheckOptions.of(**values))
    return VERDICTS[result["verdict"]]


def _options_from(directory: Path, given: dict, out: Path | None) -> dict:
    """The options from DIR/check.yaml (read strictly: a mapping of YAML_TYPES' keys), and DIR's entries as
    --copy. Options on the command line as well are refused: one place says what was checked."""
    if not directory.is_dir() or directory.is_symlink():
        raise ConfigError(f"--script-dir {directory}: not a directory")
    defaults = {option.name: [] if option.kind is list else option.default for option in OPTIONS}
    on_line = [k for k, default in {**defaults, "command": [], "copy": []}.items() if given[k] != default]
    if on_line:
        raise ConfigError(
            f"--script-dir {directory}: give --{on_line[0].replace('_', '-')} in check.yaml, not on the command line"
        )
    path = directory / "check.yaml"
    options = parse_yaml(read_bytes(path, MAX_YAML_BYTES, ConfigError), str(path), ConfigError)
    if not isinstance(options, dict):
        raise ConfigError(f"{path}: must be a mapping of options (command, output, ...)")
    choices = {option.name: option.choices for option in OPTIONS if option.choices}
    values = {}
    for key, value in options.items():
        kind = YAML_TYPES.get(key) if isinstance(key, str) else None
        if kind is None:
            raise ConfigError(f"{path}: {str(key)[:40]!r} is not an option of check ({', '.join(YAML_TYPES)})")
        if kind is list and not (isinstance(value, list) and all(isinstance(v, str) for v in value)):
            raise ConfigError(f"{path}: {key} must be a list of strings")
        if kind is float and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)
        if kind is str and isinstance(value, int | float) and not isinstance(value, bool) and key == "at":
            value = str(value)
        typed = isinstance(value, bool) if kind is bool else isinstance(value, kind) and not isinstance(value, bool)
        if kind is not list and not typed:
            kinds = {int: "an integer", bool: "true or false"}
            raise ConfigError(f"{path}: {key} must be {kinds.get(kind, 'a ' + kind.__name__)}")
        if key in choices and value not in choices[key]:
            raise ConfigError(f"{path}: {key} must be one of {', '.join(choices[key])}")
        values[key] = value
    if not values.get("command"):
        raise ConfigError(f"{path}: command is missing (e.g. command: [python, train.py])")
    # Copied into evidence that travels: nothing from outside DIR (no link, no special file), walked
    # without recursion and bounded as --copy is.
    values["copy"] = sorted(p for p in directory.iterdir() if p.name != "check.yaml")
    check_copies(values["copy"], out, "--script-dir")
    return values
