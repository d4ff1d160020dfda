"""The probe's traces of check's runs, read and set side by side: two uninterrupted runs' (where they first
differ, and where the second began), the stopped run's against clean-1's (the first update that differs
after a stop, whether each restart resumed), and what the traces say of a restart that trained nothing.
What cannot be read or was not recorded goes into the result's not-checked lines, never a traceback."""

from __future__ import annotations

from collections.abc import Callable

from reprocube.analysis.probe_trace import read_rank_traces, read_trace, steps_of
from reprocube.analysis.probe_trace_comparison import (
    compare_ranks,
    compare_stopped_ranks,
    describe_difference,
    first_difference,
)
from reprocube.check.runs import Run
from reprocube.errors import CheckpointError
from reprocube.terminal import counted


def missing_ranks(resume: dict) -> str | None:
    """Ranks a trace header counts (world_size) that wrote no trace: their resume is not shown."""
    world = resume.get("world_size")
    ranks = resume.get("ranks") or []
    if world and len(ranks) < world:
        return f"the probe heard from {counted(len(ranks), 'rank')} of {world} (call it on every rank)"
    return None


def trained_nothing(clean: Run, run: Run) -> bool:
    """Whether the uninterrupted run recorded updates with the probe and `run` recorded none."""
    try:
        recorded = [
            any(trace.updates for trace in attempt.values()) for attempt in (*run_traces(clean), *run_traces(run))
        ]
    except CheckpointError:  # unreadable: not ours to judge here (the resume's comparison names it)
        return False
    return bool(recorded) and recorded[0] and not any(recorded[len(clean.attempts) :])


def update_times(run: Run) -> tuple[float, ...]:
    """When rank 0 of each attempt recorded each update (the probe's monotonic clock, which check's file
    watcher shares on this machine), sorted; none where the probe wrote no times or a trace is unreadable."""
    try:
        traces = run_traces(run)
    except CheckpointError:
        return ()
    return tuple(sorted(at for attempt in traces if 0 in attempt for at in attempt[0].times if at is not None))


def run_traces(run: Run) -> list[dict]:
    """Each attempt's traces, by rank ({} where no process of it wrote one)."""
    return [read_rank_traces(run.probe_trace(number)) for number in range(1, len(run.attempts) + 1)]


def repeat_trace(first: Run, again: Run, result: dict, first_updates: dict[str, int | None]) -> str | None:
    """Where two uninterrupted runs' probe traces first differ, rank by rank (None: the same, or no
    probe); and in first_updates, the step of the first run that `again`'s first update is (past 1: it
    began where another run had ended)."""
    try:
        (a,), (b,) = run_traces(first), run_traces(again)
    except CheckpointError as exc:
        result["not_checked"].append(f"the probe's traces, unreadable: {exc}")
        return None
    if not a or not b:
        return None if not a and not b else f"only {'the second' if not a else 'the first'} run wrote a probe trace"
    result["probe"] = result["probe"] or {"repeat": []}
    compared = compare_ranks(a, b)
    if "error" in compared:
        result["probe"]["repeat"].append(None)
        return f"their probe traces differ: {compared['error']}"
    if 0 in a and 0 in b and b[0].updates:
        given, update = b[0].updates[0]
        reference = steps_of(a[0], 0)
        step = given or next((s for s, u in reference.items() if u == update), None)
        # At or before the first run's first recorded update (a probe called every k-th step records step
        # k first): it began where the first run began.
        first_updates[again.name] = 1 if step is not None and step <= min(reference, default=1) else step
    difference = compared["first_difference"]
    result["probe"]["repeat"].append(difference)
    if difference is None:
        unequal = next((r for r in compared["per_rank"] if not r["same_steps"]), None)
        if unequal is None:
            return None
        # Every update both recorded agrees; the runs recorded other steps (a probe in a logger throttled
        # by the clock): the rest is not compared, and no difference is shown.
        where = f" on rank {unequal['rank']}" if len(compared["ranks"]) > 1 else ""
        result["not_checked"].append(
            f"the updates only one uninterrupted run recorded{where} (the first recorded "
            f"{counted(unequal['a_steps'], 'update')}, the second {unequal['b_steps']}: the probe is called at "
            "moments that differ between runs)"
        )
        return None
    return (
        f"step {difference['step']} is the first update that differs: "
        f"{describe_difference(difference, 'first run', 'second run')}"
    )


def _first_difference_words(difference: dict | None, attempts: list[dict]) -> tuple[str | None, str | None]:
    """The stopped run's first differing update in words: (before any stop, after one); None where none."""
    if difference is None:
        return None, None
    details, step = describe_difference(difference, "uninterrupted", "resumed", hint=True), difference["step"]
    attempt, stop = attempts[difference["attempt"] - 1], difference["after_stop"]
    if not stop:  # not resume's doing: no hint at what a checkpoint lacks
        return f"step {step} differs ({describe_difference(difference, 'uninterrupted', 'stopped')})", None
    if difference.get("after_signal"):
        return None, (
            f"step {step}, an update attempt {difference['attempt']} recorded after stop {stop}'s signal (what "
            f"the script did as it stopped), is the first update that differs ({details})"
        )
    if attempt["how"] == "assumed":
        return None, (
            f"after stop {stop} the first update already differs: step {step}, after the checkpoint the "
            f"script announced at step {attempt['resumed_at']} ({details})"
        )
    return None, (
        f"after stop {stop} (resumed at step {attempt['resumed_at']}), step {step} is the first update that "
        f"differs ({details})"
    )


def resume_trace(clean: Run, stopped: Run, result: dict, same_clock: bool = True) -> dict:
    """The stopped run's probe traces against the uninterrupted run's: {"differs": the first differing
    update after a stop, or None; "before_stops": the first differing update where it came before any
    stop, or None; "compared": updates compared; "difference": the first difference as recorded}.
    same_clock: the script ran on this machine, so its probe's times and check's signal times are one
    clock's (an update recorded after a signal is the stop's doing)."""
    none = {"differs": None, "before_stops": None, "compared": 0, "difference": None}
    try:
        (reference,) = run_traces(clean)
        signals = [
            stopped.began + a.started_s + a.signal_s if same_clock and a.signal_s is not None else None
            for a in stopped.attempts
        ]
        starts = (clean.began + clean.attempts[0].started_s, [stopped.began + a.started_s for a in stopped.attempts])
        traced = compare_stopped_ranks(reference, run_traces(stopped), signals, starts if same_clock else None)
    except CheckpointError as exc:  # the script's process wrote the traces: a malformed one is not our crash
        result["not_checked"].append(f"the probe's traces, unreadable: {exc}")
        return none
    if traced is None:
        result["not_checked"].append(
            "which step first departs after a stop, and whether each restart resumed "
            "instead of starting again: the script does not call the probe "
            "(from reprocube import probe; docs/check.md)"
        )
        return none
    result["probe"] = {**(result["probe"] or {"repeat": []}), "resume": traced}
    if "error" in traced:
        return {**none, "differs": traced["error"]}
    difference, attempts = traced["first_difference"], traced["attempts"]
    before, differs = _first_difference_words(difference, attempts)
    for attempt in attempts:
        if attempt.get("label_offset"):
            result["not_checked"].append(
                f"attempt {attempt['attempt']}'s step numbers are off by {attempt['label_offset']:+d} from the "
                "uninterrupted run's (its updates' bits are those steps' own): its step counter is not restored "
                "as it was; the updates are compared by their bits"
            )
    unplaced = [str(a["attempt"]) for a in traced["attempts"] if a.get("how") == "unplaced"]
    if unplaced:
        result["not_checked"].append(
            f"the updates of attempt {', '.join(unplaced)}: its first update is one the uninterrupted run made "
            "never or more than once, and the script announced no checkpoint, so where it resumed is not known "
            "and none of its updates is compared (probe.resumed(step) after loading, or probe.checkpoint(step) "
            "after each save, places it)"
        )
    if traced["unrecorded_steps"]:
        spans = ", ".join(f"{a}-{b}" if a != b else str(a) for a, b in traced["unrecorded_steps"][:5])
        result["not_checked"].append(
            f"the updates at steps {spans}: no attempt of the stopped run recorded them (a "
            "stop ended an attempt before the probe wrote them, and the restart resumed "
            "after them: call probe.checkpoint right after each save)"
        )
    return {"differs": differs, "before_stops": before, "compared": traced["compared_steps"], "difference": difference}


def recorded_through(run: Run, step: int) -> Callable[[], bool]:
    """A check's own stop (polled): due once the run's first attempt recorded an update at or past `step`
    (rank 0; a trace not readable yet is looked at again)."""

    def due() -> bool:
        try:
            trace = read_trace(run.probe_trace(1))
        except CheckpointError:
            return False
        return trace is not None and any(recorded >= step for recorded in steps_of(trace, 0))

    return due


def differs_through(clean: Run, run: Run, step: int) -> str | None:
    """Where `run`'s first attempt's updates up to `step` first differ from clean-1's (rank 0), in words;
    None where none does, or a trace cannot be read."""
    try:
        a, b = read_trace(clean.probe_trace(1)), read_trace(run.probe_trace(1))
    except CheckpointError:
        return None
    if a is None or b is None:
        return None
    upto = [{k: v for k, v in steps_of(trace, 0).items() if k <= step} for trace in (a, b)]
    difference = first_difference(*upto, a.names)
    if difference is None:
        return None
    return f"step {difference['step']} is the first update that differs: {describe_difference(difference, 'clean-1', run.name)}"
