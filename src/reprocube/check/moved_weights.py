"""Whether a restart uses the weights it reads: `reprocube check`'s moved-weights restarts.

A restart that reads its step (and seed) from its checkpoint, throws the weights away and trains the steps
before again without recording them ends with the same bits as one that resumed, and so does one that
restores only some of its checkpoints (rounds 7 and 8). What tells them apart is what the adversarial rounds
did by hand: the stopped run's directories as they were after a stop (copied then), given to one more
restart in a fresh directory with the weights moved (each value plus one: finite, so a script that refuses
non-finite weights takes them; formats.moved_tensors). Which tensors are the weights: with the probe,
those whose fingerprint is one the probe recorded of a tensor as training had made it (trained_fingerprints:
a learning rate, a loss history or statistics saved beside them stay as they were, since moving them
changes a restart that trains again too); without it, every floating-point tensor of the state files.

- It wrote the uninterrupted run's outputs bit for bit: nothing moved reached them; it never used those
  weights (not-proven).
- Its first recorded update's loss, computed from the weights before the update, is not the uninterrupted
  run's (where only the weights were moved): it used them, and is ended there (first_update_rule).
- Its first update is the uninterrupted run's first, where the stopped run's restart from the same state
  resumed: it refused the state (a checksum no one else can make again): that tells nothing.
Outputs that merely differ claim nothing (a restart that trains again writes other outputs where a loss
history it read back was moved)."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from reprocube.analysis.outputs import compare_outputs
from reprocube.analysis.probe_trace import AttemptTrace, read_trace
from reprocube.check.evidence import MovedEvidence, MovedRestart
from reprocube.check.evidence_dirs import EvidenceDirs
from reprocube.check.file_activity import state_key
from reprocube.check.runs import Run, Stop, outputs_written
from reprocube.check.slots import Conductor
from reprocube.check.swapped_restart import copy_places, place, plan_restart
from reprocube.errors import CheckpointError
from reprocube.formats.checkpoint_formats import move_by_one
from reprocube.formats.moved_tensors import file_digests, reseal
from reprocube.probe_fingerprints import array_fingerprint
from reprocube.terminal import one_line

MAX_MOVED_STOPS = 10  # the last stops whose state is given moved (with the probe: each costs a start-up)
UNREADABLE_LOOKS = 50  # how often a trace that cannot be read is looked at again


@dataclass
class MovedWeightsRestart:
    """One restart given the stopped run's state after its stop number `stop`, weights moved."""

    stop: int
    ready: threading.Event = field(default_factory=threading.Event)  # the copy was made, or never will be
    state: dict[str, Path] | None = None  # the stopped run's directories, copied after the stop
    run: Run | None = None
    note: str = "not run"  # why it tells nothing, where it does not
    moved: list[str] = field(default_factory=list)  # the files whose weights were moved
    unmoved: list[str] = field(default_factory=list)
    weights_only: bool = False  # only the tensors the probe records were moved (found by fingerprint)
    used: str | None = None  # what its first update showed where it used the weights (it was ended there)
    began_again: bool = False  # its first update was the uninterrupted run's first (it was ended there)
    never_used: list[str] = field(default_factory=list)  # outputs it wrote as the uninterrupted run did
    unreadable: str | None = None  # the first file whose tensors could not be read or moved, and why
    restart_first: tuple | None = None  # the stopped run's restart's first update, once seen (it is final)

    @property
    def name(self) -> str:
        return f"moved-{self.stop}"


def trained_fingerprints(trace: AttemptTrace | None) -> frozenset[int]:
    """The fingerprints a probe trace recorded of tensors as training had made them: each tensor's, but the
    one it had at the first step (a buffer kept fixed, frozen statistics, a zero bias, a layer not yet
    unfrozen are no weight a restart trains on: round 8's G11, G12, G15), never 0 (every all-zero tensor
    has it). Empty without a trace."""
    columns = zip(*(update.fingerprints for _, update in trace.updates), strict=True) if trace else []
    return frozenset(f for column in columns for f in column if f != column[0]) - {0}


def tensor_fingerprints(array) -> set[int]:
    """A checkpoint tensor's probe fingerprint, and its float32 copy's where it is wider or narrower (float32
    weights saved as float64: round 8's G14)."""
    found = {array_fingerprint(array)}
    if array.dtype.kind == "f" and array.dtype.itemsize != 4:
        with contextlib.suppress(ValueError, TypeError, OverflowError):
            found.add(array_fingerprint(array.astype("float32")))
    if array.dtype == "float32":  # float32 master weights of a half-precision model (round 9's H4)
        for half in _HALF_DTYPES:
            with contextlib.suppress(ValueError, TypeError, OverflowError):
                found.add(array_fingerprint(array.astype(half)))
    return found


def _half_dtypes() -> list:
    import numpy as np

    dtypes = [np.dtype("float16")]
    with contextlib.suppress(ImportError):
        import ml_dtypes

        dtypes.append(np.dtype(ml_dtypes.bfloat16))
    return dtypes


_HALF_DTYPES = _half_dtypes()


def move_weights(
    restart: MovedWeightsRestart, files: dict[str, Path], originals: dict[str, Path], chosen: Callable | None
) -> None:
    """The tensors of `files` (the restart's, by name) that `chosen` accepts (all, where None) moved by one:
    restart.moved, where any was; restart.unmoved, the others. A checksum of a moved file kept in another (a
    sidecar, a manifest) is made again, as the script's own save would (round 8's G3, G8); `originals`: each
    file as it was (the stopped run's copy)."""
    restart.moved, restart.unmoved, digests = [], [], {}
    for name, path in files.items():
        try:
            count = move_by_one(path, chosen)
        except (CheckpointError, OSError) as exc:
            restart.unreadable = restart.unreadable or f"{name}: {exc}"
            count = None
        (restart.moved if count else restart.unmoved).append(name)
        if count:
            digests.update(zip(file_digests(originals[name]), file_digests(path), strict=False))
    if digests:
        for path in files.values():
            with contextlib.suppress(OSError):
                reseal(path, digests)


def first_update_rule(restart: MovedWeightsRestart, clean: Run, stopped: Run) -> Callable[[], bool]:
    """The restart's stop (check's own, polled): due once its first recorded update tells something, and
    then it need not run on (the check is spared the rest of its run):
    - it began again: its first update is the uninterrupted run's first, where the stopped run's restart
      from the same state made another (it refused the state: restart.began_again);
    - where only the weights were moved: its loss, computed from the weights before the update, is not the
      first loss of the stopped run's restart from the same state (restart.used): the two first updates
      set against each other, never a step label against the uninterrupted run's.
    Decided on its first update (the traces read again at each poll until then)."""
    traces: dict[str, AttemptTrace | None] = {}
    looks = UNREADABLE_LOOKS

    def first(trace: AttemptTrace | None):
        return trace.updates[0] if trace is not None and trace.updates else None

    def due() -> bool:
        nonlocal looks
        if looks <= 0 or restart.run is None:
            return False
        try:
            if traces.get("clean") is None:
                traces["clean"] = read_trace(clean.probe_trace(1))
            trace = read_trace(restart.run.probe_trace(1))
            if restart.restart_first is None:  # read until its first update is there, then kept
                resumed = read_trace(stopped.probe_trace(restart.stop + 1))
                if first(resumed) is not None:
                    restart.restart_first = (_first_step(resumed), first(resumed)[1])
        except CheckpointError:  # a line half written, or a trace that is not one
            looks -= 1
            return False
        clean_trace, made = traces["clean"], first(trace)
        if made is None or first(clean_trace) is None or restart.restart_first is None:
            return False
        looks = 0  # decided on this update, whatever it shows
        (_, update), (_, clean_first) = made, first(clean_trace)
        given, (restart_step, restart_first) = _first_step(trace), restart.restart_first
        if update == clean_first and restart_first != clean_first:
            restart.began_again = True
            restart.note = (
                "it began again at step 1 (the probe) where the stopped run's restart from that state did not: it "
                "refused the state it was given (a checksum, a check of its weights), so this cannot tell"
            )
            return True
        if given != restart_step:  # a step one names and the other does not counts as another
            restart.note = (
                f"its first update was {_step(given)}, the stopped run's restart from that state made "
                f"{_step(restart_step)}: in another directory it took another path (a run told apart by its "
                "directory), so this cannot tell"
            )
            return True
        if not restart.weights_only or restart_first.loss == update.loss:  # every float moved: a loss tells nothing
            return False
        # Set against the stopped run's own restart from the same state, update for update: no step label is
        # read (a script's labels can be off: round 10), and the same state gives the same first loss.
        at = f" (step {given})" if given is not None else ""
        restart.used = f"another loss at its first update{at} than the stopped run's restart from that state"
        return True

    return due


def _read_before_written(run: Run, names: set[str]) -> set[str]:
    """Which of `names` the run read before it first wrote them: a read after its own write is no read of
    what it was given (check's watcher looks at each file written, and inotify reports that too: H13)."""
    read, written = set(), set()
    for event in list(run.activity.events) if run.activity else []:
        if event.kind == "write":
            written.add(event.path)
        elif event.kind == "read" and event.path in names and event.path not in written:
            read.add(event.path)
    return read


def _step(step: int | None) -> str:
    return f"step {step}" if step is not None else "a step the probe does not name"


def _first_step(trace: AttemptTrace) -> int | None:
    """The step of an attempt's first update, where the probe names it: the step the script gave, or one past
    where it said it resumed."""
    given = trace.updates[0][0]
    return given if given is not None else None if trace.resumed is None else trace.resumed + 1


def judge(restart: MovedWeightsRestart, clean: Run, outputs: list[str], ignore: list[str]) -> dict | None:
    """After the restart ran: restart.never_used (the declared outputs it wrote, each the uninterrupted
    run's bit for bit) or restart.note (why it tells nothing), where its first update did not decide; the
    comparison of its outputs, where they were compared."""
    run = restart.run
    if run is None or restart.used or restart.began_again or run.stops_landed:  # decided at its first update
        return None
    if run.exit is None:
        seconds = run.attempts[-1].seconds if run.attempts else 0.0
        restart.note = f"it neither told anything by its first update nor ended within {seconds:.0f} s (ended by check)"
        return None
    if run.exit != 0:
        restart.note = f"it failed, as one that refuses changed weights may ({run.name} exited {run.exit})"
        return None
    comparison = compare_outputs(clean.work, run.work, outputs, ignore, explain=False)
    written = outputs_written(run, comparison)
    read = _read_before_written(run, set(restart.moved))
    if not written:
        restart.note = "it wrote no declared output"
    elif not read & set(restart.moved):  # it read its state elsewhere (round 9's H2, H3)
        restart.note = (
            f"it read none of the files whose weights were moved ({', '.join(restart.moved[:3])}) before writing "
            "them: it took its state from elsewhere (another file, a path kept in its checkpoint) or never read "
            "its weights (a replay), so this cannot tell"
        )
    elif all(f["same"] for f in written):
        restart.never_used = [f["path"] for f in written]
    else:  # a moved loss history read back does this too: only the first update tells
        restart.note = "it wrote other outputs, which a value read back beside the weights can explain"
    return {"run": run.name, "against": clean.name, **comparison}


MOVED_TIME, MOVED_SLACK_S = 2.0, 30.0  # a moved-weights restart's time: at most this x a clean run's, and this


class MovedWeightsRestarts:
    """The restart kind given the stopped run's state after a stop, its weights moved by one: its hooks, which
    the conductor (check.session) calls in order: `plan` before the runs, `after_stop` after each of the
    stopped run's stops (its directories copied), `stopped_ended` once that run ended, `start` in a slot
    after it, `evidence` for the verdict."""

    def __init__(self, conductor: Conductor):
        self.conductor = conductor
        self.restarts: list[MovedWeightsRestart] = []  # one per stop whose state is given, weights moved
        self.weights: frozenset[int] = frozenset()  # the trained weights' fingerprints (the probe's), if any
        self.note = "not run"  # why there are none
        self.ended = threading.Event()  # the stopped run ended: the restarts start only then

    def plan(self, stops: int, stopped: Run) -> bool:
        """Which stops' states are given (with the probe, the last MAX_MOVED_STOPS: a restart that used its
        weights is ended at its first update; without it, the last stop's alone, which runs to its end);
        whether any is."""
        if self.conductor.slurm is not None:
            self.note = "a SLURM job's directories are not copied at its stops"
        elif not stopped.state:
            self.note = "the uninterrupted run saved no file as it went (no state to move)"
        else:
            self.weights = trained_fingerprints(_clean_trace(self.conductor.clean[0]))
            given = range(max(1, stops - MAX_MOVED_STOPS + 1), stops + 1) if self.weights else [stops]
            self.restarts = [MovedWeightsRestart(stop) for stop in given]
        return bool(self.restarts)

    def after_stop(self, stopped: Run) -> None:
        """After a stop whose state a restart is given, its processes all gone: a copy of the stopped run's
        directories, what its next attempt finds (snapshot/stopped-N/)."""
        landed = len(stopped.attempts)
        restart = next((r for r in self.restarts if r.stop == landed), None)
        if restart is None:
            return
        out = self.conductor.out
        into = {label: out / "snapshot" / f"stopped-{landed}" / label for label in stopped.activity.places}
        why_not = copy_places(out, stopped.activity.places, into, self.conductor.clean[0])
        if why_not is None:
            restart.state = into
        else:
            restart.note = f"the stopped run's state at stop {landed} was not copied: {why_not}"
        restart.ready.set()

    def stopped_ended(self) -> None:
        """Whatever came of its stops: the restarts wait no longer."""
        self.ended.set()
        for restart in self.restarts:
            if not restart.ready.is_set():
                restart.note = f"the stopped run's stop {restart.stop} did not land"
                restart.ready.set()

    def start(self) -> None:
        """Once the stopped run has ended (its outputs recorded: one that writes where a path kept in its
        checkpoint says cannot change them unseen, round 9's H16), the last stop's first; none after one that
        never used its weights (no pass then)."""
        conductor = self.conductor
        self.ended.wait()
        for restart in reversed(self.restarts):
            restart.ready.wait()
            self._restart(restart)
            comparison = judge(restart, conductor.clean[0], conductor.outputs, conductor.ignore)
            if comparison is not None:
                conductor.result["comparisons"][restart.name] = comparison
            if restart.never_used:
                break

    def told(self) -> bool:
        """Whether one showed whether its weights were used (the swapped restart is then needless)."""
        return any(r.used or r.never_used for r in self.restarts)

    def runs(self) -> list[Run]:
        return [r.run for r in self.restarts if r.run is not None]

    def evidence(self) -> MovedEvidence:
        restarts = tuple(
            MovedRestart(
                stop=r.stop,
                name=r.name,
                moved=tuple(r.moved),
                weights_only=r.weights_only,
                used=r.used,
                never_used=tuple(r.never_used),
                note=r.note,
            )
            for r in self.restarts
        )
        return MovedEvidence(restarts=restarts, note=self.note)

    def _restart(self, restart: MovedWeightsRestart) -> None:
        """The command restarted once more in a fresh directory holding the stopped run's files as they were
        after `restart.stop` (all but its --copy inputs), its weights moved, with the stopped run's seed."""
        conductor = self.conductor
        if restart.state is None:
            return
        clean = conductor.clean[0]
        plan = plan_restart(restart.state, [Path(c).name for c in conductor.options.copy])
        run = conductor.new_run(restart.name)
        if EvidenceDirs.of(conductor.out).replaced is not None:
            restart.note = "its directories were replaced by the command (see the verdict)"
            return
        try:
            place(plan, run.activity.places)
        except OSError as exc:
            restart.note = one_line(f"the stopped run's files could not be placed ({exc.strerror or exc})")
            return
        places = run.activity.places
        files = {p.target: places[p.target.partition("/")[0]] / p.target.partition("/")[2] for p in plan}
        if not self._move(restart, files, {p.target: p.source for p in plan}, clean):
            return
        conductor.echo(
            one_line(
                f"  {restart.name}: {' '.join(run.command)} (in the stopped run's files after stop {restart.stop}, "
                f"weights moved by one in {', '.join(restart.moved[:3])})"
            )
        )
        restart.run = run
        until = first_update_rule(restart, clean, conductor.stopped)
        # A restart from a stop trains less than an uninterrupted run: bounded by that run's time, and some,
        # not by the watchdog's (moved weights can keep a solver or a retry loop from ever returning: H12).
        limit = min(conductor.limit, MOVED_TIME * clean.attempts[-1].seconds + MOVED_SLACK_S)
        conductor.execute(run, [Stop(until=until, ends_run=True)], limit, {})

    def _move(
        self, restart: MovedWeightsRestart, files: dict[str, Path], originals: dict[str, Path], clean: Run
    ) -> bool:
        """The weights moved in the placed files: with the probe, the tensors whose fingerprints it recorded
        as trained, wherever they are; without it, every floating-point tensor of the state files (a first
        loss then tells nothing). Whether any was; restart.note says why not."""
        weights = self.weights
        if weights:
            move_weights(restart, files, originals, lambda array: tensor_fingerprints(array) & weights)
            restart.weights_only = bool(restart.moved)
            if not restart.moved:
                unreadable = f"; {restart.unreadable}" if restart.unreadable else ""
                restart.note = one_line(
                    "no tensor in a file check can move (.npy, .npz, safetensors, torch.save's tensors) has a "
                    "fingerprint the probe recorded of a trained weight (the probe not called at the step it "
                    "saved, the weights kept as one flat vector or in another layout, a NumPy array inside a "
                    f"torch.save pickle, state under a --copy directory){unreadable}"
                )
                return False
        else:
            keys = clean.activity.state_keys()
            move_weights(restart, {n: p for n, p in files.items() if state_key(n) in keys}, originals, None)
        if not restart.moved:
            restart.note = (
                "no state file holds floating-point tensors in a format check can move (.npy, .npz, "
                f"safetensors, torch.save's zip): {', '.join(restart.unmoved[:3]) or 'none placed'}"
            )
        return bool(restart.moved)


def _clean_trace(clean: Run) -> AttemptTrace | None:
    """clean-1's probe trace (rank 0), None without one or where it cannot be read."""
    try:
        return read_trace(clean.probe_trace(1))
    except CheckpointError:
        return None
