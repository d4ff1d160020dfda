"""What a checked command wrote and read in its own directories (its work directory, HOME and TMPDIR), and
when, as Linux's inotify reports it: how `reprocube check` tells, without the probe, whether a stop came
after the command had saved anything and whether the restart read it back, and when an uninterrupted run
saves (where the default stops go).

Only whole-file events count: a write is a file closed after writing or renamed into place (a checkpoint
written then renamed, or in place); a read is a file read or opened read-only and closed. Directories are
watched as they appear (a file in a directory made and filled faster than its watch is added can be
missed). Where inotify is missing, the watches run out or its queue overflows, `complete` is False and
the caller says what it could not see. Everything is recorded by relative name and time, and a written
file's size and first HEAD_BYTES (a log appended to keeps them; a checkpoint rewritten does not); nothing
else of a file is read."""

from __future__ import annotations

import bisect
import ctypes
import ctypes.util
import os
import re
import select
import stat
import struct
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

IN_ACCESS, IN_CLOSE_WRITE, IN_CLOSE_NOWRITE, IN_MOVED_FROM, IN_MOVED_TO = 0x1, 0x8, 0x10, 0x40, 0x80
IN_CREATE, IN_Q_OVERFLOW, IN_IGNORED, IN_ISDIR = 0x100, 0x4000, 0x8000, 0x40000000
IN_ONLYDIR, IN_DONT_FOLLOW, IN_NONBLOCK, IN_CLOEXEC = 0x01000000, 0x02000000, 0o4000, 0o2000000
WATCHED = IN_ACCESS | IN_CLOSE_WRITE | IN_CLOSE_NOWRITE | IN_MOVED_FROM | IN_MOVED_TO | IN_CREATE
EVENT = struct.Struct("iIII")  # wd, mask, cookie, len (struct inotify_event), then the name
MAX_WATCHES = 4096  # directories of one run; beyond, what happens there is not seen
MAX_EVENTS = 200_000  # reads of one large file come as many events: the same file's repeats are folded
MERGE_S = 0.02  # a file read again within this is one read; other files written within this, one save
# Files of one save in one folder (a checkpoint directory's files, a checkpoint and its `last` copy) follow
# each other within this: one save, however long each file took to write
SAVE_BURST_S = 2.0
SCAN_CLOSE_S = 1.0  # a file a new directory's scan saw, then closed within this: one write
HEAD_BYTES = 64  # of a file written in place, kept to tell a log appended to from a checkpoint rewritten

_libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)


@dataclass(frozen=True)
class Event:
    at: float  # time.perf_counter()
    kind: str  # "write" or "read"
    path: str  # "<place>/<relative path>"
    size: int | None = None  # a written file's size just after (None: a directory, or gone already)
    renamed: bool = False  # a write that renamed the file into place (a whole new file, never an append)
    head: bytes | None = None  # a file written in place: its first HEAD_BYTES (a log appended to keeps them)
    # when its content last changed (its mtime, on time.perf_counter's clock): a file kept open and closed
    # as its process ends is seen written then, though nothing was written to it for a while
    modified: float | None = None

    @property
    def written_at(self) -> float:
        """When a written file's content last changed (its mtime), else when the write was seen."""
        return self.modified if self.modified is not None else self.at


@dataclass(frozen=True)
class Save:
    """One save of the command's state: its files' writes, from the first to the last."""

    start: float
    end: float
    keys: frozenset[str]  # state_key of each file written
    folder: str | None  # the real folder of its files, below a watched place's top (None: files at the top)
    first: str = ""  # state_key of its first file
    written: float = 0.0  # when its last file's content was last changed (mtime, else when seen): beside updates

    def is_partial(self, whole: frozenset[str], first_keys: frozenset[str]) -> bool:
        """Whether this save looks like a whole one being written: some of a whole save's files and not all,
        beginning with a file a whole save begins with (`first_keys`). A set of files no whole save holds (a
        save split apart because its files came slower than SAVE_BURST_S) or a lone status file written as a
        restart starts is no save in progress."""
        return self.keys < whole and self.first in first_keys

    def is_whole(self, whole: frozenset[str]) -> bool:
        """Whether this save holds every file of a whole save (`whole`: whole_save of an uninterrupted run's
        saves): the one rule for "a save is done", where a stop may follow it and a copy may be taken. A
        checkpoint folder still being filled, or a status file a restart writes as it starts, is not."""
        return self.keys >= whole

    def joined_by(self, event: Event, updates: tuple[float, ...] = ()) -> bool:
        """Whether this write of a state file is of the same save: another file than those written so far
        (the same one again, or the next of a numbered series, is the next save), within MERGE_S of the last,
        or within SAVE_BURST_S in the save's own folder (a checkpoint directory filled file by file; a
        checkpoint and its `last` copy beside it). Files at a place's top are one save only within MERGE_S:
        two checkpoint slots written a second apart are two saves. Only the files an uninterrupted run saves
        as it goes are state (state_keys): a log or a cache written beside them is no part of a save. Where
        the run's updates are known (`updates`: the probe's times, on this machine's monotonic clock), no time
        rule applies: files written with no update between them are one save (a slow save's files 2.5 s apart),
        files with an update between them two."""
        gap = event.at - self.end
        if state_key(event.path) in self.keys:
            return False
        if updates:  # the probe's update times: a save falls between two updates, however slowly written
            # (by the files' own times: the watcher stamps a write as it reads it, maybe after the next update).
            # A file renamed into place keeps its content's time, which a temporary file gone before it was
            # looked at (its name renamed away) had too: stamped when seen, that one's time is only an upper bound.
            written = min(self.written, event.written_at) if event.renamed else self.written
            return bisect.bisect_right(updates, written) == bisect.bisect_right(updates, event.written_at)
        return gap <= MERGE_S or (
            self.folder is not None and _folder(event.path) == self.folder and gap <= SAVE_BURST_S
        )


def _folder(path: str) -> str | None:
    """ "<place>/<relative path>"'s folder, None for a file at the place's top."""
    head = path.partition("/")[2].rpartition("/")[0]
    return f"{path.partition('/')[0]}/{head}" if head else None


def whole_save(saves: list[Save]) -> frozenset[str]:
    """The files one whole save holds: the set most of `saves` hold (the larger on a tie), none without any."""
    counts: dict[frozenset[str], int] = {}
    for save in saves:
        counts[save.keys] = counts.get(save.keys, 0) + 1
    return max(counts, key=lambda keys: (counts[keys], len(keys)), default=frozenset())


def first_keys(saves: list[Save], whole: frozenset[str]) -> frozenset[str]:
    """The files whole saves begin with (a save in progress begins with one of them)."""
    return frozenset(save.first for save in saves if save.is_whole(whole))


def state_key(path: str) -> str:
    """A file's key among a run's saves: its path with every number as # (ckpt-100.pt, ckpt-200.pt: one)."""
    return re.sub(r"[0-9]+", "#", path)


class FileActivity:
    """Watches `places` ({name: directory}) from start() to stop(), in a thread of its own."""

    def __init__(self, places: dict[str, Path], unwatched: frozenset[str] = frozenset()):
        """unwatched: names in a place's top directory whose trees are not watched (the runs' own
        directories, where the command's parent is watched for what it puts beside them)."""
        self.places = places
        self.unwatched = unwatched
        self.events: list[Event] = []
        self.complete = True
        self.why_incomplete = ""
        self._dirs: dict[int, str] = {}  # watch descriptor -> "<place>/<relative dir>"
        self._fd = -1
        self._thread: threading.Thread | None = None
        self._stopping = threading.Event()
        self._last: dict[tuple[str, str], float] = {}
        self._scanned: dict[str, float] = {}  # files a new directory held when its watch was added
        # called from the watcher's thread as soon as it has recorded new writes (a stop placed by what is being
        # written, --during-save, acts within a millisecond of a file's close: a poll would come after the save)
        self.on_write: Callable[[], None] | None = None
        # when the run's updates were recorded (the probe's times, sorted), once it has ended: saves group by them
        self.updates: tuple[float, ...] = ()

    def start(self) -> FileActivity:
        self._fd = _libc.inotify_init1(IN_NONBLOCK | IN_CLOEXEC) if hasattr(_libc, "inotify_init1") else -1
        if self._fd < 0:
            self._incomplete("inotify is not available here")
            return self
        for name, root in self.places.items():
            self._watch_tree(root, name)
        self._thread = threading.Thread(target=self._read_loop, name="file-activity", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._thread is not None:
            time.sleep(0.05)  # the last events of a process that just ended
            self._stopping.set()
            self._thread.join(5)
            if self._thread.is_alive():  # still adding watches (a deep tree): it closes the descriptor itself
                self._incomplete("still reading inotify's events when the run ended")
                return
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def __enter__(self) -> FileActivity:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    # --- questions ------------------------------------------------------------------------------
    def writes(self, since: float = float("-inf"), until: float = float("inf"), lasting: bool = False) -> list[Event]:
        """The writes between since and until; lasting: only of files still there (a temporary file
        that a library writes and deletes at start-up is no save)."""
        return [
            e
            for e in list(self.events)
            if e.kind == "write" and since <= e.at < until and (not lasting or self.exists(e.path))
        ]

    def exists(self, path: str) -> bool:
        place, _, relative = path.partition("/")
        return os.path.lexists(self.places[place] / relative)

    def reads(self, since: float = float("-inf"), until: float = float("inf")) -> list[Event]:
        return [e for e in list(self.events) if e.kind == "read" and since <= e.at < until]

    def saves(
        self, since: float = float("-inf"), until: float = float("inf"), state: frozenset[str] | None = None
    ) -> list[Save]:
        """The command's saves: its writes (of state files only, where `state` gives their keys; else of
        files still there), grouped as Save.joined_by says."""
        found: list[Save] = []
        for event in self.writes(since, until, lasting=state is None):
            key = state_key(event.path)
            if state is not None and key not in state:
                continue
            if found and found[-1].joined_by(event, self.updates):
                found[-1] = replace(found[-1], end=event.at, keys=found[-1].keys | {key}, written=event.written_at)
            else:
                found.append(Save(event.at, event.at, frozenset({key}), _folder(event.path), key, event.written_at))
        return found

    def save_moments(
        self, since: float = float("-inf"), until: float = float("inf"), state: frozenset[str] | None = None
    ) -> list[float]:
        """When each save (saves) began."""
        return [save.start for save in self.saves(since, until, state)]

    def state_keys(self) -> frozenset[str]:
        """What an uninterrupted run saves as it goes: the files it rewrote most often, at two or more save
        moments and at least half as many as the most rewritten one (a checkpoint saved every epoch), a
        numbered series counting as one (ckpt-1.pt, ckpt-2.pt: state_key). Python's bytecode cache, a
        library's cache in HOME or TMPDIR, a data cache or a config written at start-up (and again at the
        end), the outputs written at the end, a log a line is appended to at every step (written in place,
        growing write after write: metrics.csv; counted only where nothing else was saved twice): none is the
        state a restart resumes from. Nothing where not all was seen."""
        if not self.complete:
            return frozenset()
        # Files still there at the end first; then any (Keras' BackupAndRestore deletes its backup when
        # training ends). A log appended to is no checkpoint, unless nothing else was saved twice.
        for writes in (self.writes(lasting=True), self.writes()):
            appended = _appended(writes)
            for skipped in (appended, set()):
                moments: dict[str, list[float]] = {}
                for event in writes:  # each write of a file is a save of it, however soon
                    if event.path not in skipped:
                        moments.setdefault(state_key(event.path), []).append(event.at)
                most = max((len(times) for times in moments.values()), default=0)
                if most >= 2:
                    return frozenset(key for key, times in moments.items() if len(times) >= max(2, most / 2))
        return frozenset()

    # --- inotify --------------------------------------------------------------------------------
    def _incomplete(self, why: str) -> None:
        self.complete, self.why_incomplete = False, self.why_incomplete or why

    def _watch_tree(self, root: Path, name: str, new: bool = False) -> None:
        """root and every directory under it (walked without recursion), each watched. new: a directory the
        command made while watched: the files already in it when its watch was added (a save into a
        directory made a moment before: checkpoint-500/) are writes too, seen now."""
        pending = [(root, name)]
        while pending:
            directory, label = pending.pop()
            watched = self._watch(directory, label)
            if watched is None:
                return
            if not watched and new:
                # Watched already: a new directory both listed in its parent's scan and announced by its own
                # IN_CREATE. Its files were seen then; scanning them again made each a second write (an extra
                # save in a run's count, under load: a correct resume called not-resumed).
                continue
            try:
                with os.scandir(directory) as entries:
                    listed = [
                        (e.name, e.is_dir(follow_symlinks=False), e.is_file(follow_symlinks=False)) for e in entries
                    ]
            except OSError:
                continue
            if new:
                now = time.perf_counter()
                for entry, _, regular in listed:
                    if regular and len(self.events) < MAX_EVENTS:
                        size, _, _ = _size_head_mtime(directory / entry)  # None: gone already (a temporary file)
                        self.events.append(Event(now, "write", f"{label}/{entry}", size))
                        self._scanned[f"{label}/{entry}"] = now
            pending += [
                (directory / sub, f"{label}/{sub}")
                for sub, is_dir, _ in listed
                if is_dir and not ("/" not in label and sub in self.unwatched)
            ]

    def _watch(self, directory: Path, label: str) -> bool | None:
        """True: watched now; False: not (it is gone, or it was watched already: the same directory's watch
        descriptor); None: no more watches (the walk stops)."""
        if len(self._dirs) >= MAX_WATCHES:
            self._incomplete(f"more than {MAX_WATCHES} directories")
            return None
        wd = _libc.inotify_add_watch(self._fd, os.fsencode(directory), WATCHED | IN_ONLYDIR | IN_DONT_FOLLOW)
        if wd < 0:
            if ctypes.get_errno() == 28:  # ENOSPC: fs.inotify.max_user_watches reached
                self._incomplete("inotify's watches ran out (fs.inotify.max_user_watches)")
                return None
            return False
        known = self._dirs.get(wd) == label
        self._dirs[wd] = label
        return not known

    def _read_loop(self) -> None:
        fd = self._fd
        try:
            while True:
                stopping = self._stopping.is_set()
                ready, _, _ = select.select([fd], [], [], 0.05)
                if ready:
                    self._drain()
                elif stopping:
                    return
        finally:
            if self._stopping.is_set() and self._fd == fd:  # stop() gave up waiting: close it here
                self._fd = -1
                os.close(fd)

    def _drain(self) -> None:
        try:
            data = os.read(self._fd, 1 << 16)
        except BlockingIOError:
            return
        now, written = time.perf_counter(), len(self.events)
        offset = 0
        moved_from: dict[int, str] = {}  # cookie -> a watched directory moved away, until moved into the tree
        while offset + EVENT.size <= len(data):
            wd, mask, cookie, length = EVENT.unpack_from(data, offset)
            raw = data[offset + EVENT.size : offset + EVENT.size + length].split(b"\0", 1)[0]
            offset += EVENT.size + length
            if mask & IN_ISDIR and mask & IN_MOVED_FROM and wd in self._dirs:
                moved_from[cookie] = f"{self._dirs[wd]}/{os.fsdecode(raw)}"
            elif mask & IN_MOVED_TO:
                moved_from.pop(cookie, None)  # renamed within the tree: its watches are labelled anew below
            try:
                self._event(wd, mask, os.fsdecode(raw), now)
            except Exception as error:
                # A watcher that stopped seeing, or missed one event, must never leave `complete` True: a
                # save it missed would read as no save (an H200 run, 2026-11-27: a file gone between a new
                # directory's listing and its stat ended the thread, and check called a correct resume
                # state-leaked).
                self._incomplete(f"the watcher failed on an event ({type(error).__name__})")
        for label in moved_from.values():
            self._unwatch(label)
        hook = self.on_write
        if hook is not None and written < len(self.events):
            try:
                hook()
            except Exception as error:  # never the end of the watcher: what it saw after would go unrecorded
                self._incomplete(f"the stop placed by the writes failed ({type(error).__name__})")

    def _unwatch(self, label: str) -> None:
        """A directory moved out of the run's directories: its watches follow it (the same inodes) and would
        name what happens there, outside, as if in here under its old name. They are removed: what the
        command does there is not seen, as anywhere outside (a save there is no save of this run's)."""
        for wd, watched in list(self._dirs.items()):
            if watched == label or watched.startswith(label + "/"):
                _libc.inotify_rm_watch(self._fd, wd)
                del self._dirs[wd]

    def _event(self, wd: int, mask: int, name: str, now: float) -> None:
        if mask & IN_Q_OVERFLOW:
            self._incomplete("inotify's queue overflowed (events were lost)")
            return
        directory = self._dirs.get(wd)
        if directory is None or mask & IN_IGNORED or not name:
            return
        if mask & IN_ISDIR:
            if "/" not in directory and name in self.unwatched:
                return
            if mask & (IN_CREATE | IN_MOVED_TO):
                place = self.places[directory.split("/", 1)[0]]
                self._watch_tree(place / directory.partition("/")[2] / name, f"{directory}/{name}", new=True)
            if mask & IN_MOVED_TO and len(self.events) < MAX_EVENTS:
                # A directory written elsewhere and renamed into place (Orbax's checkpoints) is one save.
                self.events.append(Event(now, "write", f"{directory}/{name}"))
            return
        path = f"{directory}/{name}"
        full = self.places[directory.split("/", 1)[0]] / directory.partition("/")[2] / name
        # A hard link made to a saved file (link(2): no close of a write) puts a whole file in place.
        linked = bool(mask & IN_CREATE) and _hard_link(full)
        kind = (
            "write"
            if mask & (IN_CLOSE_WRITE | IN_MOVED_TO) or linked
            else "read"
            if mask & (IN_ACCESS | IN_CLOSE_NOWRITE)
            else ""
        )
        if not kind:
            return
        if kind == "read" and now - self._last.get((kind, path), float("-inf")) < MERGE_S:
            return  # the same file read again at once: one read
        if kind == "write" and now - self._scanned.pop(path, float("-inf")) < SCAN_CLOSE_S:
            return  # a new directory's scan saw it already (its close came after the watch was added)
        self._last[(kind, path)] = now
        if len(self.events) >= MAX_EVENTS:
            self._incomplete(f"more than {MAX_EVENTS} file events")
            return
        size, head, modified = None, None, None
        if kind == "write":
            size, head, mtime = _size_head_mtime(full)
            modified = None if mtime is None else mtime - (time.time() - time.perf_counter())
        renamed = bool(mask & IN_MOVED_TO) or linked
        self.events.append(Event(now, kind, path, size, renamed=renamed, head=head, modified=modified))


def _hard_link(path: Path) -> bool:
    """Whether a name just created is a regular file with another name too (a new file has one)."""
    try:
        status = path.lstat()
    except OSError:
        return False
    return stat.S_ISREG(status.st_mode) and status.st_nlink > 1


def _size_head_mtime(path: Path) -> tuple[int | None, bytes | None, float | None]:
    """A regular file's size, first HEAD_BYTES and mtime (time.time()'s clock), read without following a link
    or waiting on a FIFO."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return None, None, None
    try:
        status = os.fstat(fd)
        if not stat.S_ISREG(status.st_mode):
            return None, None, None
        return status.st_size, os.read(fd, HEAD_BYTES), status.st_mtime_ns / 1e9
    except OSError:
        return None, None, None
    finally:
        os.close(fd)


def _appended(writes: list[Event]) -> set[str]:
    """The files written in place that grew at every write and kept their first bytes, three writes or more
    (a log a line is appended to at every step); a checkpoint rewritten in place changes its first bytes
    (a zip's first member, a header's values) even where it grows (a loss history in it); a file renamed
    into place is a whole new one each time, never a log."""
    sizes: dict[str, list[int | None]] = {}
    heads: dict[str, set[bytes | None]] = {}
    renamed: set[str] = set()
    for event in writes:
        sizes.setdefault(event.path, []).append(event.size)
        heads.setdefault(event.path, set()).add(
            event.head[: min(HEAD_BYTES, sizes[event.path][0] or 0)] if event.head else None
        )
        if event.renamed:
            renamed.add(event.path)
    return {
        path
        for path, seen in sizes.items()
        if path not in renamed
        and len(seen) >= 3
        and None not in seen
        and len(heads[path]) == 1
        and None not in heads[path]
        and all(b > a for a, b in zip(seen, seen[1:], strict=False))
    }
