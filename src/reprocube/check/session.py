"""`reprocube check`'s way through a command (commands/check.py parses its options): the clean runs, which
must agree (else it is not deterministic and resume is never blamed); the receipt; the negative control
(another seed must change the outputs, else the check is void); the stopped run, stopped `stops` times and
restarted after each; and the verdict, from the declared outputs and, where the script calls the probe,
every update. Each stage that ends the check writes check.json and check.md with its verdict."""

from __future__ import annotations

import os
import threading
import time
from dataclasses import replace
from pathlib import Path

from reprocube.analysis.outputs import collect, compare_outputs
from reprocube.check.announce import announce
from reprocube.check.beside_runs import BesideRuns
from reprocube.check.comparisons import first_difference_words as _first
from reprocube.check.comparisons import identical_words as _identical
from reprocube.check.comparisons import layout_as_same, own_value_difference
from reprocube.check.copy_inputs import copy_inputs
from reprocube.check.evidence import (
    ControlEvidence,
    Evidence,
    MovedEvidence,
    RepeatEvidence,
    StoppedEvidence,
    SwapEvidence,
)
from reprocube.check.evidence_dirs import DirectoryReplaced, EvidenceDirs, changed_output, reference_digests
from reprocube.check.file_activity import FileActivity, first_keys, whole_save
from reprocube.check.guarded_command import end_all_guards
from reprocube.check.more_uninterrupted import MORE_CLEAN_RUNS, more_uninterrupted_runs
from reprocube.check.moved_weights import MovedWeightsRestarts
from reprocube.check.options import CheckOptions, validate
from reprocube.check.receipt import write_receipt
from reprocube.check.runs import SIGNALS, Run, Stop, execute, failure_line
from reprocube.check.slots import in_parallel, isolated_environment, last_line, workspace
from reprocube.check.slurm import check_slurm, execute_slurm
from reprocube.check.stop_evidence import interrupted_saves, leaked_state, stop_evidence, unproven
from reprocube.check.stops import plan_stops, with_a_wait
from reprocube.check.swapped_restart import SwappedRestart
from reprocube.check.sweep import sweep_verdict
from reprocube.check.traces import repeat_trace, resume_trace, update_times
from reprocube.check.trainer_words import restarts_said
from reprocube.check.verdict import decide, wants_more_uninterrupted_runs
from reprocube.check.verdict_words import ONE_STOP, QUICK_LEFT_OUT, QUICK_NOT_RUN
from reprocube.errors import ConfigError
from reprocube.formats.env import collect_env
from reprocube.formats.output_files import link_above
from reprocube.results.check_result import write_check
from reprocube.terminal import counted, one_line


def check(options: CheckOptions, echo=print) -> dict:
    """check.json's content, once written. Under --launcher slurm each run is a SLURM job with
    options.slurm's sbatch options, each stop a requeue (reprocube.check.slurm). --jobs: how
    many runs go at once (the clean runs together, then the control beside the stopped run); None: this
    machine's cores, at most 2 (one job under SLURM)."""
    started = time.perf_counter()
    validate(options)
    if options.slurm is not None:
        check_slurm(options.slurm)  # sbatch and scontrol answer, before any run
    stop_seed = options.stop_seed if options.stop_seed is not None else int.from_bytes(os.urandom(4), "little")
    out = workspace(options.out, options.command)
    session = CheckSession(options, out, echo, started)
    session.result |= {"stop_seed": stop_seed, "signal": options.signal}
    announce(options, session.how, out, echo)
    try:
        with session.beside:
            return session.clean_runs() or session.control_and_stopped_run(stop_seed)
    except KeyboardInterrupt:
        end_all_guards()  # the runs other threads wait on (--jobs) end too, not only the one here
        echo(f"check interrupted: its runs ended; the evidence so far is in {out} (logs/, work/)")
        raise


class CheckSession:
    """One check's runs and its growing result; each stage returns the finished result when its verdict
    ends the check, or None to go on."""

    def __init__(self, options: CheckOptions, out: Path, echo, started: float):
        self.options, self.out, self.echo, self.started = options, out, echo, started
        self.command, self.outputs, self.ignore = list(options.command), list(options.output), list(options.ignore)
        self.seed_env, self.seed_arg, self.slurm = options.seed_env, options.seed_arg, options.slurm
        cores = max(1, min(2, len(os.sched_getaffinity(0))))
        self.jobs = options.jobs or (1 if self.slurm is not None else cores)
        self.signum = SIGNALS[options.signal]
        self.how = "SLURM requeue" if self.slurm is not None else f"SIG{options.signal}"
        self.clean: list[Run] = []
        moved = (f"moved-{k}" for k in range(1, options.stops + 1))
        swept = (f"sweep-{k}" for k in range(1, (options.sweep or 0) + 1))
        clean = (f"clean-{i}" for i in range(1, options.repeat + 1 + MORE_CLEAN_RUNS))
        self.run_names = frozenset({*clean, "control", "stopped", "swapped", *moved, *swept})
        self.stopped: Run | None = None
        self.control: Run | None = None
        # the restart kinds: each a component with hooks called in order (plan, while the runs go, start, evidence)
        self.swapped = SwappedRestart(self)
        self.moved = MovedWeightsRestarts(self)
        self.beside = BesideRuns(out, self.run_names)  # what the commands write beside the runs' directories
        self.limit = 0.0  # the watchdog of each attempt after the first clean run
        self.result: dict = {
            "command": self.command,
            "outputs": {"paths": self.outputs, "ignore": self.ignore},
            "stop_seed": None,
            "signal": None,
            "runs": [],
            "comparisons": {"repeat": []},
            "not_checked": [],
            "stops": "",
            "probe": None,
            "environment": collect_env({}),
        }
        if self.slurm is not None:
            self.result["launcher"] = {"name": "slurm", "sbatch_options": self.slurm, "jobs": {}}
        if options.quick:
            self.result["quick"] = True
            self.result["not_checked"].append(QUICK_LEFT_OUT)

    # --- the runs ---------------------------------------------------------------------------------
    def new_run(self, name: str, seed: int = 0) -> Run:
        """A run in fresh directories of its own: its work directory (the command's cwd), and a HOME and a
        TMPDIR beside it, so that no run finds what another left there."""
        work, home, tmp = self.out / "work" / name, self.out / "home" / name, self.out / "tmp" / name
        log, probe = self.out / "logs" / f"{name}.log", self.out / "probe" / name
        dirs = EvidenceDirs.of(self.out)  # each made, and verified before each write, never through a link
        try:
            for directory in (work, home, tmp, log.parent, probe):
                dirs.make(directory)
            dirs.verify(work)
            copy_inputs(self.options.copy, work)  # checked before any run (check_copies); links never followed
        except DirectoryReplaced:
            pass  # recorded (dirs.replaced): its first attempt finds it and never starts; the verdict names it
        env = {**isolated_environment(home, tmp), **({self.seed_env: str(seed)} if self.seed_env else {})}
        argv = [*self.command, *([self.seed_arg.replace("{seed}", str(seed))] if self.seed_arg else [])]
        run = Run(name, work, log, env, argv, probe)
        run.dirs = dirs
        run.activity = FileActivity({"work": work, "HOME": home, "TMPDIR": tmp})
        run.on_progress = lambda seconds: self.echo(one_line(f"  {name}: {seconds:.0f} s, running; {last_line(run)}"))
        return run

    def new_stopped_run(self, name: str) -> Run:
        """A run to stop, knowing what the uninterrupted run saved as it went, and how often (the stopped run,
        and each of --sweep's)."""
        stopped, clean = self.new_run(name), self.clean[0]
        if clean.activity is not None:
            stopped.state = state = clean.activity.state_keys()
            saves = clean.activity.saves(state=state)
            stopped.save_keys = whole_save(saves)  # the files of one whole save
            stopped.save_first_keys = first_keys(saves, stopped.save_keys)
            counts = {len(run.activity.save_moments(state=state)) for run in self.clean if run.activity}
            stopped.clean_saves = counts.pop() if len(counts) == 1 else -1  # -1: saves that follow the clock
        return stopped

    def ran_together(self, planned: list[tuple[Run, list[Stop], float]], then: dict | None = None) -> list[Run]:
        """Each (run, its stops, its watchdog), up to self.jobs at once; recorded in the order given.
        then: {run name: called with the run once it ended, in its slot (the swapped restart after the
        control, beside the stopped run)}."""
        for run, stop_list, _ in planned:
            stopping = f" ({counted(len(stop_list), 'stop')})" if stop_list else ""
            self.echo(f"  {run.name}: {' '.join(run.command)}" + stopping)
        jobs: dict[str, str] = {}

        def one(item: tuple[Run, list[Stop], float]) -> None:
            run, stop_list, limit = item
            self.execute(run, stop_list, limit, jobs)
            if then and run.name in then:
                then[run.name](run)

        in_parallel(one, planned, self.jobs)
        for run, _, _ in planned:
            self.result["runs"].append(run.as_dict())
            if run.name in jobs:
                self.result["launcher"]["jobs"][run.name] = jobs[run.name]
        return [run for run, _, _ in planned]

    def execute(self, run: Run, stops: list[Stop], limit: float, jobs: dict[str, str]) -> None:
        """One run, its files watched: here, or as a SLURM job (its id into jobs), with the restart kinds'
        hooks: the control's state copied as it runs, the stopped run's after each stop."""
        ended = threading.Event()
        copier = threading.Thread(target=self.swapped.watch, args=(run, ended), name="control-state", daemon=True)
        after_stop = self.moved.after_stop if run.name == "stopped" and self.moved.restarts else None
        with run.activity:
            if run.name == "control" and self.swapped.after_saves:
                copier.start()
            try:
                if self.slurm is None:
                    execute(run, stops, self.signum, limit, after_stop)
                else:
                    jobs[run.name] = execute_slurm(run, stops, limit, self.slurm)
            finally:
                ended.set()
                if copier.is_alive():
                    copier.join()
                if self.slurm is None:  # (a SLURM job's clock may not be this machine's)
                    run.activity.updates = update_times(run)  # its saves are grouped by its updates from now on
                if run.name in ("control", "stopped") or run.name.startswith("sweep-"):  # later runs must not change
                    run.output_digests = reference_digests(run.work, self.outputs)
                if run.name == "stopped":
                    self.moved.stopped_ended()

    def compared(self, run: Run, against: Run, explain: bool = True) -> dict:
        # a file the same in every value, other bytes, is the same (check.comparisons)
        comparison = layout_as_same(compare_outputs(against.work, run.work, self.outputs, self.ignore, explain))
        for path in comparison["not_compared"]:
            detail = next(f["detail"] for f in comparison["files"] if f["path"] == path)
            self.result["not_checked"].append(f"{path} in {run.name} against {against.name}: {detail}")
        return {"run": run.name, "against": against.name, **comparison}

    def failure(self, run: Run) -> str:
        """Why a run failed (failure_line), and where it ran beside another, that it did: two runs of a
        script that binds a fixed port (torchrun's MASTER_PORT) or writes a fixed path get in each other's
        way only then."""
        alone = self.options.quick and run.name in ("clean-1", "stopped")  # --quick runs these one at a time
        beside = self.jobs > 1 and not alone and (run.name != "stopped" or bool(self.seed_env or self.seed_arg))
        hint = (
            f"; it ran beside another run (--jobs {self.jobs}): if both used one fixed port or path, --jobs 1 "
            "runs them one at a time"
        )
        return failure_line(run) + (hint if beside else "")

    def finish(self, verdict: str, stage: str, summary: str, rule: str) -> dict:
        dirs = EvidenceDirs.of(self.out)
        try:
            dirs.verify(self.out)  # check.json and check.md go into --out itself, never through a link
        except DirectoryReplaced:
            pass
        if dirs.replaced is not None and dirs.replaced.directory == dirs.out:
            verdict, summary, rule = "command-failed", dirs.message(), "directories_replaced"
        self.result.update(
            verdict=verdict,
            stage=stage,
            rule=rule,
            summary=one_line(f"{verdict}: {summary}"),
            wall_s=round(time.perf_counter() - self.started, 1),
        )
        self.echo(f"verdict: {self.result['summary']}")
        if dirs.replaced is not None and dirs.replaced.directory == dirs.out:
            self.echo(f"not written: check.json, check.md ({self.out} is no longer check's directory)")
            return self.result
        write_check(self.result, self.out)
        self.echo(f"written: {self.out / 'check.json'}, {self.out / 'check.md'}")
        return self.result

    # --- the stages -------------------------------------------------------------------------------
    def clean_runs(self) -> dict | None:
        """`repeat` uninterrupted runs, together where the cores allow, which must write the same outputs
        (and updates, by the probe) and start from nothing another run left; then the first one's receipt."""
        timeout = self.options.timeout
        clean = self.clean
        clean += self.ran_together(
            [(self.new_run(f"clean-{i}"), [], timeout or 24 * 3600.0) for i in range(1, self.options.repeat + 1)]
        )
        dirs = EvidenceDirs.of(self.out)
        try:  # what check writes into next (the receipt, the next runs' logs and directories)
            dirs.verify(*(self.out / d for d in ("work", "home", "tmp", "logs", "probe")))
        except DirectoryReplaced:
            pass
        if dirs.replaced is not None:
            return self.judge(Evidence(replaced=dirs.message()))
        # clean-1's outputs as they are now: what every later run is compared against (unchanged, checked then)
        clean[0].output_digests = reference_digests(clean[0].work, self.outputs)
        self.limit = timeout or max(120.0, 5 * max(run.attempts[-1].seconds for run in clean))
        repeat = self.repeat_evidence()
        verdict = self.judge(self.evidence(repeat=repeat))
        if verdict is not None:
            return verdict
        receipt, refused = write_receipt(self.out, self.clean[0], self.options, self.result)
        if refused is not None:
            return self.judge(self.evidence(repeat=replace(repeat, receipt_refused=refused)))
        self.echo(f"  receipt: {receipt} (reprocube reproduce {receipt.parent} -- CMD, on another machine)")
        return None

    def control_and_stopped_run(self, stop_seed: int) -> dict:
        """The negative control (if the command takes a seed) beside the stopped run, then their verdicts:
        the control's first (a void check says so whatever the stopped run did). --sweep: a stopped run per save
        instead (check.sweep)."""
        if self.options.sweep is not None:
            return sweep_verdict(self, stop_seed)
        plan, why_not = plan_stops(self.options, self.clean[0], stop_seed)
        if plan is None:
            return self.judge(self.evidence(no_saves=why_not))
        plan = plan if self.options.quick else with_a_wait(plan)  # --quick: each restart at once (said)
        self.result["stops"] = "; ".join(stop.describe() for stop in plan)
        stopped = self.stopped = self.new_stopped_run("stopped")
        planned = [(stopped, plan, self.limit)]
        control = None
        if self.options.quick:
            return self.stopped_run_alone(stopped, plan)
        if self.seed_env or self.seed_arg:
            control = self.control = self.new_run("control", seed=1)
            planned.insert(0, (control, [], self.limit))
        else:
            self.result["not_checked"].append(
                "no negative control (--seed-env or --seed-arg): whether the outputs depend "
                "on the training was not checked"
            )
        self.swapped.plan(control, stopped)
        then = {"control": self.swapped.start} if control is not None else {}
        if self.moved.plan(len(plan), stopped):
            if self.jobs == 1:  # after the stopped run, one run at a time
                then = {"stopped": lambda _: self.moved_then_swapped(control)}
            elif control is not None:  # in the control's slot once it ended
                then["control"] = self.moved_then_swapped
            else:  # in the stopped run's slot, after it
                then["stopped"] = lambda _: self.moved_then_swapped(None)
        *ended, stopped = self.ran_together(planned, then=then)
        for extra in ([self.swapped.run] if self.swapped.run else []) + self.moved.runs():
            self.result["runs"].append(extra.as_dict())
        # The verdict, stage by stage: each part is gathered only where the table has not decided yet (a run
        # whose directories the command replaced never started: there is nothing of it to gather).
        parts: dict = {"reached": "control" if ended else "stopped", **self.tampering()}
        verdict = self.judge(self.evidence(**parts))
        if verdict is None and ended:
            parts["control"] = self.control_evidence(ended[0])
            verdict = self.judge(self.evidence(**parts))
        return verdict or self.resume_verdict(parts, stopped, plan)

    def stopped_run_alone(self, stopped: Run, plan: list[Stop]) -> dict:
        """--quick: the stopped run and its verdict, with no control and no restart given other state (each a
        start-up more); a difference is still checked against more uninterrupted runs before resume is blamed."""
        [stopped] = self.ran_together([(stopped, plan, self.limit)])
        parts: dict = {"reached": "stopped", **self.tampering()}
        return self.judge(self.evidence(**parts)) or self.resume_verdict(parts, stopped, plan)

    def resume_verdict(self, parts: dict, stopped: Run, plan: list[Stop]) -> dict:
        """The stopped run against the uninterrupted one (more uninterrupted runs where it differs), then what
        the restarts given other state told (none under --quick)."""
        parts["stopped"] = self.stopped_evidence(stopped, plan)
        if len(plan) == 1:
            self.result["not_checked"].append(ONE_STOP)
        if wants_more_uninterrupted_runs(self.evidence(**parts)):
            parts["stopped"] = more_uninterrupted_runs(self, parts["stopped"])
        verdict = self.judge(self.evidence(**parts))
        if verdict is not None:
            return verdict
        if self.options.quick:
            restarts = {"swap": SwapEvidence(note=QUICK_NOT_RUN), "moved": MovedEvidence(note=QUICK_NOT_RUN)}
        else:
            restarts = {"swap": self.swapped.evidence(), "moved": self.moved.evidence()}
        parts.update(**restarts, written_beside=self.beside.written())
        return self.judge(self.evidence(**parts))

    def moved_then_swapped(self, control: Run | None) -> None:
        """The moved-weights restarts, then the swapped restart only where none of them told anything (each
        costs a start-up: one that shows whether the weights were used makes the swap, which asks the same of
        another seed's state, needless; the swap still serves where no weights could be moved: a pickle,
        HDF5, Orbax)."""
        self.moved.start()
        if self.moved.told():
            self.swapped.note = None  # not needed
        elif control is not None:
            self.swapped.start(control)

    # --- the evidence, stage by stage, and the verdict -------------------------------------------------
    def evidence(self, **parts) -> Evidence:
        """The record so far: what every stage shares, and the parts given."""
        return Evidence(
            seeded=bool(self.seed_env or self.seed_arg),
            jobs=self.jobs,
            uninterrupted=self.options.repeat,
            control_left_out=self.options.quick or self.options.sweep is not None,
            not_checked=tuple(self.result["not_checked"]),
            **parts,
        )

    def judge(self, evidence: Evidence) -> dict | None:
        """The table's verdict on the evidence, written; None where it decided nothing yet."""
        verdict = decide(evidence)
        if verdict is None:
            return None
        self.result["not_checked"] += list(verdict.not_checked)
        return self.finish(verdict.name, verdict.stage, verdict.summary, verdict.rule)

    def repeat_evidence(self) -> RepeatEvidence:
        """The uninterrupted runs: whether each ran, clean-1 wrote what was declared, and they agree (the
        first problem found ends the look, as the rules would judge it)."""
        clean = self.clean
        failed = next((run for run in clean if run.exit != 0), None)
        if failed is not None:
            return RepeatEvidence(failed=(failed.name, self.failure(failed)))
        written = collect(clean[0].work, self.outputs, [])
        unwritten = [o for o in self.outputs if not any(n == o or n.startswith(o.rstrip("/") + "/") for n in written)]
        linked = next((link_above(clean[0].work, o) for o in unwritten if link_above(clean[0].work, o)), None)
        if linked is not None:
            return RepeatEvidence(linked_output=str(linked.relative_to(clean[0].work)))
        activity = clean[0].activity
        gone = [
            o
            for o in unwritten
            if activity is not None
            and any(e.path == f"work/{o}" or e.path.startswith(f"work/{o.rstrip('/')}/") for e in activity.writes())
        ]
        if gone:  # clean-1 wrote it (inotify saw it): another process removed it before check read it
            return RepeatEvidence(removed_output=gone[0])
        if unwritten:
            return RepeatEvidence(unwritten=tuple(unwritten))
        if not collect(clean[0].work, self.outputs, self.ignore):
            raise ConfigError(f"--ignore {' '.join(self.ignore)}: ignores every declared output; nothing is compared")
        first_updates: dict[str, int | None] = {}
        for run in clean[1:]:
            comparison = self.compared(run, clean[0])
            self.result["comparisons"]["repeat"].append(comparison)
            if not any(f.get("compared", True) for f in comparison["files"]):
                return RepeatEvidence(uncomparable=run.name)
            traced, where = self.against_clean_1(run, comparison, first_updates)
            if where:
                shared = clean[0].activity is not None and not clean[0].activity.state_keys()
                own = None if traced else own_value_difference(clean[0], run, comparison, self.outputs)
                return RepeatEvidence(
                    differs=where, own_value=own, leaked=leaked_state(clean, first_updates), shared_elsewhere=shared
                )
        return RepeatEvidence(leaked=leaked_state(clean, first_updates))

    def against_clean_1(self, run: Run, comparison: dict, first_updates: dict) -> tuple[str | None, str | None]:
        """Where an uninterrupted run departs from clean-1: (its first differing update, from the probe; that
        and its first differing output, in words); (None, None) where it does not."""
        traced = repeat_trace(self.clean[0], run, self.result, first_updates)
        found = [x for x in (traced, None if comparison["identical"] else _first(comparison)) if x]
        return traced, "; ".join(found) or None

    def tampering(self) -> dict:
        """Evidence parts where the command replaced check's directories, or changed the outputs of clean-1,
        the control or the stopped run after it ended (recorded then: nothing can be compared with them)."""
        if EvidenceDirs.of(self.out).replaced is not None:
            return {"replaced": EvidenceDirs.of(self.out).message()}
        for run in (self.clean[0], self.control, self.stopped):
            if run is None or run.output_digests is None:
                continue
            changed = changed_output(run.work, self.outputs, run.output_digests)
            if changed:  # the control's and the stopped run's: a later restart given a copy of its state
                return {"changed_after": (run.name, changed, run is not self.clean[0])}
        return {}

    def control_evidence(self, control: Run) -> ControlEvidence:
        """A run with another seed must write other outputs."""
        if control.exit != 0:
            return ControlEvidence(failed=self.failure(control))
        comparison = self.compared(control, self.clean[0], explain=False)  # differing is enough
        self.result["comparisons"]["control"] = comparison
        leaked = leaked_state([*self.clean, control], {}) if control.attempts[-1].exit == 0 else None
        return ControlEvidence(identical=comparison["identical"], leaked=leaked)

    def stopped_evidence(self, stopped: Run, plan: list[Stop]) -> StoppedEvidence:
        """The run stopped and restarted after each stop, against the first clean run."""
        landed = stopped.stops_landed
        base = StoppedEvidence(how=self.how, planned=len(plan), landed=landed, clean_saves=stopped.clean_saves)
        interrupted = interrupted_saves(stopped)
        missed = tuple(n for n in range(1, landed + 1) if n not in dict(interrupted) and self.options.during_save)
        base = replace(base, interrupted_saves=tuple(words for _, words in interrupted), during_save_missed=missed)
        if stopped.exit != 0:
            return replace(base, failed=self.failure(stopped))
        if landed == 0:
            return replace(base, leaked=leaked_state([*self.clean, stopped], {}))
        comparison = self.compared(stopped, self.clean[0])
        self.result["comparisons"]["resume"] = comparison
        before = len(self.result["not_checked"])
        traced = resume_trace(self.clean[0], stopped, self.result, same_clock=self.slurm is None)
        added = self.result["not_checked"][before:]
        probe = self.result["probe"] and self.result["probe"].get("resume")
        stops = stop_evidence(stopped, probe, files_bind=self.slurm is None)
        self.result["stop_evidence"] = stops
        return replace(
            base,
            before_stops=traced["before_stops"],
            trace_differs=traced["differs"],
            outputs_identical=comparison["identical"],
            first_output_difference=None if comparison["identical"] else _first(comparison),
            identical_words=_identical(comparison),
            stops=tuple(stops),
            unproven=tuple(unproven(stops, comparison, self.result["probe"], stopped, self.clean)),
            updates_compared=traced["compared"],
            traces_unreadable=any("the probe's traces, unreadable" in line for line in self.result["not_checked"]),
            updates_partial=any(line.startswith("the updates at steps") for line in added),
            stops_after_first_save=any(stop.fraction is not None for stop in plan),
            restart_wait_s=max((s.wait_s for s in plan[:landed]), default=0.0) if self.slurm is None else 0.0,
            trainer_said=restarts_said(stopped.log),
        )
