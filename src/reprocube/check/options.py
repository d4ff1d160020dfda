"""`reprocube check`'s options, each defined once (OPTIONS: name, type, default, help), from which both the
command line (reprocube.commands.check) and DIR/check.yaml (--script-dir) are made; and CheckOptions, the
frozen whole that check() and its CheckSession are handed; `validate`, every refusal of them."""

from __future__ import annotations

import fnmatch
import re
from dataclasses import dataclass, fields
from pathlib import Path

from reprocube.analysis.outputs import parse_ignore
from reprocube.check.copy_inputs import check_copies
from reprocube.check.runs import SIGNALS
from reprocube.check.stops import seconds_of
from reprocube.errors import ConfigError
from reprocube.files import safe_name
from reprocube.formats.script_receipt import refused_seed_variable
from reprocube.orchestration.options import Option
from reprocube.terminal import one_line

LAUNCHERS = ("local", "slurm")
MAX_SWEEP = 20  # saves a sweep stops after, one run each


OPTIONS = (
    Option(
        "output",
        list,
        (),
        "a file or directory the command writes in its work directory (repeatable, required): what is compared",
        "PATH",
    ),
    Option("ignore", list, (), "outputs not compared (logs, timestamps)", "GLOB"),
    Option("repeat", int, None, "uninterrupted runs (default 2): they must agree"),
    Option("stops", int, None, "stops of the stopped run (default 2; 1 with --quick or --during-save)"),
    Option(
        "quick",
        bool,
        False,
        "the edit-and-check loop: one uninterrupted run and the stopped run only (no second uninterrupted run, "
        "no negative control, no restart given other state); the verdict names what it left out",
    ),
    Option("signal", str, "TERM", "the stopping signal (default TERM)", choices=tuple(sorted(SIGNALS))),
    Option("stop_seed", int, None, "the jitter of the default stops (replays a check's moments)"),
    Option("at", str, None, "stop each attempt this long after it started instead", "SECONDS,..."),
    Option("at_file", str, None, "stop when a new file matching GLOB appears in the work directory", "GLOB"),
    Option("at_line", str, None, "stop when a line of the command's output matches REGEX", "REGEX"),
    Option(
        "during_save",
        bool,
        False,
        "stop each attempt while a save is being written after a whole one (a file of it seen, not yet all): "
        "what a preemption during a checkpoint does to the restart",
    ),
    Option(
        "sweep",
        int,
        None,
        "one stopped run per save of the uninterrupted run, each stopped once after that save (its first N "
        "saves, the last one left out): a verdict per save, so 'exact after an epoch's end, differs mid-epoch' "
        "is one command's answer (no negative control, no restart given other state)",
        "N",
    ),
    Option("seed_env", str, None, "the variable the command reads its seed from (control: another seed)", "VAR"),
    Option("seed_arg", str, None, "an argument giving the seed, {seed} replaced (e.g. --seed={seed})", "TEMPLATE"),
    Option("timeout", float, None, "the watchdog of each attempt (default 5x a clean run)", "SECONDS"),
    Option("jobs", int, None, "runs at once (default: the cores, at most 2; 1 under SLURM)", "N"),
    Option(
        "launcher",
        str,
        "local",
        "local: child processes here | slurm: each run a SLURM job, each stop a real preemption (scontrol requeue)",
        choices=LAUNCHERS,
    ),
    Option(
        "slurm_option",
        list,
        (),
        "an sbatch option for every job (repeatable; --launcher slurm), e.g. --slurm-option=--partition=gpu",
        "--NAME=VALUE",
    ),
)
# check.yaml's keys: every option, and the command (on the command line: -- CMD [ARG ...]).
YAML_TYPES = {"command": list, **{option.name: option.kind for option in OPTIONS}}


@dataclass(frozen=True)
class CheckOptions:
    """One check's options, whole: OPTIONS' values, the command, the inputs copied into each work
    directory and where the evidence goes (None: ./check-NAME). Made by `of`, which gives each option
    left out its default from OPTIONS."""

    command: tuple[str, ...]
    output: tuple[str, ...]
    ignore: tuple[str, ...]
    copy: tuple[Path, ...]
    repeat: int
    stops: int
    quick: bool
    signal: str
    stop_seed: int | None
    during_save: bool
    sweep: int | None
    at: str | None
    at_file: str | None
    at_line: str | None
    seed_env: str | None
    seed_arg: str | None
    timeout: float | None
    jobs: int | None
    launcher: str
    slurm_option: tuple[str, ...]
    out: Path | None

    @classmethod
    def of(cls, **values) -> CheckOptions:
        """From plain values (lists become tuples), OPTIONS' defaults for those left out; a name that is not
        an option is reprocube's own bug."""
        known = {f.name for f in fields(cls)}
        unknown = set(values) - known
        if unknown:
            raise TypeError(f"not check options: {sorted(unknown)}")
        given = {"copy": (), "out": None, **{o.name: o.default for o in OPTIONS}, **values}
        given["quick"], given["during_save"] = bool(given["quick"]), bool(given["during_save"])
        # one stop by default where a second adds little: --quick; --during-save (a second stop during a save
        # finds the same whole checkpoint to fall back to)
        one = given["quick"] or given["during_save"] or given["sweep"] is not None
        given["stops"] = given["stops"] if given["stops"] is not None else (1 if one else 2)
        # --quick with --repeat is refused (validate), never silently overridden
        given["repeat"] = given["repeat"] if given["repeat"] is not None else (1 if given["quick"] else 2)
        return cls(**{k: tuple(v) if isinstance(v, list) else v for k, v in given.items()})

    @property
    def slurm(self) -> list[str] | None:
        """The sbatch options of every job under --launcher slurm; None: the runs go here."""
        return list(self.slurm_option) if self.launcher == "slurm" else None


def validate(options: CheckOptions) -> None:
    """Every refusal of check's options, before anything runs: one line naming the option (ConfigError)."""
    command, outputs, copies, out = list(options.command), list(options.output), list(options.copy), options.out
    repeat, stops, timeout, stop_seed = options.repeat, options.stops, options.timeout, options.stop_seed
    at_line, seed_env, seed_arg = options.at_line, options.seed_env, options.seed_arg
    if not command:
        raise ConfigError("no command to check: reprocube check [options] -- CMD [ARG ...]")
    if options.quick and repeat != 1:
        raise ConfigError(f"--quick runs one uninterrupted run: leave out --repeat ({repeat}), or --quick")
    if not options.quick and (repeat < 2 or repeat > 10):
        raise ConfigError(f"--repeat must be from 2 to 10 (two uninterrupted runs tell determinism), got {repeat}")
    if stops < 1 or stops > 20:
        raise ConfigError(f"--stops must be from 1 to 20, got {stops}")
    _validate_placement(options)
    if seed_env and seed_arg:
        raise ConfigError("give one of --seed-env and --seed-arg")
    if seed_arg is not None and "{seed}" not in seed_arg:
        raise ConfigError(f"--seed-arg {seed_arg!r} holds no {{seed}}")
    if timeout is not None and not 0 < timeout < float("inf"):
        raise ConfigError(f"--timeout must be a number of seconds > 0, got {timeout}")
    for output in outputs:
        if Path(output).is_absolute() or ".." in Path(output).parts or not output.strip():
            raise ConfigError(f"--output {output!r}: a path inside the work directory (relative, without ..)")
    if any("\0" in text for text in [*command, *outputs, seed_env or "", seed_arg or "", at_line or ""]):
        raise ConfigError("a NUL character in the command, an --output, the seed option or --at-line")
    # Before anything runs: a link, a tree too deep, one holding --out (the default one too).
    default = Path(f"check-{safe_name(Path(command[-1]).stem or 'command')}")  # as _workspace names it
    check_copies(copies, out if out is not None else default)
    refused = refused_seed_variable(seed_env) if seed_env is not None else None
    if refused:
        raise ConfigError(f"--seed-env {one_line(seed_env)[:64]!r} {refused}")
    if stop_seed is not None and not 0 <= stop_seed < 2**63:
        raise ConfigError(f"--stop-seed must be from 0 to 2**63-1, got {str(stop_seed)[:30]}")
    if options.slurm is not None and options.signal != "TERM":
        raise ConfigError(
            "--launcher slurm stops a run as SLURM preempts it (SIGTERM, then SIGKILL after KillWait): --signal "
            "cannot be chosen"
        )
    globs, _ = parse_ignore(list(options.ignore))  # a malformed FILE:KEY is refused here, before any run
    if outputs and all(any(fnmatch.fnmatch(o, g) for g in globs) for o in outputs):
        raise ConfigError("--ignore matches every --output: nothing would be compared")
    if options.jobs is not None and not 1 <= options.jobs <= 16:
        raise ConfigError(f"--jobs must be from 1 to 16, got {options.jobs}")


def _validate_placement(options: CheckOptions) -> None:
    """At most one way to place the stops, and the one given usable here."""
    at, at_file, at_line, sweep = options.at, options.at_file, options.at_line, options.sweep
    if sum(x is not None for x in (at, at_file, at_line, sweep)) + options.during_save > 1:
        raise ConfigError("give at most one of --at, --at-file, --at-line, --during-save and --sweep")
    if sweep is not None:
        _validate_sweep(options)
    if at is not None:
        seconds_of(at)
    if at_line is not None:
        try:
            re.compile(at_line)
        except re.error as exc:
            raise ConfigError(f"--at-line {at_line[:40]!r} is not a regular expression ({exc})") from None
    if options.slurm is not None and options.during_save:
        raise ConfigError(
            "--during-save places stops from the files a run writes, which a SLURM job's are not watched for"
        )


def _validate_sweep(options: CheckOptions) -> None:
    """--sweep N: each run one stop after its save (never more), and not what it leaves out already."""
    if not 1 <= options.sweep <= MAX_SWEEP:
        raise ConfigError(f"--sweep must be from 1 to {MAX_SWEEP} saves, got {str(options.sweep)[:30]}")
    if options.stops != 1:
        raise ConfigError(f"--sweep stops each of its runs once, after its save: leave out --stops ({options.stops})")
    if options.quick:
        raise ConfigError("--sweep runs no control and no restart given other state already: leave out --quick")
    if options.slurm is not None:
        raise ConfigError(
            "--sweep places its stops from the files a run writes, which a SLURM job's are not watched for"
        )
