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

check's side (start_guarded, GuardedCommand, end_all_guards, sweep_strays) is check.guarded_command: this
file is the guard alone, loaded by path, and what both sides share (the /proc walk, the constants)."""

from __future__ import annotations

import contextlib
import os
import re
import select
import signal
import subprocess
import sys
import time


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


def process_tree(root: int, spared: frozenset[int] = frozenset()) -> dict[int, bool]:
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


def signal_found(found: dict[int, bool], root: int, signum: int) -> int:
    """signum to each running process of `found` (process_tree(root)), through a pidfd checked to be still below
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
        return process_tree(self.me)

    def signal_descendants(self, signum: int) -> int:
        """signum to each running descendant, through a pidfd checked to be still below the guard."""
        return signal_found(self.descendants(), self.me, signum)

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


if __name__ == "__main__":
    sys.exit(_guard(sys.argv[1:]))
