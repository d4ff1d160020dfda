"""`reprocube check`'s options, each defined once (OPTIONS: name, type, default, help), from which both the
command line (reprocube.commands.check) and DIR/check.yaml (--script-dir) are made; and CheckOptions, the
frozen whole that check() and its CheckSession are handed."""

from __future__ import annotations

from dataclasses import dataclass, fields
from pathlib import Path

from reprocube.check.runs import SIGNALS
from reprocube.orchestration.options import Option

LAUNCHERS = ("local", "slurm")


OPTIONS = (
    Option(
        "output",
        list,
        (),
        "a file or directory the command writes in its work directory (repeatable, required): what is compared",
        "PATH",
    ),
    Option("ignore", list, (), "outputs not compared (logs, timestamps)", "GLOB"),
    Option("repeat", int, 2, "uninterrupted runs (default 2): they must agree"),
    Option("stops", int, 2, "stops of the stopped run (default 2)"),
    Option("signal", str, "TERM", "the stopping signal (default TERM)", choices=tuple(sorted(SIGNALS))),
    Option("stop_seed", int, None, "the jitter of the default stops (replays a check's moments)"),
    Option("at", str, None, "stop each attempt this long after it started instead", "SECONDS,..."),
    Option("at_file", str, None, "stop when a new file matching GLOB appears in the work directory", "GLOB"),
    Option("at_line", str, None, "stop when a line of the command's output matches REGEX", "REGEX"),
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
    signal: str
    stop_seed: int | None
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
        return cls(**{k: tuple(v) if isinstance(v, list) else v for k, v in given.items()})

    @property
    def slurm(self) -> list[str] | None:
        """The sbatch options of every job under --launcher slurm; None: the runs go here."""
        return list(self.slurm_option) if self.launcher == "slurm" else None
