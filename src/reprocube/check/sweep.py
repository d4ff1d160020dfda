"""`check --sweep N`: one stopped run per save of the uninterrupted run (its first N saves but its last), each
stopped once, a drawn share of the time between two saves after that save, and restarted to its end. Each
run's verdict comes from the same table as the stopped run's (check.verdict), on the same evidence; so "exact
after an epoch's end, differs after a mid-epoch save" is one command's answer, a line per save.

The check's verdict is the first save's whose restart did not resume exactly (its summary says which save),
else the last exact save's; a stop that proved nothing (after the run's last update) decides only where all
did, and is said under not checked. No negative control and no restart given other state run (said first among what was
not checked); where a stopped run differs, the more uninterrupted runs that tell a process's own
non-determinism from resume's run once, to their end, and tell every save's verdict."""

from __future__ import annotations

from dataclasses import dataclass, replace

from reprocube.check.evidence import MovedEvidence, StoppedEvidence, SwapEvidence
from reprocube.check.more_uninterrupted import more_uninterrupted_runs
from reprocube.check.runs import Run, Stop
from reprocube.check.stops import sweep_plans
from reprocube.check.traces import run_traces
from reprocube.check.verdict import Verdict, decide, wants_more_uninterrupted_runs
from reprocube.errors import EXIT_CHECK_VOID, CheckpointError
from reprocube.terminal import counted, one_line

SWEEP_LEFT_OUT = (
    "--sweep: no negative control and no restart given another run's state or its weights moved, so whether "
    "the restarts used the state they read was not checked (the check without --sweep runs them)"
)
SWEEP_NOT_RUN = "not run (--sweep)"
# what the more uninterrupted runs told: the same for every save's stopped run (they are compared to clean-1 only)
TOLD_BY_MORE_RUNS = (
    "per_process_differs",
    "more_clean_runs",
    "more_clean_runs_through",
    "more_clean_runs_failed",
    "own_value",
)
# what each stopped run's evidence writes into the result (the chosen save's is kept)
PER_RUN_RESULT = ("stop_evidence",)


@dataclass
class SaveVerdict:
    save: int  # the kth whole save of the run's first attempt, after which it was stopped
    run: Run
    verdict: Verdict
    result: dict  # what its evidence wrote into check.json: comparisons.resume, probe.resume, stop_evidence
    announced: tuple[int, ...] = ()  # the steps the uninterrupted run announced its checkpoints at (the probe)

    def resumed_at(self) -> int | None:
        """Where its restart resumed, by the probe (None without it, or where it made no update)."""
        attempts = (self.result.get("probe_resume") or {}).get("attempts") or []
        restart = attempts[1] if len(attempts) > 1 else {}
        return restart.get("resumed_at") if restart.get("steps") else None

    def tested(self) -> int | None:
        """The save its restart took: by the probe, the place of the step it resumed at among the checkpoints the
        uninterrupted run announced (a save is what the script announced; the files may group otherwise: a
        folder written twice into, a file written at some saves only, a save finished by a thread); else, by
        the files, the whole saves written before the signal. None: not told."""
        resumed = self.resumed_at()
        if self.announced and resumed is not None:
            return self.announced.index(resumed) + 1 if resumed in self.announced else None
        return self.saves_before_stop()

    def saves_before_stop(self) -> int | None:
        """How many whole saves its first attempt had written when the signal was sent (by the files' own
        times where known): the save the restart could take; None where no signal was sent."""
        attempt, run = self.run.attempts[0] if self.run.attempts else None, self.run
        if attempt is None or attempt.signal_s is None or run.activity is None:
            return None
        start = run.began + attempt.started_s
        signal, ended = start + attempt.signal_s, start + attempt.seconds
        saves = run.activity.saves(since=start, until=ended + 1.0, state=run.state)  # seen late: the files' times
        # A whole save's files may come apart into two saves as the run's updates group them afterwards (a file's
        # mtime before an update, its rename after): the files written since the last whole one are added up.
        count, since_whole = 0, frozenset()
        for save in saves:
            if (save.written or save.end) > signal:
                break
            since_whole |= save.keys
            if since_whole >= run.save_keys:
                count, since_whole = count + 1, frozenset()
        return count

    def missed(self) -> str | None:
        """Why this run tested another save than its own, in words; None where it tested its own."""
        tested, resumed = self.tested(), self.resumed_at()
        if tested == self.save:
            return None
        if self.announced and resumed is not None:
            took = f"its restart resumed at update {resumed}, " + (
                f"save {tested} as the script announced its checkpoints" if tested else "no checkpoint announced"
            )
        else:
            before = self.saves_before_stop()
            took = "no stop was sent" if before is None else f"the stop came after {counted(before, 'whole save')}"
        return f"save {self.save}: {took}, so what a restart from save {self.save} does was not tried here"

    def line(self) -> dict:
        """check.json's "sweep" entry."""
        first = (self.result.get("probe_resume") or {}).get("first_difference")
        return {
            "save": self.save,
            "run": self.run.name,
            "stops_landed": self.run.stops_landed,
            "saves_before_stop": self.saves_before_stop(),  # by the files
            "tested_save": self.tested(),  # == save where this run tried its own save
            "resumed_at": self.resumed_at(),
            "verdict": self.verdict.name,
            "rule": self.verdict.rule,
            "first_difference": first.get("step") if isinstance(first, dict) else None,
            "summary": one_line(f"{self.verdict.name}: {self.verdict.summary}"),
        }


def sweep_verdict(session, stop_seed: int) -> dict:
    """The sweep's runs and verdicts (session: check.session's CheckSession, after its clean runs)."""
    plans, why_not = sweep_plans(session.options, session.clean[0], stop_seed)
    if plans is None:
        return session.judge(session.evidence(no_saves=why_not))
    session.result["not_checked"].insert(0, SWEEP_LEFT_OUT)
    session.result["stops"] = "; ".join(f"sweep-{k}: {plan[0].describe()}" for k, plan in enumerate(plans, 1))
    runs = [session.new_stopped_run(f"sweep-{k}") for k in range(1, len(plans) + 1)]
    session.ran_together([(run, plan, session.limit) for run, plan in zip(runs, plans, strict=True)])
    shared = list(session.result["not_checked"])
    told: StoppedEvidence | None = None  # what the more uninterrupted runs told, once run
    judged, announced = [], announced_saves(session.clean[0])
    for save, (run, plan) in enumerate(zip(runs, plans, strict=True), start=1):
        session.result["not_checked"] = list(shared)
        verdict, told = _one_save(session, run, plan, told)
        judged.append(SaveVerdict(save, run, verdict, _taken(session.result), announced))
        session.echo(one_line(f"  after save {save}: {verdict.name}"))
    missed = [j.missed() for j in judged if j.missed()]
    untried = sorted(set(range(1, len(judged) + 1)) - {j.tested() for j in judged})
    if untried:  # no run's restart took these: a sweep's answer holds for the saves it tried only
        names = f"save {untried[0]}" if len(untried) == 1 else f"saves {', '.join(map(str, untried))}"
        missed.append(
            f"{names} of the {len(judged)} swept: no restart of the sweep took {'it' if len(untried) == 1 else 'them'}"
        )
    chosen = chosen_save(judged)
    voided = [j for j in judged if j.verdict.exit_status == EXIT_CHECK_VOID and j is not chosen]
    missed += [f"save {j.save}: its stop proved nothing ({j.verdict.name}: {j.verdict.summary})" for j in voided]
    _put_back(session.result, chosen.result)
    session.result["not_checked"] += missed
    session.result["sweep"] = [{**j.line(), "chosen": j is chosen} for j in judged]
    verdicts = ", ".join(_said(j) for j in judged)
    taken = chosen.tested()
    where = (
        f"after save {chosen.save}"
        if taken == chosen.save
        else f"meant for save {chosen.save}, its restart took " + (f"save {taken}" if taken else "no save told")
    )
    swept = counted(len(judged), "save")
    summary = f"the stop {where}, of {swept} swept ({verdicts}): {chosen.verdict.summary}"
    return session.finish(chosen.verdict.name, chosen.verdict.stage, summary, chosen.verdict.rule)


def chosen_save(judged: list[SaveVerdict]) -> SaveVerdict:
    """The save whose verdict is the check's: the first finding (a save whose restart differs, failed, ...),
    else the last exact one; a stop that proved nothing (after the run's last update, or before any save it
    could take) decides only where every save's did."""
    void = [j for j in judged if j.verdict.exit_status == EXIT_CHECK_VOID]
    found = [j for j in judged if j not in void and j.verdict.name != "resume-exact"]
    exact = [j for j in judged if j.verdict.name == "resume-exact"]
    return found[0] if found else exact[-1] if exact else void[0]


def _said(judged: SaveVerdict) -> str:
    """One save's verdict in the summary: the save its restart took, where that is not its own."""
    taken = judged.tested()
    if taken == judged.save:
        return f"{judged.save}: {judged.verdict.name}"
    took = f"its restart took save {taken}" if taken else "which save its restart took is not told"
    return f"{judged.save}: not tried, {took}: {judged.verdict.name}"


def announced_saves(clean: Run) -> tuple[int, ...]:
    """The steps rank 0 of the uninterrupted run announced its checkpoints at (probe.checkpoint, the trainers'
    callbacks), each once, in order; () without the probe."""
    try:
        (ranks,) = run_traces(clean)
    except (CheckpointError, ValueError):
        return ()
    trace = ranks.get(0)
    return tuple(dict.fromkeys(trace.checkpoints)) if trace is not None else ()


def _one_save(session, run: Run, plan: list[Stop], told: StoppedEvidence | None):
    """One save's verdict from the table, stage by stage as the stopped run's; and what the more uninterrupted
    runs told (run here the first time a stopped run differs)."""
    session.stopped = run
    parts: dict = {"reached": "stopped", **session.tampering()}
    verdict = decide(session.evidence(**parts))
    if verdict is None:
        # a sweep stops after each save in turn: no "after the first save only" (nor --stops to reach more)
        parts["stopped"] = replace(session.stopped_evidence(run, plan), stops_after_first_save=False)
        if wants_more_uninterrupted_runs(session.evidence(**parts)):
            if told is None:
                parts["stopped"] = told = more_uninterrupted_runs(session, parts["stopped"])
            else:
                parts["stopped"] = replace(parts["stopped"], **{f: getattr(told, f) for f in TOLD_BY_MORE_RUNS})
        verdict = decide(session.evidence(**parts))
    if verdict is None:
        restarts = {"swap": SwapEvidence(note=SWEEP_NOT_RUN), "moved": MovedEvidence(note=SWEEP_NOT_RUN)}
        parts.update(**restarts, written_beside=session.beside.written())
        verdict = decide(session.evidence(**parts))
    assert verdict is not None, "the table decides once every stage's evidence is in"  # reprocube's own bug
    session.result["not_checked"] += list(verdict.not_checked)
    return verdict, told


def _taken(result: dict) -> dict:
    """What one save's evidence wrote into the result, taken out of it (the next save's writes its own)."""
    probe = result.get("probe") or {}
    return {
        "comparisons_resume": result["comparisons"].pop("resume", None),
        "probe_resume": probe.pop("resume", None) if isinstance(probe, dict) else None,
        "not_checked": list(result["not_checked"]),
        **{key: result.pop(key, None) for key in PER_RUN_RESULT},
    }


def _put_back(result: dict, taken: dict) -> None:
    """The chosen save's evidence into the result, as a check's one stopped run's would be."""
    if taken["comparisons_resume"] is not None:
        result["comparisons"]["resume"] = taken["comparisons_resume"]
    if taken["probe_resume"] is not None:
        result["probe"] = {**(result.get("probe") or {"repeat": []}), "resume": taken["probe_resume"]}
    result["not_checked"] = taken["not_checked"]
    for key in PER_RUN_RESULT:
        if taken[key] is not None:
            result[key] = taken[key]
