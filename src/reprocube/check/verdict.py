"""`reprocube check`'s verdict: a pure function of the Evidence (check.evidence), through an ordered table of
named rules. The first rule that speaks decides; None from every rule means the stage told nothing yet and
the check goes on. No rule reads a file or starts a process, so each is tested by a record built by hand
(tests/check/test_verdict_table.py). The words of each verdict are the named templates below the rules.

What a verdict may claim: only what was compared. Every pass names what it did not check; every rule that
calls a difference resume's own first rules out what else could have made it (non-determinism, state
another run left, a stop that proved nothing)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from reprocube.check.evidence import Evidence, MovedRestart
from reprocube.check.verdict_words import (
    AGREEING,
    BEFORE_STOPS,
    CHANGED_AFTER,
    CONTROL_SAME,
    CONTROL_VOID,
    DURING_SAVE_MISSED,
    LINKED_OUTPUT,
    MOMENTS,
    MOVED_NEVER_USED,
    MOVED_NOT_SHOWN,
    NO_STOP_LANDED,
    NO_WAIT,
    NOT_DETERMINISTIC,
    NOTHING_TIES,
    OUTSIDE,
    OUTSIDE_NOT_CHECKED,
    OWN_VALUE,
    PER_PROCESS,
    QUICK_ONE,
    RARER,
    RARER_CHECKED,
    REMOVED_OUTPUT,
    REPLAY_AFTER_MOVED,
    REPLAY_NOT_CHECKED,
    SAVE_INTERRUPTED,
    SAVE_SURVIVED,
    SHARED_ELSEWHERE,
    SUSPECTS,
    SWAP,
    SWAP_NOT_SHOWN,
    TRAINER_SAID,
    UNCOMPARABLE,
    UNCONFIRMED,
    UNWRITTEN,
    VOID_STOPS,
    WAITED,
)
from reprocube.results.check_result import VERDICTS
from reprocube.terminal import counted


@dataclass(frozen=True)
class Verdict:
    name: str  # one of results.check_result.VERDICTS
    stage: str  # where it was decided: repeat, control, stopped, resume, swap, moved-weights, outside, ...
    summary: str  # the verdict in words (check.json's summary is "NAME: summary")
    rule: str  # the rule that gave it
    not_checked: tuple[str, ...] = ()  # lines this verdict adds to the evidence's not-checked ones

    @property
    def exit_status(self) -> int:
        return VERDICTS[self.name]


Rule = Callable[[Evidence], Verdict | None]
RULES: list[tuple[str, Rule]] = []


def rule(function: Rule) -> Rule:
    """A rule of the table, in the order of definition; its name is the function's."""
    RULES.append((function.__name__, function))
    return function


def decide(evidence: Evidence) -> Verdict | None:
    """The first rule's verdict, or None: nothing decided yet (the check goes on to its next stage)."""
    for name, check in RULES:
        verdict = check(evidence)
        if verdict is not None:
            return Verdict(verdict.name, verdict.stage, verdict.summary, name, verdict.not_checked)
    return None


def _v(name: str, stage: str, summary: str, not_checked: tuple[str, ...] = ()) -> Verdict:
    return Verdict(name, stage, summary, "", not_checked)


def stage_of(ev: Evidence) -> str:
    """The stage the evidence has reached: where a verdict about the whole check (directories replaced,
    outputs changed after a run ended) is said to be decided."""
    if ev.reached is not None:
        return ev.reached
    if ev.control is not None:
        return "control"
    if ev.stopped is not None or ev.no_saves is not None:
        return "stopped"
    return "repeat"


# --- the clean runs: they must run, write what was declared and agree ------------------------------------
@rule
def directories_replaced(ev: Evidence) -> Verdict | None:
    return _v("command-failed", stage_of(ev), ev.replaced) if ev.replaced else None


@rule
def clean_run_failed(ev: Evidence) -> Verdict | None:
    failed = ev.repeat and ev.repeat.failed
    return _v("command-failed", failed[0], failed[1]) if failed else None


@rule
def output_under_link(ev: Evidence) -> Verdict | None:
    linked = ev.repeat and ev.repeat.linked_output
    return _v("command-failed", "clean-1", LINKED_OUTPUT.format(linked=linked)) if linked else None


@rule
def output_removed(ev: Evidence) -> Verdict | None:
    gone = ev.repeat and ev.repeat.removed_output
    return _v("state-leaked", "repeat", REMOVED_OUTPUT.format(output=gone)) if gone else None


@rule
def output_unwritten(ev: Evidence) -> Verdict | None:
    unwritten = ev.repeat.unwritten if ev.repeat else ()
    if not unwritten:
        return None
    nor = f" (nor {', '.join(unwritten[1:])})" if len(unwritten) > 1 else ""
    return _v("command-failed", "clean-1", UNWRITTEN.format(output=unwritten[0], nor=nor))


@rule
def outputs_uncomparable(ev: Evidence) -> Verdict | None:
    run = ev.repeat and ev.repeat.uncomparable
    return _v("command-failed", run, UNCOMPARABLE) if run else None


@rule
def clean_runs_leaked(ev: Evidence) -> Verdict | None:
    repeat = ev.repeat
    if repeat is None or not repeat.leaked:
        return None
    return _v("state-leaked", "repeat", f"{repeat.leaked}; resume was not tested")


@rule
def clean_runs_differ_in_own_value(ev: Evidence) -> Verdict | None:
    """The only difference is a value check sets per run (its HOME, its TMPDIR): named, never the suspects."""
    repeat = ev.repeat
    if repeat is None or not repeat.differs or not repeat.own_value:
        return None
    return _v("not-deterministic", "repeat", OWN_VALUE.format(where=repeat.differs, value=repeat.own_value))


@rule
def clean_runs_shared_elsewhere(ev: Evidence) -> Verdict | None:
    """Runs at once that keep no checkpoint in their own directories may have shared one elsewhere (a fixed
    path): their disagreement does not show non-determinism."""
    repeat = ev.repeat
    if repeat is None or not repeat.differs or not (ev.jobs > 1 and repeat.shared_elsewhere):
        return None
    return _v("not-resumed", "repeat", SHARED_ELSEWHERE.format(where=repeat.differs))


@rule
def clean_runs_differ(ev: Evidence) -> Verdict | None:
    repeat = ev.repeat
    if repeat is None or not repeat.differs:
        return None
    return _v("not-deterministic", "repeat", NOT_DETERMINISTIC.format(where=repeat.differs, suspects=SUSPECTS))


@rule
def receipt_refused(ev: Evidence) -> Verdict | None:
    refused = ev.repeat and ev.repeat.receipt_refused
    return _v("command-failed", "receipt", refused) if refused else None


@rule
def nothing_saved_as_it_went(ev: Evidence) -> Verdict | None:
    return _v("not-resumed", "stopped", ev.no_saves) if ev.no_saves else None


# --- the outputs of a finished run changed, and the negative control -------------------------------------
@rule
def outputs_changed_after_run(ev: Evidence) -> Verdict | None:
    if ev.changed_after is None:
        return None
    run, changed, restart_copy = ev.changed_after
    how = " (a restart given a copy of its state, following a path kept in the checkpoint?)" if restart_copy else ""
    return _v("state-leaked", stage_of(ev), CHANGED_AFTER.format(run=run, changed=changed, how=how))


@rule
def control_failed(ev: Evidence) -> Verdict | None:
    failed = ev.control and ev.control.failed
    return _v("command-failed", "control", failed) if failed else None


@rule
def control_same(ev: Evidence) -> Verdict | None:
    """A run with another seed must write other outputs: else their agreement proves nothing."""
    control = ev.control
    if control is None or not control.identical:
        return None
    if control.leaked:
        return _v("state-leaked", "control", f"{CONTROL_SAME}{control.leaked}")
    return _v("control-void", "control", f"{CONTROL_SAME}{CONTROL_VOID}")


# --- the stopped run: what its stops proved ------------------------------------------------------------
@rule
def save_interrupted(ev: Evidence) -> Verdict | None:
    s = ev.stopped
    if s is None or not s.failed or not s.interrupted_saves:
        return None
    return _v(
        "save-interrupted", "stopped", SAVE_INTERRUPTED.format(where="; ".join(s.interrupted_saves), failed=s.failed)
    )


@rule
def stopped_run_failed(ev: Evidence) -> Verdict | None:
    s = ev.stopped
    if s is None or not s.failed:
        return None
    return _v("command-failed", "stopped", f"after {counted(s.landed, 'stop')}: {s.failed}")


@rule
def no_stop_landed(ev: Evidence) -> Verdict | None:
    s = ev.stopped
    if s is None or s.landed:
        return None
    if s.leaked:
        return _v("state-leaked", "stopped", f"its first attempt ended before its stop: {s.leaked}")
    return _v("no-stop-landed", "stopped", NO_STOP_LANDED)


@rule
def departs_before_stops(ev: Evidence) -> Verdict | None:
    s = ev.stopped
    if s is None or not s.before_stops:
        return None
    runs = ev.uninterrupted
    agreeing = AGREEING.format(runs=counted(runs, "agreeing uninterrupted run")) if runs > 1 else QUICK_ONE
    return _v(
        "not-deterministic", "resume", BEFORE_STOPS.format(where=s.before_stops, agreeing=agreeing, suspects=SUSPECTS)
    )


@rule
def restored_from_elsewhere(ev: Evidence) -> Verdict | None:
    """The probe says a restart resumed; its own files say not from its own checkpoint."""
    s = ev.stopped
    elsewhere = [e for e in s.stops if e.get("elsewhere")] if s else []
    if not elsewhere:
        return None
    named = "; ".join(f"stop {e['stop']}: {e['how']}" for e in elsewhere)
    what = "" if _nothing_differs(ev) else " What differs is not shown to be resume's."
    return _v("state-leaked", "resume", f"{_restarts(ev)}: {named}.{what}")


@rule
def differs_per_process(ev: Evidence) -> Verdict | None:
    """A difference after a restart that more uninterrupted runs show too: the script is not deterministic
    from one process to the next (set order under hash randomisation), not resume's doing."""
    s = ev.stopped
    if s is None or _nothing_differs(ev) or not s.per_process_differs:
        return None
    if s.own_value:  # only where each run ran: named, never the suspects
        return _v("not-deterministic", "resume", OWN_VALUE.format(where=s.per_process_differs, value=s.own_value))
    return _v(
        "not-deterministic",
        "resume",
        PER_PROCESS.format(runs=counted(s.more_clean_runs, "more uninterrupted run"), where=s.per_process_differs),
    )


@rule
def differs_with_no_run_to_tell(ev: Evidence) -> Verdict | None:
    """--quick made one uninterrupted run: a difference is resume's only where a further one agreed with the
    first; where every one of them failed, nothing tells the process's own non-determinism from resume's."""
    s = ev.stopped
    if s is None or _nothing_differs(ev) or ev.uninterrupted > 1 or s.more_clean_runs or not s.more_clean_runs_failed:
        return None
    text = UNCONFIRMED.format(restarts=_restarts(ev), found=_found(ev), failed=s.more_clean_runs_failed)
    return _v("command-failed", "resume", text)


@rule
def differs_but_no_resume_shown(ev: Evidence) -> Verdict | None:
    """No restart was shown to resume, nor read a checkpoint: nothing ties the difference to a resume."""
    s = ev.stopped
    if s is None or _nothing_differs(ev) or s.trace_differs:
        return None
    if any(e["effective"] or e.get("read") for e in s.stops):
        return None
    named = "; ".join(f"stop {e['stop']}: {e['how']}" for e in s.stops)
    return _v("not-resumed", "resume", NOTHING_TIES.format(restarts=_restarts(ev), named=named, found=_found(ev)))


@rule
def resume_differs(ev: Evidence) -> Verdict | None:
    s = ev.stopped
    if s is None or _nothing_differs(ev):
        return None
    through = f" up to step {s.more_clean_runs_through}, the first that differs" if s.more_clean_runs_through else ""
    rarer = RARER_CHECKED.format(through=through) if s.more_clean_runs else RARER
    said = "".join(f". {TRAINER_SAID.format(said=words)}" for words in s.trainer_said)
    during = "".join(f" ({where}: the restart took what it left)" for where in s.interrupted_saves)
    return _v("resume-differs", "resume", f"{_restarts(ev)}{during}, {_found(ev)}. {rarer}{said}")


@rule
def stops_proved_nothing(ev: Evidence) -> Verdict | None:
    s = ev.stopped
    void = [e for e in s.stops if not e["effective"]] if s else []
    if not void:
        return None
    named = "; ".join(f"stop {e['stop']}: {e['how']}" for e in void)
    return _v("not-resumed", "resume", VOID_STOPS.format(restarts=_restarts(ev), named=named))


@rule
def same_but_unproven(ev: Evidence) -> Verdict | None:
    s = ev.stopped
    if s is None or not s.unproven:
        return None
    return _v("not-proven", "resume", f"{_same(ev)}, but the resume is not proven: {'; '.join(s.unproven)}")


@rule
def swapped_restart_ignored_state(ev: Evidence) -> Verdict | None:
    """A restart given another seed's state wrote the uninterrupted run's outputs: it did not continue."""
    if not _restarts_gathered(ev) or not ev.swap.same_files:
        return None
    when = "after its last save but one" if ev.swap.from_last_save_but_one else "when it ended"
    files = ", ".join(ev.swap.same_files[:3])
    return _v("not-proven", "swap", f"{_same(ev)}, but the resume is not proven: {SWAP.format(when=when, files=files)}")


@rule
def moved_weights_never_used(ev: Evidence) -> Verdict | None:
    """A restart given this run's state with its weights moved by one wrote the uninterrupted run's outputs."""
    caught = next((r for r in _moved(ev) if r.never_used), None)
    if not _restarts_gathered(ev) or caught is None:
        return None
    what = "weights" if caught.weights_only else "floating-point values"
    text = MOVED_NEVER_USED.format(
        stop=caught.stop,
        what=what,
        moved=", ".join(caught.moved[:3]),
        outputs=", ".join(caught.never_used[:3]),
        log=caught.name,
    )
    return _v("not-proven", "moved-weights", f"{_same(ev)}, but the resume is not proven: {text}", _swap_lines(ev))


@rule
def wrote_beside_runs(ev: Evidence) -> Verdict | None:
    if not _restarts_gathered(ev) or not ev.written_beside:
        return None
    text = OUTSIDE.format(same=_same(ev), where=", ".join(ev.written_beside[:3]))
    return _v("state-leaked", "outside", text, _swap_lines(ev))


@rule
def resume_exact(ev: Evidence) -> Verdict | None:
    """Every stop effective, all compared the same, no restart told otherwise: the pass, naming the rest."""
    s = ev.stopped
    if not _restarts_gathered(ev):
        return None
    added = (*_swap_lines(ev), OUTSIDE_NOT_CHECKED, *_moved_lines(ev), *_wait_lines(ev))
    not_checked = (*ev.not_checked, *added)
    how = "; ".join(f"stop {e['stop']}: {e['how']}" for e in s.stops)
    more = f" and {counted(len(not_checked) - 1, 'more item')}" if len(not_checked) > 1 else ""
    saves = f" of the uninterrupted run's {s.clean_saves}" if s.clean_saves > 0 else ""
    first = "first save" if s.planned == 1 else f"first {s.planned} saves"
    moments = MOMENTS.format(first=first, of=saves) if s.stops_after_first_save else ""
    moments += "".join(f"; {SAVE_SURVIVED.format(where=where)}" for where in s.interrupted_saves)
    if s.during_save_missed:
        stops = f"stop{'s' if len(s.during_save_missed) > 1 else ''} {', '.join(map(str, s.during_save_missed))}"
        moments += f"; {DURING_SAVE_MISSED.format(stops=stops)}"
    summary = (
        f"stopped {counted(s.landed, 'time')} by {s.how} and restarted, every stop effective ({how}); every "
        f"declared output is {s.identical_words}{_updates_words(ev)}{_moved_shown(ev)}{_caveat(ev)}{moments}; not "
        f"checked: {not_checked[0]}{more} (check.md)"
    )
    return _v("resume-exact", "resume", summary, added)


# --- what the conductor asks before it believes a difference ----------------------------------------------
def wants_more_uninterrupted_runs(ev: Evidence) -> bool:
    """Whether the verdict would blame the resume for a difference that more uninterrupted runs could show
    to be the script's from one process to the next (two that agreed were lucky): asked once."""
    verdict = decide(ev)
    return (
        verdict is not None
        and verdict.rule in ("differs_but_no_resume_shown", "resume_differs")
        and not ev.stopped.more_clean_runs
    )


# --- what the rules share -----------------------------------------------------------------------------
def _restarts_gathered(ev: Evidence) -> bool:
    """The last stage's evidence is in: the stopped run's, and what the restarts given another state told
    (the rules after them speak only then)."""
    return ev.stopped is not None and ev.swap is not None and ev.moved is not None


def _nothing_differs(ev: Evidence) -> bool:
    s = ev.stopped
    return s is not None and s.outputs_identical and not s.trace_differs


def _found(ev: Evidence) -> str:
    s = ev.stopped
    found = [x for x in (s.trace_differs, None if s.outputs_identical else s.first_output_difference) if x]
    return "; ".join(found or ["no declared output could be compared (see not checked)"])


def _restarts(ev: Evidence) -> str:
    s = ev.stopped
    effective = sum(1 for e in s.stops if e["effective"])
    return f"after {counted(s.landed, 'stop')} by {s.how} ({effective} of {s.planned} effective)"


def _same(ev: Evidence) -> str:
    return f"{_restarts(ev)}, every declared output compared is {ev.stopped.identical_words}"


def _caveat(ev: Evidence) -> str:  # --quick and --sweep run no control, and say so once, first
    return "" if ev.seeded or ev.control_left_out else "; no negative control"


def _updates_words(ev: Evidence) -> str:
    """What the probe's updates showed, for the pass."""
    s = ev.stopped
    updates = (
        f" and so is each of its {counted(s.updates_compared, 'update')} (the probe)" if s.updates_compared else ""
    )
    if s.traces_unreadable:
        return updates + "; the probe's traces could not be read (not checked)"
    if s.updates_compared and s.updates_partial:
        return updates + " it recorded (not all: see not checked)"
    return updates


def _moved(ev: Evidence) -> tuple[MovedRestart, ...]:
    return ev.moved.restarts if ev.moved is not None else ()


def _swap_lines(ev: Evidence) -> tuple[str, ...]:
    """What the swapped restart could not tell, once the rules have come past it."""
    swap = ev.swap
    if swap is None or swap.not_needed or swap.same_files or swap.note is None:
        return ()
    return (f"{SWAP_NOT_SHOWN}: {swap.note}",)


def _used(ev: Evidence) -> list[MovedRestart]:
    return sorted((r for r in _moved(ev) if r.used and r.weights_only), key=lambda r: r.stop)


def _moved_lines(ev: Evidence) -> tuple[str, ...]:
    """Each stop whose moved-weights restart did not show its weights used, with why; then the replay, which
    stays named even where every stop's restart used them (they ran in another directory)."""
    used = _used(ev)
    lines = [MOVED_NOT_SHOWN.format(stop=r.stop, note=r.note) for r in _moved(ev) if r not in used]
    if not _moved(ev):
        lines.append(f"whether the restarts used the weights they read: {ev.moved.note if ev.moved else 'not run'}")
    landed = ev.stopped.landed if ev.stopped else 0
    lines.append(REPLAY_AFTER_MOVED if used and len({r.stop for r in used}) == landed else REPLAY_NOT_CHECKED)
    return tuple(lines)


def _moved_shown(ev: Evidence) -> str:
    used = _used(ev)
    if not used:
        return ""
    if len(used) == 1:
        return f"; a restart given its state after stop {used[0].stop}, in another directory, its weights moved, used them ({used[0].used})"
    each = "; ".join(f"stop {r.stop}: {r.used}" for r in used)
    stops = " and ".join(str(r.stop) for r in used)
    return f"; restarts given its state after stops {stops}, in another directory, weights moved, used them ({each})"


def _wait_lines(ev: Evidence) -> tuple[str, ...]:
    """State that expires with time (a wall-clock budget, a lease kept in the checkpoint) is tried only as
    far as a restart waited: never where every restart came at once, up to the wait where one waited."""
    waited = ev.stopped.restart_wait_s if ev.stopped is not None else 0.0
    return (WAITED.format(seconds=f"{waited:g}"),) if waited else (NO_WAIT,)
