"""check.json and check.md (`reprocube check`): the schema, the verdicts with their exit statuses, the writer
and the strict reader."""

from __future__ import annotations

from pathlib import Path

from reprocube.errors import (
    EXIT_CHECK_VOID,
    EXIT_COMMAND_FAILED,
    EXIT_DIFFERENT,
    EXIT_NOT_DETERMINISTIC,
    EXIT_NOT_PROVEN,
    EXIT_OK,
    EXIT_SAVE_INTERRUPTED,
    EXIT_STATE_LEAKED,
)
from reprocube.results.markdown_text import md_code, md_text
from reprocube.results.schema import ResultFile


def _upgrade_2(value: dict) -> dict:
    """Version 2 to 3: the rule that gave the verdict was not recorded (null); the restarts given the stopped
    run's state with its weights moved were named "poisoned-N" and their stage "poison"."""
    renamed = {f"poisoned-{stop}": f"moved-{stop}" for stop in range(1, 101)}
    runs = value.get("runs")
    if isinstance(runs, list):
        value["runs"] = [
            {**run, "name": renamed.get(run.get("name"), run.get("name"))} if isinstance(run, dict) else run
            for run in runs
        ]
    comparisons = value.get("comparisons")
    if isinstance(comparisons, dict):
        value["comparisons"] = {renamed.get(k, k): v for k, v in comparisons.items()}
    if value.get("stage") == "poison":
        value["stage"] = "moved-weights"
    return {**value, "rule": None}


CHECK_RESULT = ResultFile(
    "check.json",
    # 2: "probe"; 3: "rule", the moved-weights restarts named so (run moved-N, stage moved-weights); 4: the same
    # keys, not-proven and state-leaked with exit statuses of their own (11, 12; were 9); 5: the verdict
    # save-interrupted (13); 6: "quick" (a check --quick); 7: "sweep" (a check --sweep)
    version=7,
    upgrades=(
        (2, _upgrade_2),
        (3, lambda value: value),
        (4, lambda value: value),
        (5, lambda value: value),
        (6, lambda value: value),
    ),
    keys=(
        "command",  # the argv checked, as given
        "verdict",  # VERDICTS
        "summary",  # the verdict in one line
        "stage",  # where the verdict was decided: repeat, control, resume (or the run that failed)
        "rule",  # the rule of check.verdict's table that gave the verdict (null in a file of version 2)
        "outputs",  # the declared --output paths, and the --ignore globs
        "stop_seed",  # what --stop-seed replays
        "stops",  # the planned stops, in words
        "signal",
        "runs",  # each run: name, work directory, log, command, attempts (timed, exit status, stop)
        "comparisons",  # {repeat: [...], control, resume}: compare_outputs of a run against the first
        "not_checked",  # what this check did not establish, in words (no control, stops that did not land)
        "probe",  # null (the script never called reprocube.probe) or {repeat: [first differences], resume: ...}
        "environment",  # this machine and process, as env.json records it
        "wall_s",
    ),
    optional_keys=(
        "launcher",  # --launcher slurm: {name, sbatch_options, jobs: {run: SLURM job id}}
        "stop_evidence",  # per stop of the stopped run: landed, effective, and how that was told (or why not)
        "quick",  # true: check --quick (one uninterrupted run, no control, no restart given other state)
        # check --sweep: per save, {save, run, stops_landed, resumed_at, verdict, rule, first_difference, summary}
        "sweep",
    ),
)
VERDICTS = {
    "resume-exact": EXIT_OK,
    "resume-differs": EXIT_DIFFERENT,
    "not-deterministic": EXIT_NOT_DETERMINISTIC,
    "control-void": EXIT_CHECK_VOID,
    "no-stop-landed": EXIT_CHECK_VOID,
    "not-resumed": EXIT_CHECK_VOID,  # a stop proved nothing: nothing saved before it, or the restart began again
    "state-leaked": EXIT_STATE_LEAKED,  # a run started from state another run left outside its directories
    # what was compared is identical, but the resume is not proven: restarts shown by their files only (no
    # probe), declared outputs not compared, ranks the probe did not hear from, or a restart given another
    # seed's state or the stopped run's with its weights moved that wrote the uninterrupted run's outputs
    "not-proven": EXIT_NOT_PROVEN,
    "command-failed": EXIT_COMMAND_FAILED,
    # a stop landed while a checkpoint was being written and the restart failed on what it left: a finding about
    # the script's preemption safety, not a failure of the command
    "save-interrupted": EXIT_SAVE_INTERRUPTED,
}


def write_check(result: dict, directory: Path) -> Path:
    return CHECK_RESULT.write(directory, result, markdown(result))


def read_check(path: Path) -> dict:
    """The verdict keys of a check.json, typed."""
    fields = CHECK_RESULT.read(path)
    return {
        "verdict": fields.one_of("verdict", tuple(VERDICTS)),
        "summary": fields.text("summary"),
        "stage": fields.text("stage"),
        "rule": fields.nullable("rule", fields.text),
        "command": fields.texts("command"),
        "stop_seed": fields.integer("stop_seed"),
        "not_checked": fields.texts("not_checked"),
    }


RUN_NAMES = (
    "clean-1",
    "clean-2",
    "clean-3",
    "clean-4",
    "clean-5",
    "clean-6",
    "clean-7",
    "clean-8",
    "clean-9",
    "clean-10",
    "clean-11",  # past --repeat: the uninterrupted runs started where the stopped run differs
    "clean-12",
    "control",
    "stopped",
    "swapped",  # the restart given the control's state (check/swapped_restart.py)
    # the restarts given the stopped run's state after a stop, its weights moved (check/moved_weights.py)
    *(f"moved-{stop}" for stop in range(1, 101)),
    *(f"sweep-{save}" for save in range(1, 21)),  # check --sweep: a stopped run per save (check/sweep.py)
)
HOW_RESUMED = ("first", "given", "matched", "assumed", "unplaced")


def read_check_page(path: Path) -> dict:
    """Everything the check page shows, typed: read_check's keys, the runs' attempts, the resumed run's
    file comparison and the probe's answer (a check directory travels: nothing here is a path to open)."""
    fields = CHECK_RESULT.read(path)
    page = read_check(path)
    page["runs"] = []
    for run in fields.records("runs"):
        attempts = [
            {
                "started_s": a.number("started_s"),
                "seconds": a.number("seconds"),
                "exit": a.nullable("exit", lambda k, a=a: a.integer(k, -255, 255)),
                "stop": a.nullable("stop", a.text),
                "stopped_early": a.boolean("stopped_early"),
            }
            for a in run.records("attempts")
        ]
        page["runs"].append({"name": run.one_of("name", RUN_NAMES), "attempts": attempts})
    comparisons = fields.mapping("comparisons")
    resume = comparisons.nullable("resume", comparisons.mapping) if comparisons.has("resume") else None
    page["files"] = [
        {
            "path": f.text("path"),
            "same": f.boolean("same"),
            "detail": f.nullable("detail", f.text),
            "bytes_differ": _bytes_differ(f),
        }
        for f in (resume.records("files") if resume else [])
    ]
    page["probe"] = _read_probe(fields.nullable("probe", fields.mapping))
    page["stop_evidence"] = [
        {
            "stop": e.integer("stop", 1, 10_000),
            "landed": e.boolean("landed"),
            "effective": e.boolean("effective"),
            "how": e.text("how"),
        }
        for e in (fields.records("stop_evidence") if fields.has("stop_evidence") else [])
    ]
    page["sweep"] = [_read_sweep_line(line) for line in (fields.records("sweep") if fields.has("sweep") else [])]
    return page


def _read_sweep_line(line) -> dict:
    """One save of check --sweep, typed (check/sweep.py's SaveVerdict.line)."""

    def count(key: str) -> int | None:
        return line.nullable(key, lambda k: line.integer(k, 0, 2**62))

    return {
        "save": line.integer("save", 1, 10_000),
        "run": line.one_of("run", RUN_NAMES),
        "saves_before_stop": count("saves_before_stop"),
        "tested_save": count("tested_save"),
        "resumed_at": count("resumed_at"),
        "verdict": line.one_of("verdict", tuple(VERDICTS)),
        "first_difference": count("first_difference"),
        "chosen": line.boolean("chosen"),
    }


def _read_probe(probe) -> dict | None:
    if probe is None or not probe.has("resume"):
        return None
    resume = probe.mapping("resume")
    if resume.has("error"):
        return {"error": resume.text("error"), "attempts": [], "first_difference": None}
    attempts = []
    for a in resume.records("attempts"):
        attempt = {"attempt": a.integer("attempt", 1, 10_000), "steps": a.integer("steps")}
        if attempt["steps"]:
            attempt.update(resumed_at=a.integer("resumed_at"), how=a.one_of("how", HOW_RESUMED))
        attempts.append(attempt)
    first = resume.nullable("first_difference", resume.mapping)
    if first is not None:
        first = {
            "step": first.integer("step", 1),
            "after_stop": first.integer("after_stop"),
            "loss_a": first.text("loss_a"),
            "loss_b": first.text("loss_b"),
            "tensors": first.texts("tensors"),
        }
    return {
        "attempts": attempts,
        "first_difference": first,
        "compared_steps": resume.integer("compared_steps"),
        "reference_steps": resume.integer("reference_steps"),
    }


def markdown(result: dict) -> str:
    lines = [
        "# reprocube check",
        "",
        f"**Verdict: {result['verdict']}** (exit {VERDICTS[result['verdict']]}; rule `{result['rule']}`, "
        "docs/check.md)",
        "",
        md_text(result["summary"]),
        "",
        f"- command: {md_code(' '.join(result['command']))}",
        f"- outputs compared: {', '.join(map(md_code, result['outputs']['paths']))}"
        + (f" (ignoring {md_text(', '.join(result['outputs']['ignore']))})" if result["outputs"]["ignore"] else ""),
        f"- stops: {result['stops'] or 'none'} by "
        + ("SLURM requeue (scontrol requeue)" if result.get("launcher") else f"SIG{result['signal']}")
        + (
            f"; the same moments again: `--stop-seed {result['stop_seed']}`"
            if "of a clean run" in result["stops"]
            else ""
        ),
    ]
    lines += [
        f"- stop {e['stop']}: {'effective' if e['effective'] else 'proved nothing'}: {md_text(e['how'])}"
        for e in result.get("stop_evidence", [])
    ]
    lines += [f"- not checked: {md_text(item)}" for item in result["not_checked"]]
    lines += _sweep_lines(result.get("sweep"))
    lines += _probe_lines(result["probe"])
    lines += ["", "| run | attempt | started (s) | seconds | exit | stop |", "|---|---|---|---|---|---|"]
    for run in result["runs"]:
        for number, attempt in enumerate(run["attempts"], start=1):
            stop = attempt["stop"] or ""
            stop += " (ended before it)" if attempt["stopped_early"] else ""
            lines.append(
                f"| {run['name']} | {number} | {attempt['started_s']} | {attempt['seconds']} | "
                f"{attempt['exit']} | {stop} |"
            )
    for name, comparison in _comparisons(result["comparisons"]):
        lines += ["", f"## {name}", ""]
        changed = [f for f in comparison["files"] if not f["same"]]
        # the same but for what --ignore FILE:KEY (or a Keras archive's save date) left out: other bytes
        but_for = [f for f in comparison["files"] if same_but_for_fields(f)]
        same = len(comparison["files"]) - len(changed) - len(but_for)
        also = f", {len(but_for)} the same but for ignored fields" if but_for else ""
        lines.append(f"{same} of {len(comparison['files'])} files bit-identical{also}")
        lines += [f"- {md_code(f['path'])}: {md_text(f['detail'])}" for f in [*but_for, *changed][:20]]
        lines += [f"- {md_code(m)}: written by neither run" for m in comparison["missing"]]
    return "\n".join(lines) + "\n"


def _sweep_lines(sweep: list[dict] | None) -> list[str]:
    """check --sweep: a row per save, its stopped run's verdict (the details above are the chosen save's)."""
    if not sweep:
        return []
    lines = [
        "",
        "| save | run | its restart took save | restart resumed at update | verdict | first differing update |",
        "|---|---|---|---|---|---|",
    ]
    for line in sweep:
        shown = {k: "" if line[k] is None else line[k] for k in ("tested_save", "resumed_at", "first_difference")}
        lines.append(
            f"| {line['save']} | {line['run']} | {shown['tested_save']} | {shown['resumed_at']} | "
            f"{line['verdict']} | {shown['first_difference']} |"
        )
    return [*lines, ""]


def _comparisons(comparisons: dict) -> list[tuple[str, dict]]:
    named = [(f"repeat: {c['run']} against {c['against']}", c) for c in comparisons.get("repeat", [])]
    for key, title in (("control", "negative control: another seed"), ("resume", "the stopped and resumed run")):
        if comparisons.get(key):
            named.append(
                (f"{title}: {comparisons[key]['run']} against {comparisons[key]['against']}", comparisons[key])
            )
    return named


def _probe_lines(probe: dict | None) -> list[str]:
    """What the probe's traces showed: updates compared, where each restart resumed, the first difference."""
    resume = (probe or {}).get("resume")
    if not resume or "error" in resume:
        return []
    first = resume["first_difference"]
    lines = [
        f"- probe: {resume['compared_steps']} of the uninterrupted run's {resume['reference_steps']} updates "
        "compared (loss bits and per-tensor weight fingerprints)"
    ]
    for attempt in resume["attempts"][1:]:
        if attempt["steps"]:
            how = {
                "matched": "its first update is that step's",
                "given": "the step the script gave",
                "assumed": "assumed: the last checkpoint announced",
                "unplaced": "not placed",
            }[attempt["how"]]
            lines.append(f"  - attempt {attempt['attempt']} resumed at step {attempt['resumed_at']} ({how})")
    if first is not None:
        tensors = ", ".join(map(md_code, first["tensors"])) or "none"
        lines.append(
            f"  - first differing update: step {first['step']}, after stop {first['after_stop']}; loss "
            f"{first['loss_b']} (stopped run) vs {first['loss_a']}; tensors differing: {tensors}"
        )
    if resume["unrecorded_steps"]:
        lines.append(f"  - steps no attempt of the stopped run recorded (not compared): {resume['unrecorded_steps']}")
    return lines


def _bytes_differ(entry) -> bool:
    """Whether a file compared the same has other bytes (the same but for ignored fields): its two sha256s
    recorded and different."""
    digests = [entry.nullable(k, entry.text) if entry.has(k) else None for k in ("sha256_a", "sha256_b")]
    return None not in digests and digests[0] != digests[1]


def same_but_for_fields(entry: dict) -> bool:
    """Whether a compared file's entry is the same but for fields left out (--ignore FILE:KEY, a Keras
    archive's save date): the same, with two sha256s that differ. Never to be called bit-identical."""
    return bool(entry.get("same")) and entry.get("sha256_a") != entry.get("sha256_b")
