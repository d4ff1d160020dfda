"""The runs of `reprocube check`: someone else's training command, started in a fresh work directory of its
own, run to completion or stopped by a real signal at planned moments and started again, each attempt
timed and its output logged. The command runs in its own process group (a signal reaches the script and
its workers, as a scheduler's does), under a guard that is the subreaper of all it starts and ends them
all with the attempt or when check dies, however (reprocube.check.process_guard), and is bounded
by a watchdog."""

from __future__ import annotations

import errno
import fnmatch
import os
import re
import shlex
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from reprocube.check.evidence_dirs import DirectoryReplaced, EvidenceDirs
from reprocube.check.file_activity import FileActivity, state_key
from reprocube.check.guarded_command import GuardedCommand, start_guarded
from reprocube.files import walk_below
from reprocube.orchestration.children import (
    PROGRESS_EVERY_S,
    STOPPED,
    ProgressReport,
    last_error_line,
    watch_child,
)
from reprocube.probe import ENV as PROBE_ENV
from reprocube.runtime.procfs import proc_stat

SIGNALS = {"TERM": signal.SIGTERM, "INT": signal.SIGINT, "USR1": signal.SIGUSR1, "KILL": signal.SIGKILL}
POLL_S = 0.02  # how often a file trigger looks: a checkpoint written in well under a second is still caught
EXIT_WAIT_S = 60.0  # after a signal, how long the command may take to write its checkpoint and exit (at most
# what the attempt's watchdog leaves)


@dataclass(frozen=True)
class Stop:
    """When to signal an attempt: `seconds` after it started, when a file matching `file_glob` appears in
    the work directory (one no earlier attempt saw), when a line of its output matches `line`, or
    `after_save` seconds after the attempt's first whole save (of the files an uninterrupted run saved as it went:
    the default stops, placed from that run's saves so that each follows something the restart can read)."""

    seconds: float | None = None
    file_glob: str | None = None
    line: str | None = None
    after_save: float | None = None
    fraction: float | None = None  # a planned stop: its share of the uninterrupted run's time between saves
    during_save: bool = False  # --during-save: as soon as a save begun after a whole one is seen, not yet whole
    nth_save: int = 1  # `after_save` counts from the attempt's nth whole save (--sweep: one run per save)
    # check's own stops: when this says so (the moved-weights restart's: once it showed what it had to), and then
    # the run ends, restarted no more
    until: Callable[[], bool] | None = field(default=None, compare=False)
    ends_run: bool = False
    wait_s: float = 0.0  # how long after this stop its restart starts (state that expires with time shows)

    def describe(self) -> str:
        later = f", its restart {self.wait_s:g} s later" if self.wait_s else ""
        return self._moment() + later

    def _moment(self) -> str:
        if self.until is not None:
            return "once it had recorded what check needed of it (check's own stop)"
        if self.file_glob is not None:
            return f"when a new file matches {self.file_glob}"
        if self.line is not None:
            return f"at an output line matching {self.line}"
        if self.during_save:
            return "at a write of a save begun after a whole one, not yet whole (as check's file watcher saw it)"
        if self.after_save is not None:
            nth = "first" if self.nth_save == 1 else _ordinal(self.nth_save)
            return (
                f"{self.after_save:.2f} s after the attempt's {nth} whole save ({self.fraction:.3f} of the time "
                "between two saves of a clean run, from one's last file to the next one's first)"
            )
        return f"{self.seconds:.2f} s after the attempt started"

    def due(self, elapsed: float, run: Run, seen: set[str], attempt_start: float) -> bool:
        """Whether a time, file or save stop's moment came (a line stop is each launcher's: it reads the
        output)."""
        if self.until is not None:
            return self.until()
        if self.seconds is not None:
            return elapsed >= self.seconds
        if self.during_save:
            return False  # the file watcher's own thread gives it, at the write (_attempt)
        if self.after_save is not None:
            key = (attempt_start, self.nth_save)
            ended = run.whole_saves.get(key)
            if ended is None and run.activity is not None:  # looked for until found: then remembered
                ended = run.whole_saves[key] = whole_save_ended(run, attempt_start, self.nth_save)
            return ended is not None and time.perf_counter() >= ended + self.after_save
        return self.file_glob is not None and any(p not in seen for p in _matching(run.work, self.file_glob))


def _write_trigger(run: Run, attempt_start: float, matched: threading.Event, send: Callable[[], None]):
    """--during-save's trigger, called by the file watcher's thread after each write it records: `send` once,
    as soon as a save begun after a whole one is being written."""

    def at_write() -> None:
        if not matched.is_set() and _saving_after_a_whole_save(run, attempt_start):
            matched.set()
            send()

    return at_write


def _saving_after_a_whole_save(run: Run, attempt_start: float) -> bool:
    """Whether the run's last save began in this attempt and is being written (Save.is_partial), every file of a
    whole save having been written before it (in any attempt): a stop now leaves a partial checkpoint beside a
    whole one (what a restart may fall back to). Judged by the files written, not by earlier saves whole: a
    save written slowly is seen split while it runs (the probe's updates group it only once the run ended)."""
    saves = run.activity.saves(since=attempt_start, state=run.state)
    if not saves or not saves[-1].is_partial(run.save_keys, run.save_first_keys):
        return False
    written = {state_key(event.path) for event in run.activity.writes(run.began, saves[-1].start)}
    return run.save_keys <= written


def whole_save_ended(run: Run, attempt_start: float, nth: int = 1) -> float | None:
    """When the attempt's nth whole save ended (its last file written): whole, a save that holds every file
    of an uninterrupted run's save (run.save_keys); None until n have. A stop placed from a save's first
    file fell inside a checkpoint directory still being filled; one placed from a partial save (a status
    file a restart writes as it starts) came before the restart's first checkpoint."""
    saves = run.activity.saves(since=attempt_start, state=run.state)
    ends = [save.end for save in saves if save.is_whole(run.save_keys)]
    return ends[nth - 1] if len(ends) >= nth else None


def _ordinal(n: int) -> str:
    return f"{n}{'th' if 10 <= n % 100 <= 20 else {1: 'st', 2: 'nd', 3: 'rd'}.get(n % 10, 'th')}"


@dataclass
class Attempt:
    started_s: float  # since the run started
    seconds: float
    exit: int | None  # None: ended by the watchdog
    stop: str | None = None  # the stop it was given ("SIGTERM 1.20 s after ..."), None: it ran to its end
    stopped_early: bool = False  # it ended on its own before its stop came
    signal_s: float | None = None  # when the stop's signal was sent, since the attempt started
    # whether a process of the command's group caught that signal then (a handler that may save after it):
    # True where it could not be told (a note too many, never one too few)
    caught: bool = True

    def as_dict(self) -> dict:
        return {
            "started_s": round(self.started_s, 3),
            "seconds": round(self.seconds, 3),
            "exit": self.exit,
            "stop": self.stop,
            "stopped_early": self.stopped_early,
            "signal_s": None if self.signal_s is None else round(self.signal_s, 3),
        }


@dataclass
class Run:
    name: str
    work: Path
    log: Path
    env: dict[str, str]
    command: list[str]
    probe: Path  # where each attempt's probe trace goes (reprocube.probe), if the script calls it
    attempts: list[Attempt] = field(default_factory=list)
    # called with the seconds an attempt has run, every PROGRESS_EVERY_S: never a long silence, on any output
    on_progress: Callable[[float], None] | None = field(default=None, repr=False, compare=False)
    # what the command wrote and read in its directories (the work directory, HOME, TMPDIR), if watched
    activity: FileActivity | None = field(default=None, repr=False, compare=False)
    began: float = 0.0  # time.perf_counter() when its first attempt started: Attempt.started_s counts from it
    # the keys of the files an uninterrupted run saves as it goes (FileActivity.state_keys): its saves
    state: frozenset[str] = field(default_factory=frozenset, repr=False, compare=False)
    # how many times each uninterrupted run saved them (-1: not equally often); the stopped run's attempts
    # together save as often where each continued from the last one's save
    clean_saves: int = 0
    # the files one whole save of an uninterrupted run holds (file_activity.whole_save): a checkpoint folder's
    save_keys: frozenset[str] = field(default_factory=frozenset, repr=False, compare=False)
    # the files whole saves begin with (file_activity.first_keys): a save in progress begins with one of them
    save_first_keys: frozenset[str] = field(default_factory=frozenset, repr=False, compare=False)
    # (an attempt's start, n) -> when its nth save was whole (what a default stop waits on), once seen
    whole_saves: dict[tuple[float, int], float | None] = field(default_factory=dict, repr=False, compare=False)
    # check's directories under --out (verified before each attempt writes into them), if recorded
    dirs: EvidenceDirs | None = field(default=None, repr=False, compare=False)
    # clean-1's declared outputs' sha256 when the clean runs ended (what later runs are compared against)
    output_digests: dict[str, str | None] | None = field(default=None, repr=False, compare=False)

    def own_dirs(self) -> list[Path]:
        """The directories of check's that an attempt of this run writes into or runs in."""
        places = [Path(self.env[k]) for k in ("HOME", "TMPDIR") if k in self.env]
        return [self.log.parent, self.probe, self.work, *places]

    def probe_trace(self, attempt: int) -> Path:
        return self.probe / f"attempt-{attempt}.jsonl"

    @property
    def stops_landed(self) -> int:
        return sum(1 for a in self.attempts if a.stop and not a.stopped_early)

    @property
    def exit(self) -> int | None:
        return self.attempts[-1].exit if self.attempts else None

    def as_dict(self) -> dict:
        return {
            "name": self.name,
            "work": str(self.work),
            "log": str(self.log),
            "command": self.command,
            "probe": str(self.probe),
            "attempts": [a.as_dict() for a in self.attempts],
            "stops_landed": self.stops_landed,
        }


def outputs_written(run: Run, comparison: dict) -> list[dict]:
    """A comparison's entries for the declared outputs `run` wrote itself (its file activity) that were
    compared: an output placed in its directory and left alone shows nothing of what it did."""
    wrote = {event.path.partition("/")[2] for event in run.activity.writes()} if run.activity else set()
    return [
        f
        for f in comparison["files"]
        if f.get("compared", True) and not (f["detail"] or "").startswith("only in") and f["path"] in wrote
    ]


def failure_line(run: Run) -> str:
    """Why a run failed, in one line: its last attempt's exit status (or the watchdog), its time, what the
    command last said and where its log is."""
    if not run.attempts:  # its directories were not check's any more when it was to start
        return f"{run.name} never started (log: {run.log})"
    attempt = run.attempts[-1]
    status = "ended by the watchdog" if attempt.exit is None else f"exited {attempt.exit}"
    return f"{run.name} {status} after {attempt.seconds:.1f} s: {last_error_line(run.log)} (log: {run.log})"


def execute(
    run: Run, stops: list[Stop], signum: int, timeout_s: float, after_stop: Callable[[Run], None] | None = None
) -> Run:
    """Run the command in run.work; after each stop that lands, start it again, until an attempt ends on
    its own (exit status recorded) or ends by the watchdog. A stop whose attempt ends first is recorded as
    stopped_early and the run is over (nothing was interrupted). after_stop: called with the run after
    each stop that landed, its attempt's processes all gone, before the next attempt starts."""
    run.began = began = time.perf_counter()
    seen = entries_below(run.work)
    for stop in [*stops, None]:
        try:
            attempt = _attempt(run, stop, signum, timeout_s, seen, began)
        except DirectoryReplaced:  # recorded in run.dirs: the check's verdict names it; nothing more runs
            break
        run.attempts.append(attempt)
        seen |= entries_below(run.work)
        if stop is None or attempt.stopped_early or attempt.exit is None or stop.ends_run:
            break
        if after_stop is not None:
            after_stop(run)
        time.sleep(stop.wait_s)
    return run


def _open_log(path: Path, directory: int | None = None):
    """The run's log, appended to and never written through a link: the checked command can reach check's
    directory (a link it planted in place of a log is removed, never followed, and said in the new log).
    directory: a descriptor of the log's directory (EvidenceDirs.open_dir), which the name is opened in."""
    flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC
    name = path.name if directory is not None else path
    try:
        return os.fdopen(os.open(name, flags, 0o644, dir_fd=directory), "a")
    except OSError as exc:
        if exc.errno != errno.ELOOP:
            raise
    os.unlink(name, dir_fd=directory)  # the link itself, not what it names
    log = os.fdopen(os.open(name, flags | os.O_EXCL, 0o644, dir_fd=directory), "a")
    log.write(f"[reprocube check: {path.name} was a symbolic link (planted by the command?): removed, not followed]\n")
    return log


def _run_log(run: Run):
    """The run's log, opened to append, its directories checked to be check's own right before (another
    run's command, --jobs, may have replaced one meanwhile)."""
    if run.dirs is None:
        run.log.parent.mkdir(parents=True, exist_ok=True)
        run.probe.mkdir(parents=True, exist_ok=True)
        return _open_log(run.log)
    run.dirs.verify(*run.own_dirs())
    directory = run.dirs.open_dir(run.log.parent)
    try:
        return _open_log(run.log, directory)
    finally:
        os.close(directory)


def _attempt(run: Run, stop: Stop | None, signum: int, timeout_s: float, seen: set[str], began: float) -> Attempt:
    with _run_log(run) as log:
        log.write(f"$ {shlex.join(run.command)}\n")
        log.flush()
        env = {**run.env, PROBE_ENV: str(run.probe_trace(len(run.attempts) + 1).absolute())}  # it runs elsewhere
        start = time.perf_counter()
        try:
            child = start_guarded(run.command, run.work, env, log, stop.line if stop is not None else None)
        except OSError as exc:  # not found, not executable: the command failed, as a shell's 127 says
            log.write(f"error: could not start {run.command[0]!r}: {exc.strerror or exc}\n")
            return Attempt(start - began, 0.0, 127, None)
        matched, signalled, caught = threading.Event(), [], []  # signalled: when the stop's signal was sent
        pattern = re.compile(stop.line) if stop is not None and stop.line is not None else None

        def on_line() -> None:  # at once, from the reader: the script has gone no further than its next line
            if not matched.is_set():
                matched.set()
                caught.append(_group_catches(child.pid, signum))
                signalled.append(time.perf_counter())
                _signal_group(child, signum)

        def send_now() -> None:  # the signal first, the save going on meanwhile; /proc cannot tell after it
            signalled.append(time.perf_counter())
            _signal_group(child, signum)
            caught.append(True)  # a note too many, never one too few

        if stop is not None and stop.during_save and run.activity is not None:  # at the write, not at a poll
            run.activity.on_write = _write_trigger(run, start, matched, send_now)
        reader = threading.Thread(target=_copy_output, args=(child, log, pattern, on_line), daemon=True)
        reader.start()
        try:
            given = _wait_for_trigger(child, stop, run, seen, matched, start, timeout_s, run.on_progress)
            if given and not matched.is_set():
                caught.append(_group_catches(child.pid, signum))
                signalled.append(time.perf_counter())
                _signal_group(child, signum)
            given = given or matched.is_set()  # the reader's signal may have ended it before the loop looked
            left = max(0.0, timeout_s - (time.perf_counter() - start))  # the watchdog bounds the exit too
            status = _wait_exit(child, min(EXIT_WAIT_S, left) if given else left)
            waited = time.perf_counter() - start  # its end, or the watchdog's moment (then ended: GRACE_S more)
        finally:
            if run.activity is not None:
                run.activity.on_write = None
            _end_group(child)
            reader.join(5)
        seconds = time.perf_counter() - start
        note = f"{signal.Signals(signum).name} {stop.describe()}" if stop is not None else None
        signal_s = signalled[0] - start if given and signalled else None
        if note and given:
            sent = f"sent at {signal_s:.2f} s" if signal_s is not None else "sent"
            if status is not None:
                ended = f"the attempt ended at {seconds:.2f} s"
            else:
                by = "the watchdog" if left <= EXIT_WAIT_S else f"check ({EXIT_WAIT_S:.0f} s after the signal)"
                ended = f"the attempt ended at {waited:.2f} s (by {by}; its last process gone at {seconds:.2f} s)"
            log.write(f"[reprocube check: {note}, {sent}; {ended}]\n")
        attempt = Attempt(start - began, seconds, status, note, stop is not None and not given, signal_s)
        attempt.caught = caught[0] if caught else True
        return attempt


def _copy_output(child: GuardedCommand, log, pattern: re.Pattern | None, on_line) -> None:
    """The reader of an attempt: its guard copies the output into the log and matches the line stop's
    pattern (check never runs a pattern, nor holds a line: reprocube.check.process_guard);
    on_line is called at a matching line. Returns once all the output is in the log."""
    if pattern is not None:
        child.on_matched(on_line)
    child.finished()


def _group_catches(pid: int, signum: int) -> bool:
    """Whether a process of pid's process group catches signum now (/proc's SigCgt): one that does not
    dies of it at once, so nothing it writes comes after it. True where /proc cannot tell."""
    try:
        group = os.getpgid(pid)
        entries = [entry for entry in os.listdir("/proc") if entry.isdigit()]
    except OSError:
        return True
    bit = 1 << (signum - 1)
    for entry in entries:
        stat = proc_stat(entry)
        if stat is None or stat.group != group:
            continue  # gone meanwhile, or another group's
        try:
            with open(f"/proc/{entry}/status", "rb") as status_file:
                caught = next(line for line in status_file if line.startswith(b"SigCgt:"))
            if int(caught.split()[1], 16) & bit:
                return True
        except (OSError, ValueError, IndexError, StopIteration):
            continue  # gone meanwhile: it catches nothing now
    return False


def _signal_group(child: GuardedCommand, signum: int) -> None:
    child.send_signal(signum)  # to the command's process group, while it runs


def _wait_for_trigger(
    child,
    stop: Stop | None,
    run: Run,
    seen: set[str],
    matched: threading.Event,
    start: float,
    timeout_s: float,
    on_progress=None,
) -> bool:
    """True when the stop's moment came while the command ran; False when it ended first (or there is no
    stop: it runs to its end, bounded by the watchdog)."""

    def due(elapsed: float) -> bool:
        return stop.due(elapsed, run, seen, start) or ((stop.line is not None or stop.during_save) and matched.is_set())

    watched = watch_child(
        lambda: child.poll() is None,
        POLL_S,
        start,
        clock=time.perf_counter,
        progress=ProgressReport(on_progress, PROGRESS_EVERY_S, time.perf_counter, since=start),
        stop_now=due if stop is not None else None,
        timeout_s=timeout_s,
    )
    return watched.outcome == STOPPED


def _wait_exit(child: subprocess.Popen, seconds: float) -> int | None:
    try:
        return child.wait(seconds)
    except subprocess.TimeoutExpired:
        return None  # the watchdog: _end_group ends it


def _end_group(child: GuardedCommand) -> None:
    """Everything the command started ends with the attempt: its process group and any daemon it made
    (the guard is their subreaper), SIGTERM then SIGKILL."""
    child.end()


def entries_below(work: Path) -> set[str]:
    """Every entry below work by relative name (`dir/file`; files.walk_below: any depth, links not followed,
    an unreadable directory or one gone meanwhile skipped). What each launcher's file stops compare against:
    the entries no earlier attempt saw."""
    return {path for path, _, _ in walk_below(work)}


def _matching(work: Path, pattern: str) -> list[str]:
    """The entries below work that the glob names (Path.glob's syntax); a `**` pattern is matched against
    entries_below' walk, never by Path.glob's recursion (a tree deeper than Python's recursion limit)."""
    if "**" not in pattern:
        return [p.relative_to(work).as_posix() for p in work.glob(pattern)]
    parts = [part for part in pattern.split("/") if part not in ("", ".")]
    return sorted(path for path in entries_below(work) if _glob_match(parts, path.split("/")))


def _glob_match(parts: list[str], names: list[str]) -> bool:
    """Whether a path's names match a glob's parts, `**` standing for any number of directories."""
    reachable = {0}  # how many names the parts so far can have consumed
    for part in parts:
        if part == "**":
            reachable = set(range(min(reachable), len(names) + 1)) if reachable else set()
        else:
            reachable = {i + 1 for i in reachable if i < len(names) and fnmatch.fnmatchcase(names[i], part)}
    return len(names) in reachable
