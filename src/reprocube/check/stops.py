"""Where the stopped run is stopped: the stops asked for (--at, --at-file, --at-line), or the default ones,
each a share of the time between two of an uninterrupted run's saves after its attempt's first whole save, drawn
from a seed (--stop-seed replays them); and the last stop's restart a while later than the others."""

from __future__ import annotations

import random
from dataclasses import replace

from reprocube.check.runs import Run, Stop
from reprocube.errors import ConfigError

RESTART_WAIT_S = 1.0  # the last stop's restart comes this long after it (the others at once)
SWEEP_UPTO = 0.5  # --sweep's stops: at most this share of the time between two saves after theirs


def plan_stops(options, clean: Run, stop_seed: int) -> tuple[list[Stop] | None, str]:
    """The stops asked for, or the default ones: each a share of the time between two of an
    uninterrupted run's saves (idle_between_saves) after its attempt's first whole save. None (and why) where that run saved
    nothing as it went (no file rewritten, no numbered series): no stop could follow a save and
    still interrupt something. options: check's (check.options.CheckOptions)."""
    stops, at, at_file, at_line = options.stops, options.at, options.at_file, options.at_line
    if at is not None or at_file is not None or at_line is not None:
        return stops_asked(stops, at, at_file, at_line), ""
    activity, attempt = clean.activity, clean.attempts[-1]
    saves = activity.save_moments(state=activity.state_keys()) if activity is not None else []
    seen = "" if activity is None or activity.complete else f" ({activity.why_incomplete})"
    if len(saves) < 2:
        return None, (
            f"in {attempt.seconds:.1f} s the uninterrupted run rewrote no file as it went{seen} (a "
            "checkpoint saved again and again, or a numbered series of them, in its work directory, "
            "HOME or TMPDIR; files written once, like caches and outputs, are no checkpoint): no stop "
            "can come after a save and still interrupt the run, so resume cannot be tested (a "
            "checkpoint only at the end?). Stop it yourself with --at SECONDS, --at-file GLOB or "
            "--at-line REGEX to see what a restart does"
        )
    if options.during_save:
        return [Stop(during_save=True)] * stops, ""
    return planned_stops(stops, idle_between_saves(activity), stop_seed), ""


def sweep_plans(options, clean: Run, stop_seed: int) -> tuple[list[list[Stop]] | None, str]:
    """--sweep N: one plan per save of the uninterrupted run but its last (after which nothing is left to
    resume), at most N: one stop, a drawn share of the time between two saves after the attempt's kth whole
    save. None (and why) where that run saved fewer than twice as it went."""
    activity = clean.activity
    saves = activity.saves(state=activity.state_keys()) if activity is not None else []
    if len(saves) < 2:
        return None, plan_stops(options, clean, stop_seed)[1]  # (why none: the same words)
    # In the gap's first half: a stop meant for one save must not come after the next (a watcher sees late).
    count, gap = min(options.sweep, len(saves) - 1), idle_between_saves(activity)
    fractions = planned_stops(count, gap, stop_seed, upto=SWEEP_UPTO)
    return [[replace(stop, nth_save=k)] for k, stop in enumerate(fractions, start=1)], ""


def idle_between_saves(activity) -> float:
    """The median time from the end of one whole save (FileActivity.saves: a checkpoint folder's files, a
    model and then its optimizer, are one save) to the start of the next: where a stop leaves a whole
    checkpoint behind and interrupts training."""
    saves = activity.saves(state=activity.state_keys())
    gaps = sorted(b.start - a.end for a, b in zip(saves, saves[1:], strict=False))
    return max(0.0, gaps[len(gaps) // 2]) if gaps else 0.0


def with_a_wait(plan: list[Stop]) -> list[Stop]:
    """The plan with its last stop's restart RESTART_WAIT_S later than the others' (which start at once): a
    restart whose state expires with time (a wall-clock budget kept in the checkpoint) then differs."""
    return [*plan[:-1], replace(plan[-1], wait_s=RESTART_WAIT_S)] if plan else plan


def planned_stops(count: int, save_gap_s: float, seed: int, upto: float = 0.95) -> list[Stop]:
    """`count` stops, each `fraction` of the uninterrupted run's time between two saves after its
    attempt's first whole save (from right after its last file to just before the next save), the fractions drawn from `seed`
    (recorded: --stop-seed replays them)."""
    rng = random.Random(seed)
    fractions = [0.05 + (upto - 0.05) * rng.random() for _ in range(count)]
    return [Stop(after_save=round(save_gap_s * f, 3), fraction=f) for f in fractions]


def seconds_of(at: str) -> list[float]:
    try:
        values = [float(part) for part in at.split(",")]
    except ValueError:
        raise ConfigError(f"--at {at!r}: give seconds separated by commas, e.g. 2.5,4") from None
    if not values or not all(0 < v < float("inf") for v in values):
        raise ConfigError(f"--at {at!r}: each stop must be a number of seconds > 0")
    return values


def stops_asked(count: int, at, at_file, at_line) -> list[Stop]:
    """The stops --at, --at-file or --at-line asked for."""
    if at is not None:
        return [Stop(seconds=s) for s in seconds_of(at)]
    if at_file is not None:
        return [Stop(file_glob=at_file)] * count
    return [Stop(line=at_line)] * count
