"""`reprocube check`'s way through a command (commands/check.py parses its options): the clean runs, which
must agree (else it is not deterministic and resume is never blamed); the receipt; the negative control
(another seed must change the outputs, else the check is void); the stopped run, stopped `stops` times and
restarted after each; and the verdict, from the declared outputs and, where the script calls the probe,
every update. Each stage that ends the check writes check.json and check.md with its verdict."""

from __future__ import annotations

import os
import re
import statistics
import time
from pathlib import Path

from reprocube.analysis.outputs import collect, compare_outputs
from reprocube.analysis.probe_trace import compare_stopped, describe_difference, first_difference, read_trace, steps_of
from reprocube.env import collect_env
from reprocube.errors import CheckpointError, ConfigError
from reprocube.files import claim_new_or_empty, safe_name
from reprocube.orchestration.check_runs import SIGNALS, Run, Stop, execute, failure_line, planned_stops
from reprocube.orchestration.check_slurm import check_slurm, execute_slurm
from reprocube.orchestration.copy_inputs import check_copies, copy_inputs
from reprocube.results.check_result import write_check
from reprocube.script_receipt import input_digests, output_digests, write_script_receipt
from reprocube.terminal import counted, one_line

SUSPECTS = (
    "unseeded generators (Python's random, NumPy, the framework's: torch.manual_seed, tf.random.set_seed, a JAX "
    "key), PYTHONHASHSEED (set and dict order), non-deterministic kernels and thread counts "
    "(torch.use_deterministic_algorithms, TF_DETERMINISTIC_OPS, XLA flags, cuDNN/oneDNN autotuning), data-loader "
    "workers, and timestamps or absolute paths written into the outputs (--ignore them)"
)


def check(
    command: list[str],
    outputs: list[str],
    ignore: list[str],
    copies: list[Path],
    repeat: int = 2,
    stops: int = 2,
    signal_name: str = "TERM",
    stop_seed: int | None = None,
    at: str | None = None,
    at_file: str | None = None,
    at_line: str | None = None,
    seed_env: str | None = None,
    seed_arg: str | None = None,
    timeout: float | None = None,
    out: Path | None = None,
    echo=print,
    slurm: list[str] | None = None,
) -> dict:
    """check.json's content, once written. slurm: None runs here; a list of sbatch options runs each run as
    a SLURM job with them, each stop a requeue (reprocube.orchestration.check_slurm)."""
    started = time.perf_counter()
    _check_arguments(
        command, outputs, copies, repeat, stops, at, at_file, at_line, seed_env, seed_arg, timeout, stop_seed, out
    )
    if slurm is not None:
        if signal_name != "TERM":
            raise ConfigError(
                "--launcher slurm stops a run as SLURM preempts it (SIGTERM, then SIGKILL after "
                "KillWait): --signal cannot be chosen"
            )
        check_slurm(slurm)
    stop_seed = stop_seed if stop_seed is not None else int.from_bytes(os.urandom(4), "little")
    out = _workspace(out, command)
    session = CheckSession(command, outputs, ignore, copies, seed_env, seed_arg, out, echo, slurm, started)
    session.result |= {"stop_seed": stop_seed, "signal": signal_name}
    session.signum = SIGNALS[signal_name]
    session.how = "SLURM requeue" if slurm is not None else f"SIG{signal_name}"
    session.announce(repeat, stops)
    try:
        return (
            session.clean_runs(repeat, timeout)
            or session.negative_control()
            or session.stopped_run(stops, at, at_file, at_line, stop_seed)
        )
    except KeyboardInterrupt:
        echo(f"check interrupted: its runs ended; the evidence so far is in {out} (logs/, work/)")
        raise


class CheckSession:
    """One check's runs and its growing result; each stage returns the finished result when its verdict
    ends the check, or None to go on."""

    def __init__(self, command, outputs, ignore, copies, seed_env, seed_arg, out: Path, echo, slurm, started):
        self.command, self.outputs, self.ignore, self.copies = command, outputs, ignore, copies
        self.seed_env, self.seed_arg, self.out, self.echo, self.slurm = seed_env, seed_arg, out, echo, slurm
        self.started = started
        self.signum, self.how = None, ""
        self.clean: list[Run] = []
        self.limit = 0.0  # the watchdog of each attempt after the first clean run
        self.result: dict = {
            "command": command,
            "outputs": {"paths": outputs, "ignore": ignore},
            "stop_seed": None,
            "signal": None,
            "runs": [],
            "comparisons": {"repeat": []},
            "not_checked": [],
            "stops": "",
            "probe": None,
            "environment": collect_env({}),
        }
        if slurm is not None:
            self.result["launcher"] = {"name": "slurm", "sbatch_options": slurm, "jobs": {}}

    def announce(self, repeat: int, stops: int) -> None:
        self.echo(
            one_line(
                f"check {' '.join(self.command)}: {repeat} clean runs, {counted(stops, 'stop')} by {self.how}; "
                f"evidence in {self.out}"
            )
        )
        copied = {path.name for path in self.copies}
        for arg in self.command:  # a relative path the user meant from here: the command runs in a fresh directory
            if not Path(arg).is_absolute() and Path(arg).is_file() and Path(arg).name not in copied:
                self.echo(
                    one_line(
                        f"  note: {arg} is here but the command runs in an empty work directory: pass "
                        f"--copy {arg}, or give its absolute path"
                    )
                )

    # --- the runs ---------------------------------------------------------------------------------
    def new_run(self, name: str, seed: int = 0) -> Run:
        work = self.out / "work" / name
        work.mkdir(parents=True)
        copy_inputs(self.copies, work)  # checked before any run (check_copies); links never followed
        env = {**os.environ, **({self.seed_env: str(seed)} if self.seed_env else {})}
        argv = [*self.command, *([self.seed_arg.replace("{seed}", str(seed))] if self.seed_arg else [])]
        run = Run(name, work, self.out / "logs" / f"{name}.log", env, argv, self.out / "probe" / name)
        run.on_progress = lambda seconds: self.echo(one_line(f"  {name}: {seconds:.0f} s, running; {_last_line(run)}"))
        return run

    def ran(self, run: Run, stop_list: list[Stop], limit: float) -> Run:
        stopping = f" ({counted(len(stop_list), 'stop')})" if stop_list else ""
        self.echo(f"  {run.name}: {' '.join(run.command)}" + stopping)
        if self.slurm is None:
            execute(run, stop_list, self.signum, limit)
        else:
            self.result["launcher"]["jobs"][run.name] = execute_slurm(run, stop_list, limit, self.slurm)
        self.result["runs"].append(run.as_dict())
        return run

    def compared(self, run: Run, against: Run, explain: bool = True) -> dict:
        comparison = compare_outputs(against.work, run.work, self.outputs, self.ignore, explain)
        for path in comparison["not_compared"]:
            detail = next(f["detail"] for f in comparison["files"] if f["path"] == path)
            self.result["not_checked"].append(f"{path} in {run.name} against {against.name}: {detail}")
        return {"run": run.name, "against": against.name, **comparison}

    def finish(self, verdict: str, stage: str, summary: str) -> dict:
        self.result.update(
            verdict=verdict,
            stage=stage,
            summary=one_line(f"{verdict}: {summary}"),
            wall_s=round(time.perf_counter() - self.started, 1),
        )
        write_check(self.result, self.out)
        self.echo(f"verdict: {self.result['summary']}")
        self.echo(f"written: {self.out / 'check.json'}, {self.out / 'check.md'}")
        return self.result

    # --- the stages -------------------------------------------------------------------------------
    def clean_runs(self, repeat: int, timeout: float | None) -> dict | None:
        """`repeat` uninterrupted runs, which must write the same outputs (and updates, by the probe);
        then the first one's receipt."""
        clean = self.clean
        clean.append(self.ran(self.new_run("clean-1"), [], timeout or 24 * 3600.0))
        if clean[0].exit != 0:
            return self.finish("command-failed", "clean-1", failure_line(clean[0]))
        self.limit = timeout or max(120.0, 5 * clean[0].attempts[-1].seconds)
        if not collect(clean[0].work, self.outputs, self.ignore):
            written = f"it wrote none of the declared outputs ({', '.join(self.outputs)})"
            return self.finish("command-failed", "clean-1", written)
        for i in range(2, repeat + 1):
            clean.append(self.ran(self.new_run(f"clean-{i}"), [], self.limit))
            if clean[-1].exit != 0:
                return self.finish("command-failed", clean[-1].name, failure_line(clean[-1]))
            comparison = self.compared(clean[-1], clean[0])
            self.result["comparisons"]["repeat"].append(comparison)
            traced = _repeat_trace(clean[0], clean[-1], self.result)
            if not comparison["identical"] or traced:
                where = "; ".join(x for x in (traced, None if comparison["identical"] else _first(comparison)) if x)
                return self.finish(
                    "not-deterministic",
                    "repeat",
                    f"two uninterrupted runs differ ({where}); resume was not tested. Usual suspects: {SUSPECTS}",
                )
        receipt = _write_receipt(
            self.out, clean[0], self.copies, self.outputs, self.ignore, self.result["environment"], self.seed_env
        )
        self.echo(f"  receipt: {receipt} (reprocube reproduce {receipt.parent} -- CMD, on another machine)")
        return None

    def negative_control(self) -> dict | None:
        """A run with another seed must write other outputs; without a seed option, said as not checked."""
        if not (self.seed_env or self.seed_arg):
            self.result["not_checked"].append(
                "no negative control (--seed-env or --seed-arg): whether the outputs depend "
                "on the training was not checked"
            )
            return None
        control = self.ran(self.new_run("control", seed=1), [], self.limit)
        if control.exit != 0:
            return self.finish("command-failed", "control", failure_line(control))
        self.result["comparisons"]["control"] = self.compared(
            control, self.clean[0], explain=False
        )  # differing is enough
        if self.result["comparisons"]["control"]["identical"]:
            return self.finish(
                "control-void",
                "control",
                "a run with another seed wrote the same outputs: they do "
                "not depend on the training, so their agreement proves nothing",
            )
        return None

    def stopped_run(self, stops: int, at, at_file, at_line, stop_seed: int) -> dict:
        """The run stopped `stops` times and restarted after each, against the first clean run: the verdict."""
        clean_s = statistics.median(a.attempts[-1].seconds for a in self.clean)
        plan = _stops(stops, at, at_file, at_line, clean_s, stop_seed)
        self.result["stops"] = "; ".join(stop.describe() for stop in plan)
        stopped = self.ran(self.new_run("stopped"), plan, self.limit)
        landed = stopped.stops_landed
        if stopped.exit != 0:
            return self.finish("command-failed", "stopped", f"after {counted(landed, 'stop')}: {failure_line(stopped)}")
        if landed < len(plan):
            self.result["not_checked"].append(
                f"{len(plan) - landed} of the {len(plan)} stops did not land: the command ended before them"
            )
        if landed == 0:
            return self.finish(
                "no-stop-landed",
                "stopped",
                "the command finished before its first stop: resume was not "
                "tested (stop earlier: --at SECONDS, --at-file GLOB or --at-line REGEX)",
            )
        return self.resume_verdict(stopped, landed)

    def resume_verdict(self, stopped: Run, landed: int) -> dict:
        comparison = self.compared(stopped, self.clean[0])
        self.result["comparisons"]["resume"] = comparison
        traced = _resume_trace(self.clean[0], stopped, self.result)
        restarts = f"after {counted(landed, 'stop')} by {self.how} and as many restarts"
        if not comparison["identical"] or traced["differs"]:
            found = [x for x in (traced["differs"], None if comparison["identical"] else _first(comparison)) if x]
            return self.finish("resume-differs", "resume", f"{restarts}, {'; '.join(found)}")
        if traced["not_resumed"]:
            return self.finish(
                "not-resumed",
                "resume",
                f"{restarts}: {traced['not_resumed']} instead of resuming, so "
                "resume was not tested (the same outputs show only that the script is deterministic)",
            )
        caveat = "; no negative control" if not (self.seed_env or self.seed_arg) else ""
        updates = (
            f" and so is each of its {counted(traced['compared'], 'update')} (the probe)" if traced["compared"] else ""
        )
        not_checked = self.result["not_checked"]
        if any("the probe's traces, unreadable" in line for line in not_checked):
            updates += "; the probe's traces could not be read (not checked)"
        elif traced["compared"] and any(line.startswith("the updates at steps") for line in not_checked):
            updates += " it recorded (not all: see not checked)"
        return self.finish(
            "resume-exact",
            "resume",
            f"stopped {counted(landed, 'time')} by {self.how} and "
            f"restarted, every declared output is bit-identical to an uninterrupted run's{updates}{caveat}",
        )


def _check_arguments(
    command, outputs, copies, repeat, stops, at, at_file, at_line, seed_env, seed_arg, timeout, stop_seed, out=None
):
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
    if seed_env is not None and not re.match(r"^[A-Za-z_][A-Za-z0-9_]*\Z", seed_env):
        raise ConfigError(f"--seed-env {seed_env[:40]!r} is not a variable name (letters, digits, _)")
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


def _stops(count: int, at, at_file, at_line, clean_s: float, seed: int) -> list[Stop]:
    if at is not None:
        return [Stop(seconds=s) for s in _seconds(at)]
    if at_file is not None:
        return [Stop(file_glob=at_file)] * count
    if at_line is not None:
        return [Stop(line=at_line)] * count
    return planned_stops(count, clean_s, seed)


def _workspace(out: Path | None, command: list[str]) -> Path:
    out = Path(out) if out is not None else Path(f"check-{safe_name(Path(command[-1]).stem or 'command')}")
    claim_new_or_empty(out, "check")
    return out


def _write_receipt(
    out: Path, clean: Run, copies: list[Path], outputs: list[str], ignore: list[str], env: dict, seed_env: str | None
) -> Path:
    """The uninterrupted run's receipt (reprocube.script_receipt), once two such runs agreed: what
    `reprocube reproduce` retrains on another machine."""
    return write_script_receipt(
        out / "receipt",
        clean.command,
        input_digests(copies),
        outputs,
        output_digests(collect(clean.work, outputs, ignore)),
        clean.probe_trace(1),
        clean.attempts[-1].seconds,
        env,
        {"variable": seed_env, "value": clean.env[seed_env]} if seed_env else None,
    )


def _traces(run: Run) -> list:
    return [read_trace(run.probe_trace(number)) for number in range(1, len(run.attempts) + 1)]


def _repeat_trace(first: Run, again: Run, result: dict) -> str | None:
    """Where two uninterrupted runs' probe traces first differ (None: the same, or no probe)."""
    try:
        (a,), (b,) = _traces(first), _traces(again)
    except CheckpointError as exc:
        result["not_checked"].append(f"the probe's traces, unreadable: {exc}")
        return None
    if a is None or b is None:
        return (
            None
            if a is None and b is None
            else f"only {'the second' if a is None else 'the first'} run wrote a probe trace"
        )
    result["probe"] = result["probe"] or {"repeat": []}
    if a.names != b.names:
        result["probe"]["repeat"].append(None)
        return f"their probe traces record other tensors ({len(a.names)} vs {len(b.names)})"
    a_steps, b_steps = steps_of(a, 0), steps_of(b, 0)
    difference = first_difference(a_steps, b_steps, a.names)
    result["probe"]["repeat"].append(difference)
    if difference is None and set(a_steps) != set(b_steps):  # one made updates the other never did
        return f"the first run made {counted(len(a_steps), 'update')}, the second {len(b_steps)}"
    if difference is None:
        return None
    return (
        f"step {difference['step']} is the first update that differs: "
        f"{describe_difference(difference, 'first run', 'second run')}"
    )


def _resume_trace(clean: Run, stopped: Run, result: dict) -> dict:
    """The stopped run's probe traces against the uninterrupted run's: {"differs": the first differing
    update, after which stop, or None; "not_resumed": a restart that began at step 1 again, or None}."""
    try:
        (reference,) = _traces(clean)
        traced = compare_stopped(reference, _traces(stopped)) if reference is not None else None
    except CheckpointError as exc:  # the script's process wrote the traces: a malformed one is not our crash
        result["not_checked"].append(f"the probe's traces, unreadable: {exc}")
        return {"differs": None, "not_resumed": None, "compared": 0}
    if traced is None:
        result["not_checked"].append(
            "which step first departs after a stop, and whether each restart resumed "
            "instead of starting again: the script does not call the probe "
            "(from reprocube import probe; docs/check.md)"
        )
        return {"differs": None, "not_resumed": None, "compared": 0}
    result["probe"] = {**(result["probe"] or {"repeat": []}), "resume": traced}
    if "error" in traced:
        return {"differs": traced["error"], "not_resumed": None, "compared": 0}
    difference, attempts = traced["first_difference"], traced["attempts"]
    differs = None
    if difference is not None:
        details, step = describe_difference(difference, "uninterrupted", "resumed"), difference["step"]
        attempt, stop = attempts[difference["attempt"] - 1], difference["after_stop"]
        if not stop:
            differs = f"step {step} differs before any stop ({details})"
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
    if traced["unrecorded_steps"]:
        spans = ", ".join(f"{a}-{b}" if a != b else str(a) for a, b in traced["unrecorded_steps"][:5])
        result["not_checked"].append(
            f"the updates at steps {spans}: no attempt of the stopped run recorded them (a "
            "stop ended an attempt before the probe wrote them, and the restart resumed "
            "after them: call probe.checkpoint right after each save)"
        )
    scratch = [a["attempt"] for a in attempts if a.get("from_scratch")]
    not_resumed = f"after stop {scratch[0] - 1} the script began again at step 1" if scratch else None
    return {"differs": differs, "not_resumed": not_resumed, "compared": traced["compared_steps"]}


def _last_line(run: Run) -> str:
    """The command's newest output line (its own words; shown escaped), for a progress line."""
    try:
        with open(run.log, "rb") as log:
            log.seek(max(0, log.seek(0, os.SEEK_END) - 4096))
            lines = [line for line in log.read().decode(errors="replace").splitlines() if line.strip()]
    except OSError:
        return "no output yet"
    return f"its last line: {lines[-1][:120]}" if lines else "no output yet"


def _first(comparison: dict) -> str:
    if comparison["missing"]:
        return f"{comparison['missing'][0]} was written by neither run"
    differing = [f for f in comparison["files"] if not f["same"] and f.get("compared", True)]
    if not differing:
        return "no declared output was written"
    first = next((f for f in differing if f.get("tensor")), differing[0])  # the weights first, then the rest
    others = len(differing) - 1
    return f"{first['path']} differs: {first['detail']}" + (f" (and {counted(others, 'other file')})" if others else "")
