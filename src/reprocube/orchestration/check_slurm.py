"""`reprocube check --launcher slurm`: each run of the command is one SLURM batch job, and each stop a real
preemption: `scontrol requeue`, with which SLURM ends the running job (SIGTERM to its processes, SIGKILL
after the cluster's KillWait) and later starts its batch script again, as PreemptMode=REQUEUE does. An
attempt is one start of the job; its time counts from when SLURM ran it, not from when it was queued.

The batch script is ours (written into check's directory, every value shell-quoted): it enters the work
directory, points the probe at this attempt's trace (SLURM_RESTART_COUNT), runs the command and writes its
exit status into the job's log. check's directory must be on a filesystem the compute nodes share."""

from __future__ import annotations

import re
import shlex
import subprocess
import time
from pathlib import Path

from reprocube.errors import ConfigError
from reprocube.orchestration.check_runs import PROGRESS_EVERY_S, Attempt, Run, Stop, _files, _matching
from reprocube.probe import ENV as PROBE_ENV

POLL_S = 0.5  # how often the job's state is asked (each look runs scontrol)
TRIGGER_POLL_S = 0.02  # how often a stop's moment is looked for (the log and the work directory: cheap)
EXIT_LINE = re.compile(rb"^\[reprocube check: attempt (\d+) exited (\d+)\]$", re.M)
RUNNING = ("RUNNING", "COMPLETING")
ENDED = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL", "DEADLINE")
KILLED = 137  # no exit line: SLURM killed the batch script itself (after KillWait)
COMMAND_TIMEOUT_S = 60


def check_options(options: list[str]) -> None:
    """sbatch options from the command line (the user's own, passed as given): each one `--name` or
    `--name=value`, never one that check sets itself."""
    own = ("--output", "--error", "--open-mode", "--requeue", "--no-requeue", "--parsable", "--chdir", "--wrap",
           "--export", "--job-name")  # fmt: skip
    for option in options:
        if not re.match(r"^--[a-z][a-z-]*(=.*)?\Z", option, re.S):
            raise ConfigError(f"--slurm-option {option[:40]!r}: give sbatch's long form, --name or --name=value")
        if option.split("=", 1)[0] in own:
            raise ConfigError(f"--slurm-option {option[:40]!r}: check sets this itself")


def execute_slurm(run: Run, stops: list[Stop], timeout_s: float, options: list[str]) -> str:
    """check_runs.execute's contract as one SLURM job (its id returned): after each stop that lands, SLURM
    starts the job again, until an attempt ends on its own or by the watchdog. The job never outlives
    this call."""
    job = _submit(run, options)
    began, seen = time.perf_counter(), _files(run.work)
    try:
        for number, stop in enumerate([*stops, None], start=1):
            attempt = _attempt(run, job, number, stop, timeout_s, seen, began)
            run.attempts.append(attempt)
            seen |= _files(run.work)
            if stop is None or attempt.stopped_early or attempt.exit is None:
                break
    finally:
        _scontrol("scancel", job)  # a no-op once it ended; a Ctrl-C or a watchdog ends it here
    return job


def batch_script(run: Run) -> str:
    trace = shlex.quote(str(run.probe.absolute()))
    return "\n".join([
        "#!/bin/bash",
        "# reprocube check: one attempt of a run per start of this job (SLURM_RESTART_COUNT: its requeues).",
        "attempt=$(( ${SLURM_RESTART_COUNT:-0} + 1 ))",
        f"export {PROBE_ENV}={trace}/attempt-$attempt.jsonl",
        f"cd {shlex.quote(str(run.work.absolute()))} || exit 97",
        f"echo {shlex.quote('$ ' + shlex.join(run.command))}",
        # The command runs as a child so that its exit status reaches the log; SLURM's SIGTERM reaches it
        # too (it signals every process of the job), and the handler keeps this shell waiting for it.
        "trap 'true' TERM",
        f"{shlex.join(run.command)} </dev/null &",
        "child=$!",
        'while wait "$child"; status=$?; kill -0 "$child" 2>/dev/null; do :; done',
        'echo "[reprocube check: attempt $attempt exited $status]"',
        'exit "$status"',
        "",
    ])  # fmt: skip


def _submit(run: Run, options: list[str]) -> str:
    run.log.parent.mkdir(parents=True, exist_ok=True)
    run.probe.mkdir(parents=True, exist_ok=True)
    script = run.log.with_suffix(".sbatch")
    script.write_text(batch_script(run))
    argv = ["sbatch", "--parsable", "--requeue", "--open-mode=append", f"--output={run.log.absolute()}",
            f"--job-name=reprocube-check-{run.name}", *options, str(script.absolute())]  # fmt: skip
    env = {k: v for k, v in run.env.items() if k != PROBE_ENV}
    try:
        done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=COMMAND_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise ConfigError(f"--launcher slurm: sbatch could not submit {run.name}: {exc}") from None
    if done.returncode != 0:
        raise ConfigError(f"--launcher slurm: sbatch refused {run.name}: {done.stderr.strip()[:300]}")
    return done.stdout.strip().split(";")[0]


def _state(job: str) -> tuple[str, int]:
    """The job's state and how many times SLURM started it again."""
    try:
        done = subprocess.run(["scontrol", "-o", "show", "job", job], capture_output=True, text=True,
                              timeout=COMMAND_TIMEOUT_S)  # fmt: skip
    except subprocess.TimeoutExpired:
        return "UNKNOWN", 0
    fields = dict(re.findall(r"(\w+)=(\S*)", done.stdout))
    restarts = fields.get("Restarts", "0")
    return fields.get("JobState", "UNKNOWN" if done.returncode == 0 else "GONE"), int(
        restarts
    ) if restarts.isdigit() else 0


def _scontrol(*argv: str) -> None:
    try:
        subprocess.run(list(argv) if argv[0] == "scancel" else ["scontrol", *argv], capture_output=True,
                       timeout=COMMAND_TIMEOUT_S)  # fmt: skip
    except (OSError, subprocess.TimeoutExpired):
        pass


def _attempt(run: Run, job: str, number: int, stop: Stop | None, timeout_s: float, seen: set[str],
             began: float) -> Attempt:  # fmt: skip
    queued = time.perf_counter()
    reported = queued
    while True:  # until SLURM runs this start of the job (or the job ended before it)
        state, restarts = _state(job)
        if state == "RUNNING" and restarts == number - 1 or state in ENDED or state == "GONE":
            break
        if time.perf_counter() - reported >= PROGRESS_EVERY_S and run.on_progress is not None:
            reported = time.perf_counter()
            run.on_progress(reported - queued)
        if time.perf_counter() - queued > timeout_s + 600:
            return Attempt(queued - began, 0.0, None, None)  # never started: the watchdog
        time.sleep(POLL_S)
    start, cursor = time.perf_counter(), [_size(run.log)]
    given, looked = False, start
    while state in RUNNING and restarts == number - 1:
        elapsed = time.perf_counter() - start
        if run.on_progress is not None and time.perf_counter() - reported >= PROGRESS_EVERY_S:
            reported = time.perf_counter()
            run.on_progress(elapsed)
        if stop is not None and _stop_came(stop, elapsed, run, seen, cursor):
            given = True
            _scontrol("requeue", job)
            break
        if elapsed >= timeout_s:
            _scontrol("scancel", job)
            return Attempt(start - began, elapsed, None, None)
        time.sleep(TRIGGER_POLL_S)
        if time.perf_counter() - looked >= POLL_S:
            state, restarts = _state(job)
            looked = time.perf_counter()
    deadline = time.perf_counter() + COMMAND_TIMEOUT_S + 120  # SLURM's KillWait is 30 s by default
    while given and time.perf_counter() < deadline and _exit_of(run.log, number) is None:
        state, _ = _state(job)
        if state not in RUNNING:
            break
        time.sleep(POLL_S)
    seconds = time.perf_counter() - start
    status = _exit_of(run.log, number)
    if status is None and state in ENDED:
        status = KILLED
    note = f"SLURM requeue (scontrol requeue) {stop.describe()}" if stop is not None else None
    if note and given:
        with open(run.log, "a") as log:
            log.write(f"[reprocube check: {note}, after {seconds:.2f} s]\n")
    return Attempt(start - began, seconds, KILLED if status is None else status, note,
                   stopped_early=stop is not None and not given)  # fmt: skip


def _stop_came(stop: Stop, elapsed: float, run: Run, seen: set[str], cursor: list[int]) -> bool:
    """Whether the stop's moment came; cursor[0]: how far this attempt's log was read (whole lines)."""
    if stop.seconds is not None:
        return elapsed >= stop.seconds
    if stop.file_glob is not None:
        return any(p not in seen for p in _matching(run.work, stop.file_glob))
    if stop.line is not None:
        with open(run.log, "rb") as log:
            log.seek(cursor[0])
            text = log.read(1_000_000)
        complete = text[: text.rfind(b"\n") + 1]
        cursor[0] += len(complete)
        pattern = re.compile(stop.line)
        return any(pattern.search(line.decode("utf-8", "replace")) for line in complete.splitlines())
    return False


def _exit_of(log: Path, number: int) -> int | None:
    """The exit status the batch script wrote for attempt `number`, if it has."""
    try:
        text = log.read_bytes()[-1_000_000:]
    except OSError:
        return None
    found = [int(status) for attempt, status in EXIT_LINE.findall(text) if int(attempt) == number]
    return found[-1] if found else None


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0
