"""Child processes: every command that runs reprocube again (verify's runs, bench's measurements, the
study's runs and its Hydra launcher) builds, runs and reads them here, one way."""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from reprocube.errors import TrainingError
from reprocube.files import entry_size
from reprocube.runtime.procfs import load_prctl
from reprocube.training.metrics import last_logged_step

MAX_ERROR_LINE = 300
PROGRESS_EVERY_S = 30.0  # a line while a child runs: never more than this long without a word


def print_now(line: str) -> None:
    print(line, flush=True)  # progress must reach a batch job's log as it happens


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


_prctl = load_prctl()  # loaded here: the forked child only calls it


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
    """`python -P -m MODULE ARGS`: -P, or `-m` would put the current directory first on sys.path, and a
    reprocube.py (or reprocube/) in the directory a user runs from, a published run's for example, would be
    imported in reprocube's place."""
    return [sys.executable, "-P", "-m", module, *args]


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


class StalledChild(TrainingError):
    """A watched child made no progress for its stop time and was ended (exit 5)."""


@dataclass(frozen=True)
class Watchdog:
    """How long a child may make no progress: reported after warn_after_s (and each time as long again),
    ended after stop_after_s (None: never). `setting` names what the user set, for the line that ends it."""

    warn_after_s: float = 120.0
    stop_after_s: float | None = None
    setting: str = "a stop time"  # the user's words for stop_after_s: `--stall-timeout 6`

    @classmethod
    def of_config(cls, cfg) -> Watchdog:
        """verify's and the study's: the config's watchdog.warn_minutes and watchdog.stop_minutes."""
        stop = cfg.watchdog.stop_minutes
        return cls(
            warn_after_s=60.0 * cfg.watchdog.warn_minutes,
            stop_after_s=None if stop is None else 60.0 * stop,
            setting=f"watchdog.stop_minutes={stop:g}" if stop is not None else "watchdog.stop_minutes",
        )


DEFAULT_WATCHDOG = Watchdog()  # reported after 2 minutes without progress, never ended


class ProgressWatch:
    """One child's progress: any growth of its log or of a `progress` file (a run's metrics.jsonl gains a
    line every log.every_steps). poll() reports a stall through on_stall(seconds) and, past the stop time,
    ends the child and raises StalledChild naming the last global step the child logged."""

    def __init__(
        self, command: list[str], log: Path, progress: list[Path], watchdog: Watchdog, on_stall: Callable[[float], None]
    ) -> None:
        self.command, self.log, self.progress, self.on_stall = command, log, progress, on_stall
        self.warn_after_s = watchdog.warn_after_s
        if watchdog.stop_after_s is not None:  # a stall is reported before it is ended
            self.warn_after_s = min(self.warn_after_s, watchdog.stop_after_s / 2)
        self.watchdog = watchdog
        self.last_sizes, self.last_change, self.warned_at = None, time.monotonic(), 0.0

    def poll(self, child: subprocess.Popen) -> None:
        sizes = [entry_size(path, missing=-1) for path in (self.log, *self.progress)]
        now = time.monotonic()
        if sizes != self.last_sizes:
            self.last_sizes, self.last_change, self.warned_at = sizes, now, 0.0
        quiet = now - self.last_change
        stop = self.watchdog.stop_after_s
        if stop is not None and quiet >= stop:
            _end(child)
            steps = [s for s in (last_logged_step(p) for p in self.progress if p.name == "metrics.jsonl") if s]
            where = f"after global step {max(steps)} (the last it logged)" if steps else "before logging any step"
            raise StalledChild(
                f"{shlex.join(self.command[2:])[:80]} made no progress for {quiet:.0f} s, stuck {where}, and was "
                f"ended ({self.watchdog.setting}); log: {self.log}"
            )
        if quiet >= self.warn_after_s and quiet - self.warned_at >= self.warn_after_s:
            self.warned_at = quiet
            self.on_stall(quiet)


def environment_with(settings: dict[str, str | None]) -> dict[str, str]:
    """This process's environment with `settings` applied: a value set, None unset (an intervention's
    variables, as --match sets them for a child)."""
    env = {k: v for k, v in os.environ.items() if k not in settings or settings[k] is not None}
    env.update({k: v for k, v in settings.items() if v is not None})
    return env


class ProgressReport:
    """on_progress(seconds), if given, at most once every every_s seconds of `clock`, counted from `since`:
    a line for output that is not a terminal, where nothing redraws. One report may span several loops
    (a SLURM job's wait in the queue and its run)."""

    def __init__(
        self,
        on_progress: Callable[[float], None] | None,
        every_s: float = PROGRESS_EVERY_S,
        clock: Callable[[], float] = time.monotonic,
        since: float | None = None,
    ) -> None:
        self.on_progress, self.every_s, self.clock = on_progress, every_s, clock
        self.reported = clock() if since is None else since

    def tick(self, seconds: float) -> None:
        """Report `seconds` if every_s passed since the last report."""
        if self.on_progress is None:
            return
        now = self.clock()
        if now - self.reported >= self.every_s:
            self.reported = now
            self.on_progress(seconds)


ENDED, STOPPED, TIMED_OUT = "ended", "stopped", "timed out"  # how watch_child returned


@dataclass(frozen=True)
class Watched:
    outcome: str  # ENDED: running() said no; STOPPED: stop_now said signal now; TIMED_OUT: timeout_s passed
    seconds: float  # since `started`, at the last tick (0.0: none)


def watch_child(
    running: Callable[[], bool],
    poll_s: float,
    started: float,
    clock: Callable[[], float] = time.monotonic,
    progress: ProgressReport | None = None,
    stop_now: Callable[[float], bool] | None = None,
    timeout_s: float | None = None,
    on_tick: Callable[[], None] | None = None,
) -> Watched:
    """The one loop that watches a child (run_watched's, check's attempts, a SLURM job's). While running()
    says it runs, each tick, in this order: on_tick() (a watchdog: it may end the child and raise), the
    progress report of the seconds since `started` (by `clock`), stop_now(seconds) (a stop trigger: True
    says signal now, and the loop returns STOPPED), the time limit (seconds >= timeout_s: TIMED_OUT), then
    a sleep of poll_s. Ending the child is the caller's: each ends its own kind (a process, a guarded
    group, a SLURM job)."""
    seconds = 0.0
    while running():
        if on_tick is not None:
            on_tick()
        seconds = clock() - started
        if progress is not None:
            progress.tick(seconds)
        if stop_now is not None and stop_now(seconds):
            return Watched(STOPPED, seconds)
        if timeout_s is not None and seconds >= timeout_s:
            return Watched(TIMED_OUT, seconds)
        time.sleep(poll_s)
    return Watched(ENDED, seconds)


def run_watched(
    command: list[str],
    log: Path,
    progress: list[Path],
    on_stall: Callable[[float], None],
    env: dict[str, str] | None = None,
    watchdog: Watchdog = DEFAULT_WATCHDOG,
    cwd: str | Path | None = None,
    poll_s: float = 1.0,
    on_progress: Callable[[float], None] | None = None,
    progress_every_s: float = 30.0,
) -> int:
    """run_child's contract, with a watchdog (ProgressWatch): a hang is never silent, and is ended after
    the watchdog's stop time (StalledChild). on_progress(seconds running), if given, every
    progress_every_s: a line for output that is not a terminal, where nothing redraws."""
    child = start_child(command, log, cwd=cwd, env=env)
    watch = ProgressWatch(command, log, progress, watchdog, on_stall)
    started = time.monotonic()
    try:
        watch_child(
            lambda: child.poll() is None,
            poll_s,
            started,
            progress=ProgressReport(on_progress, progress_every_s, since=started),
            on_tick=lambda: watch.poll(child),
        )
    finally:
        if child.poll() is None:  # an exception here (Ctrl-C): the child does not outlive the wait
            _end(child)
    return child.returncode


def _end(child: subprocess.Popen, grace_s: float = 10.0) -> None:
    child.terminate()
    try:
        child.wait(grace_s)
    except subprocess.TimeoutExpired:
        child.kill()
        child.wait()


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
