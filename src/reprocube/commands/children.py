"""Child processes: every command that runs reprocube again (verify's runs, bench's measurements, the
study's runs and its Hydra launcher) builds, runs and reads them here, one way."""

from __future__ import annotations

import shlex
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

MAX_ERROR_LINE = 300


def child_args(overrides: list[str], config_files: list[str], place_keys: tuple[str, ...]) -> list[str]:
    """The user's config files (absolute: a child may run elsewhere, e.g. a SLURM job) and overrides for
    a child `reprocube` process, without the overrides the caller sets itself (those starting with
    place_keys)."""
    files = [arg for path in config_files for arg in ("--config-file", str(Path(path).resolve()))]
    return files + [o for o in overrides if not o.startswith(place_keys)]


def reprocube_command(*args: str) -> list[str]:
    """`python -m reprocube ARGS` with this interpreter (the venv or image the parent runs in)."""
    return python_module_command("reprocube", *args)


def python_module_command(module: str, *args: str) -> list[str]:
    return [sys.executable, "-m", module, *args]


def run_child(
    command: list[str],
    log: Path,
    cwd: str | Path | None = None,
    echo: Callable[[str], None] | None = None,
    env: dict[str, str] | None = None,
) -> int:
    """Run `command`, appending a `$ command` line and then its stdout and stderr to `log`; `echo`, if
    given, receives each output line as it comes; `env`, if given, is the child's whole environment.
    Returns the exit status."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "a") as out:
        out.write(f"$ {shlex.join(command)}\n")
        out.flush()
        if echo is None:
            return subprocess.run(command, stdout=out, stderr=subprocess.STDOUT, cwd=cwd, env=env).returncode
        with subprocess.Popen(
            command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=cwd, env=env
        ) as child:
            for line in child.stdout:
                out.write(line)
                out.flush()
                echo(line.rstrip("\n"))
        return child.returncode


def start_child(
    command: list[str], log: Path, cwd: str | Path | None = None, env: dict[str, str] | None = None
) -> subprocess.Popen:
    """Start `command` without waiting, its stdout and stderr appended to `log` after a `$ command` line
    (run_child's log format); `env`, if given, is its whole environment. The caller polls it."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "a") as out:  # the child keeps its own descriptor
        out.write(f"$ {shlex.join(command)}\n")
        out.flush()
        return subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, cwd=cwd, env=env)


def last_error_line(log: Path) -> str:
    """What the last child run into `log` said (a log may hold earlier attempts, each after its `$ command`
    line): its last `reprocube:` line (TensorFlow's C++ start-up lines come first), else the last line
    naming an error (a traceback's), else its last line."""
    try:
        text = log.read_text(errors="replace")
    except OSError:
        return f"no log at {log}"
    last_attempt = ("\n" + text).rsplit("\n$ ", 1)[-1].split("\n", 1)[-1] if "$ " in text else text
    lines = [line for line in last_attempt.splitlines() if line.strip()]
    own = [line for line in lines if line.startswith("reprocube:")]
    errors = [line for line in lines if "Error" in line]
    return (own or errors or lines or ["no output"])[-1][:MAX_ERROR_LINE]
