"""The probe's traces (read by reprocube.analysis.probe_trace) compared: for `reprocube check`, the first
step at which one run of a script departs from another, and for a stopped run, after which stop, where
each restart resumed and whether it resumed at all.

Each attempt of a stopped run has its own trace. An attempt's records carry the global step when the
script passed it; otherwise the first attempt counts from step 1 and a later one from where it resumed,
found by its first update: the uninterrupted run's step whose loss bits and fingerprints it equals (an
update at another step does not give the same bits), else the last checkpoint an earlier attempt
announced (then the attempt departs at its first update, and the answer says it assumed; with none announced
it is "unplaced" and none of its updates is compared: counted from step 0 a correct resume whose first update
repeats a record, as a learning rate of 0 makes it, differed). A `resumed`
record (probe.resumed) places the attempt as a given step does.

Several processes write one trace each: compare_ranks / compare_stopped_ranks compare two runs rank by
rank; a rank that wrote a trace in one run and not the other is a difference.

Each first difference carries a `cause_hint`: the same loss but other weights points at the optimizer's
state, another loss at what the forward pass saw (cause_hint)."""

from __future__ import annotations

import re

from reprocube.analysis.probe_trace import AttemptTrace, Update, loss_value, step_times, steps_of


def first_difference(a: dict[int, Update], b: dict[int, Update], names: list[str]) -> dict | None:
    """The first step both traces hold whose update differs: the loss bits, and the tensors whose
    fingerprints differ, named."""
    for step in sorted(set(a) & set(b)):
        if a[step] != b[step]:
            return _described(step, a[step], b[step], names)
    return None


def _described(step: int, a: Update, b: Update, names: list[str]) -> dict:
    tensors = [name for name, x, y in zip(names, a.fingerprints, b.fingerprints, strict=True) if x != y]
    difference = {
        "step": step,
        "loss_a": loss_value(a),
        "loss_b": loss_value(b),
        "loss_same": a.loss == b.loss and a.loss_dtype == b.loss_dtype,
        "tensors": tensors,
        "tensor_count": len(names),
    }
    difference["cause_hint"] = cause_hint(difference)
    return difference


# A restart whose first update comes as late as the uninterrupted run reached that update retrained the
# updates before it without recording them (it began again; its outputs equal a resumed run's only because
# it is deterministic). Judged only where the updates skipped took at least LATE_SPAN_S and as long as the
# uninterrupted run's start-up, and the restart came LATE_FRACTION of the way there: a slower machine
# moment (2 runs share 2 CPUs) or a checkpoint's load stays well below it.
LATE_SPAN_S = 1.0
LATE_FRACTION = 0.75


def compare_stopped(
    clean: AttemptTrace,
    attempts: list[AttemptTrace | None],
    signals: list[float | None] | None = None,
    starts: tuple[float | None, list[float | None]] | None = None,
) -> dict:
    """The stopped run's attempts against the uninterrupted run's trace: where each attempt resumed
    (given, matched or assumed), whether a restart started again from step 1, the first differing update
    and after which stop, and the uninterrupted run's steps no attempt recorded (a stop ends an attempt
    before the probe writes its last steps: those after the last checkpoint it announced are lost, and
    retrained by the restart only if it resumes from that checkpoint; they are not compared).
    signals: when each attempt's stop signal was sent (CLOCK_MONOTONIC seconds, None where it got none or
    the clocks are not one machine's): an update the first attempt recorded after its signal (the script's
    own doing as it stopped: a last partial update, say) that differs first is after that stop, not before
    it ("after_signal").
    starts: when the uninterrupted run and each attempt began (the same clock; None where unknown): a restart
    that resumed by its first update, but made it as late as the uninterrupted run reached that update, is
    "late_first_update" (_late_first_update)."""
    reference = steps_of(clean, 0)
    # A record that the uninterrupted run made at several steps (an update that changes nothing) places
    # no restart: only records it made once are matched.
    counts: dict[Update, int] = {}
    for update in reference.values():
        counts[update] = counts.get(update, 0) + 1
    by_update = {update: step for step, update in reference.items() if counts[update] == 1}
    described, trained, announced, first = [], {}, [], None
    for number, trace in enumerate(attempts, start=1):
        if trace is None or not trace.updates:
            described.append({"attempt": number, "steps": 0})
            announced += trace.checkpoints if trace else []
            continue
        if trace.names != clean.names:
            return {
                "error": f"attempt {number} recorded other tensors than the uninterrupted run ({len(trace.names)} "
                f"vs {len(clean.names)})",
                "attempts": described,
            }
        given, update = trace.updates[0]
        if trace.resumed is not None and given is None:  # the script said where it resumed (probe.resumed)
            start, how = trace.resumed, "given"
        elif number == 1 or given is not None:
            start, how = (given - 1 if given is not None else 0), "given" if given is not None else "first"
        elif update in by_update:
            start, how = by_update[update] - 1, "matched"
        elif reference and update == reference[min(reference)]:
            # The uninterrupted run's first record, which it made again later (updates that change nothing:
            # a replay buffer filling): a restart that begins with it began again, never "assumed" to resume.
            start, how = min(reference) - 1, "matched"
        elif announced:
            start, how = announced[-1], "assumed"
        else:  # nothing places it: its first update is one the uninterrupted run made never or several times
            start, how = 0, "unplaced"
        steps, offset = ({} if how == "unplaced" else steps_of(trace, start)), 0
        if how == "given" and reference.get(start + 1) != update and update in by_update:
            # The bits are the uninterrupted run's update at another step than the script's label says:
            # it resumed there, and only its step counter is off (trust the bits, say the labels).
            offset = start - (by_update[update] - 1)
            start, how = by_update[update] - 1, "matched"
            steps = {step - offset: record for step, record in steps.items()}
        # Began again: its first update is at or before the uninterrupted run's first recorded one (a probe
        # called every k-th step records step k first, in a restart that began again too). From scratch:
        # began again although an earlier attempt had announced a checkpoint (a restart before the first
        # checkpoint rightly begins again).
        declared = bool(trace.resumed)  # probe.resumed(k), k > 0: where it resumed, not a guess from a record
        began_again = (
            number > 1
            and how not in ("assumed", "unplaced")
            and (start == 0 or (not declared and start + 1 <= min(reference, default=1)))
        )
        entry = {
            "attempt": number,
            "steps": len(steps),
            # where it said it resumed (probe.resumed), where its first record comes later (a sparse probe)
            "resumed_at": trace.resumed if declared and how == "given" and trace.resumed < start else start,
            "how": how,
            "last_announced": announced[-1] if announced else None,
            "from_scratch": began_again and any(announced),
            "began_again": began_again,
            "last_step": max(steps, default=start),  # its last recorded update (by the uninterrupted run's steps)
        }
        if offset:
            entry["label_offset"] = offset  # the script's step numbers minus the steps its bits are
        signal = _nth(signals, number) if signals else None
        if signal is not None:  # its last update before its stop's signal (one that trained on made more)
            made_at = step_times(trace, start + offset)
            entry["last_before_signal"] = max((s - offset for s, at in made_at.items() if at <= signal), default=start)
        if number > 1 and start > 0 and not began_again and starts is not None:
            late = _late_first_update(clean, trace, min(steps), starts[0], _nth(starts[1], number))
            if late is not None:
                entry["late_first_update"] = late
        described.append(entry)
        difference = first_difference(reference, steps, clean.names)
        if difference is not None and first is None:
            first = {**difference, "attempt": number, "after_stop": number - 1}
            made = step_times(trace, start + offset).get(difference["step"] + offset)
            signal = signals[number - 1] if signals and number <= len(signals) else None
            # Only the first attempt's: a later one's update after its signal may as well be its restart's
            # doing (it resumed from the stop before), and that stop is named.
            if number == 1 and signal is not None and made is not None and made > signal:
                first.update(after_stop=number, after_signal=True)
        trained.update(steps)
        announced += trace.checkpoints
    missing = sorted(set(reference) - set(trained))
    return {
        "attempts": described,
        "first_difference": first,
        "compared_steps": len(set(reference) & set(trained)),
        "reference_steps": len(reference),
        "reference_last": max(reference, default=0),
        "unrecorded_steps": _ranges(missing),
        "extra_steps": _ranges(sorted(set(trained) - set(reference))),
    }


def _nth(values: list[float | None], number: int) -> float | None:
    return values[number - 1] if number <= len(values) else None


def _late_first_update(
    clean: AttemptTrace, trace: AttemptTrace, first_step: int, clean_began: float | None, began: float | None
) -> dict | None:
    """{"step", "delay_s", "reach_first_s", "reach_step_s"} where the attempt's first update (`first_step`)
    came LATE_FRACTION of the way from when the uninterrupted run made its first update to when it made
    that one, each counted from its process's start; None where it came sooner, or cannot be told."""
    times = step_times(clean, 0)
    made = trace.times[0] if trace.times else None
    reach_step = times.get(first_step)
    if None in (clean_began, began, made, reach_step) or not times or times[min(times)] is None:
        return None
    reach_first, reach_step, delay = times[min(times)] - clean_began, reach_step - clean_began, made - began
    span = reach_step - reach_first
    if span < max(LATE_SPAN_S, reach_first) or delay < reach_first + LATE_FRACTION * span:
        return None
    return {
        "step": first_step,
        "delay_s": round(delay, 2),
        "reach_first_s": round(reach_first, 2),
        "reach_step_s": round(reach_step, 2),
    }


def _ranges(steps: list[int]) -> list[list[int]]:
    """[[first, last], ...] of consecutive steps."""
    ranges: list[list[int]] = []
    for step in steps:
        if ranges and ranges[-1][1] == step - 1:
            ranges[-1][1] = step
        else:
            ranges.append([step, step])
    return ranges


def describe_difference(difference: dict, a: str = "A", b: str = "B", hint: bool = False) -> str:
    """The losses (labelled a and b) and the tensors whose fingerprints differ, in a few words; on which
    rank where the run had several; with `hint`, cause_hint's words after them."""
    tensors = difference["tensors"]
    weights = f"weights differ in {_named(tensors)}" if tensors else "the weights after it are the same"
    where = f"on rank {difference['rank']}, " if difference.get("world", 1) > 1 else ""
    if difference["loss_same"] and _no_loss(difference):
        text = f"{where}no loss recorded (NaN in both); {weights}"
    elif difference["loss_same"]:
        text = f"{where}the same loss; {weights}"
    else:
        text = f"{where}loss {difference['loss_b']} {b} vs {difference['loss_a']} {a}; {weights}"
    why = difference.get("cause_hint", cause_hint(difference)) if hint else None
    return f"{text}; {why}" if why else text


def _named(tensors: list[str]) -> str:
    return ", ".join(tensors[:4]) + (f" and {len(tensors) - 4} more" if len(tensors) > 4 else "")


# Names of the state a forward pass in training mode updates besides the weights (PyTorch, Flax, Keras).
_STATISTICS = re.compile(r"running_mean|running_var|num_batches_tracked|moving_mean|moving_variance|batch_stats")


def _no_loss(difference: dict) -> bool:
    """Both losses NaN: what a probe given no loss records, never evidence that the forward passes agreed."""
    return difference["loss_a"] == difference["loss_b"] == "nan"


def cause_hint(difference: dict) -> str | None:
    """Where to look, from how update k differs. The update before it agreed in both runs, so the same
    weights went into update k: the same loss bits but other weights after it means the forward pass
    agreed and the step did not (the optimizer's state: momentum, Adam's moments, the learning-rate
    schedule or its step counter); another loss means the forward pass saw something else (the data
    order, a random generator such as dropout's, or the model's own state such as batch-norm
    statistics). The tensors that differ are named. None where neither applies."""
    step, tensors = difference["step"], difference["tensors"]
    if difference["loss_same"] and _no_loss(difference):
        # NaN in both: the probe was given no loss (probe.watch, a trainer whose model returns none), so the
        # forward pass and the update cannot be told apart: every suspect stays.
        if not tensors:
            return None
        return (
            f"no loss recorded at update {step}, and other weights after it ({_named(tensors)}): the data "
            "order, a random generator, the model's state (batch-norm statistics) or the optimizer's state "
            "(momentum, Adam's moments, the learning-rate schedule); give the probe the loss to tell the forward "
            "pass from the update"
        )
    if difference["loss_same"]:
        if not tensors:
            return None
        return (
            f"the same loss but other weights at update {step} ({_named(tensors)}): the forward pass agreed and "
            "the update did not, which points at the optimizer's state (momentum, Adam's moments, the "
            "learning-rate schedule or its step counter): not saved, not restored, or restored from another step"
        )
    statistics = [name for name in tensors if _STATISTICS.search(name)]
    after = f"; the weights after it differ in {_named(tensors)}" if tensors else "; the weights after it agree"
    stats = f" ({', '.join(statistics[:4])} differ)" if statistics else ""
    return (
        f"another loss at update {step}: the forward pass saw other inputs or other randomness, which points at "
        "the data order (shuffling, the loader's position after the restart), a random generator (dropout, "
        f"augmentation) or the model's state (batch-norm statistics{stats}){after}"
    )


def compare_ranks(a: dict[int, AttemptTrace], b: dict[int, AttemptTrace]) -> dict:
    """Two uninterrupted runs' traces (read_rank_traces of each), rank by rank: {"ranks": every rank
    either wrote, "per_rank": [{"rank", "a_steps", "b_steps", "same_steps", "first_difference"}], "first_difference":
    the earliest differing update of any rank (the lowest rank on a tie) with its "rank", or None,
    "error": a rank that wrote a trace in one run only, or recorded other tensors, named; else absent}."""
    ranks = sorted(set(a) | set(b))
    result: dict = {"ranks": ranks, "per_rank": [], "first_difference": None}
    errors = [
        f"rank {r} wrote a probe trace in {'the first' if r in a else 'the second'} run only"
        for r in ranks
        if (r in a) != (r in b)
    ]
    for rank in (r for r in ranks if r in a and r in b):
        if a[rank].names != b[rank].names:
            errors.append(f"rank {rank}'s traces record other tensors ({len(a[rank].names)} vs {len(b[rank].names)})")
            continue
        a_steps, b_steps = steps_of(a[rank], 0), steps_of(b[rank], 0)
        difference = first_difference(a_steps, b_steps, a[rank].names)
        if difference is not None:
            difference.update(rank=rank, world=len(ranks))
        result["per_rank"].append(
            {
                "rank": rank,
                "a_steps": len(a_steps),
                "b_steps": len(b_steps),
                "same_steps": set(a_steps) == set(b_steps),  # False: one made updates the other never did
                "first_difference": difference,
            }
        )
    differences = [r["first_difference"] for r in result["per_rank"] if r["first_difference"] is not None]
    result["first_difference"] = min(differences, key=lambda d: (d["step"], d["rank"]), default=None)
    if errors:
        result["error"] = "; ".join(errors)
    return result


def compare_stopped_ranks(
    clean: dict[int, AttemptTrace],
    attempts: list[dict[int, AttemptTrace]],
    signals: list[float | None] | None = None,
    starts: tuple[float | None, list[float | None]] | None = None,
) -> dict | None:
    """The stopped run's attempts (read_rank_traces of each) against the uninterrupted run's traces, rank
    by rank with compare_stopped. None where the uninterrupted run wrote no trace. The answer has
    compare_stopped's keys, from the rank whose first difference comes first (the earliest step, then the
    lowest rank; the lowest rank where none differs), with "rank" and "world" in first_difference, plus
    "rank", "ranks" and "per_rank" ([{"rank", "first_difference": its step or None, "compared_steps",
    "attempts"}]).
    A rank that wrote traces in one run only, or another rank's error, is its "error", naming the rank."""
    if not clean:
        return None
    ranks = sorted(set(clean).union(*attempts))
    one_sided = [r for r in ranks if r not in clean or not any(r in attempt for attempt in attempts)]
    compared = {
        rank: compare_stopped(clean[rank], [attempt.get(rank) for attempt in attempts], signals, starts)
        for rank in ranks
        if rank not in one_sided
    }
    errors = [
        f"rank {r} wrote a probe trace in the {'uninterrupted' if r in clean else 'stopped'} run only"
        for r in one_sided
    ]
    errors += [f"rank {r}: {c['error']}" for r, c in compared.items() if "error" in c]
    differing = [r for r, c in compared.items() if c.get("first_difference")]
    main = min(
        differing, key=lambda r: (compared[r]["first_difference"]["step"], r), default=min(compared, default=None)
    )
    result = dict(compared[main]) if main is not None else {"attempts": [], "first_difference": None}
    if result.get("first_difference"):
        result["first_difference"] = {**result["first_difference"], "rank": main, "world": len(ranks)}
    result.update(
        rank=main,
        ranks=ranks,
        # the processes the traces' headers count (a rank that wrote none: its resume is not shown)
        world_size=max((t.world_size or 1 for t in clean.values()), default=1),
        per_rank=[
            {
                "rank": r,
                "first_difference": (c.get("first_difference") or {}).get("step"),
                "compared_steps": c.get("compared_steps", 0),
                "attempts": c.get("attempts", []),  # where each attempt of this rank resumed
            }
            for r, c in compared.items()
        ],
    )
    if errors:
        result["error"] = "; ".join(errors)
    return result
