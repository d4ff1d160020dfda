"""More uninterrupted runs, started where the stopped run differs: where one of them differs from clean-1 too,
the script differs from one process to the next (two uninterrupted runs that agreed were lucky), and resume is
not blamed. Under --quick, which made one uninterrupted run, they are all that stands between a difference and
resume's blame: they run to their end and their outputs are compared, and where none ran well the verdict says
so instead of blaming resume."""

from __future__ import annotations

from dataclasses import replace

from reprocube.check.comparisons import own_value_difference
from reprocube.check.evidence import StoppedEvidence
from reprocube.check.runs import Stop
from reprocube.check.traces import differs_through, recorded_through
from reprocube.terminal import one_line

MORE_CLEAN_RUNS = 2  # uninterrupted runs started where the stopped run differs (per-process non-determinism)


def more_uninterrupted_runs(session, stopped: StoppedEvidence) -> StoppedEvidence:
    """MORE_CLEAN_RUNS more uninterrupted runs, together, each against clean-1 (session: check.session's
    CheckSession): the stopped run's evidence with what they showed."""
    first = session.options.repeat + 1
    names = [f"clean-{n}" for n in range(first, first + MORE_CLEAN_RUNS)]
    session.echo(
        one_line(f"  the stopped run differs: {len(names)} more uninterrupted runs tell whether every process does")
    )
    # With the probe's first differing update, each run is ended once it recorded that step: only the updates
    # up to it are compared (the rest of the run would cost a whole run for nothing more). Not under --quick:
    # there no two uninterrupted runs' outputs were ever compared, and a difference in an output alone (a
    # timestamp) would pass for resume's. (Not under SLURM: a check's own stop there is a requeue.)
    difference = ((session.result["probe"] or {}).get("resume") or {}).get("first_difference")
    # Nor under --sweep: what they tell stands for every save's stopped run, whose first differences differ.
    whole = session.options.quick or session.options.sweep is not None
    ends_early = difference and difference.get("after_stop") and session.slurm is None and not whole
    through = difference["step"] if ends_early else None
    planned = [(session.new_run(name), [], session.limit) for name in names]
    if through is not None:
        planned = [
            (run, [Stop(until=recorded_through(run, through), ends_run=True)], limit) for run, _, limit in planned
        ]
    runs = session.ran_together(planned)
    failed = next((session.failure(run) for run in runs if run.exit != 0 and not run.stops_landed), None)
    stopped = replace(stopped, more_clean_runs_failed=failed)
    if through is not None:
        told = [
            (run, differs_through(session.clean[0], run, through)) for run in runs if run.exit == 0 or run.stops_landed
        ]
        shown = next(((run, where) for run, where in told if where), None)
        if shown is not None:
            return replace(stopped, per_process_differs=f"{shown[0].name}: {shown[1]}", more_clean_runs=len(told))
        return replace(stopped, more_clean_runs=len(told), more_clean_runs_through=through)
    ran = [run for run in runs if run.exit == 0]  # a failure tells nothing of determinism
    for run in ran:
        comparison = session.compared(run, session.clean[0])
        session.result["comparisons"]["repeat"].append(comparison)
        _, where = session.against_clean_1(run, comparison, {})
        if where:
            own = own_value_difference(session.clean[0], run, comparison, session.outputs)
            return replace(stopped, per_process_differs=f"{run.name}: {where}", own_value=own, more_clean_runs=len(ran))
    return replace(stopped, more_clean_runs=len(ran))
