"""The one record of what `reprocube check`'s runs showed: the conductor (check.session) gathers it, stage by
stage, from the runs, their files and the probe's traces; the verdict (check.verdict) is a pure function of
it. Frozen: nothing decides by changing it, and a rule can be tested with a record built by hand.

A stage's part is None until that stage has run: the clean runs (`repeat`), the negative control
(`control`), the stopped run (`stopped`) and the restarts given another run's state (`swap`, `moved`)."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class RepeatEvidence:
    """The uninterrupted runs, in the order they are judged (the first problem found ends the look)."""

    failed: tuple[str, str] | None = None  # (the first clean run that failed, why)
    linked_output: str | None = None  # a declared output under a symbolic link in clean-1's directory
    removed_output: str | None = None  # clean-1 wrote it and another process removed it before it was read
    unwritten: tuple[str, ...] = ()  # declared outputs clean-1 did not write
    uncomparable: str | None = None  # a run none of whose outputs could be compared with clean-1's
    differs: str | None = None  # where two uninterrupted runs first differ (their outputs or updates)
    own_value: str | None = None  # that difference is a value check sets per run (its HOME or TMPDIR)
    leaked: str | None = None  # a run started from state another left outside its directories
    shared_elsewhere: bool = False  # runs at once that saved no checkpoint in their own directories
    receipt_refused: str | None = None  # the receipt's directory planted or replaced by the command


@dataclass(frozen=True)
class ControlEvidence:
    """The run with another seed."""

    failed: str | None = None  # why it failed
    identical: bool = False  # it wrote the uninterrupted run's outputs
    leaked: str | None = None


@dataclass(frozen=True)
class StoppedEvidence:
    """The run stopped `planned` times and restarted after each, against clean-1."""

    how: str  # "SIGTERM", "SLURM requeue"
    planned: int
    landed: int
    failed: str | None = None  # why it failed
    leaked: str | None = None  # its first attempt (no stop landed) started from another run's state
    before_stops: str | None = None  # its first differing update came before any stop
    trace_differs: str | None = None  # its first differing update after a stop (the probe)
    outputs_identical: bool = True
    first_output_difference: str | None = None  # the first declared output that differs, in words
    identical_words: str = "bit-identical to an uninterrupted run's"  # how the outputs are the same
    stops: tuple[dict, ...] = ()  # stop_evidence: {"stop", "landed", "effective", "how", "by"?, ...}
    unproven: tuple[str, ...] = ()  # what keeps identical outputs from proving the resume
    updates_compared: int = 0
    traces_unreadable: bool = False
    updates_partial: bool = False  # the probe did not record every update (see not checked)
    clean_saves: int = 0  # how often the uninterrupted run saved (-1: it follows the clock)
    stops_after_first_save: bool = False  # default stops: each a share of a save interval
    survived: tuple[int, ...] = ()  # stops whose signal the command outlived: it trained on to its end
    restart_wait_s: float = 0.0  # the longest a restart waited after its stop (0: each came at once)
    per_process_differs: str | None = None  # more uninterrupted runs, started because this one differs
    more_clean_runs: int = 0  # how many such runs told something (0: none ran)
    more_clean_runs_through: int | None = None  # they were compared up to this update only (then ended)
    more_clean_runs_failed: str | None = None  # why one of them failed (a failure tells nothing of determinism)
    own_value: str | None = None  # per_process_differs is only in a value check sets per run (HOME, TMPDIR)
    trainer_said: tuple[str, ...] = ()  # known messages of the trainer in the restarts' log (check.trainer_words)
    interrupted_saves: tuple[str, ...] = ()  # stops that landed while a save was being written, in words
    during_save_missed: tuple[int, ...] = ()  # --during-save stops that came only once the save was whole


@dataclass(frozen=True)
class SwapEvidence:
    """The restart given the control's state under the uninterrupted run's names."""

    same_files: tuple[str, ...] = ()  # it wrote these of the uninterrupted run's outputs bit for bit
    note: str | None = None  # what it could not tell (a not-checked line), None where it told it
    not_needed: bool = False  # a moved-weights restart told it already
    from_last_save_but_one: bool = False  # given the control's state after its last save but one


@dataclass(frozen=True)
class MovedRestart:
    """One restart given the stopped run's state after `stop`, its weights moved by one."""

    stop: int
    name: str
    moved: tuple[str, ...] = ()
    weights_only: bool = False  # the probe's trained weights alone were moved (else every float tensor)
    used: str | None = None  # its first update differed from the uninterrupted run's: how
    never_used: tuple[str, ...] = ()  # it read a moved file and wrote these outputs bit for bit
    note: str = "not run"  # why it told nothing


@dataclass(frozen=True)
class MovedEvidence:
    restarts: tuple[MovedRestart, ...] = ()
    note: str = "not run"  # why there are none


@dataclass(frozen=True)
class Evidence:
    seeded: bool = False  # --seed-env or --seed-arg: a negative control ran
    reached: str | None = None  # the stage the runs reached: where a verdict on the whole check is decided
    jobs: int = 1
    uninterrupted: int = 2  # uninterrupted runs made before the stops (--repeat; 1 under --quick)
    control_left_out: bool = False  # --quick or --sweep: no control runs, said first among what was left out
    replaced: str | None = None  # check's own directories replaced by the command: in words
    changed_after: tuple[str, str, bool] | None = None  # (run, what changed, a restart's copy?) after it ended
    repeat: RepeatEvidence | None = None
    no_saves: str | None = None  # the uninterrupted run saved nothing as it went: why no stop was planned
    control: ControlEvidence | None = None
    stopped: StoppedEvidence | None = None
    swap: SwapEvidence | None = None
    moved: MovedEvidence | None = None
    written_beside: tuple[str, ...] = ()  # what the commands wrote beside the runs' directories in --out
    not_checked: tuple[str, ...] = field(default_factory=tuple)  # gathered with the evidence, in order
