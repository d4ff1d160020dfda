"""check's side of the process guard (check.process_guard, the script each attempt runs under): start a
command under a guard and hold it as a Popen-like handle (GuardedCommand), end every live guard on Ctrl-C
(end_all_guards), and sweep what a killed guard held (sweep_strays: check is a child subreaper while any
guard lives). Kept apart from the guard itself, which is a script run by `python -I -S` with the standard
library only.

start_guarded gives a Popen-like handle (pid, poll, wait, returncode: the command's own) with send_signal
(to the command's group) and end. The guard itself may die (the command SIGKILLs its parent, `pkill -f`
matches the guard's command line): so while any guard lives, check is a child subreaper too (what the dead
guard held is reparented to check, not to PID 1), and each end() then sweeps (sweep_strays): every process
below check that is not one of its live guards or below one is SIGKILLed and reaped. With --jobs 2 the
other run's guard and what it holds are spared."""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable

from reprocube.check import process_guard
from reprocube.check.process_guard import (
    DRAIN_S,
    GRACE_S,
    PR_GET_CHILD_SUBREAPER,
    PR_SET_CHILD_SUBREAPER,
    SWEEP_S,
    load_prctl,
    proc_stat,
    process_tree,
    signal_found,
)

_LIVE: set[int] = set()  # the pids of check's guards, from their start until end() has waited for them


_LIVE_LOCK = threading.Lock()  # held while a guard starts and while a sweep lists and kills: never a race


_SUBREAPER = {"set_here": False}  # whether check was made a subreaper here (and must be unmade)


def _set_subreaper(on: bool) -> None:
    """Check a child subreaper while any guard lives (under _LIVE_LOCK): set where it was not already."""
    prctl = load_prctl(use_errno=True)
    if prctl is None:
        return
    if on and not _SUBREAPER["set_here"]:
        was = ctypes.c_int(0)
        prctl(PR_GET_CHILD_SUBREAPER, ctypes.byref(was), 0, 0, 0)
        if not was.value and prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0:
            _SUBREAPER["set_here"] = True
    elif not on and _SUBREAPER["set_here"]:
        prctl(PR_SET_CHILD_SUBREAPER, 0, 0, 0, 0)
        _SUBREAPER["set_here"] = False


def end_all_guards(timeout: float = GRACE_S + 2.0) -> None:
    """Ctrl-C of check: every live guard asked to end its attempt (SIGTERM: the command's group and its
    descendants ended, as at an attempt's end), also those that threads of check (--jobs) wait on, and
    waited for until their threads have seen them go (or `timeout`)."""
    with _LIVE_LOCK:
        guards = list(_LIVE)
    for pid in guards:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with _LIVE_LOCK:
            if not _LIVE & set(guards):
                return
        time.sleep(0.02)


def sweep_strays(timeout: float = SWEEP_S) -> int:
    """SIGKILL every process below check that is not one of its live guards nor below one (what a guard
    that was killed held: reparented to check, its subreaper), until none is left or `timeout`; the zombies
    among check's own children reaped (by pid: never a guard's status, nor another child's). When no guard
    lives any more, check stops being a subreaper. Returns how many processes were signalled."""
    me, sent = os.getpid(), 0
    deadline = time.monotonic() + timeout
    with _LIVE_LOCK:
        while True:
            found = process_tree(me, frozenset(_LIVE))
            for pid, alive in found.items():
                if not alive:
                    with contextlib.suppress(ChildProcessError, OSError):
                        os.waitpid(pid, os.WNOHANG)  # ours if it was reparented to check; else its parent's
            if not any(found.values()) and not any(_is_child(pid, me) for pid in found):
                break
            if time.monotonic() >= deadline:
                break  # one in uninterruptible sleep may linger
            sent += signal_found(found, me, signal.SIGKILL)
            time.sleep(0.01)
        if not _LIVE:
            _set_subreaper(False)
    return sent


def _is_child(pid: int, parent: int) -> bool:
    stat = proc_stat(pid)
    return stat is not None and stat.parent == parent


class GuardedCommand:
    """One attempt's command under its guard, for check: pid, poll(), wait(timeout) and returncode as
    subprocess.Popen's (the command's own status: -15 after SIGTERM), send_signal(signum) to its process
    group, on_matched(callback) for a line matching the pattern, and end() (everything below ended)."""

    def __init__(self, command: list[str], cwd, env: dict[str, str], log, line: str | None) -> None:
        self.args = command
        self.returncode: int | None = None
        self._exited, self._finished = threading.Event(), threading.Event()
        self._lock = threading.Lock()
        self._matched, self._callback = 0, None
        status_r, status_w = os.pipe()
        control_r, self._control = os.pipe()
        try:
            with _LIVE_LOCK:  # no sweep between the fork and the guard's pid known as live
                _set_subreaper(True)
                try:
                    self.guard = subprocess.Popen(
                        [
                            sys.executable,
                            "-I",
                            "-S",
                            os.path.abspath(process_guard.__file__),
                            str(status_w),
                            str(control_r),
                        ]
                        + [str(os.getpid()), "-" if line is None else "+" + line, "--", *command],
                        cwd=cwd,
                        env=env,
                        stdout=log,
                        stderr=log,
                        pass_fds=(status_w, control_r),
                    )
                except BaseException:
                    if not _LIVE:
                        _set_subreaper(False)
                    raise
                _LIVE.add(self.guard.pid)
        except BaseException:
            os.close(status_r)
            os.close(self._control)
            raise
        finally:
            os.close(status_w)
            os.close(control_r)
        self._status = os.fdopen(status_r, "rb")
        try:
            first = self._status.readline().decode("utf-8", "replace").strip().split(" ", 2)
        except BaseException:  # a Ctrl-C meanwhile: the guard ends what it started
            self._status.close()
            self.end()
            raise
        if first[0] != "pid":
            self._status.close()
            self.end()
            if first[0] == "error" and len(first) == 3:
                raise OSError(int(first[1]) or None, first[2])
            raise OSError(None, f"its guard ended before starting it (exit {self.guard.returncode})")
        self.pid = int(first[1])
        threading.Thread(target=self._read_status, daemon=True).start()

    def _read_status(self) -> None:
        try:
            for raw in self._status:
                word, _, rest = raw.decode("utf-8", "replace").strip().partition(" ")
                if word == "matched":
                    with self._lock:
                        self._matched += 1
                        callback = self._callback
                    if callback is not None:
                        callback()
                elif word == "exit":
                    self.returncode = int(rest)
                    self._exited.set()
        finally:
            self._status.close()
            if self.returncode is None:  # the guard died without saying: the command went with it
                self.returncode = self.guard.wait() or -signal.SIGKILL
            self._exited.set()
            self._finished.set()

    def on_matched(self, callback: Callable[[], None]) -> None:
        with self._lock:
            self._callback, pending = callback, self._matched
        if pending:
            callback()

    def poll(self) -> int | None:
        return self.returncode if self._exited.is_set() else None

    def wait(self, timeout: float | None = None) -> int:
        if not self._exited.wait(timeout):
            raise subprocess.TimeoutExpired(self.args, timeout)
        return self.returncode

    def finished(self, timeout: float | None = None) -> bool:
        """Whether all the command's output is in the log (its guard ended), within timeout."""
        return self._finished.wait(timeout)

    def send_signal(self, signum: int) -> None:
        """signum to the command's process group (the guard sends it while the command runs)."""
        with contextlib.suppress(OSError):
            os.write(self._control, f"signal {int(signum)}\n".encode())

    def end(self) -> None:
        """Everything the command started ends (the guard's end), and the guard with it; then whatever a
        killed guard left to check, its subreaper (sweep_strays)."""
        try:
            if self.guard.poll() is None:
                self.guard.send_signal(signal.SIGTERM)
                try:
                    self.guard.wait(GRACE_S + SWEEP_S + DRAIN_S + 5)
                except subprocess.TimeoutExpired:
                    self.guard.kill()  # the command dies with it (PDEATHSIG); a straggler may not
                    self.guard.wait()
        finally:
            if self.guard.returncode is not None:
                with _LIVE_LOCK:
                    _LIVE.discard(self.guard.pid)
            sweep_strays()
        if self._control >= 0:
            os.close(self._control)
            self._control = -1


def start_guarded(command: list[str], cwd, env: dict[str, str], log, line: str | None = None) -> GuardedCommand:
    """The command started under a guard (see the module): OSError (as Popen's) when it cannot start."""
    return GuardedCommand(command, cwd, env, log, line)
