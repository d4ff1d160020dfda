"""Whether a restart uses the state it reads: `reprocube check`'s swapped restart.

A probe's record of where a restart resumed is the script's word, and that it read its checkpoint says only
that it opened the file: a restart that reads its checkpoint, throws the state away, trains again from
step 1 and records only the steps it had not recorded before passes both (issue 53, round 4). What tells
is what the restart does with another state. So a fresh run directory gets what the negative control (the
same script with another seed) had in its directories after its last save but one, copied as it ran
(snapshot; its finished state where no copy was kept: that leaves a restart nothing to train, and one that
exports a finished checkpoint unread passes), its declared outputs and the
--copy inputs apart (an output that is also the checkpoint, a state file, is kept), under the names the
uninterrupted run gave the same files (a name holding the seed, runs/seed1/ckpt.pt, placed as
runs/seed0/ckpt.pt); the command is run there with the uninterrupted run's seed. A restart that continues
from the state it finds writes the control's results, not the uninterrupted run's; one that writes the
uninterrupted run's outputs bit for bit did not continue from it (it started again, or it refused another
run's checkpoint). Only outputs the restart wrote itself count (FileActivity): one placed there and left
alone shows nothing. The test only ever weakens a verdict: outputs that differ do not show that the
restart continued (a seed-dependent file that outlives a restart, a config saved in the checkpoint, make a
restart that began again write other outputs too), so they add no claim. It tells only where one of the
control's state files lands on a state file of the uninterrupted run (a checkpoint deleted at the end, or
kept under a name that is not the same but for its numbers, leaves the restart nothing to find) and is
not that file's bytes (a checkpoint the seed does not change).

Regular files only are copied, never through a link; the trees are walked with a stack."""

from __future__ import annotations

import contextlib
import os
import stat
from dataclasses import dataclass
from pathlib import Path

from reprocube.check.file_activity import state_key
from reprocube.files import sha256_regular, walk_below

MAX_ENTRIES = 100_000  # walked in one run's directories
MAX_BYTES_RATIO = 2  # the control's files copied: at most this many times the uninterrupted run's bytes


@dataclass(frozen=True)
class Placement:
    source: Path  # the control's file
    target: str  # "<place>/<relative path>" in the fresh run


def regular_files(places: dict[str, Path]) -> list[str]:
    """Every regular file under `places` ({label: directory}) as "<label>/<relative path>" (files.walk_below:
    links never followed), at most MAX_ENTRIES entries in all."""
    found: list[str] = []
    left = MAX_ENTRIES
    for label, root in places.items():
        for path, _, is_file in walk_below(root, limit=left + 1):
            left -= 1
            if left < 0:
                return found
            if is_file:
                found.append(f"{label}/{path}")
    return found


def plan_swap(
    clean: dict[str, Path],
    control: dict[str, Path],
    keys: frozenset[str],
    outputs: list[str],
    copies: list[str],
) -> tuple[list[Placement], str | None]:
    """Where each file the control left goes in the fresh run: its own name where the uninterrupted run has
    a file of that name, else the uninterrupted run's name for the same key where both have as many files
    of it (paired in sorted order: seed1_epoch7, seed1_epoch8 onto seed0_epoch7, seed0_epoch8), else its
    own. Not placed: the --copy inputs (the fresh run has its own) and declared outputs that are no state
    file. An empty plan and why where there is nothing that could tell: no state file of the control's lands
    on one of the uninterrupted run's with other bytes, or the control left more than the uninterrupted
    run did (MAX_BYTES_RATIO times its bytes: nothing unbounded is copied)."""
    ours, theirs = regular_files(clean), regular_files(control)
    by_key: dict[str, list[str]] = {}
    for path in ours:
        by_key.setdefault(state_key(path), []).append(path)
    their_by_key: dict[str, list[str]] = {}
    for path in theirs:
        their_by_key.setdefault(state_key(path), []).append(path)
    present, plan = set(ours), []
    landings: list[tuple[Path, Path]] = []  # a control's state file and the uninterrupted run's it lands on
    for key, sources in sorted(their_by_key.items()):
        targets = sorted(by_key.get(key, []))
        pairs = {s: s for s in sources}
        if not set(sources) <= present and len(targets) == len(sources):
            pairs = dict(zip(sorted(sources), targets, strict=True))
        for source, target in sorted(pairs.items()):
            label, _, relative = source.partition("/")
            if not _given(source, target, keys, outputs, copies):
                continue
            target_label, _, target_relative = target.partition("/")
            origin = control[label] / relative
            plan.append(Placement(origin, target))
            if key in keys and target in present:
                landings.append((origin, clean[target_label] / target_relative))
    # The size first: nothing unbounded is read, not even to compare it.
    size = sum(_size(p.source) for p in plan)
    if size > copy_budget(clean):
        return [], f"the control left {size >> 20} MiB, more than {MAX_BYTES_RATIO}x what the uninterrupted run did"
    if not any(not _same_bytes(origin, landing) for origin, landing in landings):
        return [], (
            "none of the control's state files lands on one of the uninterrupted run's with other bytes (a "
            "checkpoint deleted at the end, one kept under another name, or one the seed does not change)"
        )
    return plan, None


def plan_restart(given: dict[str, Path], copies: list[str]) -> list[Placement]:
    """Every file of `given` (a run's directories as copied at a stop) placed under its own name in a fresh
    run, but the --copy inputs (it has its own): all its next attempt would find, the declared outputs
    written so far included (a log it appends to)."""
    return [
        Placement(given[name.partition("/")[0]] / name.partition("/")[2], name)
        for name in regular_files(given)
        if not _copy_input(name, copies)
    ]


def _given(source: str, target: str, keys: frozenset[str], outputs: list[str], copies: list[str]) -> bool:
    """Whether a run's file ("<label>/<relative path>") is given to a fresh run as `target`: not a --copy
    input (the fresh run has its own), not a declared output unless it is also a state file."""
    if _copy_input(source, copies):
        return False
    target_label, _, target_relative = target.partition("/")
    output = target_label == "work" and any(_under(target_relative, o) for o in outputs)
    return not output or state_key(source) in keys


def _copy_input(name: str, copies: list[str]) -> bool:
    """Whether a run's file ("<label>/<relative path>") is a --copy input or lies under one."""
    label, _, relative = name.partition("/")
    return label == "work" and relative.split("/", 1)[0] in copies


def copy_budget(clean: dict[str, Path]) -> int:
    """The most bytes of the control's copied: MAX_BYTES_RATIO times what the uninterrupted run left, and
    64 MiB more."""
    files = regular_files(clean)
    return MAX_BYTES_RATIO * sum(_size(clean[f.partition("/")[0]] / f.partition("/")[2]) for f in files) + (64 << 20)


def state_files(places: dict[str, Path], keys: frozenset[str]) -> dict[str, tuple[int, int, int]]:
    """Each regular file of a state key under `places`: (inode, size, mtime in ns), what a save changes (a
    file renamed into place is another inode, one rewritten has another mtime)."""
    found = {}
    for name in regular_files(places):
        if state_key(name) in keys:
            with contextlib.suppress(OSError):
                status = (places[name.partition("/")[0]] / name.partition("/")[2]).lstat()
                found[name] = (status.st_ino, status.st_size, status.st_mtime_ns)
    return found


def snapshot(places: dict[str, Path], into: dict[str, Path], budget: int) -> str | None:
    """Every regular file under `places` copied into the same label's directory of `into` (made, empty, by
    the caller), as place() copies: the state a run has now, kept while it goes on. None, or why nothing was copied (more than `budget` bytes); OSError where a file could not be."""
    files = regular_files(places)
    sources = [places[f.partition("/")[0]] / f.partition("/")[2] for f in files]
    size = sum(_size(source) for source in sources)
    if size > budget:
        return f"it left {size >> 20} MiB, more than {MAX_BYTES_RATIO}x what the uninterrupted run did"
    place([Placement(source, f) for source, f in zip(sources, files, strict=True)], into)
    return None


def place(plan: list[Placement], places: dict[str, Path]) -> None:
    """Copy each planned file into the fresh run's directories, each directory on the way made or found
    without following a link and each file created new (O_EXCL, O_NOFOLLOW): never written through a link
    the command planted, never over anything. OSError where one cannot be placed (the caller gives up)."""
    for placement in plan:
        label, _, relative = placement.target.partition("/")
        directory = os.open(places[label], os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        try:
            *parents, name = relative.split("/")
            for part in parents:
                with contextlib.suppress(FileExistsError):
                    os.mkdir(part, 0o755, dir_fd=directory)
                inner = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=directory)
                os.close(directory)
                directory = inner
            flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
            source = os.open(placement.source, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
            try:
                if not stat.S_ISREG(os.fstat(source).st_mode):
                    raise OSError(f"{placement.source}: not a regular file")
                target = os.open(name, flags, 0o644, dir_fd=directory)
                try:
                    while chunk := os.read(source, 1 << 20):
                        view = memoryview(chunk)
                        while view:
                            view = view[os.write(target, view) :]
                    times = os.fstat(source)  # its age kept: a script may take its newest checkpoint by mtime
                    os.utime(target, ns=(times.st_atime_ns, times.st_mtime_ns))
                finally:
                    os.close(target)
            finally:
                os.close(source)
        finally:
            os.close(directory)


def _size(path: Path) -> int:
    try:
        return path.lstat().st_size
    except OSError:
        return 0


def _same_bytes(a: Path, b: Path) -> bool:
    return sha256_regular(a) == sha256_regular(b)


def _under(name: str, output: str) -> bool:
    output = output.rstrip("/")
    return name == output or name.startswith(output + "/")
