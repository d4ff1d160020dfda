"""`reprocube check --launcher slurm`: each run of the command is one SLURM batch job, and each stop a real
preemption: `scontrol requeue`, with which SLURM ends the running job (SIGTERM to its processes, SIGKILL
after the cluster's KillWait) and later starts its batch script again, as PreemptMode=REQUEUE does. An
attempt is one start of the job.

The batch script is ours (written into check's directory, every value shell-quoted): it enters the work
directory, points the probe at this attempt's trace (SLURM_RESTART_COUNT), and writes when the attempt
began and how it ended into files of its own beside the job's log (never into the command's output, which
could imitate them). check's directory must be on a filesystem the compute nodes share."""

from __future__ import annotations

import re
import shlex
import shutil
import signal
import subprocess
import time
from pathlib import Path

from reprocube.check.runs import Attempt, Run, Stop, entries_below
from reprocube.errors import ConfigError
from reprocube.files import entry_size
from reprocube.orchestration.children import PROGRESS_EVERY_S, STOPPED, TIMED_OUT, ProgressReport, watch_child
from reprocube.probe import ENV as PROBE_ENV

POLL_S = 0.5  # how often the job's state is asked (each look runs scontrol)
TRIGGER_POLL_S = 0.02  # how often a stop's moment is looked for (the log and the work directory: cheap)
RUNNING = ("RUNNING", "COMPLETING")
ENDED = (
    "COMPLETED",
    "FAILED",
    "CANCELLED",
    "TIMEOUT",
    "NODE_FAIL",
    "OUT_OF_MEMORY",
    "BOOT_FAIL",
    "DEADLINE",
    "PREEMPTED",
)
KILLED = 137  # no status written: SLURM killed the batch script itself (after KillWait)
NO_WORK_DIRECTORY = 97  # the batch script could not enter the work directory (not on a shared filesystem)
COMMAND_TIMEOUT_S = 60
# sbatch options check sets itself, or that break one job per run with attempts as its starts. sbatch
# takes any unambiguous prefix of a long option, so a prefix of one of these is refused too.
REFUSED_OPTIONS = (
    "--output",
    "--error",
    "--input",
    "--open-mode",
    "--requeue",
    "--no-requeue",
    "--parsable",
    "--chdir",
    "--wrap",
    "--export",
    "--export-file",
    "--job-name",
    "--test-only",
    "--wait",
    "--array",
    "--hold",
    "--begin",
    "--dependency",
    "--signal",
    "--kill-on-invalid-dep",
)


def check_slurm(options: list[str]) -> None:
    """Before anything runs: sbatch is here, and the sbatch options (the user's own, passed as given) are
    each `--name` or `--name=value`, none of REFUSED_OPTIONS or a prefix of one."""
    for option in options:
        if not re.match(r"^--[a-z][a-z-]*(=.*)?\Z", option, re.S):
            raise ConfigError(f"--slurm-option {option[:40]!r}: give sbatch's long form, --name or --name=value")
        name = option.split("=", 1)[0]
        refused = next((r for r in REFUSED_OPTIONS if r.startswith(name)), None)
        if refused:
            raise ConfigError(f"--slurm-option {option[:40]!r}: {refused} is check's own or breaks its jobs")
    if shutil.which("sbatch") is None or shutil.which("scontrol") is None:
        raise ConfigError("--launcher slurm: sbatch and scontrol are not on PATH (SLURM's client commands)")


def execute_slurm(run: Run, stops: list[Stop], timeout_s: float, options: list[str]) -> str:
    """check_runs.execute's contract as one SLURM job (its id returned): after each stop that lands, SLURM
    starts the job again, until an attempt ends on its own or by the watchdog. The job never outlives
    this call: it is cancelled on the way out, also when check is ended by SIGTERM or SIGHUP."""
    job = None
    previous = {signum: signal.signal(signum, _interrupted) for signum in (signal.SIGTERM, signal.SIGHUP)}
    try:
        job = _submit(run, options)
        run.began = began = time.perf_counter()
        seen = entries_below(run.work)
        for number, stop in enumerate([*stops, None], start=1):
            attempt = _attempt(run, job, number, stop, timeout_s, seen, began)
            run.attempts.append(attempt)
            seen |= entries_below(run.work)
            if stop is None or attempt.stopped_early or attempt.exit is None:
                break
    finally:
        if job is not None:
            _run(["scancel", job])  # a no-op once it ended
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    return job


def _interrupted(signum, _frame):
    raise KeyboardInterrupt(f"check ended by {signal.Signals(signum).name}")


def batch_script(run: Run) -> str:
    marks = shlex.quote(str(_marks(run).absolute()))
    return "\n".join(
        [
            "#!/bin/bash",
            "# reprocube check: one attempt of a run per start of this job (SLURM_RESTART_COUNT: its requeues).",
            "attempt=$(( ${SLURM_RESTART_COUNT:-0} + 1 ))",
            f"marks={marks}",
            'date +%s.%N > "$marks/attempt-$attempt.began"',
            f"export {PROBE_ENV}={shlex.quote(str(run.probe.absolute()))}/attempt-$attempt.jsonl",
            (
                f"cd {shlex.quote(str(run.work.absolute()))} || "
                f'{{ echo {NO_WORK_DIRECTORY} > "$marks/attempt-$attempt.exit"; exit {NO_WORK_DIRECTORY}; }}'
            ),
            # The command runs as a child so that its exit status is known; SLURM's SIGTERM reaches it too (it
            # signals every process of the job), and the handler keeps this shell waiting for it.
            "trap 'true' TERM",
            f"{shlex.join(run.command)} </dev/null &",
            "child=$!",
            'while wait "$child"; status=$?; kill -0 "$child" 2>/dev/null; do :; done',
            'echo "$status $(date +%s.%N)" > "$marks/attempt-$attempt.exit"',
            'exit "$status"',
            "",
        ]
    )


def _marks(run: Run) -> Path:
    return run.log.parent / f"{run.name}.attempts"


def _submit(run: Run, options: list[str]) -> str:
    run.log.parent.mkdir(parents=True, exist_ok=True)
    run.probe.mkdir(parents=True, exist_ok=True)
    _marks(run).mkdir()
    script = run.log.with_suffix(".sbatch")
    script.write_text(batch_script(run))
    with open(run.log, "a") as log:  # SLURM appends the command's output after it
        log.write(f"$ {shlex.join(run.command)}\n")
    # --export=ALL: the job gets this environment (the seed variable included) whatever SBATCH_EXPORT says.
    argv = [
        "sbatch",
        "--parsable",
        "--requeue",
        "--export=ALL",
        "--open-mode=append",
        f"--output={run.log.absolute()}",
        f"--job-name=reprocube-check-{run.name}",
        *options,
        str(script.absolute()),
    ]
    env = {k: v for k, v in run.env.items() if k != PROBE_ENV}
    done = _run(argv, env)
    job = done.stdout.strip().split(";")[0] if done is not None and done.returncode == 0 else ""
    if not job.isdigit():
        why = "no answer" if done is None else (done.stderr.strip() or done.stdout.strip())[:300]
        raise ConfigError(f"--launcher slurm: sbatch did not submit {run.name}: {why}")
    return job


def _run(argv: list[str], env: dict | None = None) -> subprocess.CompletedProcess | None:
    try:
        return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=COMMAND_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired):
        return None


def _state(job: str, last: tuple[str, int]) -> tuple[str, int]:
    """The job's state and how many times SLURM started it again; `last` while the controller does not
    answer (a brief outage is not the job's end)."""
    done = _run(["scontrol", "-o", "show", "job", job])
    if done is None:
        return last
    if done.returncode != 0:
        return ("GONE", last[1]) if "Invalid job id" in done.stderr else last
    fields = dict(re.findall(r"(\w+)=(\S*)", done.stdout))
    restarts = fields.get("Restarts", "")
    return fields.get("JobState", last[0]), int(restarts) if restarts.isdigit() else last[1]


def _attempt(
    run: Run, job: str, number: int, stop: Stop | None, timeout_s: float, seen: set[str], began: float
) -> Attempt:
    queued = time.perf_counter()
    progress = ProgressReport(run.on_progress, PROGRESS_EVERY_S, time.perf_counter, since=queued)
    state = ("PENDING", number - 1)

    def queued_still() -> bool:  # until SLURM runs this start of the job (or the job ended before it)
        nonlocal state
        state = _state(job, state)
        started = state == ("RUNNING", number - 1) or state[0] in ENDED or state[0] == "GONE"
        return not (started or _ended(run, number))

    waited = watch_child(queued_still, POLL_S, queued, time.perf_counter, progress, timeout_s=timeout_s + 600)
    if waited.outcome == TIMED_OUT:
        return Attempt(queued - began, 0.0, None, None)  # never started: the watchdog
    start, cursor, looked = time.perf_counter(), [entry_size(run.log)], time.perf_counter()
    given, signal_s = False, None

    def running() -> bool:  # the job's state asked every POLL_S; the marks looked at each tick
        nonlocal state, looked
        if time.perf_counter() - looked >= POLL_S:
            state, looked = _state(job, state), time.perf_counter()
        return state[0] in RUNNING and state[1] == number - 1 and not _ended(run, number)

    def stop_came(elapsed: float) -> bool:
        return _stop_came(stop, elapsed, run, seen, cursor, start)

    watched = watch_child(
        running,
        TRIGGER_POLL_S,
        start,
        time.perf_counter,
        progress,
        stop_now=stop_came if stop is not None else None,
        timeout_s=timeout_s,
    )
    if watched.outcome == STOPPED:
        # Only a job still running this attempt is requeued: a requeue of one that just ended would
        # start it again and count as a stop that interrupted nothing.
        state = _state(job, state)
        if state == ("RUNNING", number - 1) and not _ended(run, number):
            signal_s = time.perf_counter() - start
            done = _run(["scontrol", "requeue", job])
            given = done is not None and done.returncode == 0
    elif watched.outcome == TIMED_OUT:
        _run(["scancel", job])
        return Attempt(start - began, watched.seconds, None, None)
    ended = _wait_job_gone(run, job, number, state)
    status, finished = ended if ended else (KILLED, time.time())
    started_at = _began(run, number)
    seconds = finished - started_at if started_at is not None else time.perf_counter() - start
    note = f"SLURM requeue (scontrol requeue) {stop.describe()}" if stop is not None else None
    if note and given:
        with open(run.log, "a") as log:
            log.write(f"[reprocube check: {note}, after {seconds:.2f} s]\n")
    return Attempt(start - began, seconds, status, note, stop is not None and not given, signal_s if given else None)


def _wait_job_gone(run: Run, job: str, number: int, state: tuple[str, int]):
    """The attempt's end as its marks say, once the job left RUNNING and COMPLETING (a requeue counts the
    restart at once, while the job is still COMPLETING: the attempt is over only once its processes are
    gone), or after SLURM's KillWait and some."""
    deadline = time.perf_counter() + COMMAND_TIMEOUT_S + 120  # SLURM's KillWait is 30 s by default
    while not _ended(run, number) and time.perf_counter() < deadline:
        state = _state(job, state)
        if state[0] not in RUNNING:
            break
        time.sleep(POLL_S)
    return _ended(run, number)


def _stop_came(stop: Stop, elapsed: float, run: Run, seen: set[str], cursor: list[int], start: float) -> bool:
    """Whether the stop's moment came; cursor[0]: how far this attempt's log was read (whole lines)."""
    if stop.line is None:
        return stop.due(elapsed, run, seen, start)
    with open(run.log, "rb") as log:
        log.seek(cursor[0])
        text = log.read(1_000_000)
    complete = text[: text.rfind(b"\n") + 1] or (text if len(text) == 1_000_000 else b"")
    cursor[0] += len(complete)
    pattern = re.compile(stop.line)
    return any(pattern.search(line.decode("utf-8", "replace")) for line in complete.splitlines())


def _ended(run: Run, number: int) -> tuple[int, float] | None:
    """(exit status, when) as the batch script wrote them for attempt `number`, once it has."""
    try:
        fields = (_marks(run) / f"attempt-{number}.exit").read_text().split()
    except OSError:
        return None
    if not fields or not fields[0].isdigit():
        return None
    return int(fields[0]), float(fields[1]) if len(fields) > 1 and _is_number(fields[1]) else time.time()


def _began(run: Run, number: int) -> float | None:
    try:
        text = (_marks(run) / f"attempt-{number}.began").read_text().strip()
    except OSError:
        return None
    return float(text) if _is_number(text) else None


def _is_number(text: str) -> bool:
    return re.fullmatch(r"[0-9]+(\.[0-9]+)?", text) is not None
