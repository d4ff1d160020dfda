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
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from reprocube.analysis.outputs import compare_outputs, under_output
from reprocube.check.evidence import SwapEvidence
from reprocube.check.evidence_dirs import DirectoryReplaced, EvidenceDirs
from reprocube.check.file_activity import MERGE_S, state_key
from reprocube.check.runs import Run, failure_line, outputs_written
from reprocube.check.slots import Conductor
from reprocube.check.traces import trained_nothing
from reprocube.files import entry_size, sha256_regular, walk_below
from reprocube.terminal import counted, one_line

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
    written: tuple[list[str], list[str]] = ([], []),
) -> tuple[list[Placement], str | None]:
    """Where each file the control left goes in the fresh run: its own name where the uninterrupted run has
    a file of that name, else the uninterrupted run's name for the same key where both have as many files
    of it (paired in sorted order: seed1_epoch7, seed1_epoch8 onto seed0_epoch7, seed0_epoch8), else, for
    the state files whose names tell no pairing (a folder named by a hash of the seed), by what the runs did:
    `written`, (the uninterrupted run's, the control's) state files in the order each run first wrote them,
    paired in that order; else its own. Not placed: the --copy inputs (the fresh run has its own) and declared outputs that are no state
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
    # State files no name pairs, paired by the order each run first wrote them (what the runs did).
    clean_order, control_order = written
    unnamed_control = [p for p in control_order if p in theirs and not by_key.get(state_key(p))]
    unnamed_clean = [p for p in clean_order if p in ours and not their_by_key.get(state_key(p))]
    by_order = dict(zip(unnamed_control, unnamed_clean, strict=False))
    present, plan = set(ours), []
    landings: list[tuple[Path, Path]] = []  # a control's state file and the uninterrupted run's it lands on
    for key, sources in sorted(their_by_key.items()):
        targets = sorted(by_key.get(key, []))
        pairs = {s: by_order.get(s, s) for s in sources}
        if not set(sources) <= present and len(targets) == len(sources):
            pairs = dict(zip(sorted(sources), targets, strict=True))
        for source, target in sorted(pairs.items()):
            label, _, relative = source.partition("/")
            if not _given(source, target, keys, outputs, copies):
                continue
            target_label, _, target_relative = target.partition("/")
            origin = control[label] / relative
            plan.append(Placement(origin, target))
            if state_key(target) in keys and target in present:
                landings.append((origin, clean[target_label] / target_relative))
    # The size first: nothing unbounded is read, not even to compare it.
    size = sum(entry_size(p.source) for p in plan)
    if size > copy_budget(clean):
        return [], f"the control left {size >> 20} MiB, more than {MAX_BYTES_RATIO}x what the uninterrupted run did"
    if not any(not _same_bytes(origin, landing) for origin, landing in landings):
        return [], (
            "none of the control's state files lands on one of the uninterrupted run's with other bytes (a "
            "checkpoint deleted at the end, one kept under another name, or one the seed does not change)"
        )
    return plan, None


def first_written(activity, keys: frozenset[str]) -> list[str]:
    """A run's state files (of `keys`) in the order it first wrote them: what pairs two runs' checkpoints
    whose names tell nothing (check.file_activity's labelled paths)."""
    seen: dict[str, None] = {}
    for event in activity.writes():
        if state_key(event.path) in keys:
            seen.setdefault(event.path, None)
    return list(seen)


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
    output = target_label == "work" and any(under_output(target_relative, o) for o in outputs)
    return not output or state_key(source) in keys


def _copy_input(name: str, copies: list[str]) -> bool:
    """Whether a run's file ("<label>/<relative path>") is a --copy input or lies under one."""
    label, _, relative = name.partition("/")
    return label == "work" and relative.split("/", 1)[0] in copies


def copy_budget(clean: dict[str, Path]) -> int:
    """The most bytes of the control's copied: MAX_BYTES_RATIO times what the uninterrupted run left, and
    64 MiB more."""
    files = regular_files(clean)
    return MAX_BYTES_RATIO * sum(entry_size(clean[f.partition("/")[0]] / f.partition("/")[2]) for f in files) + (
        64 << 20
    )


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
    size = sum(entry_size(source) for source in sources)
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


def _same_bytes(a: Path, b: Path) -> bool:
    return sha256_regular(a) == sha256_regular(b)


SNAPSHOT_POLL_S = 0.01  # how often the control's saves are looked at while it runs
QUIET_S = 2 * MERGE_S  # a whole save then written nothing more for this long: copied (a save's last file closed)


class SwappedRestart:
    """The restart kind given the control's state: its hooks, which the conductor (check.session) calls in
    order: `plan` before the runs, `watch` while the control runs (its state copied after its last save but
    one), `start` in the control's slot once it ended, `evidence` for the verdict."""

    def __init__(self, conductor: Conductor):
        self.conductor = conductor
        self.run: Run | None = None
        self.note: str | None = "not run"  # why it tells nothing (None: a moved-weights restart made it needless)
        self.state: dict[str, Path] | None = None  # the control's directories after its last save but one
        self.after_saves = 0  # after how many of the control's saves to copy them (0: not copied)
        self.state_note = "not copied as it ran"  # why its finished state is given instead

    def plan(self, control: Run | None, stopped: Run) -> None:
        if control is None:
            self.note = "no control run's state to give a restart (--seed-env or --seed-arg)"
        elif self.conductor.slurm is None and stopped.state:  # (a SLURM job's files are not watched as it runs)
            control.state, control.save_keys = stopped.state, stopped.save_keys
            self.after_saves = max(1, stopped.clean_saves - 1)  # -1 (saves that follow the clock): 1

    def watch(self, control: Run, ended: threading.Event) -> None:
        """While the control runs: once it has saved its state as often as an uninterrupted run does but
        once, that save whole (every file of an uninterrupted run's save) and nothing written for QUIET_S, a
        copy of its directories, what the swapped restart is given. A finished run's state leaves a restart nothing to train (one that never loads its weights and
        exports a finished checkpoint as it finds it passed that way); this one leaves it the run's last
        stretch (little to train: the check costs little more). Where the control saved again during the
        copy, or ended first, nothing is kept, and its finished state is given (said)."""
        activity, keys, wanted, out = control.activity, control.state, self.after_saves, self.conductor.out
        counted_events, saves, written = -1, 0, []
        while not ended.wait(SNAPSHOT_POLL_S):
            if len(activity.events) != counted_events:  # looked through again only when something happened
                counted_events = len(activity.events)
                found = activity.saves(state=keys)
                saves = len(found)
                written = [e for e in activity.writes() if state_key(e.path) in keys]
            if saves > wanted:
                self.state_note = "it saved again before its state could be copied"
                return
            now = time.perf_counter()
            if saves < wanted or not written or now - written[-1].at < QUIET_S:
                continue
            if not found[-1].is_whole(control.save_keys):  # a checkpoint folder still being filled
                continue
            into = {label: out / "snapshot" / "control" / label for label in activity.places}
            before = state_files(activity.places, keys)
            why_not = copy_places(out, activity.places, into, self.conductor.clean[0])
            if why_not is None and state_files(activity.places, keys) != before:  # the copy may mix two saves
                why_not = "it saved again while its state was being copied"
            if why_not is None:
                self.state = into
            else:
                self.state_note = f"its state was not copied as it ran: {why_not}"
            return
        self.state_note = "it ended before its last save but one was seen"

    def start(self, control: Run) -> None:
        """After the control, in its slot: the command restarted in a fresh directory holding what the control
        left (its outputs apart), under the uninterrupted run's names, with the uninterrupted run's seed:
        whether a restart continues from the state it finds."""
        conductor = self.conductor
        clean = conductor.clean[0]
        if control.exit != 0 or clean.activity is None or control.activity is None:
            self.note = "the control run did not end well"
            return
        copies = [Path(c).name for c in conductor.options.copy]
        given = self.state or control.activity.places
        keys = clean.activity.state_keys()
        written = (first_written(clean.activity, keys), first_written(control.activity, control.activity.state_keys()))
        plan, why_not = plan_swap(clean.activity.places, given, keys, conductor.outputs, copies, written)
        if not plan:
            self.note = why_not
            return
        swapped = conductor.new_run("swapped")
        if EvidenceDirs.of(conductor.out).replaced is not None:
            self.note = "its directories were replaced by the command (see the verdict)"
            return
        try:
            place(plan, swapped.activity.places)
        except OSError as exc:  # a name taken twice, a link on the way: never written through, no traceback
            self.note = one_line(f"the control's files could not be placed ({exc.strerror or exc})")
            return
        when = "after its last save but one" if self.state else f"at its end: {self.state_note}"
        conductor.echo(
            one_line(f"  swapped: {' '.join(swapped.command)} (in the control's {counted(len(plan), 'file')}, {when})")
        )
        conductor.execute(swapped, [], conductor.limit, conductor.result.get("launcher", {}).get("jobs", {}))
        self.run = swapped

    def evidence(self) -> SwapEvidence:
        """What it told: the uninterrupted run's outputs it wrote bit for bit (it did not continue from the
        state it found), or why it tells nothing; outputs that differ add no claim (see above)."""
        conductor, swapped, last_but_one = self.conductor, self.run, self.state is not None
        if swapped is None:
            return SwapEvidence(note=self.note, not_needed=self.note is None)
        if swapped.exit != 0:
            return SwapEvidence(note=f"it failed ({failure_line(swapped)})")
        clean = conductor.clean[0]
        comparison = compare_outputs(clean.work, swapped.work, conductor.outputs, conductor.ignore, explain=False)
        written = outputs_written(swapped, comparison)  # an output placed with the control's files shows nothing
        conductor.result["comparisons"]["swap"] = {"run": "swapped", "against": clean.name, **comparison}
        if not written:
            return SwapEvidence(note="it wrote no declared output")
        if all(f["same"] for f in written):
            return SwapEvidence(same_files=tuple(f["path"] for f in written), from_last_save_but_one=last_but_one)
        if trained_nothing(clean, swapped):
            # Given a finished run's state, a restart that begins again unrecorded and one that resumes both
            # have nothing left to train: other outputs show nothing.
            state = (
                "its state after its last save but one"
                if last_but_one
                else "its finished state: nothing was left to train"
            )
            return SwapEvidence(note=f"the restart given the control's state made no update ({state})")
        return SwapEvidence()


def copy_places(out: Path, places: dict[str, Path], into: dict[str, Path], clean: Run) -> str | None:
    """A run's directories copied into check's own (made first, never through a link), within the budget an
    uninterrupted run's size sets; why not, where they could not be."""
    try:
        for directory in into.values():
            EvidenceDirs.of(out).make(directory)
        return snapshot(places, into, copy_budget(clean.activity.places))
    except (DirectoryReplaced, OSError) as exc:
        return one_line(f"its files could not be copied ({getattr(exc, 'strerror', None) or exc})")
