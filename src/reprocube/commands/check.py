"""`reprocube check [options] -- CMD [ARG ...]`: a black-box test that any training command resumes bit for
bit from its own checkpoints. CMD runs in fresh, empty work directories under --out: to completion
`--repeat` times (if those differ, it is not deterministic and resume is never blamed), once with another
seed (the negative control: its outputs must differ, else the check is void), and once stopped `--stops`
times by a real signal and started again after each stop until it ends. The declared outputs of the
stopped run are then compared with the first uninterrupted run's: bytes, then tensors, keys or lines.
This module reads the options (the command line or DIR/check.yaml); the check itself is
reprocube.orchestration.check_session."""

from __future__ import annotations

import argparse
from pathlib import Path

from reprocube.errors import ConfigError
from reprocube.orchestration.check_runs import SIGNALS
from reprocube.orchestration.check_session import check
from reprocube.orchestration.copy_inputs import check_copies
from reprocube.results.check_result import VERDICTS
from reprocube.untrusted import MAX_YAML_BYTES, parse_yaml, read_bytes

LAUNCHERS = ("local", "slurm")
HELP = "prove that any training command resumes bit-exactly from its own checkpoints: reprocube check -- CMD"


def add_arguments(parser) -> None:
    add = parser.add_argument
    add(
        "--script-dir",
        type=Path,
        metavar="DIR",
        help="everything in DIR is copied into each work directory and DIR/check.yaml gives the command and the "
        "options (the mlcube check task; then give no other option but --out)",
    )
    add(
        "--output",
        action="append",
        default=[],
        metavar="PATH",
        help="a file or directory the command writes in its work directory (repeatable, required): what is compared",
    )
    add("--ignore", action="append", default=[], metavar="GLOB", help="outputs not compared (logs, timestamps)")
    add("--copy", action="append", default=[], type=Path, metavar="PATH", help="copied into each work directory")
    add("--repeat", type=int, default=2, help="uninterrupted runs (default 2): they must agree")
    add("--stops", type=int, default=2, help="stops of the stopped run (default 2)")
    add("--signal", choices=sorted(SIGNALS), default="TERM", help="the stopping signal (default TERM)")
    add("--stop-seed", type=int, help="the jitter of the default stops (replays a check's moments)")
    add("--at", metavar="SECONDS,...", help="stop each attempt this long after it started instead")
    add("--at-file", metavar="GLOB", help="stop when a new file matching GLOB appears in the work directory")
    add("--at-line", metavar="REGEX", help="stop when a line of the command's output matches REGEX")
    add("--seed-env", metavar="VAR", help="the variable the command reads its seed from (control: another seed)")
    add("--seed-arg", metavar="TEMPLATE", help="an argument giving the seed, {seed} replaced (e.g. --seed={seed})")
    add("--timeout", type=float, metavar="SECONDS", help="the watchdog of each attempt (default 5x a clean run)")
    add("--jobs", type=int, metavar="N", help="runs at once (default: the cores, at most 2; 1 under SLURM)")
    add(
        "--launcher",
        choices=LAUNCHERS,
        default="local",
        help=(
            "local: child processes here | slurm: each run a SLURM job, each stop a real preemption (scontrol requeue)"
        ),
    )
    add(
        "--slurm-option",
        action="append",
        default=[],
        metavar="--NAME=VALUE",
        help="an sbatch option for every job (repeatable; --launcher slurm), e.g. --slurm-option=--partition=gpu",
    )
    add("--out", type=Path, help="where the work directories, logs and check.json go (default ./check-NAME)")
    add("command", nargs=argparse.REMAINDER, help="-- CMD [ARG ...]: the training command")


# check.yaml (--script-dir): the options' names as on the command line, with _ for -, and their types.
OPTION_TYPES = {
    "command": list,
    "output": list,
    "ignore": list,
    "repeat": int,
    "stops": int,
    "signal": str,
    "stop_seed": int,
    "at": str,
    "at_file": str,
    "at_line": str,
    "seed_env": str,
    "seed_arg": str,
    "timeout": float,
    "jobs": int,
    "launcher": str,
    "slurm_option": list,
}
DEFAULTS = {
    "output": [],
    "ignore": [],
    "copy": [],
    "repeat": 2,
    "stops": 2,
    "signal": "TERM",
    "command": [],
    "launcher": "local",
    "slurm_option": [],
}


def run(args) -> int:
    if args.script_dir is not None:
        _options_from(args)
    if not args.output:
        raise ConfigError("give at least one --output PATH: what the command writes that is compared")
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if args.slurm_option and args.launcher != "slurm":
        raise ConfigError("--slurm-option is for --launcher slurm")
    result = check(
        command,
        args.output,
        args.ignore,
        args.copy,
        args.repeat,
        args.stops,
        args.signal,
        args.stop_seed,
        args.at,
        args.at_file,
        args.at_line,
        args.seed_env,
        args.seed_arg,
        args.timeout,
        args.out,
        slurm=args.slurm_option if args.launcher == "slurm" else None,
        jobs=args.jobs,
    )
    return VERDICTS[result["verdict"]]


def _options_from(args) -> None:
    """args from DIR/check.yaml (read strictly: a mapping of OPTION_TYPES' keys), and DIR's entries as
    --copy. Options on the command line as well are refused: one place says what was checked."""
    directory = args.script_dir
    if not directory.is_dir() or directory.is_symlink():
        raise ConfigError(f"--script-dir {directory}: not a directory")
    given = [k for k, default in DEFAULTS.items() if getattr(args, k) not in (default, None)]
    given += [k for k in OPTION_TYPES if k not in DEFAULTS and getattr(args, k) is not None]
    if given:
        raise ConfigError(
            f"--script-dir {directory}: give --{given[0].replace('_', '-')} in check.yaml, not on the command line"
        )
    path = directory / "check.yaml"
    options = parse_yaml(read_bytes(path, MAX_YAML_BYTES, ConfigError), str(path), ConfigError)
    if not isinstance(options, dict):
        raise ConfigError(f"{path}: must be a mapping of options (command, output, ...)")
    for key, value in options.items():
        kind = OPTION_TYPES.get(key) if isinstance(key, str) else None
        if kind is None:
            raise ConfigError(f"{path}: {str(key)[:40]!r} is not an option of check ({', '.join(OPTION_TYPES)})")
        if kind is list and not (isinstance(value, list) and all(isinstance(v, str) for v in value)):
            raise ConfigError(f"{path}: {key} must be a list of strings")
        if kind is float and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)
        if kind is str and isinstance(value, int | float) and not isinstance(value, bool) and key == "at":
            value = str(value)
        if kind is not list and not (isinstance(value, kind) and not isinstance(value, bool)):
            raise ConfigError(f"{path}: {key} must be {'an integer' if kind is int else 'a ' + kind.__name__}")
        if key == "signal" and value not in SIGNALS:
            raise ConfigError(f"{path}: signal must be one of {', '.join(sorted(SIGNALS))}")
        if key == "launcher" and value not in LAUNCHERS:
            raise ConfigError(f"{path}: launcher must be one of {', '.join(LAUNCHERS)}")
        setattr(args, key, value)
    if not args.command:
        raise ConfigError(f"{path}: command is missing (e.g. command: [python, train.py])")
    # Copied into evidence that travels: nothing from outside DIR (no link, no special file), walked
    # without recursion and bounded as --copy is.
    args.copy = sorted(p for p in directory.iterdir() if p.name != "check.yaml")
    check_copies(args.copy, args.out, "--script-dir")
