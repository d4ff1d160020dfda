"""Child processes: every command that runs reprocube again (verify's runs, bench's measurements, the
study's runs and its Hydra launcher) builds, runs and reads them here, one way."""

from __future__ import annotations

import ctypes
import os
import shlex
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

MAX_ERROR_LINE = 300

# Children die with their parent: without this a SIGTERM or SIGKILL to `reprocube reproduce` (verify, bench,
# study) left its `reprocube train` child running to the end under PID 1. The kernel sends the child
# PARENT_DEATH_SIGNAL when the *thread* that started it ends: every caller starts children from the main
# thread, which lives as long as the process. A SIGTERM to a parent keeps Python's default action (only the
# trainer's loop handles SIGTERM), so it ends the parent at once and so its children. SIGTERM, not SIGKILL:
# a trainer then writes its step checkpoint and exits within one step group (SLURM's cancel or preemption
# SIGTERMs the whole job, and the requeued job resumes from that checkpoint); any other child ends at once.
# Linux only (prctl); elsewhere children start as before and may outlive their parent.
PR_SET_PDEATHSIG = 1
PARENT_DEATH_SIGNAL = signal.SIGTERM


def _load_prctl():
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL(None).prctl  # loaded here: the forked child only calls it
    except (OSError, AttributeError):
        return None


_prctl = _load_prctl()


def _die_with_parent():
    """A preexec_fn (run in the child between fork and exec) that asks for PARENT_DEATH_SIGNAL when this
    process dies, and exits if it already died before the request was made; None where prctl is missing."""
    if _prctl is None:
        return None
    parent = os.getpid()

    def request() -> None:
        _prctl(PR_SET_PDEATHSIG, int(PARENT_DEATH_SIGNAL), 0, 0, 0)
        if os.getppid() != parent:  # the parent died between fork and prctl: nothing will signal us
            os._exit(1)

    return request


def child_args(overrides: list[str], config_files: list[str], set_here: tuple[str, ...]) -> list[str]:
    """The user's config files (absolute: a child may run elsewhere, e.g. a SLURM job) and overrides for
    a child `reprocube` process, without the overrides the caller sets itself (those starting with
    set_here)."""
    files = [arg for path in config_files for arg in ("--config-file", str(Path(path).resolve()))]
    return files + [o for o in overrides if not o.startswith(set_here)]


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
    Returns the exit status. The child dies with this process (_die_with_parent)."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "a") as out:
        out.write(f"$ {shlex.join(command)}\n")
        out.flush()
        if echo is None:
            return subprocess.run(
                command, stdout=out, stderr=subprocess.STDOUT, cwd=cwd, env=env, preexec_fn=_die_with_parent()
            ).returncode
        with subprocess.Popen(
            command,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            cwd=cwd,
            env=env,
            preexec_fn=_die_with_parent(),
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
    (run_child's log format); `env`, if given, is its whole environment. The caller polls it. The child
    dies with this process (_die_with_parent)."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "a") as out:  # the child keeps its own descriptor
        out.write(f"$ {shlex.join(command)}\n")
        out.flush()
        return subprocess.Popen(
            command, stdout=out, stderr=subprocess.STDOUT, cwd=cwd, env=env, preexec_fn=_die_with_parent()
        )


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
