"""What each stop of `reprocube check`'s stopped run proved. A stop counts (is effective) only if the
command had saved something before it and the next attempt demonstrably continued from it:

- saved: a file the run wrote in its directories (work directory, HOME, TMPDIR) before the signal, as
  inotify saw it (reprocube.orchestration.file_activity), or a checkpoint announced to the probe;
- continued: with the probe, the next attempt's first update is past step 1 (the step it gave, or the
  uninterrupted run's step whose bits it equals); a restart that began at step 1 again never counts,
  whatever it read. Without the probe (or where it cannot tell), the next attempt read a file the run had
  written before the stop, and that file is named: a script that reads back some other file it wrote
  (a config) would count, which the probe's two calls rule out.

A stop that did not land (the command ended first) proved nothing either. And where a run's first
attempt began past update 1, or an uninterrupted run took a fraction of another's time, it started from
state that another run left outside its directories (`leaked_state`)."""

from __future__ import annotations

from reprocube.orchestration.check_runs import Run
from reprocube.terminal import counted

LEAK_RATIO = 0.4  # a complete run this much faster than another started from state someone else left


def stop_evidence(run: Run, traced: dict | None) -> list[dict]:
    """Per requested stop of `run`: {"stop", "landed", "effective", "how"}; traced: compare_stopped's
    answer for the run (None without the probe)."""
    probe_attempts = {a["attempt"]: a for a in (traced or {}).get("attempts", [])}
    evidence = []
    for number, attempt in enumerate(run.attempts, start=1):
        if attempt.stop is None:
            continue
        if attempt.stopped_early or number == len(run.attempts):
            how = "it did not land: the command ended before it" if attempt.stopped_early else "no restart followed"
            evidence.append({"stop": number, "landed": False, "effective": False, "how": how})
            continue
        evidence.append({"stop": number, "landed": True, **_judged(run, number, probe_attempts.get(number + 1))})
    return evidence


def _judged(run: Run, number: int, probed: dict | None) -> dict:
    stopped, restart = run.attempts[number - 1], run.attempts[number]
    signal_at = run.began + stopped.started_s + (stopped.signal_s if stopped.signal_s is not None else stopped.seconds)
    restart_from, restart_to = run.began + restart.started_s, run.began + restart.started_s + restart.seconds
    activity = run.activity
    saved = {e.path for e in activity.writes(until=signal_at)} if activity is not None else set()
    announced = probed is not None and probed.get("last_announced") is not None
    seen = (
        "" if activity is None or activity.complete else f" (not all file activity was seen: {activity.why_incomplete})"
    )
    if probed is not None and probed.get("from_scratch"):
        return {"effective": False, "how": f"attempt {number + 1} began again at step 1 (the probe)"}
    if not saved and not announced:
        return {
            "effective": False,
            "how": f"nothing was saved before it: attempt {number} had written no file in its work directory, "
            f"HOME or TMPDIR and announced no checkpoint{seen}",
        }
    if (
        probed is not None
        and probed.get("steps")
        and probed["how"] in ("given", "matched")
        and probed["resumed_at"] > 0
    ):
        return {"effective": True, "how": f"attempt {number + 1} resumed at step {probed['resumed_at']} (the probe)"}
    if probed is not None and probed.get("steps") and probed["how"] in ("given", "matched", "first"):
        return {"effective": False, "how": f"attempt {number + 1} began again at step 1 (the probe)"}
    written_again: dict[str, float] = {}
    for event in activity.writes(restart_from, restart_to) if activity is not None else []:
        written_again.setdefault(event.path, event.at)
    read = sorted(
        {
            e.path
            for e in (activity.reads(restart_from, restart_to) if activity is not None else [])
            if e.path in saved and e.at < written_again.get(e.path, float("inf"))
        }
    )
    if read:
        named = ", ".join(read[:3]) + (f" and {len(read) - 3} more" if len(read) > 3 else "")
        return {
            "effective": True,
            "how": f"attempt {number + 1} read {named}, which the run had written before the stop (files: "
            "call the probe to see where it resumed)",
        }
    return {
        "effective": False,
        "how": f"attempt {number + 1} read none of the {counted(len(saved), 'file')} the run had written before "
        f"the stop: it began again instead of resuming{seen}",
    }


def leaked_state(clean: list[Run], first_updates: dict[str, int | None]) -> str | None:
    """Why a run seems to have started from state another left outside its directories, or None.
    first_updates: a run's name -> the uninterrupted run's step its first update matches (or the step it
    gave), None where unknown."""
    for name, step in first_updates.items():
        if step is not None and step > 1:
            return f"{name}'s first update is step {step} of an uninterrupted run: it began where another run ended"
    times = {run.name: run.attempts[-1].seconds for run in clean if run.attempts and run.attempts[-1].exit == 0}
    if len(times) >= 2:
        fast, slow = min(times, key=times.get), max(times, key=times.get)
        if times[fast] < LEAK_RATIO * times[slow]:
            return (
                f"{fast} took {times[fast]:.1f} s where {slow} took {times[slow]:.1f} s: it began from "
                "state another run left (a checkpoint at a fixed path outside its work directory?)"
            )
    return None
