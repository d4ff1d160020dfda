"""What each stop of `reprocube check`'s stopped run proved. A stop counts (is effective) only if the
command had saved something before it and the next attempt demonstrably continued from it:

- saved: a state file whole on disk when the restart began (written before the signal, not cut off by
  it), or a checkpoint announced to the probe. A state file is one the uninterrupted run saved as it
  went: rewritten at two or more save moments, or a numbered series (FileActivity.state_keys). Files
  written once (Python's bytecode cache, a library's cache in HOME or TMPDIR, a config written at
  start-up, the outputs at the end) are never a checkpoint, whatever a restart reads of them.
- continued: with the probe, the next attempt's first update is past step 1 (the step it gave, or the
  uninterrupted run's step whose bits it equals), and came about when a resumed run's first update would,
  not as late as the uninterrupted run reached that step (probe_trace_comparison's late_first_update: a restart
  that retrained those updates without recording them); a restart that began at step 1 again never counts.
  Without the probe (or where it made no update), the next attempt read a saved state file and then
  saved again itself, and the attempt that ran to the end saved fewer times than the uninterrupted run
  (one that began again saves as often). The files are named in the verdict.

A stop that did not land (the command ended first) proved nothing either. And where a run's first
attempt began past update 1, or an uninterrupted run took a fraction of another's time, it started from
state that another run left outside its directories (`leaked_state`)."""

from __future__ import annotations

import os.path

from reprocube.check.file_activity import SAVE_BURST_S, state_key
from reprocube.check.runs import Run
from reprocube.check.traces import missing_ranks
from reprocube.terminal import counted

MTIME_SLACK_S = 0.01  # a file's mtime is the kernel's coarse time: up to a tick (4 ms at 250 Hz) early
LEAK_RATIO = 0.4  # a complete run this much faster than another started from state someone else left


def stop_evidence(run: Run, traced: dict | None, files_bind: bool = True) -> list[dict]:
    """Per requested stop of `run`: {"stop", "landed", "effective", "how"}; traced: compare_stopped's
    answer for the run (None without the probe). files_bind: the probe's word that a restart resumed must
    be borne out by what it read (False under SLURM, where the signal's moment is when the requeue was
    asked, not when the job got it: the probe's word stands alone)."""
    probe_attempts = {a["attempt"]: a for a in (traced or {}).get("attempts", [])}
    began_again = _ranks_that_began_again(traced)
    evidence = []
    for number, attempt in enumerate(run.attempts, start=1):
        if attempt.stop is None:
            continue
        if attempt.stopped_early or number == len(run.attempts):
            how = "it did not land: the command ended before it" if attempt.stopped_early else "no restart followed"
            if attempt.stopped_early and "when a new file matches" in attempt.stop and number > 1:
                # --at-file waits for a file no earlier attempt made: a fixed name comes once (round 7's F14)
                how += " (an --at-file stop waits for a new file: one of a name an earlier attempt made never comes)"
            evidence.append({"stop": number, "landed": False, "effective": False, "how": how})
            continue
        if began_again.get(number + 1):
            ranks = ", ".join(map(str, began_again[number + 1]))
            how = f"attempt {number + 1} began again at step 1 on rank {ranks} (the probe)"
            evidence.append({"stop": number, "landed": True, "effective": False, "how": how})
            continue
        judged = _judged(run, number, probe_attempts.get(number + 1), probe_attempts.get(number), traced, files_bind)
        later = _later_resume(probe_attempts, number + 1)
        if judged.get("by") == "files" and later is not None and not probe_attempts.get(number + 1, {}).get("steps"):
            # The restart was stopped again before the probe wrote any update (it writes in groups): the
            # next restart the probe saw resumed from the checkpoints this one read.
            judged = {
                "effective": True,
                "by": "probe",
                "how": f"attempt {number + 1} read a checkpoint and was stopped before the probe recorded an update; "
                f"attempt {later['attempt']} resumed at step {later['resumed_at']} (the probe)",
            }
        evidence.append({"stop": number, "landed": True, **judged})
    return evidence


def interrupted_saves(run: Run) -> list[tuple[int, str]]:
    """Each stop that landed while a save was being written, (its number, in words): its attempt's last save never held
    every file of an uninterrupted run's whole save (run.save_keys) and was still being written (a file within
    SAVE_BURST_S) when the attempt ended. Judged from the attempt's whole span, not the signal's moment: the
    watcher stamps a write when it reads it, possibly after the signal. Nothing where a save's files are not
    known."""
    if run.activity is None or not run.save_keys:
        return []
    found = []
    for number, attempt in enumerate(run.attempts[:-1], start=1):
        if attempt.signal_s is None or attempt.stopped_early:
            continue
        start = run.began + attempt.started_s
        end = start + attempt.seconds
        saves = run.activity.saves(since=start, until=end, state=run.state)
        if (
            not saves
            or not saves[-1].is_partial(run.save_keys, run.save_first_keys)
            or end - saves[-1].end > SAVE_BURST_S
        ):
            continue
        last = saves[-1]
        written = [e.path for e in run.activity.writes(last.start, end) if state_key(e.path) in last.keys]
        folders = {os.path.dirname(path) for path in written}  # "<place>/<dir>": a folder below the place
        where = (
            f"{folders.pop()}/" if len(folders) == 1 and "/" in next(iter(folders)) else ", ".join(sorted(set(written)))
        )
        found.append(
            (
                number,
                f"stop {number} landed while {where} was being written ({len(last.keys)} of the "
                f"{len(run.save_keys)} files of a whole save)",
            )
        )
    return found


def _later_resume(probe_attempts: dict[int, dict], after: int) -> dict | None:
    """The first attempt after `after` with updates, if the probe places it past step 1 (given or by its
    bits); None where it began again or cannot be placed."""
    for number in sorted(probe_attempts):
        attempt = probe_attempts[number]
        if number > after and attempt.get("steps"):
            resumed = attempt["how"] in ("given", "matched") and attempt["resumed_at"] > 0
            return attempt if resumed and not attempt.get("began_again") else None
    return None


def _ranks_that_began_again(traced: dict | None) -> dict[int, list[int]]:
    """attempt -> the ranks whose updates in it began at step 1 again after a checkpoint was announced
    (the probe, rank by rank: every rank must resume, not only the one shown)."""
    found: dict[int, list[int]] = {}
    per_rank = (traced or {}).get("per_rank") or []
    if len(per_rank) < 2:
        return found
    for entry in per_rank:
        for attempt in entry.get("attempts", []):
            scratch = (
                attempt.get("from_scratch")
                or attempt.get("began_again")
                or (attempt.get("steps") and attempt.get("how") in ("given", "matched") and attempt["resumed_at"] == 0)
            )
            if attempt["attempt"] > 1 and scratch:
                found.setdefault(attempt["attempt"], []).append(entry["rank"])
    return found


def _judged(
    run: Run, number: int, probed: dict | None, before: dict | None, traced: dict | None, files_bind: bool
) -> dict:
    """One stop: `probed` and `before` are the probe's word on the restart and on the stopped attempt."""
    stopped, restart = run.attempts[number - 1], run.attempts[number]
    signal_at = run.began + stopped.started_s + (stopped.signal_s if stopped.signal_s is not None else stopped.seconds)
    restart_from, restart_to = run.began + restart.started_s, run.began + restart.started_s + restart.seconds
    activity = run.activity
    saved = _saved(run, signal_at, restart_from, killed=stopped.exit is None or stopped.exit < 0)
    announced = probed is not None and probed.get("last_announced") is not None
    seen = (
        "" if activity is None or activity.complete else f" (not all file activity was seen: {activity.why_incomplete})"
    )
    if probed is not None and (probed.get("from_scratch") or probed.get("began_again")):
        return {"effective": False, "how": f"attempt {number + 1} began again at step 1 (the probe)"}
    interrupted_nothing = _interrupted_nothing(number, before, (traced or {}).get("reference_last"))
    if interrupted_nothing is not None:
        return interrupted_nothing
    if not saved and not announced:
        return {
            "effective": False,
            "how": f"nothing was saved before it: attempt {number} had not saved a checkpoint (no file that an "
            f"uninterrupted run saves as it goes, in its work directory, HOME or TMPDIR, written whole before "
            f"the signal; no checkpoint announced to the probe){seen}",
        }
    if probed is not None and probed.get("steps"):
        judged = _judged_by_probe(run, number, probed, saved, files_bind)
        if judged is not None:
            return judged
    return _judged_by_files(run, number, saved, restart_from, restart_to, seen)


def _interrupted_nothing(number: int, before: dict | None, last: int | None) -> dict | None:
    """A stop whose attempt had made every update of an uninterrupted run: it interrupted no training."""
    if not (before is not None and before.get("steps") and last and before.get("last_step", 0) >= last):
        return None
    if before.get("last_before_signal", last) < last:  # the signal came mid-training, the updates went on
        return {
            "effective": False,
            "survived": True,
            "how": f"attempt {number} outlived the signal: it trained on after it, from step "
            f"{before['last_before_signal'] + 1} to the uninterrupted run's last update {last} (the probe), so "
            "the stop interrupted no training (the script ignores or defers the signal and does not stop)",
        }
    return {
        "effective": False,
        "how": f"attempt {number} had made every update of an uninterrupted run before the signal (the "
        "probe): the stop interrupted no training (a line printed late, or a stop during its exit)",
    }


def _judged_by_probe(run: Run, number: int, probed: dict, saved: set[str], files_bind: bool) -> dict | None:
    """A stop judged by the probe's word on its restart, borne out by what the restart read (files_bind);
    None where the probe cannot place the restart (the files judge it then)."""
    stopped, restart = run.attempts[number - 1], run.attempts[number]
    signal_at = run.began + stopped.started_s + (stopped.signal_s if stopped.signal_s is not None else stopped.seconds)
    restart_from, restart_to = run.began + restart.started_s, run.began + restart.started_s + restart.seconds
    if probed["how"] in ("given", "matched") and probed["resumed_at"] > 0:
        late = probed.get("late_first_update")
        if late:
            return {
                "effective": False,
                "how": f"attempt {number + 1}'s first update is step {late['step']} (the probe), but it came "
                f"{late['delay_s']} s after the attempt started, where the uninterrupted run made its first "
                f"update {late['reach_first_s']} s after its start and step {late['step']} after "
                f"{late['reach_step_s']} s: it trained the updates before again without recording them "
                "(began again), or spent that long before its first update (a data loader fast-forwarded "
                "batch by batch, a slow checkpoint load): timing cannot tell these apart, so the stop proves "
                "nothing",
            }
        # what the restart read of what the stopped attempt's own stop handler saved, if any caught the signal
        handler_read = _read_after_signal(run, restart_from, restart_to, signal_at) if stopped.caught else set()
        unread = _unread_state(run, saved, restart_from, restart_to, handler_read) if files_bind else None
        if unread:
            return {
                "effective": False,
                # what it resumed from is not this run's own checkpoint (it saved none)
                "elsewhere": unread.startswith("its run saved no state file"),
                "how": f"attempt {number + 1}'s first update is step "
                f"{probed['resumed_at'] + 1} (the probe), but {unread}",
            }
        after_signal = (
            f"; from a file written after the signal ({', '.join(sorted(handler_read)[:2])}: the script's own "
            "stop path): what it saves as it goes was not tested (--signal KILL tests it)"
            if handler_read
            else ""
        )
        return {
            "effective": True,
            "by": "probe",
            "how": f"attempt {number + 1} resumed at step {probed['resumed_at']} (the probe)" + after_signal,
        }
    if probed["how"] in ("given", "matched", "first"):
        return {"effective": False, "how": f"attempt {number + 1} began again at step 1 (the probe)"}
    return None


def _unread_state(
    run: Run, saved: set[str], restart_from: float, restart_to: float, handler_read: set[str]
) -> str | None:
    """Why the probe's word that a restart resumed is not borne out by its files (None: it is, or the files
    were not all seen: under SLURM, or inotify missed some): where everything was seen, a restart that
    resumed read a state file its run saved before the stop. A first update past step 1 alone can be a
    restart that began again without recording the steps it redid (a logger that skips steps already
    logged), or one that read its state from outside its own directories (another run's)."""
    activity = run.activity
    if activity is None or not activity.complete:
        return None
    if not saved:
        if handler_read:
            return None  # it resumed from what its stop handler saved (said in the stop's note)
        if not any(state_key(e.path) in run.state for e in activity.writes(until=restart_from)):
            return (
                "its run saved no state file in its work directory, HOME or TMPDIR before the stop: it resumed "
                "from state elsewhere (a fixed path another run can write), which check does not accept"
            )
        return (
            "no state file its run saved was whole on disk when it began (each written after the signal by an "
            "attempt the signal ended): it began again without recording the steps it redid, or resumed from "
            "state elsewhere"
        )
    if not _restart_reads(activity, saved, restart_from, restart_to):
        return (
            f"it read none of the {counted(len(saved), 'file')} saved before the stop: it began again without "
            "recording the steps it redid, or resumed from state elsewhere"
        )
    return None


def _read_after_signal(run: Run, restart_from: float, restart_to: float, signal_at: float) -> set[str]:
    """The files the restart read that the stopped attempt wrote after the signal (its own stop handler's
    save, under any name: preempt.npz, Lightning's hpc_ckpt): where it resumed from one, the checkpoints it
    saves as it goes (what a crash resumes from) were not tested."""
    activity = run.activity
    if activity is None:
        return set()
    return _written_after(activity, signal_at, restart_from) & {
        e.path for e in activity.reads(restart_from, restart_to)
    }


def _written_after(activity, signal_at: float, restart_from: float) -> set[str]:
    """The files the stopped attempt wrote after its stop's signal. No slack on inotify's times (they lag the
    write): a save just before the signal may be named as after it, a note too many, never one too few (a
    handler's save right after the signal is what this is for). But a file whose content last changed
    before the signal (its mtime; a few ms of slack for the kernel's coarse clock) was not saved after it:
    one kept open (SQLite, a log) is closed as the process ends."""
    return {
        e.path
        for e in activity.writes(signal_at, restart_from)
        if e.modified is None or e.modified >= signal_at - MTIME_SLACK_S
    }


def _restart_reads(activity, saved: set[str], restart_from: float, restart_to: float) -> list:
    """The reads of saved files (or of files inside a saved directory) by a restart, before it wrote them
    again."""

    def saved_as(path: str) -> str | None:  # the saved file, or the saved directory holding it (Orbax)
        return next((s for s in saved if path == s or path.startswith(s + "/")), None)

    # In the order inotify gave them, not by time: the events of one read of its queue share a time (on a
    # busy machine a restart's read of its checkpoint and its next save of it can come together).
    reads, written_again = [], set()
    for event in list(activity.events):
        if not restart_from <= event.at < restart_to:
            continue
        if event.kind == "write":
            written_again.add(event.path)
        elif (name := saved_as(event.path)) is not None and name not in written_again:
            reads.append(event)
    return reads


# inotify's events are stamped when check reads them, up to a few tenths of a second late on a busy machine:
# a save that an --at-line stop followed at once is stamped after the signal. A write stamped within this of
# the signal counts as before it (one truly cut off leaves a truncated file, which a restart cannot resume
# from unnoticed: it fails, or begins again and the probe says so).
SIGNAL_SLACK_S = 0.25


def _saved(run: Run, signal_at: float, restart_from: float, killed: bool) -> set[str]:
    """The state files (run.state) whole on disk when the restart began: written before the signal and
    not written again after it by an attempt the signal killed (that write was cut off: a truncated
    file); an attempt that handled the signal and exited on its own saved deliberately."""
    if run.activity is None:
        return set()
    last: dict[str, float] = {}
    for event in run.activity.writes(until=restart_from):
        if state_key(event.path) in run.state:
            last[event.path] = event.at
    return {path for path, at in last.items() if at < signal_at + SIGNAL_SLACK_S or not killed}


def _saved_as(path: str, saved: set[str]) -> str | None:
    """The saved file a path is, or the saved directory holding it (an Orbax checkpoint)."""
    return next((s for s in saved if path == s or path.startswith(s + "/")), None)


def _judged_by_files(run: Run, number: int, saved: set[str], restart_from: float, restart_to: float, seen: str):
    """Without the probe's word: the restart read a saved state file (and, where it ran to the end, saved
    again after it), and the attempt that ran to the end saved fewer times than an uninterrupted run (one
    that began again saves as often)."""
    activity = run.activity
    if activity is None or not activity.complete:
        why = activity.why_incomplete if activity is not None else "not watched"
        return {"effective": False, "how": f"what attempt {number + 1} read and wrote was not all seen ({why})"}
    reads = _restart_reads(activity, saved, restart_from, restart_to)
    if not reads:
        return {
            "effective": False,
            "how": f"attempt {number + 1} read none of the {counted(len(saved), 'file')} saved before "
            f"the stop: it began again instead of resuming{seen}",
        }
    read = {_saved_as(e.path, saved) for e in reads}
    named = ", ".join(sorted(read)[:3])
    # The attempt that ran to its end must have saved the checkpoint it read again: else it trained
    # nothing from it (resumed after the last save, or read what an attempt that ran on after the signal
    # left). An attempt stopped again before its first save is judged by the last one's saves below.
    progress = [
        e for e in activity.writes(reads[0].at, restart_to) if state_key(e.path) in {state_key(r) for r in read}
    ]
    if not progress and number + 1 == len(run.attempts):
        return {
            "effective": False,
            "how": f"attempt {number + 1} read {named} but saved nothing after it: it trained nothing (a stop "
            "after the last save, or an attempt that ran to its end after the signal)",
        }
    # The count of saves tells a resume from a restart: the attempts of a run that resumed save, all
    # together, exactly as often as an uninterrupted run (none redid a save); one that began again
    # redoes its saves. Only where saves follow the training, not the clock (both uninterrupted runs
    # saved equally often).
    total = len(activity.save_moments(since=run.began, state=run.state))
    if run.clean_saves <= 0:
        return {
            "effective": False,
            "read": True,  # it read a checkpoint: a difference after it may be the resume's
            "how": f"attempt {number + 1} read {named}, but whether it continued from it cannot be told from its "
            "files: the uninterrupted runs saved a different number of times (saves that follow the clock, not "
            "the training). The probe's two calls tell (docs/check.md)",
        }
    if total != run.clean_saves:
        return {
            "effective": False,
            "read": True,  # it read a checkpoint: a difference after it may be the resume's
            "how": f"attempt {number + 1} read {named}, but the attempts saved {total} times in all where an "
            f"uninterrupted run saved {run.clean_saves}: that they continued from one another's saves is not "
            "shown (a restart that began again redoes saves; so does a save when the signal came)",
        }
    return {
        "effective": True,
        "by": "files",  # a read and a count: not proof that the restart applied what it read
        "read": True,
        "how": f"attempt {number + 1} read {named}, saved before the stop, and the attempts saved {total} times in "
        "all, as an uninterrupted run (the files; whether it applied all it read, the probe would show)",
    }


def leaked_state(clean: list[Run], first_updates: dict[str, int | None]) -> str | None:
    """Why a run seems to have started from state another left outside its directories, or None.
    first_updates: a run's name -> the uninterrupted run's step its first update matches (or the step it
    gave), None where unknown."""
    for name, step in first_updates.items():
        if step is not None and step > 1:
            return f"{name}'s first update is step {step} of an uninterrupted run: it began where another run ended"
    if any(step is not None for step in first_updates.values()):
        return None  # the probe placed the runs' first updates: their times say nothing more
    times = {run.name: run.attempts[-1].seconds for run in clean if run.attempts and run.attempts[-1].exit == 0}
    if len(times) >= 2:
        fast, slow = min(times, key=times.get), max(times, key=times.get)
        if times[fast] < LEAK_RATIO * times[slow]:
            return (
                f"{fast} took {times[fast]:.1f} s where {slow} took {times[slow]:.1f} s: it may have begun from "
                "state another run left (a checkpoint at a fixed path outside its work directory?), or found a "
                "cache warm (a dataset or compiled code at a fixed path); the probe's first update would tell"
            )
    return None


# A last attempt that resumed at least RESUMED_LATE of the way into the training yet took SLOW_RESTART of an
# uninterrupted run's time or more did not show that it resumed (its expected share is 1 - RESUMED_LATE).
RESUMED_LATE, SLOW_RESTART = 0.3, 0.9


def unproven(evidence: list[dict], comparison: dict, probe: dict | None, stopped: Run, clean: list[Run]) -> list[str]:
    """What keeps identical outputs after effective stops from proving the resume: a restart shown by its
    files only (it read a checkpoint and saved as often as it should: it may still have begun again, e.g.
    with rotated checkpoints or saves skipped for steps already saved), a declared output not compared,
    a rank whose trace is missing, file activity not all seen (the probe's word was not checked against
    what the restarts read), a last attempt that took as long as an uninterrupted run although it resumed
    well into the training (it may have redone, unrecorded, the steps before)."""
    reasons = []
    activity = stopped.activity
    if activity is not None and not activity.complete:
        reasons.append(f"what the restarts read was not all seen ({activity.why_incomplete})")
    resume = (probe or {}).get("resume") or {}
    last = next((a for a in resume.get("attempts", []) if a["attempt"] == len(stopped.attempts)), None)
    total, whole = resume.get("reference_last") or 0, min((r.attempts[-1].seconds for r in clean), default=0)
    if (
        last
        and last.get("steps")
        and total
        and whole
        and stopped.attempts[-1].exit == 0
        and _training_dominates(clean[0])
    ):
        share = last["resumed_at"] / total
        took = stopped.attempts[-1].seconds
        if share >= RESUMED_LATE and took >= SLOW_RESTART * whole:
            reasons.append(
                f"attempt {len(stopped.attempts)} took {took:.1f} s, as long as an uninterrupted run ({whole:.1f} s), "
                f"though its first update is step {last['resumed_at'] + 1} of {total}: it may have redone the "
                "steps before without recording them"
            )
    by_files = [e["stop"] for e in evidence if e["effective"] and e.get("by") == "files"]
    if by_files:
        reasons.append(
            f"{'stops' if len(by_files) > 1 else 'stop'} {', '.join(map(str, by_files))} shown by files only (a "
            "restart read a checkpoint; whether it applied it or began again, only the probe shows: "
            "from reprocube import probe, docs/check.md)"
        )
    unread = comparison.get("not_compared") or []
    if unread:
        reasons.append(f"{', '.join(unread[:3])} not compared (see not checked)")
    missing = missing_ranks(resume)
    if missing:
        reasons.append(missing)
    return reasons


def _training_dominates(clean: Run) -> bool:
    """Whether an uninterrupted run's first save came in the first half of it: its start-up (importing a
    framework, loading data) is then a small part, and a restart's duration tells how much it trained."""
    activity = clean.activity
    if activity is None or not clean.attempts:
        return False
    began = clean.began + clean.attempts[0].started_s
    saves = activity.save_moments(since=began, state=clean.state or activity.state_keys())
    return bool(saves) and saves[0] - began <= 0.5 * clean.attempts[-1].seconds
