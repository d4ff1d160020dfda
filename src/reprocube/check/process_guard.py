"""Containment of `reprocube check`'s attempts: nothing the command starts outlives its attempt or check,
and nothing it prints can stall check.

Each attempt runs under a guard: this file, run as a script by a fresh interpreter (`python -I -S`, the
standard library only). The guard is a child subreaper (PR_SET_CHILD_SUBREAPER): whatever the command
starts, a double-forked or setsid daemon included, stays its descendant (an orphan is reparented to it,
not to PID 1). It starts the command in a process group of its own, copies its output into the log in
bounded chunks, matches `--at-line` against each line (at most MAX_LINE bytes of its head and of its
tail: memory is bounded whatever a line's length), and tells check over a pipe the command's pid, a
matching line and its exit status. When the command exits, when check asks (SIGTERM: the watchdog, a
Ctrl-C, the attempt's end) or when check dies (EOF on the control pipe, or PR_SET_PDEATHSIG, so a
SIGKILL of check included), the guard SIGTERMs the command's group and every other descendant, gives
the command GRACE_S to exit, then SIGKILLs every descendant until none is left (each through a pidfd
checked to be a descendant: a recycled pid is never signalled), and exits. A regex that backtracks for
hours stalls only the guard: check's watchdog still ends the attempt (the guard's SIGTERM handler
interrupts the search).

Imported, the module is check's side: start_guarded gives a Popen-like handle (pid, poll, wait,
returncode: the command's own) with send_signal (to the command's group) and end. The guard itself may
die (the command SIGKILLs its parent, `pkill -f` matches the guard's command line): so while any guard
lives, check is a child subreaper too (what the dead guard held is reparented to check, not to PID 1),
and each end() then sweeps (sweep_strays): every process below check that is not one of its live guards
or below one is SIGKILLed and reaped. With --jobs 2 the other run's guard and what it holds are spared."""

from __future__ import annotations

import contextlib
import ctypes
import os
import re
import select
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable


def _procfs():
    """reprocube's one /proc reader and prctl loader (runtime/procfs.py, standard library only), loaded by its
    path: the guard runs as a script (python -I -S), with no reprocube on its path."""
    import importlib.util

    path = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "runtime", "procfs.py")
    spec = importlib.util.spec_from_file_location("_reprocube_guard_procfs", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclass looks its module up there
    spec.loader.exec_module(module)
    return module


_PROCFS = _procfs()
load_prctl, proc_stat = _PROCFS.load_prctl, _PROCFS.proc_stat

PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36
PR_GET_CHILD_SUBREAPER = 37
CHUNK = 1 << 16  # output is read and written this many bytes at a time
MAX_LINE = 1 << 20  # of a longer line, its first and its last MAX_LINE bytes are matched
GRACE_S = 5.0  # after the SIGTERM that ends an attempt, how long the command may take before SIGKILL
SWEEP_S = 10.0  # how long the guard goes on SIGKILLing descendants (one in uninterruptible sleep may linger)
DRAIN_S = 2.0  # after the last descendant, how long output may still come (a pipe end passed to a stranger)


def _tree(root: int, spared: frozenset[int] = frozenset()) -> dict[int, bool]:
    """Every process below `root` (pid -> still running; False: a zombie), without those in `spared`
    and what lies below them."""
    children: dict[int, list[tuple[int, bool]]] = {}
    try:
        listed = os.listdir("/proc")
    except OSError:
        listed = []  # no /proc (not Linux): only the command's group is ended
    for name in listed:
        if not name.isdigit():
            continue
        stat = proc_stat(name)
        if stat is not None:
            children.setdefault(stat.parent, []).append((int(name), stat.state != b"Z"))
    found, frontier = {}, [root]
    while frontier:
        for pid, alive in children.get(frontier.pop(), ()):
            if pid not in found and pid not in spared:
                found[pid] = alive
                frontier.append(pid)
    return found


def _signal_found(found: dict[int, bool], root: int, signum: int) -> int:
    """signum to each running process of `found` (_tree(root)), through a pidfd checked to be still below
    `root` (its parent `root` or one of `found`): a recycled pid is never signalled."""
    sent = 0
    for pid, alive in found.items():
        if not alive:
            continue
        try:
            pidfd = os.pidfd_open(pid)
        except (AttributeError, OSError):
            pidfd = None
        try:
            stat = proc_stat(pid)
            if stat is None:
                continue  # gone
            if stat.parent != root and stat.parent not in found:
                continue  # the pid was recycled by a process that is not ours
            if pidfd is not None:
                signal.pidfd_send_signal(pidfd, signum)
            else:
                os.kill(pid, signum)
            sent += 1
        except ProcessLookupError:
            pass
        finally:
            if pidfd is not None:
                os.close(pidfd)
    return sent


# ---- the guard (run as a script) ----------------------------------------------------------------------


class _Ending(Exception):
    """Raised by the guard's SIGTERM handler inside a long regex search: the attempt ends now."""


class _Guard:
    def __init__(self, status_fd: int, control_fd: int, pattern: re.Pattern | None) -> None:
        self.status_fd, self.control_fd, self.pattern = status_fd, control_fd, pattern
        self.me = os.getpid()
        self.leader: subprocess.Popen | None = None
        self.leader_status: int | None = None
        self.ending = False
        self.searching = False
        self.head, self.tail, self.long = bytearray(), bytearray(), False
        self.out_fd = -1

    # -- signals
    def on_term(self, signum, frame) -> None:
        self.ending = True
        if self.searching:
            raise _Ending

    def tell(self, message: str) -> None:
        try:
            os.write(self.status_fd, message.encode("utf-8", "replace") + b"\n")
        except OSError:
            pass  # check is gone: nobody reads

    # -- the command's output
    def copy(self, chunk: bytes) -> None:
        view = memoryview(chunk)
        while view:
            try:
                written = os.write(1, view)
            except InterruptedError:
                continue
            except OSError:
                return  # the log cannot be written (a full disk): the output is dropped, never a crash
            view = view[written:]

    def feed(self, chunk: bytes) -> None:
        """Each line (its first and last MAX_LINE bytes) against the pattern, until one matches."""
        start = 0
        while self.pattern is not None and start < len(chunk):
            newline = chunk.find(b"\n", start)
            end = len(chunk) if newline < 0 else newline + 1
            self.add(chunk[start:end])
            if newline >= 0:
                self.search(self.tail if self.long else self.head)
                self.head.clear()
                self.tail.clear()
                self.long = False
            start = end

    def add(self, piece: bytes) -> None:
        if not self.long:
            room = MAX_LINE - len(self.head)
            if len(piece) <= room:
                self.head += piece
                return
            self.head += piece[:room]
            self.long = True
            self.search(self.head)  # at once: a line that never ends is still matched
            piece = piece[room:]
        self.tail += piece
        if len(self.tail) > MAX_LINE:
            del self.tail[: len(self.tail) - MAX_LINE]

    def search(self, line: bytearray) -> None:
        if self.pattern is None or not line:
            return
        text = bytes(line).decode("utf-8", "replace")
        try:
            self.searching = True  # from here the SIGTERM handler may interrupt the search (_Ending)
            hit = None if self.ending else self.pattern.search(text)
            self.searching = False
        except _Ending:
            self.searching, hit, self.pattern = False, None, None  # the attempt ends: nothing more is matched
        if hit:
            self.pattern = None  # one stop per attempt: no further line is matched
            self.tell("matched")

    def read_output(self) -> bool:
        """What the pipe holds now, copied (and matched): False at its end."""
        try:
            chunk = os.read(self.out_fd, CHUNK)
        except BlockingIOError:
            return True
        except OSError:
            chunk = b""
        if not chunk:
            self.search(self.tail if self.long else self.head)  # a last line without a newline
            os.close(self.out_fd)
            self.out_fd = -1
            return False
        self.copy(chunk)
        self.feed(chunk)
        return True

    # -- processes
    def reap(self) -> None:
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            if self.leader is not None and pid == self.leader.pid:
                code = os.waitstatus_to_exitcode(status)
                while self.out_fd >= 0 and self.read_output():  # its last lines before its exit status
                    if not select.select([self.out_fd], [], [], 0)[0]:
                        break
                self.leader_status = self.leader.returncode = code
                self.tell(f"exit {self.leader_status}")

    def descendants(self) -> dict[int, bool]:
        """Every process below the guard: pid -> still running (False: a zombie)."""
        return _tree(self.me)

    def signal_descendants(self, signum: int) -> int:
        """signum to each running descendant, through a pidfd checked to be still below the guard."""
        return _signal_found(self.descendants(), self.me, signum)

    def signal_group(self, signum: int) -> None:
        if self.leader is not None and self.leader_status is None:  # not reaped: its group id is still its
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.leader.pid, signum)

    def wait_readable(self, timeout: float | None) -> list[int]:
        watched = [self.wake_r, *([self.control_fd] if self.control_fd >= 0 else [])]
        watched += [self.out_fd] if self.out_fd >= 0 else []
        return select.select(watched, [], [], timeout)[0]

    def serve(self) -> None:
        """The attempt: output copied, stops passed on, until the command exits or the end is asked."""
        while not self.ending and self.leader_status is None:
            self.pump(None)

    def control(self) -> None:
        data = os.read(self.control_fd, 512)
        if not data:  # check is gone (or done): end everything
            os.close(self.control_fd)
            self.control_fd = -1
            self.ending = True
            return
        for line in data.decode("ascii", "replace").splitlines():
            words = line.split()
            if len(words) == 2 and words[0] == "signal" and words[1].isdigit():
                self.signal_group(int(words[1]))

    def end(self) -> None:
        """SIGTERM to the group and every descendant, GRACE_S for the command, then SIGKILL until none is left;
        the output copied meanwhile, to its end."""
        self.pattern = None  # no more matching: the attempt is over
        self.signal_group(signal.SIGTERM)
        self.signal_descendants(signal.SIGTERM)
        deadline = time.monotonic() + GRACE_S
        while self.leader_status is None and time.monotonic() < deadline:
            self.pump(deadline - time.monotonic())
        deadline = time.monotonic() + SWEEP_S
        while time.monotonic() < deadline:
            self.reap()
            if not self.descendants():
                break
            self.signal_group(signal.SIGKILL)
            self.signal_descendants(signal.SIGKILL)
            self.pump(0.01)
        deadline = time.monotonic() + DRAIN_S
        while self.out_fd >= 0 and time.monotonic() < deadline:
            self.pump(deadline - time.monotonic())
        self.reap()

    def pump(self, timeout: float | None) -> None:
        """One wait (None: until something happens): children reaped, control read, output copied."""
        readable = self.wait_readable(None if timeout is None else max(0.0, timeout))
        if self.wake_r in readable:
            with contextlib.suppress(BlockingIOError):
                os.read(self.wake_r, 512)
            self.reap()
        if self.control_fd in readable:
            self.control()
        if self.out_fd in readable:
            self.read_output()


def _guard(argv: list[str]) -> int:
    status_fd, control_fd, parent, line = int(argv[0]), int(argv[1]), int(argv[2]), argv[3]
    command = argv[5:]
    guard = _Guard(status_fd, control_fd, re.compile(line[1:]) if line.startswith("+") else None)
    prctl = load_prctl(use_errno=True)
    if prctl is not None:
        prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    guard.wake_r, wake_w = os.pipe()
    os.set_blocking(guard.wake_r, False)
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w, warn_on_full_buffer=False)
    signal.signal(signal.SIGTERM, guard.on_term)
    signal.signal(signal.SIGCHLD, lambda signum, frame: None)  # wakes the select: a process below ended
    for signum in (signal.SIGINT, signal.SIGHUP):  # check decides (a Ctrl-C reaches check's whole group)
        if signal.getsignal(signum) is not signal.SIG_IGN:
            signal.signal(signum, lambda signum, frame: None)  # a handler, not SIG_IGN: the command gets SIG_DFL
    if prctl is not None:
        prctl(PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0)
    if os.getppid() != parent:
        return 0  # check died before it could be told: nothing was started

    def die_with_guard() -> None:  # the command itself, should the guard be SIGKILLed
        if prctl is not None:
            prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)

    try:
        guard.leader = subprocess.Popen(
            command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, process_group=0, preexec_fn=die_with_guard
        )
    except OSError as exc:
        guard.tell(f"error {exc.errno or 0} {exc.strerror or exc}")
        return 0
    except (ValueError, subprocess.SubprocessError) as exc:
        guard.tell(f"error 0 {exc}")
        return 0
    guard.out_fd = os.dup(guard.leader.stdout.fileno())
    guard.leader.stdout.close()
    os.set_blocking(guard.out_fd, False)
    guard.tell(f"pid {guard.leader.pid}")
    guard.serve()
    guard.end()
    return 0


# ---- check's side -------------------------------------------------------------------------------------

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
            found = _tree(me, frozenset(_LIVE))
            for pid, alive in found.items():
                if not alive:
                    with contextlib.suppress(ChildProcessError, OSError):
                        os.waitpid(pid, os.WNOHANG)  # ours if it was reparented to check; else its parent's
            if not any(found.values()) and not any(_is_child(pid, me) for pid in found):
                break
            if time.monotonic() >= deadline:
                break  # one in uninterruptible sleep may linger
            sent += _signal_found(found, me, signal.SIGKILL)
            time.sleep(0.01)
        if not _LIVE:
            _set_subreaper(False)
    return sent


def _is_child(pid: int, parent: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            return int(stat.read().rsplit(b")", 1)[1].split()[1]) == parent
    except (OSError, IndexError, ValueError):
        return False


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
                        [sys.executable, "-I", "-S", os.path.abspath(__file__), str(status_w), str(control_r)]
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


if __name__ == "__main__":
    sys.exit(_guard(sys.argv[1:]))
