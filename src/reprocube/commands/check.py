"""`reprocube check [options] -- CMD [ARG ...]`: a black-box test that any training command resumes bit for
bit from its own checkpoints. CMD runs in fresh, empty work directories under --out: to completion
`--repeat` times (if those differ, it is not deterministic and resume is never blamed), once with another
seed (the negative control: its outputs must differ, else the check is void), and once stopped `--stops`
times by a real signal and started again after each stop until it ends. The declared outputs of the
stopped run are then compared with the first uninterrupted run's: bytes, then tensors, keys or lines."""

from __future__ import annotations

import argparse
import os
import re
import shutil
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
from reprocube.results.check_result import VERDICTS, write_check
from reprocube.script_receipt import input_digests, output_digests, write_script_receipt
from reprocube.terminal import counted, one_line
from reprocube.untrusted import MAX_YAML_BYTES, parse_yaml, read_bytes

LAUNCHERS = ("local", "slurm")
HELP = "prove that any training command resumes bit-exactly from its own checkpoints: reprocube check -- CMD"
SUSPECTS = (
    "unseeded generators (Python's random, NumPy, the framework's: torch.manual_seed, tf.random.set_seed, a JAX "
    "key), PYTHONHASHSEED (set and dict order), non-deterministic kernels and thread counts "
    "(torch.use_deterministic_algorithms, TF_DETERMINISTIC_OPS, XLA flags, cuDNN/oneDNN autotuning), data-loader "
    "workers, and timestamps or absolute paths written into the outputs (--ignore them)"
)


def add_arguments(parser) -> None:
    add = parser.add_argument
    add(
        "--script-dir",
        type=Path,
        metavar="DIR",
        help="everything in DIR is copied into each work directory and DIR/check.yaml gives the command and the "
        "options (the mlcube check task; then give no other option but --out)",
    )
    add(
        "--output",
        action="append",
        default=[],
        metavar="PATH",
        help="a file or directory the command writes in its work directory (repeatable, required): what is compared",
    )
    add("--ignore", action="append", default=[], metavar="GLOB", help="outputs not compared (logs, timestamps)")
    add("--copy", action="append", default=[], type=Path, metavar="PATH", help="copied into each work directory")
    add("--repeat", type=int, default=2, help="uninterrupted runs (default 2): they must agree")
    add("--stops", type=int, default=2, help="stops of the stopped run (default 2)")
    add("--signal", choices=sorted(SIGNALS), default="TERM", help="the stopping signal (default TERM)")
    add("--stop-seed", type=int, help="the jitter of the default stops (replays a check's moments)")
    add("--at", metavar="SECONDS,...", help="stop each attempt this long after it started instead")
    add("--at-file", metavar="GLOB", help="stop when a new file matching GLOB appears in the work directory")
    add("--at-line", metavar="REGEX", help="stop when a line of the command's output matches REGEX")
    add("--seed-env", metavar="VAR", help="the variable the command reads its seed from (control: another seed)")
    add("--seed-arg", metavar="TEMPLATE", help="an argument giving the seed, {seed} replaced (e.g. --seed={seed})")
    add("--timeout", type=float, metavar="SECONDS", help="the watchdog of each attempt (default 5x a clean run)")
    add(
        "--launcher",
        choices=LAUNCHERS,
        default="local",
        help="local: child processes here | slurm: each run a SLURM job, each stop a real preemption (scontrol requeue)",
    )
    add(
        "--slurm-option",
        action="append",
        default=[],
        metavar="--NAME=VALUE",
        help="an sbatch option for every job (repeatable; --launcher slurm), e.g. --slurm-option=--partition=gpu",
    )
    add("--out", type=Path, help="where the work directories, logs and check.json go (default ./check-NAME)")
    add("command", nargs=argparse.REMAINDER, help="-- CMD [ARG ...]: the training command")


# check.yaml (--script-dir): the options' names as on the command line, with _ for -, and their types.
OPTION_TYPES = {
    "command": list,
    "output": list,
    "ignore": list,
    "repeat": int,
    "stops": int,
    "signal": str,
    "stop_seed": int,
    "at": str,
    "at_file": str,
    "at_line": str,
    "seed_env": str,
    "seed_arg": str,
    "timeout": float,
    "launcher": str,
    "slurm_option": list,
}
DEFAULTS = {
    "output": [],
    "ignore": [],
    "copy": [],
    "repeat": 2,
    "stops": 2,
    "signal": "TERM",
    "command": [],
    "launcher": "local",
    "slurm_option": [],
}


def run(args) -> int:
    if args.script_dir is not None:
        _options_from(args)
    if not args.output:
        raise ConfigError("give at least one --output PATH: what the command writes that is compared")
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if args.slurm_option and args.launcher != "slurm":
        raise ConfigError("--slurm-option is for --launcher slurm")
    result = check(
        command,
        args.output,
        args.ignore,
        args.copy,
        args.repeat,
        args.stops,
        args.signal,
        args.stop_seed,
        args.at,
        args.at_file,
        args.at_line,
        args.seed_env,
        args.seed_arg,
        args.timeout,
        args.out,
        slurm=args.slurm_option if args.launcher == "slurm" else None,
    )
    return VERDICTS[result["verdict"]]


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
    """slurm: None runs here; a list of sbatch options runs each run as a SLURM job with them, each stop
    a requeue (reprocube.orchestration.check_slurm)."""
    started = time.perf_counter()
    _check_arguments(
        command, outputs, copies, repeat, stops, at, at_file, at_line, seed_env, seed_arg, timeout, stop_seed
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
    signum = SIGNALS[signal_name]
    how = "SLURM requeue" if slurm is not None else f"SIG{signal_name}"
    echo(
        one_line(
            f"check {' '.join(command)}: {repeat} clean runs, {counted(stops, 'stop')} by {how}; evidence in {out}"
        )
    )
    copied = {path.name for path in copies}
    for arg in command:  # a relative path the user meant from here: the command runs in a fresh directory
        if not Path(arg).is_absolute() and Path(arg).is_file() and Path(arg).name not in copied:
            echo(
                one_line(
                    f"  note: {arg} is here but the command runs in an empty work directory: pass "
                    f"--copy {arg}, or give its absolute path"
                )
            )

    def new_run(name: str, seed: int = 0) -> Run:
        work = out / "work" / name
        work.mkdir(parents=True)
        for path in copies:
            (shutil.copytree if path.is_dir() else shutil.copy2)(path, work / path.name)
        env = {**os.environ, **({seed_env: str(seed)} if seed_env else {})}
        argv = [*command, *([seed_arg.replace("{seed}", str(seed))] if seed_arg else [])]
        run = Run(name, work, out / "logs" / f"{name}.log", env, argv, out / "probe" / name)
        run.on_progress = lambda seconds: echo(one_line(f"  {name}: {seconds:.0f} s, running; {_last_line(run)}"))
        return run

    result = {
        "command": command,
        "outputs": {"paths": outputs, "ignore": ignore},
        "stop_seed": stop_seed,
        "signal": signal_name,
        "runs": [],
        "comparisons": {"repeat": []},
        "not_checked": [],
        "stops": "",
        "probe": None,
        "environment": collect_env({}),
    }
    if slurm is not None:
        result["launcher"] = {"name": "slurm", "sbatch_options": slurm, "jobs": {}}

    def finish(verdict: str, stage: str, summary: str) -> dict:
        result.update(
            verdict=verdict,
            stage=stage,
            summary=one_line(f"{verdict}: {summary}"),
            wall_s=round(time.perf_counter() - started, 1),
        )
        write_check(result, out)
        echo(f"verdict: {result['summary']}")
        echo(f"written: {out / 'check.json'}, {out / 'check.md'}")
        return result

    def compared(run: Run, against: Run, explain: bool = True) -> dict:
        comparison = compare_outputs(against.work, run.work, outputs, ignore, explain)
        for path in comparison["not_compared"]:
            detail = next(f["detail"] for f in comparison["files"] if f["path"] == path)
            result["not_checked"].append(f"{path} in {run.name} against {against.name}: {detail}")
        return {"run": run.name, "against": against.name, **comparison}

    def ran(run: Run, stop_list: list[Stop], limit: float) -> Run:
        echo(f"  {run.name}: {' '.join(run.command)}" + (f" ({counted(len(stop_list), 'stop')})" if stop_list else ""))
        if slurm is None:
            execute(run, stop_list, signum, limit)
        else:
            result["launcher"]["jobs"][run.name] = execute_slurm(run, stop_list, limit, slurm)
        result["runs"].append(run.as_dict())
        return run

    try:
        clean = [ran(new_run("clean-1"), [], timeout or 24 * 3600.0)]
        if clean[0].exit != 0:
            return finish("command-failed", "clean-1", failure_line(clean[0]))
        clean_s = clean[0].attempts[-1].seconds
        limit = timeout or max(120.0, 5 * clean_s)
        if not collect(clean[0].work, outputs, ignore):
            return finish("command-failed", "clean-1", f"it wrote none of the declared outputs ({', '.join(outputs)})")
        for i in range(2, repeat + 1):
            clean.append(ran(new_run(f"clean-{i}"), [], limit))
            if clean[-1].exit != 0:
                return finish("command-failed", clean[-1].name, failure_line(clean[-1]))
            comparison = compared(clean[-1], clean[0])
            result["comparisons"]["repeat"].append(comparison)
            traced = _repeat_trace(clean[0], clean[-1], result)
            if not comparison["identical"] or traced:
                where = "; ".join(x for x in (traced, None if comparison["identical"] else _first(comparison)) if x)
                return finish(
                    "not-deterministic",
                    "repeat",
                    f"two uninterrupted runs differ ({where}); resume was not tested. Usual suspects: {SUSPECTS}",
                )
        receipt = _write_receipt(out, clean[0], copies, outputs, ignore, result["environment"], seed_env)
        echo(f"  receipt: {receipt} (reprocube reproduce {receipt.parent} -- CMD, on another machine)")
        if seed_env or seed_arg:
            control = ran(new_run("control", seed=1), [], limit)
            if control.exit != 0:
                return finish("command-failed", "control", failure_line(control))
            result["comparisons"]["control"] = compared(control, clean[0], explain=False)  # differing is enough
            if result["comparisons"]["control"]["identical"]:
                return finish(
                    "control-void",
                    "control",
                    "a run with another seed wrote the same outputs: they do "
                    "not depend on the training, so their agreement proves nothing",
                )
        else:
            result["not_checked"].append(
                "no negative control (--seed-env or --seed-arg): whether the outputs depend "
                "on the training was not checked"
            )
        plan = _stops(stops, at, at_file, at_line, statistics.median(a.attempts[-1].seconds for a in clean), stop_seed)
        result["stops"] = "; ".join(stop.describe() for stop in plan)
        stopped = ran(new_run("stopped"), plan, limit)
        landed = stopped.stops_landed
        if stopped.exit != 0:
            return finish("command-failed", "stopped", f"after {counted(landed, 'stop')}: {failure_line(stopped)}")
        if landed < len(plan):
            result["not_checked"].append(
                f"{len(plan) - landed} of the {len(plan)} stops did not land: the command ended before them"
            )
        if landed == 0:
            return finish(
                "no-stop-landed",
                "stopped",
                "the command finished before its first stop: resume was not "
                "tested (stop earlier: --at SECONDS, --at-file GLOB or --at-line REGEX)",
            )
        comparison = compared(stopped, clean[0])
        result["comparisons"]["resume"] = comparison
        traced = _resume_trace(clean[0], stopped, result)
        restarts = f"after {counted(landed, 'stop')} by {how} and as many restarts"
        if not comparison["identical"] or traced["differs"]:
            found = [x for x in (traced["differs"], None if comparison["identical"] else _first(comparison)) if x]
            return finish("resume-differs", "resume", f"{restarts}, {'; '.join(found)}")
        if traced["not_resumed"]:
            return finish(
                "not-resumed",
                "resume",
                f"{restarts}: {traced['not_resumed']} instead of resuming, so "
                "resume was not tested (the same outputs show only that the script is deterministic)",
            )
        caveat = "; no negative control" if not (seed_env or seed_arg) else ""
        updates = (
            f" and so is each of its {counted(traced['compared'], 'update')} (the probe)" if traced["compared"] else ""
        )
        if any("the probe's traces, unreadable" in line for line in result["not_checked"]):
            updates += "; the probe's traces could not be read (not checked)"
        elif traced["compared"] and any(line.startswith("the updates at steps") for line in result["not_checked"]):
            updates += " it recorded (not all: see not checked)"
        return finish(
            "resume-exact",
            "resume",
            f"stopped {counted(landed, 'time')} by {how} and "
            f"restarted, every declared output is bit-identical to an uninterrupted run's{updates}{caveat}",
        )
    except KeyboardInterrupt:
        echo(f"check interrupted: its runs ended; the evidence so far is in {out} (logs/, work/)")
        raise


def _options_from(args) -> None:
    """args from DIR/check.yaml (read strictly: a mapping of OPTION_TYPES' keys), and DIR's entries as
    --copy. Options on the command line as well are refused: one place says what was checked."""
    directory = args.script_dir
    if not directory.is_dir() or directory.is_symlink():
        raise ConfigError(f"--script-dir {directory}: not a directory")
    given = [k for k, default in DEFAULTS.items() if getattr(args, k) not in (default, None)]
    given += [k for k in OPTION_TYPES if k not in DEFAULTS and getattr(args, k) is not None]
    if given:
        raise ConfigError(
            f"--script-dir {directory}: give --{given[0].replace('_', '-')} in check.yaml, not on the command line"
        )
    path = directory / "check.yaml"
    options = parse_yaml(read_bytes(path, MAX_YAML_BYTES, ConfigError), str(path), ConfigError)
    if not isinstance(options, dict):
        raise ConfigError(f"{path}: must be a mapping of options (command, output, ...)")
    for key, value in options.items():
        kind = OPTION_TYPES.get(key) if isinstance(key, str) else None
        if kind is None:
            raise ConfigError(f"{path}: {str(key)[:40]!r} is not an option of check ({', '.join(OPTION_TYPES)})")
        if kind is list and not (isinstance(value, list) and all(isinstance(v, str) for v in value)):
            raise ConfigError(f"{path}: {key} must be a list of strings")
        if kind is float and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)
        if kind is str and isinstance(value, int | float) and not isinstance(value, bool) and key == "at":
            value = str(value)
        if kind is not list and not (isinstance(value, kind) and not isinstance(value, bool)):
            raise ConfigError(f"{path}: {key} must be {'an integer' if kind is int else 'a ' + kind.__name__}")
        if key == "signal" and value not in SIGNALS:
            raise ConfigError(f"{path}: signal must be one of {', '.join(sorted(SIGNALS))}")
        if key == "launcher" and value not in LAUNCHERS:
            raise ConfigError(f"{path}: launcher must be one of {', '.join(LAUNCHERS)}")
        setattr(args, key, value)
    if not args.command:
        raise ConfigError(f"{path}: command is missing (e.g. command: [python, train.py])")
    for entry in directory.rglob("*"):  # copied into evidence that travels: nothing from outside DIR
        if entry.is_symlink() or not (entry.is_file() or entry.is_dir()):
            raise ConfigError(f"--script-dir {directory}: {entry} is a link or not a regular file")
    args.copy = sorted(p for p in directory.iterdir() if p.name != "check.yaml")


def _check_arguments(
    command, outputs, copies, repeat, stops, at, at_file, at_line, seed_env, seed_arg, timeout, stop_seed
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
    for path in copies:
        if not path.exists():
            raise ConfigError(f"--copy {path}: does not exist")
    if at is not None:
        _seconds(at)
    if any("\0" in text for text in [*command, *outputs, seed_env or "", seed_arg or ""]):
        raise ConfigError("a NUL character in the command, an --output or the seed option")
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
    return f"step {difference['step']} is the first update that differs: {describe_difference(difference, 'first run', 'second run')}"


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
            differs = f"after stop {stop} (resumed at step {attempt['resumed_at']}), step {step} is the first update that differs ({details})"
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
