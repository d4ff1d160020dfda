"""`reprocube check`'s way through a command (commands/check.py parses its options): the clean runs, which
must agree (else it is not deterministic and resume is never blamed); the receipt; the negative control
(another seed must change the outputs, else the check is void); the stopped run, stopped `stops` times and
restarted after each; and the verdict, from the declared outputs and, where the script calls the probe,
every update. Each stage that ends the check writes check.json and check.md with its verdict."""

from __future__ import annotations

import contextlib
import fnmatch
import os
import re
import threading
import time
from dataclasses import replace
from pathlib import Path

from reprocube.analysis.outputs import collect, compare_outputs, parse_ignore
from reprocube.analysis.probe_trace import (
    AttemptTrace,
    compare_ranks,
    compare_stopped_ranks,
    describe_difference,
    read_rank_traces,
    read_trace,
    steps_of,
)
from reprocube.check.comparisons import first_difference_words as _first
from reprocube.check.comparisons import identical_words as _identical
from reprocube.check.comparisons import layout_as_same, own_value_difference
from reprocube.check.copy_inputs import check_copies, copy_inputs
from reprocube.check.evidence import (
    ControlEvidence,
    Evidence,
    MovedEvidence,
    MovedRestart,
    RepeatEvidence,
    StoppedEvidence,
    SwapEvidence,
)
from reprocube.check.evidence_dirs import DirectoryReplaced, EvidenceDirs, changed_output, reference_digests
from reprocube.check.file_activity import MERGE_S, FileActivity, state_key
from reprocube.check.moved_weights import (
    MAX_MOVED_STOPS,
    MovedWeightsRestart,
    first_update_rule,
    judge,
    move_weights,
    tensor_fingerprints,
    trained_fingerprints,
)
from reprocube.check.options import CheckOptions
from reprocube.check.process_guard import end_all_guards
from reprocube.check.runs import (
    SIGNALS,
    Run,
    Stop,
    execute,
    failure_line,
    outputs_written,
    planned_stops,
    with_a_wait,
)
from reprocube.check.slurm import check_slurm, execute_slurm
from reprocube.check.stop_evidence import leaked_state, stop_evidence
from reprocube.check.swapped_restart import copy_budget, place, plan_restart, plan_swap, snapshot, state_files
from reprocube.check.verdict import decide, wants_more_uninterrupted_runs
from reprocube.errors import CheckpointError, ConfigError
from reprocube.files import claim_new_or_empty, names_regular_file, safe_name
from reprocube.formats.env import collect_env
from reprocube.formats.output_files import link_above
from reprocube.formats.script_receipt import input_digests, output_digests, refused_seed_variable, write_script_receipt
from reprocube.results.check_result import write_check
from reprocube.terminal import counted, one_line

# A last attempt that resumed at least RESUMED_LATE of the way into the training yet took SLOW_RESTART of an
# uninterrupted run's time or more did not show that it resumed (its expected share is 1 - RESUMED_LATE).
RESUMED_LATE, SLOW_RESTART = 0.3, 0.9
MORE_CLEAN_RUNS = 2  # uninterrupted runs started where the stopped run differs (per-process non-determinism)


def check(options: CheckOptions, echo=print) -> dict:
    """check.json's content, once written. Under --launcher slurm each run is a SLURM job with
    options.slurm's sbatch options, each stop a requeue (reprocube.check.slurm). --jobs: how
    many runs go at once (the clean runs together, then the control beside the stopped run); None: this
    machine's cores, at most 2 (one job under SLURM)."""
    started = time.perf_counter()
    _check_arguments(options)
    if options.slurm is not None:
        if options.signal != "TERM":
            raise ConfigError(
                "--launcher slurm stops a run as SLURM preempts it (SIGTERM, then SIGKILL after "
                "KillWait): --signal cannot be chosen"
            )
        check_slurm(options.slurm)
    globs, _ = parse_ignore(list(options.ignore))  # a malformed FILE:KEY is refused here, before any run
    if options.output and all(any(fnmatch.fnmatch(o, g) for g in globs) for o in options.output):
        raise ConfigError("--ignore matches every --output: nothing would be compared")
    if options.jobs is not None and not 1 <= options.jobs <= 16:
        raise ConfigError(f"--jobs must be from 1 to 16, got {options.jobs}")
    stop_seed = options.stop_seed if options.stop_seed is not None else int.from_bytes(os.urandom(4), "little")
    out = _workspace(options.out, options.command)
    session = CheckSession(options, out, echo, started)
    session.result |= {"stop_seed": stop_seed, "signal": options.signal}
    session.announce()
    try:
        with session.watch_beside_runs():
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
        self.swapped: Run | None = None  # the restart given the control's state (swapped_restart)
        self.beside: FileActivity | None = None  # what is written beside the runs' directories (watch_beside_runs)
        moved = (f"moved-{k}" for k in range(1, options.stops + 1))
        clean = (f"clean-{i}" for i in range(1, options.repeat + 1 + MORE_CLEAN_RUNS))
        self.run_names = frozenset({*clean, "control", "stopped", "swapped", *moved})
        self.swap_note: str | None = "not run"  # why there is none (None: a moved-weights restart made it redundant)
        # the moved-weights restarts (moved_weights_restarts), one per stop whose state is given with its weights moved
        self.moved_restarts: list[MovedWeightsRestart] = []
        self.weights: frozenset[int] = frozenset()  # the trained weights' fingerprints (the probe's), if any
        self.moved_note = "not run"  # why there is none
        self.stopped_ended = threading.Event()  # the moved-weights restarts start after it (moved_weights_restarts)
        self.stopped: Run | None = None
        self.control: Run | None = None
        # the control's directories as they were after its last save but one (snapshot_control), and after
        # how many of its saves to copy them (0: not copied)
        self.control_state: dict[str, Path] | None = None
        self.snapshot_after = 0
        self.control_state_note = "not copied as it ran"  # why its finished state is given instead
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

    def announce(self) -> None:
        repeat, stops = self.options.repeat, self.options.stops
        self.echo(
            one_line(
                f"check {' '.join(self.command)}: {repeat} clean runs, {counted(stops, 'stop')} by {self.how}; "
                f"evidence in {self.out}"
            )
        )
        self.echo(
            "  note: each run has an empty HOME and TMPDIR of its own: configuration read from your ~ "
            "(~/.keras/keras.json, accelerate's default_config.yaml, rc files) is not there (docs/check.md)"
        )
        copied = {path.name for path in self.options.copy}
        for arg in self.command:  # a relative path the user meant from here: the command runs in a fresh directory
            if not Path(arg).is_absolute() and names_regular_file(arg) and Path(arg).name not in copied:
                self.echo(
                    one_line(
                        f"  note: {arg} is here but the command runs in an empty work directory: pass "
                        f"--copy {arg}, or give its absolute path"
                    )
                )

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
        run.on_progress = lambda seconds: self.echo(one_line(f"  {name}: {seconds:.0f} s, running; {_last_line(run)}"))
        return run

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
        """One run, its files watched: here, or as a SLURM job (its id into jobs). The control's state is
        copied as it runs (snapshot_control)."""
        ended = threading.Event()
        copier = threading.Thread(target=self.snapshot_control, args=(run, ended), name="control-state", daemon=True)
        after_stop = self.snapshot_stopped if run.name == "stopped" and self.moved_restarts else None
        with run.activity:
            if run.name == "control" and self.snapshot_after:
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
                if run.name in ("control", "stopped"):  # what later restarts must not change (tampered)
                    run.output_digests = reference_digests(run.work, self.outputs)
                if run.name == "stopped":  # whatever came of its stops: the moved-weights restarts wait no longer
                    self.stopped_ended.set()
                    for restart in self.moved_restarts:
                        if not restart.ready.is_set():
                            restart.note = f"the stopped run's stop {restart.stop} did not land"
                            restart.ready.set()

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
        beside = self.jobs > 1 and (run.name != "stopped" or bool(self.seed_env or self.seed_arg))
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
        receipt, refused = self.receipt()
        if refused is not None:
            return self.judge(self.evidence(repeat=replace(repeat, receipt_refused=refused)))
        self.echo(f"  receipt: {receipt} (reprocube reproduce {receipt.parent} -- CMD, on another machine)")
        return None

    def control_and_stopped_run(self, stop_seed: int) -> dict:
        """The negative control (if the command takes a seed) beside the stopped run, then their verdicts:
        the control's first (a void check says so whatever the stopped run did)."""
        plan, why_not = self.plan_stops(stop_seed)
        if plan is None:
            return self.judge(self.evidence(no_saves=why_not))
        plan = with_a_wait(plan)
        self.result["stops"] = "; ".join(stop.describe() for stop in plan)
        stopped = self.stopped = self.new_run("stopped")
        clean = self.clean[0]
        if clean.activity is not None:  # what the uninterrupted run saved as it went, and how often
            stopped.state = clean.activity.state_keys()
            counts = {len(run.activity.save_moments(state=stopped.state)) for run in self.clean if run.activity}
            stopped.clean_saves = counts.pop() if len(counts) == 1 else -1  # -1: saves that follow the clock
        planned = [(stopped, plan, self.limit)]
        if self.seed_env or self.seed_arg:
            control = self.control = self.new_run("control", seed=1)
            if self.slurm is None and stopped.state:  # (a SLURM job's files are not watched as it runs)
                control.state = stopped.state
                self.snapshot_after = max(1, stopped.clean_saves - 1)  # -1 (saves that follow the clock): 1
            planned.insert(0, (control, [], self.limit))
        else:
            self.result["not_checked"].append(
                "no negative control (--seed-env or --seed-arg): whether the outputs depend "
                "on the training was not checked"
            )
            self.swap_note = "no control run's state to give a restart (--seed-env or --seed-arg)"
        then = {"control": self.swapped_restart} if len(planned) > 1 else {}
        if self.slurm is not None:
            self.moved_note = "a SLURM job's directories are not copied at its stops"
        elif not stopped.state:
            self.moved_note = "the uninterrupted run saved no file as it went (no state to move)"
        else:
            # With the probe, every stop's state (the weights found by their fingerprints; a restart that used
            # them is ended at its first update); without it, the last stop's alone (each runs to its end).
            self.weights = trained_fingerprints(self.clean_trace())
            last = len(plan)
            stops = range(max(1, last - MAX_MOVED_STOPS + 1), last + 1) if self.weights else [last]
            self.moved_restarts = [MovedWeightsRestart(stop) for stop in stops]
            control_run = planned[0][0] if len(planned) > 1 else None
            if self.jobs == 1:  # after the stopped run, one run at a time
                then = {"stopped": lambda _: self.moved_then_swapped(control_run)}
            elif control_run is not None:  # in the control's slot once it ended
                then["control"] = self.moved_then_swapped
            else:  # in the stopped run's slot, after it
                then["stopped"] = lambda _: self.moved_then_swapped(None)
        *control, stopped = self.ran_together(planned, then=then)
        for extra in (self.swapped, *(r.run for r in self.moved_restarts)):
            if extra is not None:
                self.result["runs"].append(extra.as_dict())
        # The verdict, stage by stage: each part is gathered only where the table has not decided yet.
        parts: dict = self.tampering()
        if control:
            parts["control"] = self.control_evidence(control[0])
        parts["stopped"] = self.stopped_evidence(stopped, plan)
        if wants_more_uninterrupted_runs(self.evidence(**parts)):
            parts["stopped"] = self.more_uninterrupted_runs(parts["stopped"])
        verdict = self.judge(self.evidence(**parts))
        if verdict is not None:
            return verdict
        parts.update(
            swap=self.swap_evidence(), moved=self.moved_evidence(), written_beside=tuple(self.written_beside_runs())
        )
        return self.judge(self.evidence(**parts))

    def snapshot_control(self, control: Run, ended: threading.Event) -> None:
        """While the control runs: once it has saved its state as often as an uninterrupted run does but
        once, and written nothing of it for QUIET_S, a copy of its directories, what the swapped restart
        is given. A finished run's state leaves a restart nothing to train (one that never loads its
        weights and exports a finished checkpoint as it finds it passed that way); this one leaves it the
        run's last stretch (little to train: the check costs little more). Where the control saved again
        during the copy, or ended first, nothing is kept, and its finished state is given (said)."""
        activity, keys, wanted = control.activity, control.state, self.snapshot_after

        def state_writes() -> list:
            return [e for e in activity.writes() if state_key(e.path) in keys]

        counted_events, saves, written = -1, 0, []
        while not ended.wait(SNAPSHOT_POLL_S):
            if len(activity.events) != counted_events:  # looked through again only when something happened
                counted_events = len(activity.events)
                saves, written = len(activity.save_moments(state=keys)), state_writes()
            if saves > wanted:
                self.control_state_note = "it saved again before its state could be copied"
                return
            if saves < wanted or not written or time.perf_counter() - written[-1].at < QUIET_S:
                continue
            into = {label: self.out / "snapshot" / "control" / label for label in activity.places}
            dirs = EvidenceDirs.of(self.out)
            before = state_files(activity.places, keys)
            try:
                for directory in into.values():
                    dirs.make(directory)
                why_not = snapshot(activity.places, into, copy_budget(self.clean[0].activity.places))
            except (DirectoryReplaced, OSError) as exc:
                why_not = one_line(f"its files could not be copied ({getattr(exc, 'strerror', None) or exc})")
            if why_not is None and state_files(activity.places, keys) != before:  # the copy may mix two saves
                why_not = "it saved again while its state was being copied"
            if why_not is None:
                self.control_state = into
            else:
                self.control_state_note = f"its state was not copied as it ran: {why_not}"
            return
        self.control_state_note = "it ended before its last save but one was seen"

    def snapshot_stopped(self, stopped: Run) -> None:
        """After each of the stopped run's stops whose state a moved-weights restart is given, its processes all
        gone: a copy of its directories, what its next attempt finds (snapshot/stopped-N/)."""
        landed = len(stopped.attempts)
        restart = next((r for r in self.moved_restarts if r.stop == landed), None)
        if restart is None:
            return
        into = {label: self.out / "snapshot" / f"stopped-{landed}" / label for label in stopped.activity.places}
        try:
            for directory in into.values():
                EvidenceDirs.of(self.out).make(directory)
            why_not = snapshot(stopped.activity.places, into, copy_budget(self.clean[0].activity.places))
        except (DirectoryReplaced, OSError) as exc:
            why_not = one_line(f"its files could not be copied ({getattr(exc, 'strerror', None) or exc})")
        if why_not is None:
            restart.state = into
        else:
            restart.note = f"the stopped run's state at stop {landed} was not copied: {why_not}"
        restart.ready.set()

    def moved_weights_restarts(self) -> None:
        """The moved-weights restarts (check.moved_weights), once the stopped run has ended (its outputs
        recorded: one that writes where a path kept in its checkpoint says cannot change them unseen, round
        9's H16), the last stop's first; none after one that never used its weights (no pass then)."""
        self.stopped_ended.wait()
        for restart in reversed(self.moved_restarts):
            restart.ready.wait()
            self.moved_weights_restart(restart)
            comparison = judge(restart, self.clean[0], self.outputs, self.ignore)
            if comparison is not None:
                self.result["comparisons"][restart.name] = comparison
            if restart.never_used:
                break

    def moved_weights_restart(self, restart: MovedWeightsRestart) -> None:
        """The command restarted once more in a fresh directory holding the stopped run's files as they were
        after `restart.stop` (all but its --copy inputs), its weights moved, with the stopped run's seed."""
        if restart.state is None:
            return
        clean = self.clean[0]
        plan = plan_restart(restart.state, [Path(c).name for c in self.options.copy])
        run = self.new_run(restart.name)
        if EvidenceDirs.of(self.out).replaced is not None:
            restart.note = "its directories were replaced by the command (see the verdict)"
            return
        try:
            place(plan, run.activity.places)
        except OSError as exc:
            restart.note = one_line(f"the stopped run's files could not be placed ({exc.strerror or exc})")
            return
        places = run.activity.places
        files = {p.target: places[p.target.partition("/")[0]] / p.target.partition("/")[2] for p in plan}
        originals = {p.target: p.source for p in plan}
        weights = self.weights
        if weights:  # the weights alone, wherever they are, found by the fingerprints the probe recorded
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
                return
        else:  # no probe: every floating-point tensor of the state files (a first loss then tells nothing)
            keys = clean.activity.state_keys()
            move_weights(restart, {n: p for n, p in files.items() if state_key(n) in keys}, originals, None)
        if not restart.moved:
            restart.note = (
                "no state file holds floating-point tensors in a format check can move (.npy, .npz, "
                f"safetensors, torch.save's zip): {', '.join(restart.unmoved[:3]) or 'none placed'}"
            )
            return
        self.echo(
            one_line(
                f"  {restart.name}: {' '.join(run.command)} (in the stopped run's files after stop {restart.stop}, "
                f"weights moved by one in {', '.join(restart.moved[:3])})"
            )
        )
        restart.run = run
        until = first_update_rule(restart, clean, self.stopped)
        # A restart from a stop trains less than an uninterrupted run: bounded by that run's time, and some,
        # not by the watchdog's (moved weights can keep a solver or a retry loop from ever returning: H12).
        limit = min(self.limit, MOVED_TIME * clean.attempts[-1].seconds + MOVED_SLACK_S)
        self.execute(run, [Stop(until=until, ends_run=True)], limit, {})

    def clean_trace(self) -> AttemptTrace | None:
        """clean-1's probe trace (rank 0), None without one or where it cannot be read."""
        try:
            return read_trace(self.clean[0].probe_trace(1))
        except CheckpointError:
            return None

    @contextlib.contextmanager
    def watch_beside_runs(self):
        """While the runs go: what any command writes in check's directories that hold the runs' own
        (work/, home/, tmp/ under --out, "../" from a work directory), their trees unwatched. Nothing but the
        runs' directories belongs there (--out was new or empty): whatever is written there, even if removed
        later, is a run's state kept outside its own directories."""
        dirs, places = EvidenceDirs.of(self.out), {p: self.out / p for p in ("work", "home", "tmp")}
        try:
            for directory in places.values():
                dirs.make(directory)
        except DirectoryReplaced:  # the verdict names it (the runs find it before they start)
            yield
            return
        self.beside = FileActivity(places, unwatched=self.run_names)
        with self.beside:
            yield

    def written_beside_runs(self) -> list[str]:
        """What the commands wrote beside the runs' directories (watch_beside_runs), as out-relative paths."""
        if self.beside is None:
            return []
        written = {e.path for e in self.beside.writes() if e.path.split("/")[1] not in self.run_names}
        return sorted(written)

    def moved_then_swapped(self, control: Run | None) -> None:
        """The moved-weights restarts, then the swapped restart only where none of them told anything (each
        costs a start-up: a moved-weights restart that shows whether the weights were used makes the swap, which
        asks the same of another seed's state, redundant; the swap still serves where no weights could be
        moved: a pickle, HDF5, Orbax)."""
        self.moved_weights_restarts()
        if any(r.used or r.never_used for r in self.moved_restarts):
            self.swap_note = None  # not needed
        elif control is not None:
            self.swapped_restart(control)

    def swapped_restart(self, control: Run) -> None:
        """After the control, in its slot: the command restarted in a fresh directory holding what the control
        left (its outputs apart), under the uninterrupted run's names, with the uninterrupted run's seed
        (reprocube.check.swapped_restart): whether a restart continues from the state it finds."""
        clean = self.clean[0]
        if control.exit != 0 or clean.activity is None or control.activity is None:
            self.swap_note = "the control run did not end well"
            return
        copies = [Path(c).name for c in self.options.copy]
        keys = clean.activity.state_keys()
        given = self.control_state or control.activity.places
        plan, why_not = plan_swap(clean.activity.places, given, keys, self.outputs, copies)
        if not plan:
            self.swap_note = why_not
            return
        swapped = self.new_run("swapped")
        if EvidenceDirs.of(self.out).replaced is not None:
            self.swap_note = "its directories were replaced by the command (see the verdict)"
            return
        try:
            place(plan, swapped.activity.places)
        except OSError as exc:  # a name taken twice, a link on the way: never written through, no traceback
            self.swap_note = one_line(f"the control's files could not be placed ({exc.strerror or exc})")
            return
        when = "after its last save but one" if self.control_state else f"at its end: {self.control_state_note}"
        self.echo(
            one_line(f"  swapped: {' '.join(swapped.command)} (in the control's {counted(len(plan), 'file')}, {when})")
        )
        self.execute(swapped, [], self.limit, self.result.get("launcher", {}).get("jobs", {}))
        self.swapped = swapped

    def plan_stops(self, stop_seed: int) -> tuple[list[Stop] | None, str]:
        """The stops asked for, or the default ones: each a share of the time between two of an
        uninterrupted run's saves after its attempt's first save. None (and why) where that run saved
        nothing as it went (no file rewritten, no numbered series): no stop could follow a save and
        still interrupt something."""
        stops, at, at_file, at_line = (getattr(self.options, k) for k in ("stops", "at", "at_file", "at_line"))
        if at is not None or at_file is not None or at_line is not None:
            return _stops(stops, at, at_file, at_line), ""
        clean = self.clean[0]
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
        # The time between two saves of one file (a checkpoint written as two files, the model and then the
        # optimizer, is one save: the gap between its files is no interval between saves).
        state = activity.state_keys()
        per_file: dict[str, list[float]] = {}
        for event in activity.writes():
            if state_key(event.path) in state:
                per_file.setdefault(event.path, []).append(event.at)
        gaps = sorted(b - a for times in per_file.values() for a, b in zip(times, times[1:], strict=False))
        if not gaps:  # a numbered series (each file written once): between its saves
            gaps = sorted(b - a for a, b in zip(saves, saves[1:], strict=False))
        return planned_stops(stops, gaps[len(gaps) // 2], stop_seed), ""

    # --- the evidence, stage by stage, and the verdict -------------------------------------------------
    def evidence(self, **parts) -> Evidence:
        """The record so far: what every stage shares, and the parts given."""
        return Evidence(
            seeded=bool(self.seed_env or self.seed_arg),
            jobs=self.jobs,
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
            traced = _repeat_trace(clean[0], run, self.result, first_updates)
            if not comparison["identical"] or traced:
                where = "; ".join(x for x in (traced, None if comparison["identical"] else _first(comparison)) if x)
                shared = clean[0].activity is not None and not clean[0].activity.state_keys()
                own = None if traced else own_value_difference(clean[0], run, comparison, self.outputs)
                return RepeatEvidence(
                    differs=where, own_value=own, leaked=leaked_state(clean, first_updates), shared_elsewhere=shared
                )
        return RepeatEvidence(leaked=leaked_state(clean, first_updates))

    def receipt(self) -> tuple[Path | None, str | None]:
        """clean-1's receipt, in a new directory of --out (never one the command planted, nor through a link);
        or why it could not be written there."""
        dirs = EvidenceDirs.of(self.out)
        try:
            dirs.absent(self.out / "receipt")
            return _write_receipt(
                self.out,
                self.clean[0],
                self.options.copy,
                self.outputs,
                self.ignore,
                self.result["environment"],
                self.seed_env,
                self.result["not_checked"],
            ), None
        except FileExistsError:  # planted between the look and the write
            try:
                dirs.absent(self.out / "receipt")
            except DirectoryReplaced:
                pass
            return None, dirs.message() or "receipt: planted by the command"
        except DirectoryReplaced:
            return None, dirs.message()

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
        if stopped.exit != 0:
            return replace(base, failed=self.failure(stopped))
        if landed == 0:
            return replace(base, leaked=leaked_state([*self.clean, stopped], {}))
        comparison = self.compared(stopped, self.clean[0])
        self.result["comparisons"]["resume"] = comparison
        before = len(self.result["not_checked"])
        traced = _resume_trace(self.clean[0], stopped, self.result, same_clock=self.slurm is None)
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
            unproven=tuple(_unproven(stops, comparison, self.result["probe"], stopped, self.clean)),
            updates_compared=traced["compared"],
            traces_unreadable=any("the probe's traces, unreadable" in line for line in self.result["not_checked"]),
            updates_partial=any(line.startswith("the updates at steps") for line in added),
            stops_after_first_save=any(stop.fraction is not None for stop in plan),
            restart_waits_varied=self.slurm is None and any(stop.wait_s for stop in plan[:landed]),
        )

    def more_uninterrupted_runs(self, stopped: StoppedEvidence) -> StoppedEvidence:
        """MORE_CLEAN_RUNS more uninterrupted runs, together, each against clean-1: where one differs too,
        the script differs from one process to the next (two that agreed were lucky), not on resume."""
        first = self.options.repeat + 1
        names = [f"clean-{n}" for n in range(first, first + MORE_CLEAN_RUNS)]
        self.echo(
            one_line(f"  the stopped run differs: {len(names)} more uninterrupted runs tell whether every process does")
        )
        runs = self.ran_together([(self.new_run(name), [], self.limit) for name in names])
        for run in runs:
            if run.exit != 0:
                continue  # a failure here tells nothing of determinism; the stopped run's difference stands
            comparison = self.compared(run, self.clean[0])
            self.result["comparisons"]["repeat"].append(comparison)
            traced = _repeat_trace(self.clean[0], run, self.result, {})
            if not comparison["identical"] or traced:
                where = "; ".join(x for x in (traced, None if comparison["identical"] else _first(comparison)) if x)
                return replace(stopped, per_process_differs=f"{run.name}: {where}", more_clean_runs=len(runs))
        return replace(stopped, more_clean_runs=sum(1 for run in runs if run.exit == 0))

    def swap_evidence(self) -> SwapEvidence:
        """What the swapped restart told: the uninterrupted run's outputs it wrote bit for bit (it did not
        continue from the state it found), or why it tells nothing; outputs that differ add no claim
        (check.swapped_restart says why)."""
        swapped, last_but_one = self.swapped, self.control_state is not None
        if swapped is None:
            return SwapEvidence(note=self.swap_note, not_needed=self.swap_note is None)
        if swapped.exit != 0:
            return SwapEvidence(note=f"it failed ({failure_line(swapped)})")
        comparison = compare_outputs(self.clean[0].work, swapped.work, self.outputs, self.ignore, explain=False)
        written = outputs_written(swapped, comparison)  # an output placed with the control's files shows nothing
        self.result["comparisons"]["swap"] = {"run": "swapped", "against": self.clean[0].name, **comparison}
        if not written:
            return SwapEvidence(note="it wrote no declared output")
        if all(f["same"] for f in written):
            return SwapEvidence(same_files=tuple(f["path"] for f in written), from_last_save_but_one=last_but_one)
        if _trained_nothing(self.clean[0], swapped):
            # Given a finished run's state, a restart that begins again unrecorded and one that resumes both
            # have nothing left to train: other outputs show nothing.
            state = (
                "its state after its last save but one"
                if last_but_one
                else "its finished state: nothing was left to train"
            )
            return SwapEvidence(note=f"the restart given the control's state made no update ({state})")
        return SwapEvidence()

    def moved_evidence(self) -> MovedEvidence:
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
            for r in self.moved_restarts
        )
        return MovedEvidence(restarts=restarts, note=self.moved_note)


MOVED_TIME, MOVED_SLACK_S = 2.0, 30.0  # a moved-weights restart's time: at most this x a clean run's, and this
SNAPSHOT_POLL_S = 0.01  # how often the control's saves are looked at while it runs
QUIET_S = 2 * MERGE_S  # no write of its state for this long: its save is whole (a model, then its optimizer)


def _check_arguments(options: CheckOptions) -> None:
    command, outputs, copies, out = list(options.command), list(options.output), list(options.copy), options.out
    repeat, stops, timeout, stop_seed = options.repeat, options.stops, options.timeout, options.stop_seed
    at, at_file, at_line, seed_env, seed_arg = (
        options.at,
        options.at_file,
        options.at_line,
        options.seed_env,
        options.seed_arg,
    )
    if not command:
        raise ConfigError("no command to check: reprocube check [options] -- CMD [ARG ...]")
    if repeat < 2 or repeat > 10:
        raise ConfigError(f"--repeat must be from 2 to 10 (two uninterrupted runs tell determinism), got {repeat}")
    if stops < 1 or stops > 20:
        raise ConfigError(f"--stops must be from 1 to 20, got {stops}")
    if sum(x is not None for x in (at, at_file, at_line)) > 1:
        raise ConfigError("give at most one of --at, --at-file and --at-line")
    if seed_env and seed_arg:
        raise ConfigError("give one of --seed-env and --seed-arg")
    if seed_arg is not None and "{seed}" not in seed_arg:
        raise ConfigError(f"--seed-arg {seed_arg!r} holds no {{seed}}")
    if timeout is not None and not 0 < timeout < float("inf"):
        raise ConfigError(f"--timeout must be a number of seconds > 0, got {timeout}")
    for output in outputs:
        if Path(output).is_absolute() or ".." in Path(output).parts or not output.strip():
            raise ConfigError(f"--output {output!r}: a path inside the work directory (relative, without ..)")
    if at is not None:
        _seconds(at)
    if any("\0" in text for text in [*command, *outputs, seed_env or "", seed_arg or "", at_line or ""]):
        raise ConfigError("a NUL character in the command, an --output, the seed option or --at-line")
    # Before anything runs: a link, a tree too deep, one holding --out (the default one too).
    default = Path(f"check-{safe_name(Path(command[-1]).stem or 'command')}")  # as _workspace names it
    check_copies(copies, out if out is not None else default)
    refused = refused_seed_variable(seed_env) if seed_env is not None else None
    if refused:
        raise ConfigError(f"--seed-env {one_line(seed_env)[:64]!r} {refused}")
    if stop_seed is not None and not 0 <= stop_seed < 2**63:
        raise ConfigError(f"--stop-seed must be from 0 to 2**63-1, got {str(stop_seed)[:30]}")
    if at_line is not None:
        try:
            re.compile(at_line)
        except re.error as exc:
            raise ConfigError(f"--at-line {at_line[:40]!r} is not a regular expression ({exc})") from None


def _seconds(at: str) -> list[float]:
    try:
        values = [float(part) for part in at.split(",")]
    except ValueError:
        raise ConfigError(f"--at {at!r}: give seconds separated by commas, e.g. 2.5,4") from None
    if not values or not all(0 < v < float("inf") for v in values):
        raise ConfigError(f"--at {at!r}: each stop must be a number of seconds > 0")
    return values


def _stops(count: int, at, at_file, at_line) -> list[Stop]:
    if at is not None:
        return [Stop(seconds=s) for s in _seconds(at)]
    if at_file is not None:
        return [Stop(file_glob=at_file)] * count
    return [Stop(line=at_line)] * count


def isolated_environment(home: Path, tmp: Path) -> dict[str, str]:
    """This process's environment for a run, with a HOME and a TMPDIR of the run's own (state a script
    keeps under ~ or in the temporary directory cannot pass from one run to another). The XDG base
    directories follow HOME; Python's user site-packages stay where they are (PYTHONUSERBASE), so what
    `pip install --user` put there still imports. PYTHONUNBUFFERED=1: a Python script's line reaches check
    when it is printed, not when a block fills or the script exits (an --at-line stop must come while the
    script is at that line)."""
    import site

    env = {k: v for k, v in os.environ.items() if not re.match(r"^XDG_(CACHE|CONFIG|DATA|STATE)_HOME\Z", k)}
    env.setdefault("PYTHONUSERBASE", site.getuserbase())
    env["PYTHONUNBUFFERED"] = "1"
    absolute = {"HOME": home.absolute(), "TMPDIR": tmp.absolute(), "TMP": tmp.absolute(), "TEMP": tmp.absolute()}
    return env | {name: str(path) for name, path in absolute.items()}


def in_parallel(work, items: list, jobs: int) -> None:
    """work(item) for each item, up to `jobs` at once (threads: each waits on its own processes); the
    first exception raised is raised here once all have ended."""
    if jobs <= 1 or len(items) <= 1:
        for item in items:
            work(item)
        return
    errors: list[BaseException] = []
    pending = list(items)
    lock = threading.Lock()

    def worker() -> None:
        while True:
            with lock:
                if not pending or errors:
                    return
                item = pending.pop(0)
            try:
                work(item)
            except BaseException as exc:  # noqa: BLE001 - raised again in the caller's thread
                errors.append(exc)

    threads = [threading.Thread(target=worker, daemon=True) for _ in range(min(jobs, len(items)))]
    for thread in threads:
        thread.start()
    for thread in threads:
        while thread.is_alive():
            thread.join(0.2)  # a KeyboardInterrupt reaches this thread between the waits
    if errors:
        raise errors[0]


def _workspace(out: Path | None, command: list[str]) -> Path:
    out = Path(out) if out is not None else Path(f"check-{safe_name(Path(command[-1]).stem or 'command')}")
    claim_new_or_empty(out, "check")
    return out


def _write_receipt(
    out: Path,
    clean: Run,
    copies: list[Path],
    outputs: list[str],
    ignore: list[str],
    env: dict,
    seed_env: str | None,
    notes: list[str],
) -> Path:
    """The uninterrupted run's receipt (reprocube.formats.script_receipt), once two such runs agreed: what
    `reprocube reproduce` retrains on another machine; what it records otherwise than asked, in notes."""
    return write_script_receipt(
        out / "receipt",
        clean.command,
        input_digests(copies),
        outputs,
        output_digests(collect(clean.work, outputs, ignore), notes),
        clean.probe_trace(1),
        clean.attempts[-1].seconds,
        env,
        {"variable": seed_env, "value": clean.env[seed_env]} if seed_env else None,
    )


def _unproven(evidence: list[dict], comparison: dict, probe: dict | None, stopped: Run, clean: list[Run]) -> list[str]:
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
    missing = _missing_ranks(resume)
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


def _missing_ranks(resume: dict) -> str | None:
    """Ranks a trace header counts (world_size) that wrote no trace: their resume is not shown."""
    world = resume.get("world_size")
    ranks = resume.get("ranks") or []
    if world and len(ranks) < world:
        return f"the probe heard from {counted(len(ranks), 'rank')} of {world} (call it on every rank)"
    return None


def _trained_nothing(clean: Run, run: Run) -> bool:
    """Whether the uninterrupted run recorded updates with the probe and `run` recorded none."""
    try:
        recorded = [any(trace.updates for trace in attempt.values()) for attempt in (*_traces(clean), *_traces(run))]
    except CheckpointError:  # unreadable: not ours to judge here (the resume's comparison names it)
        return False
    return bool(recorded) and recorded[0] and not any(recorded[len(clean.attempts) :])


def _traces(run: Run) -> list[dict]:
    """Each attempt's traces, by rank ({} where no process of it wrote one)."""
    return [read_rank_traces(run.probe_trace(number)) for number in range(1, len(run.attempts) + 1)]


def _repeat_trace(first: Run, again: Run, result: dict, first_updates: dict[str, int | None]) -> str | None:
    """Where two uninterrupted runs' probe traces first differ, rank by rank (None: the same, or no
    probe); and in first_updates, the step of the first run that `again`'s first update is (past 1: it
    began where another run had ended)."""
    try:
        (a,), (b,) = _traces(first), _traces(again)
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


def _resume_trace(clean: Run, stopped: Run, result: dict, same_clock: bool = True) -> dict:
    """The stopped run's probe traces against the uninterrupted run's: {"differs": the first differing
    update after a stop, or None; "before_stops": the first differing update where it came before any
    stop, or None; "compared": updates compared; "difference": the first difference as recorded}.
    same_clock: the script ran on this machine, so its probe's times and check's signal times are one
    clock's (an update recorded after a signal is the stop's doing)."""
    none = {"differs": None, "before_stops": None, "compared": 0, "difference": None}
    try:
        (reference,) = _traces(clean)
        signals = [
            stopped.began + a.started_s + a.signal_s if same_clock and a.signal_s is not None else None
            for a in stopped.attempts
        ]
        starts = (clean.began + clean.attempts[0].started_s, [stopped.began + a.started_s for a in stopped.attempts])
        traced = compare_stopped_ranks(reference, _traces(stopped), signals, starts if same_clock else None)
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
    differs = before = None
    if difference is not None:
        details, step = describe_difference(difference, "uninterrupted", "resumed", hint=True), difference["step"]
        attempt, stop = attempts[difference["attempt"] - 1], difference["after_stop"]
        if not stop:  # not resume's doing: no hint at what a checkpoint lacks
            before = f"step {step} differs ({describe_difference(difference, 'uninterrupted', 'stopped')})"
        elif difference.get("after_signal"):
            differs = (
                f"step {step}, an update attempt {difference['attempt']} recorded after stop {stop}'s signal (what "
                f"the script did as it stopped), is the first update that differs ({details})"
            )
        elif attempt["how"] == "assumed":
            differs = (
                f"after stop {stop} the first update already differs: step {step}, after the checkpoint the "
                f"script announced at step {attempt['resumed_at']} ({details})"
            )
        else:
            differs = (
                f"after stop {stop} (resumed at step {attempt['resumed_at']}), "
                f"step {step} is the first update that differs ({details})"
            )
    for attempt in attempts:
        if attempt.get("label_offset"):
            result["not_checked"].append(
                f"attempt {attempt['attempt']}'s step numbers are off by {attempt['label_offset']:+d} from the "
                "uninterrupted run's (its updates' bits are those steps' own): its step counter is not restored "
                "as it was; the updates are compared by their bits"
            )
    if traced["unrecorded_steps"]:
        spans = ", ".join(f"{a}-{b}" if a != b else str(a) for a, b in traced["unrecorded_steps"][:5])
        result["not_checked"].append(
            f"the updates at steps {spans}: no attempt of the stopped run recorded them (a "
            "stop ended an attempt before the probe wrote them, and the restart resumed "
            "after them: call probe.checkpoint right after each save)"
        )
    return {"differs": differs, "before_stops": before, "compared": traced["compared_steps"], "difference": difference}


def _last_line(run: Run) -> str:
    """The command's newest output line (its own words; shown escaped), for a progress line."""
    try:
        with open(run.log, "rb") as log:
            log.seek(max(0, log.seek(0, os.SEEK_END) - 4096))
            lines = [line for line in log.read().decode(errors="replace").splitlines() if line.strip()]
    except OSError:
        return "no output yet"
    return f"its last line: {lines[-1][:120]}" if lines else "no output yet"
