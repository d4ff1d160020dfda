"""check's verdict table (reprocube.check.verdict), rule by rule, on evidence built by hand: no process is
started, no file read. Each row is one case the verdict must handle, the adversary findings of rounds 1-9
and round 10 among them, reduced to what their runs showed; the row names the verdict, the stage, the rule
that must give it and words the summary must (and must not) hold. The ground-truth matrix
(tests/check/test_ground_truth.py) and a few end-to-end checks per rule family run the same rules on real runs."""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace

import pytest

from reprocube.check import verdict as table
from reprocube.check.evidence import (
    ControlEvidence,
    Evidence,
    MovedEvidence,
    MovedRestart,
    RepeatEvidence,
    StoppedEvidence,
    SwapEvidence,
)
from reprocube.check.verdict_words import NO_WAIT, QUICK_LEFT_OUT, QUICK_NOT_RUN
from reprocube.results.check_result import VERDICTS

# --- evidence as the runs would leave it ------------------------------------------------------------------
EFFECTIVE = {
    "stop": 1,
    "landed": True,
    "effective": True,
    "by": "probe",
    "how": "attempt 2 resumed at step 9 (the probe)",
}
EFFECTIVE_2 = {**EFFECTIVE, "stop": 2, "how": "attempt 3 resumed at step 17 (the probe)"}
BY_FILES = {"stop": 1, "landed": True, "effective": True, "by": "files", "read": True, "how": "attempt 2 read ckpt.pt"}
NOT_SAVED = {"stop": 1, "landed": True, "effective": False, "how": "nothing was saved before it"}
NO_RESTART = {"stop": 1, "landed": False, "effective": False, "how": "no restart followed"}
ELSEWHERE = {**EFFECTIVE, "elsewhere": True, "how": "attempt 2 read no checkpoint of its own"}
READ_ONLY = {"stop": 1, "landed": True, "effective": False, "read": True, "how": "it began again over ckpt.pt"}
SURVIVED = {
    "stop": 1,
    "landed": True,
    "effective": False,
    "survived": True,
    "how": "attempt 1 trained on after the signal to its end (it outlived the signal: the stop interrupted nothing)",
}

STOPPED = StoppedEvidence(how="SIGTERM", planned=1, landed=1, stops=(EFFECTIVE,), restart_wait_s=1.0)
STOPPED_TWO = replace(STOPPED, planned=2, landed=2, stops=(EFFECTIVE, EFFECTIVE_2))
USED = MovedRestart(stop=1, name="moved-1", moved=("ckpt.pt",), weights_only=True, used="its first loss 2.1 vs 2.3")
NEVER_USED = MovedRestart(stop=1, name="moved-1", moved=("ckpt.pt",), weights_only=True, never_used=("model.pt",))
SWAP_TOLD = SwapEvidence(not_needed=True)
PASSING = Evidence(
    seeded=True,
    repeat=RepeatEvidence(),
    control=ControlEvidence(),
    stopped=STOPPED,
    swap=SWAP_TOLD,
    moved=MovedEvidence(restarts=(USED,)),
)


def stopped(**changes) -> Evidence:
    """The passing evidence with the stopped run's part changed."""
    return replace(PASSING, stopped=replace(STOPPED, **changes))


@dataclass(frozen=True)
class Row:
    evidence: Evidence
    verdict: str | None  # None: the stage told nothing yet (the check goes on)
    stage: str | None = None
    rule: str | None = None
    says: tuple[str, ...] = ()  # in the summary
    never: tuple[str, ...] = ()  # never in the summary
    names: tuple[str, ...] = ()  # among the not-checked lines the verdict adds
    origin: str = ""  # the finding it reduces, where it is one
    id: str = field(default="", compare=False)


ROWS = [
    # --- the clean runs ---
    Row(Evidence(repeat=RepeatEvidence()), None, id="clean runs agree: go on"),
    Row(
        Evidence(replaced="work was replaced by the command"),
        "command-failed",
        "repeat",
        "directories_replaced",
        ("replaced",),
        id="check's directories replaced",
    ),
    Row(
        Evidence(repeat=RepeatEvidence(failed=("clean-2", "exit 1: Traceback"))),
        "command-failed",
        "clean-2",
        "clean_run_failed",
        ("exit 1",),
        id="a clean run failed",
    ),
    Row(
        Evidence(repeat=RepeatEvidence(linked_output="out")),
        "command-failed",
        "clean-1",
        "output_under_link",
        ("out is a symbolic link",),
        id="output under a link",
    ),
    Row(
        Evidence(repeat=RepeatEvidence(removed_output="model.pt")),
        "state-leaked",
        "repeat",
        "output_removed",
        ("removed or replaced by another process",),
        origin="round 4: remove_others.py",
        id="output removed by another run",
    ),
    Row(
        Evidence(repeat=RepeatEvidence(unwritten=("a.pt", "b.pt"))),
        "command-failed",
        "clean-1",
        "output_unwritten",
        ("a.pt", "(nor b.pt)"),
        id="outputs not written",
    ),
    Row(
        Evidence(repeat=RepeatEvidence(uncomparable="clean-2")),
        "command-failed",
        "clean-2",
        "outputs_uncomparable",
        ("none of its declared outputs could be compared",),
        origin="round 4: hard_linked_save.py",
        id="nothing comparable",
    ),
    Row(
        Evidence(repeat=RepeatEvidence(differs="model.pt differs", leaked="clean-2's first update is step 9")),
        "state-leaked",
        "repeat",
        "clean_runs_leaked",
        ("step 9", "resume was not tested"),
        origin="round 3: a16 (state in HOME)",
        id="clean runs differ, one began where another ended",
    ),
    Row(
        Evidence(repeat=RepeatEvidence(leaked="clean-2 took a fraction of clean-1's time")),
        "state-leaked",
        "repeat",
        "clean_runs_leaked",
        ("fraction",),
        id="clean runs agree, one began from another's state",
    ),
    Row(
        Evidence(
            repeat=RepeatEvidence(
                differs="config.json differs: key home", own_value="the HOME check gives each run (config.json)"
            )
        ),
        "not-deterministic",
        "repeat",
        "clean_runs_differ_in_own_value",
        ("HOME check gives each run", "--ignore"),
        ("Usual suspects",),
        origin="round 10: a config that records ~ and the temp dir",
        id="clean runs differ only in check's HOME/TMPDIR",
    ),
    Row(
        Evidence(jobs=2, repeat=RepeatEvidence(differs="model.pt differs", shared_elsewhere=True)),
        "not-resumed",
        "repeat",
        "clean_runs_shared_elsewhere",
        ("--jobs 1",),
        origin="round 4: state_beside.py",
        id="runs at once, no checkpoint of their own",
    ),
    Row(
        Evidence(jobs=1, repeat=RepeatEvidence(differs="model.pt differs", shared_elsewhere=True)),
        "not-deterministic",
        "repeat",
        "clean_runs_differ",
        ("Usual suspects",),
        id="one at a time, no checkpoint: not deterministic",
    ),
    Row(
        Evidence(repeat=RepeatEvidence(differs="step 3 is the first update that differs")),
        "not-deterministic",
        "repeat",
        "clean_runs_differ",
        ("step 3", "resume was not tested"),
        id="clean runs differ",
    ),
    Row(
        Evidence(repeat=RepeatEvidence(receipt_refused="receipt: planted by the command")),
        "command-failed",
        "receipt",
        "receipt_refused",
        ("planted",),
        origin="round 4: plant_dirs.py",
        id="receipt directory planted",
    ),
    Row(
        Evidence(repeat=RepeatEvidence(), no_saves="in 3.0 s the uninterrupted run rewrote no file as it went"),
        "not-resumed",
        "stopped",
        "nothing_saved_as_it_went",
        ("rewrote no file",),
        id="nothing saved as it went",
    ),
    # --- after a run ended, and the control ---
    Row(
        replace(PASSING, changed_after=("clean-1", "model.pt", False)),
        "state-leaked",
        "control",
        "outputs_changed_after_run",
        ("clean-1's outputs changed",),
        ("a restart given a copy",),
        id="clean-1's outputs changed later",
    ),
    Row(
        replace(PASSING, changed_after=("stopped", "model.pt", True)),
        "state-leaked",
        "control",
        "outputs_changed_after_run",
        ("a restart given a copy of its state",),
        origin="round 9: H1",
        id="a restart wrote into the stopped run's outputs",
    ),
    Row(
        replace(PASSING, control=None, seeded=False, changed_after=("stopped", "model.pt", True)),
        "state-leaked",
        "stopped",
        "outputs_changed_after_run",
        id="changed, without a control: stage stopped",
    ),
    Row(
        replace(PASSING, replaced="probe was replaced"),
        "command-failed",
        "control",
        "directories_replaced",
        id="directories replaced while the control ran",
    ),
    Row(
        replace(PASSING, control=ControlEvidence(failed="exit 2")),
        "command-failed",
        "control",
        "control_failed",
        ("exit 2",),
        id="control failed",
    ),
    Row(
        replace(PASSING, control=ControlEvidence(identical=True)),
        "control-void",
        "control",
        "control_same",
        ("do not depend on the training",),
        id="control writes the same outputs",
    ),
    Row(
        replace(PASSING, control=ControlEvidence(identical=True, leaked="it began at step 9")),
        "state-leaked",
        "control",
        "control_same",
        ("began at step 9",),
        id="control the same, from another's state",
    ),
    # --- the stopped run ---
    Row(
        stopped(
            failed="stopped exited 1: FileNotFoundError: out/checkpoint-5/rng.json; it ran beside another run (--jobs 2)",
            interrupted_saves=(
                "stop 1 landed while work/out/checkpoint-5/ was being written (2 of the 7 files of a whole save)",
            ),
        ),
        "save-interrupted",
        "stopped",
        "save_interrupted",
        (
            "work/out/checkpoint-5/ was being written (2 of the 7",
            "the restart then failed",
            "may leave a run that cannot resume",
            "the failure is not the partial checkpoint's",
        ),
        origin="issue 66 item 2: the Trainer's checkpoint-5/ with 2 of 7 files, called command-failed with a --jobs hint",
        id="a stop during a save, the restart failed on it",
    ),
    Row(
        stopped(
            interrupted_saves=("stop 1 landed while work/ckpt/ was being written (1 of the 2 files of a whole save)",)
        ),
        "resume-exact",
        "resume",
        "resume_exact",
        ("work/ckpt/ was being written", "survives a preemption during that save"),
        id="a stop during a save, the restart resumed exactly all the same",
    ),
    Row(
        stopped(
            outputs_identical=False,
            first_output_difference="final.npy differs",
            interrupted_saves=("stop 1 landed while work/w.npy was being written (1 of the 2 files of a whole save)",),
        ),
        "resume-differs",
        "resume",
        "resume_differs",
        ("work/w.npy was being written (1 of the 2 files of a whole save): the restart took what it left",),
        origin="issue 66 item 2's adversary: a restart that loads a half-written checkpoint and trains on",
        id="a stop during a save, the restart took what it left and differs",
    ),
    Row(
        stopped(failed="exit 1 after the restart"),
        "command-failed",
        "stopped",
        "stopped_run_failed",
        ("after 1 stop", "exit 1"),
        origin="round 6: Trainer's incomplete checkpoint",
        id="stopped run failed",
    ),
    Row(
        stopped(landed=0, stops=(NO_RESTART,)),
        "no-stop-landed",
        "stopped",
        "no_stop_landed",
        ("finished before its first stop",),
        id="no stop landed",
    ),
    Row(
        stopped(landed=0, leaked="it took 0.1 of clean-1's time"),
        "state-leaked",
        "stopped",
        "no_stop_landed",
        ("first attempt ended before its stop",),
        id="no stop landed, another's state",
    ),
    Row(
        stopped(before_stops="step 2 differs"),
        "not-deterministic",
        "resume",
        "departs_before_stops",
        ("before its first stop", "step 2", "2 agreeing uninterrupted runs do not exclude"),
        ("--quick",),
        id="departs before any stop",
    ),
    Row(
        replace(stopped(before_stops="step 2 differs"), uninterrupted=1, not_checked=(QUICK_LEFT_OUT,)),
        "not-deterministic",
        "resume",
        "departs_before_stops",
        ("before its first stop", "--quick made one uninterrupted run"),
        ("agreeing",),
        origin="issue 66 item 5: a quick check has one uninterrupted run; none agreed with another",
        id="quick: departs before any stop",
    ),
    Row(
        Evidence(
            uninterrupted=1,
            control_left_out=True,
            repeat=RepeatEvidence(),
            stopped=replace(STOPPED, restart_wait_s=0.0),  # every restart at once
            swap=SwapEvidence(note=QUICK_NOT_RUN),
            moved=MovedEvidence(note=QUICK_NOT_RUN),
            not_checked=(QUICK_LEFT_OUT,),
        ),
        "resume-exact",
        "resume",
        "resume_exact",
        ("not checked: --quick: one uninterrupted run", "no negative control"),
        ("used them",),
        (f"whether the restarts used the weights they read: {QUICK_NOT_RUN}", NO_WAIT),
        origin="issue 66 item 5: the pass of a quick check names first what it left out",
        id="quick: the pass names what it left out",
    ),
    Row(
        stopped(stops=(ELSEWHERE,)),
        "state-leaked",
        "resume",
        "restored_from_elsewhere",
        ("read no checkpoint of its own",),
        ("What differs",),
        origin="round 7: F1 state in /dev/shm",
        id="resumed from state elsewhere, outputs the same",
    ),
    Row(
        stopped(stops=(ELSEWHERE,), outputs_identical=False, first_output_difference="model.pt differs"),
        "state-leaked",
        "resume",
        "restored_from_elsewhere",
        ("What differs is not shown to be resume's",),
        id="resumed from elsewhere, outputs differ",
    ),
    Row(
        stopped(
            outputs_identical=False,
            first_output_difference="model.pt differs",
            per_process_differs="clean-3's model.pt differs",
            more_clean_runs=2,
        ),
        "not-deterministic",
        "resume",
        "differs_per_process",
        ("2 more uninterrupted runs", "PYTHONHASHSEED"),
        ("resume-differs",),
        origin="round 10: set order under hash randomisation",
        id="differs, and so does another uninterrupted run",
    ),
    Row(
        stopped(
            outputs_identical=False,
            first_output_difference="out.txt differs",
            per_process_differs="clean-2: out.txt differs",
            own_value="the run's work directory",
            more_clean_runs=2,
        ),
        "not-deterministic",
        "resume",
        "differs_per_process",
        ("only in the run's work directory", "records where it ran"),
        ("PYTHONHASHSEED",),
        origin="issue 66 item 5's adversary: the work directory in an output, under --quick",
        id="differs, and another uninterrupted run only in its own directory",
    ),
    Row(
        replace(
            stopped(
                outputs_identical=False,
                first_output_difference="final.npy differs",
                more_clean_runs_failed="clean-2 exited 1: address already in use",
            ),
            uninterrupted=1,
        ),
        "command-failed",
        "resume",
        "differs_with_no_run_to_tell",
        ("--quick made one uninterrupted run", "address already in use", "nothing shows it is resume's"),
        ("Two agreeing", "--repeat N"),
        origin="issue 66 item 5's adversary: --quick, the more uninterrupted runs failed (a fixed port)",
        id="quick: differs, and every further uninterrupted run failed",
    ),
    Row(
        stopped(
            outputs_identical=False,
            first_output_difference="final.npy differs",
            stops=(READ_ONLY,),
            more_clean_runs_failed="clean-3 exited 1: address already in use",
        ),
        "resume-differs",
        "resume",
        "resume_differs",
        ("final.npy differs", "Two agreeing uninterrupted runs"),
        origin="the whole check: two uninterrupted runs agreed before the stops, a failed further one adds nothing",
        id="differs, further uninterrupted runs failed, two agreed before",
    ),
    Row(
        stopped(outputs_identical=False, first_output_difference="model.pt differs", stops=(NOT_SAVED,)),
        "not-resumed",
        "resume",
        "differs_but_no_resume_shown",
        ("nothing ties that to a resume",),
        id="differs, no restart shown to resume",
    ),
    Row(
        stopped(outputs_identical=False, first_output_difference="model.pt differs", stops=(READ_ONLY,)),
        "resume-differs",
        "resume",
        "resume_differs",
        ("model.pt differs",),
        id="differs, a restart read a checkpoint",
    ),
    Row(
        stopped(trace_differs="after stop 1 (resumed at step 9), step 9 is the first update that differs"),
        "resume-differs",
        "resume",
        "resume_differs",
        ("step 9", "--repeat N"),
        id="an update differs after a stop",
    ),
    Row(
        stopped(trace_differs="step 9 differs", more_clean_runs=2),
        "resume-differs",
        "resume",
        "resume_differs",
        ("More uninterrupted runs",),
        ("--repeat N",),
        id="differs; more clean runs agreed",
    ),
    Row(
        stopped(trace_differs="step 9 differs", more_clean_runs=2, more_clean_runs_through=9),
        "resume-differs",
        "resume",
        "resume_differs",
        ("agreed with the first up to step 9",),
        id="differs; more clean runs agreed up to its first differing update",
    ),
    Row(
        stopped(trace_differs="step 9 differs", trainer_said=("Lightning warned in the restart that its dataloader",)),
        "resume-differs",
        "resume",
        "resume_differs",
        ("step 9 differs", "The trainer said why itself: Lightning warned in the restart that its dataloader"),
        id="differs; the trainer said why in the restart's log",
        origin="issue 66 item 4",
    ),
    Row(
        stopped(outputs_identical=False, first_output_difference=None),
        "resume-differs",
        "resume",
        "resume_differs",
        ("no declared output could be compared",),
        id="differs, nothing could be compared",
    ),
    Row(
        stopped(stops=(NOT_SAVED,)),
        "not-resumed",
        "resume",
        "stops_proved_nothing",
        ("nothing was saved before it", "deterministic"),
        id="the same, nothing saved before the stop",
    ),
    Row(
        stopped(stops=(SURVIVED,)),
        "not-resumed",
        "resume",
        "stops_proved_nothing",
        ("outlived the signal",),
        ("a line printed late",),
        origin="round 10: a script that ignores SIGTERM",
        id="the command survived the signal",
    ),
    Row(
        stopped(unproven=("stop 1 shown by files only",)),
        "not-proven",
        "resume",
        "same_but_unproven",
        ("files only",),
        id="the same, shown by files only",
    ),
    Row(
        stopped(stops=(BY_FILES,), unproven=("model.pt not compared",)),
        "not-proven",
        "resume",
        "same_but_unproven",
        ("not compared",),
        id="the same, an output not compared",
    ),
    # --- the restarts given another state ---
    Row(replace(PASSING, swap=None, moved=None), None, id="stopped stage alone: the restarts' evidence still to come"),
    Row(
        replace(
            PASSING,
            swap=SwapEvidence(same_files=("model.pt",), from_last_save_but_one=True),
            moved=MovedEvidence(note="no float tensors"),
        ),
        "not-proven",
        "swap",
        "swapped_restart_ignored_state",
        ("after its last save but one", "model.pt bit for bit"),
        origin="round 6: export_when_complete.py",
        id="swapped restart wrote the uninterrupted outputs",
    ),
    Row(
        replace(PASSING, moved=MovedEvidence(restarts=(NEVER_USED,))),
        "not-proven",
        "moved-weights",
        "moved_weights_never_used",
        ("never used those weights", "logs/moved-1.log"),
        origin="round 7: a restart that replays",
        id="moved weights never used",
    ),
    Row(
        replace(PASSING, written_beside=("work/../shared.db",)),
        "state-leaked",
        "outside",
        "wrote_beside_runs",
        ("outside its run's directories",),
        origin="round 4: sqlite_log.py",
        id="wrote beside the runs' directories",
    ),
    # --- the pass, and what it names ---
    Row(
        PASSING,
        "resume-exact",
        "resume",
        "resume_exact",
        ("every stop effective", "used them"),
        names=(table.REPLAY_AFTER_MOVED,),
        id="the pass",
    ),
    Row(
        replace(PASSING, seeded=False, control=None),
        "resume-exact",
        "resume",
        "resume_exact",
        ("no negative control",),
        id="the pass without a control",
    ),
    Row(
        stopped(restart_wait_s=0.0),
        "resume-exact",
        "resume",
        "resume_exact",
        names=(table.NO_WAIT,),
        origin="round 10: a wall-clock budget kept in the checkpoint",
        id="every restart came at once: named",
    ),
    Row(
        PASSING,
        "resume-exact",
        "resume",
        "resume_exact",
        names=(table.WAITED.format(seconds="1"),),
        origin="round 10: a checkpoint stale after 2 s passed a 1 s wait",
        id="a restart waited 1 s: a longer absence named",
    ),
    Row(
        stopped(
            identical_words="identical to an uninterrupted run's (bit for bit but model.pt: every value bit-identical under a strict reader, laid out in other bytes (a layout difference, not a resume difference))"
        ),
        "resume-exact",
        "resume",
        "resume_exact",
        ("a layout difference",),
        origin="round 10: pickle's memo",
        id="outputs the same but for their layout",
    ),
    Row(
        replace(
            PASSING, stopped=STOPPED_TWO, moved=MovedEvidence(restarts=(USED, replace(USED, stop=2, name="moved-2")))
        ),
        "resume-exact",
        "resume",
        "resume_exact",
        ("stops 1 and 2",),
        names=(table.REPLAY_AFTER_MOVED,),
        id="every stop's moved-weights restart used its weights",
    ),
    Row(
        replace(PASSING, moved=MovedEvidence(note="a SLURM job's directories are not copied at its stops")),
        "resume-exact",
        "resume",
        "resume_exact",
        never=("used them",),
        names=(
            "whether the restarts used the weights they read: a SLURM job's directories are not copied at its stops",
            table.REPLAY_NOT_CHECKED,
        ),
        id="no moved-weights restart: named",
    ),
    Row(
        replace(
            PASSING,
            swap=SwapEvidence(note="it wrote no declared output"),
            moved=MovedEvidence(restarts=(replace(USED, used=None, note="it failed"),)),
        ),
        "resume-exact",
        "resume",
        "resume_exact",
        names=(f"{table.SWAP_NOT_SHOWN}: it wrote no declared output",),
        id="swap and moved restart told nothing: named",
    ),
    Row(
        stopped(updates_compared=40, updates_partial=True),
        "resume-exact",
        "resume",
        "resume_exact",
        ("40 updates", "not all: see not checked"),
        id="the probe recorded some updates only",
    ),
    Row(
        stopped(traces_unreadable=True),
        "resume-exact",
        "resume",
        "resume_exact",
        ("could not be read",),
        id="the probe's traces unreadable",
    ),
    Row(
        stopped(during_save_missed=(1,)),
        "resume-exact",
        "resume",
        "resume_exact",
        ("stop 1 meant to land during a save came once the save was whole", "was not tried there"),
        origin="issue 66 item 2: --during-save's stop came after a save written faster than check looks",
        id="during-save: the stop came after the save",
    ),
    Row(
        stopped(stops_after_first_save=True, clean_saves=4),
        "resume-exact",
        "resume",
        "resume_exact",
        ("at these moments only", "of the uninterrupted run's 4"),
        id="default stops: these moments only",
    ),
]


@pytest.mark.parametrize("row", ROWS, ids=[row.id for row in ROWS])
def test_verdict_table_row(row: Row):
    verdict = table.decide(row.evidence)
    if row.verdict is None:
        assert verdict is None, verdict
        return
    assert verdict is not None, f"no rule spoke; expected {row.verdict}"
    assert (verdict.name, verdict.stage, verdict.rule) == (row.verdict, row.stage, row.rule), verdict
    assert verdict.exit_status == VERDICTS[row.verdict]
    for words in row.says:
        assert words in verdict.summary, (words, verdict.summary)
    for words in row.never:
        assert words not in verdict.summary, (words, verdict.summary)
    for line in row.names:
        assert line in verdict.not_checked, (line, verdict.not_checked)


def test_verdict_table_every_rule_has_a_row():
    """A rule no row reaches is a rule nobody tested."""
    reached = {table.decide(row.evidence).rule for row in ROWS if row.verdict is not None}
    assert reached == {name for name, _ in table.RULES}, {name for name, _ in table.RULES} - reached


def test_verdict_table_every_verdict_is_reachable():
    assert {row.verdict for row in ROWS if row.verdict} == set(VERDICTS)


def test_verdict_table_a_pass_names_what_it_did_not_check():
    """No verdict says more than was compared: a pass always names the replay and state outside the run's
    directories, and its summary counts every not-checked line, gathered ones first."""
    evidence = replace(PASSING, not_checked=("the updates at steps 5-8: no attempt recorded them",))
    verdict = table.decide(evidence)
    assert verdict.name == "resume-exact"
    assert table.OUTSIDE_NOT_CHECKED in verdict.not_checked
    assert "not checked: the updates at steps 5-8" in verdict.summary
    assert f"and {len(verdict.not_checked)} more items" in verdict.summary


def test_a_check_that_runs_no_control_says_so_once():
    """--quick and --sweep name the control among what they left out, first: the pass says it there only
    (it said "no negative control" twice where the command took no seed)."""
    quick = Evidence(
        uninterrupted=1,
        control_left_out=True,
        repeat=RepeatEvidence(),
        stopped=replace(STOPPED, restart_wait_s=0.0),
        swap=SwapEvidence(note=QUICK_NOT_RUN),
        moved=MovedEvidence(note=QUICK_NOT_RUN),
        not_checked=(QUICK_LEFT_OUT,),
    )
    verdict = table.decide(quick)
    assert verdict.name == "resume-exact" and verdict.summary.count("no negative control") == 1, verdict.summary
    whole = table.decide(replace(quick, control_left_out=False, uninterrupted=2, not_checked=()))
    assert whole.summary.count("no negative control") == 1, whole.summary  # the whole check without a seed


def test_verdict_table_is_pure_and_fast():
    """The whole table, every row, in well under a second: no process, no file."""
    started = time.perf_counter()
    for _ in range(20):
        for row in ROWS:
            table.decide(row.evidence)
    assert time.perf_counter() - started < 5


def test_verdict_table_rules_are_short():
    """Each rule at most 25 lines: a rule that grows is two rules."""
    import inspect

    for name, function in table.RULES:
        assert len(inspect.getsource(function).splitlines()) <= 25, name


def test_docs_check_md_tables_every_rule_as_the_table_decides_it():
    """docs/check.md's verdict table is the rule table in words: every rule once, in order, each with a
    verdict its rows give and that verdict's exit status."""
    import re
    from pathlib import Path

    text = (Path(__file__).resolve().parents[2] / "docs" / "check.md").read_text()
    documented = re.findall(r"^\| `([a-z_]+)` \| `([a-z-]+)` \| (\d+) \|", text, re.MULTILINE)
    assert [rule for rule, _, _ in documented] == [name for name, _ in table.RULES]
    given: dict[str, set[str]] = {}
    for row in ROWS:
        if row.verdict is not None:
            given.setdefault(row.rule, set()).add(row.verdict)
    for rule, verdict, status in documented:
        assert verdict in given[rule], (rule, verdict, given[rule])
        assert int(status) == VERDICTS[verdict], (rule, verdict, status)


def test_a_ci_step_tells_each_kind_of_answer_by_its_exit_status():
    """Issue 66 item 6: 'identical but not proven', 'no stop proved anything' and 'state leaked' are three
    answers a CI step acts on differently (look at the trace, stop elsewhere, isolate the run): three statuses,
    none shared with a pass, a difference, non-determinism or a failure."""
    void = {VERDICTS[name] for name in ("control-void", "no-stop-landed", "not-resumed")}
    assert len(void) == 1
    kinds = [void.pop(), VERDICTS["not-proven"], VERDICTS["state-leaked"]]
    others = {VERDICTS[name] for name in ("resume-exact", "resume-differs", "not-deterministic", "command-failed")}
    assert len(set(kinds)) == 3 and not set(kinds) & others, (kinds, others)


def test_the_check_page_has_a_next_step_for_every_verdict():
    """The page's 'what to do' per verdict (pages/check_page.py): a verdict added to the table has one too
    (save-interrupted had none: its page raised KeyError)."""
    from reprocube.pages.check_page import NEXT_STEP

    assert set(NEXT_STEP) == set(VERDICTS)
