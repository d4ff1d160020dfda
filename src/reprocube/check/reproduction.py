"""`reprocube reproduce SCRIPT_RECEIPT [--copy PATH] [--match] -- CMD`: a script that is not ours, run
again here and compared with its receipt (reprocube.formats.script_receipt, written by `reprocube check`).

The command is the one its user gives, never one read from the receipt (a receipt travels: running its
command would run whatever it says); where the two differ, that is a difference named first. CMD runs in
a fresh, empty work directory under --out with the --copy inputs, the probe on, as `check` runs it. Then:
the inputs by sha256 against A's (the source hashed), every update of the probe trace against A's (the
first differing step, its losses and tensors), the declared outputs by digest, and the environments
(the likely causes). With --match, where B differs and this machine can emulate A's settings (ISA caps,
documented variables), CMD runs once more under them. Every claim of A's receipt is reproduced, differs,
or is named as not checked."""

from __future__ import annotations

import hashlib
import os
import signal
import time
from pathlib import Path

from reprocube.analysis.match_plan import session_settings, settings_text
from reprocube.analysis.probe_trace import read_trace, steps_of
from reprocube.analysis.probe_trace_comparison import describe_difference, first_difference
from reprocube.check.copy_inputs import check_copies, copy_inputs
from reprocube.check.runs import Run, execute, failure_line
from reprocube.errors import CheckpointError, ConfigError
from reprocube.files import claim_new_or_empty
from reprocube.formats.env import collect_env
from reprocube.formats.env_comparison import env_differences
from reprocube.formats.script_receipt import (
    DIGESTED,
    NOT_REGULAR,
    ScriptReceipt,
    command_file_digests,
    input_digests,
    outputs_named,
)
from reprocube.orchestration.children import environment_with
from reprocube.results.script_reproduce_result import write_script_reproduce
from reprocube.terminal import counted, one_line

TIMEOUT_FACTOR = 10  # B's watchdog: this many times A's run, at least MIN_TIMEOUT_S
MIN_TIMEOUT_S = 300.0


def reproduce_script(
    receipt: ScriptReceipt, command: list[str], copies: list[Path], out: Path, match: bool, echo=print
) -> dict:
    started = time.perf_counter()
    if not command:
        raise ConfigError("a script receipt is reproduced by running its command: reprocube reproduce RECEIPT -- CMD")
    check_copies(copies, out)  # a link, a tree too deep, one holding --out: one line before anything runs
    b_inputs = input_digests(copies)  # a link or a special file is refused here, before anything is written
    a_trace = _a_trace(receipt)  # checked against the receipt's sha256 before anything runs
    claim_new_or_empty(out, "reproduce")
    echo(one_line(f"reproduce {receipt.directory / 'receipt.json'}: {' '.join(command)}; runs and logs in {out}"))
    inputs = _inputs(receipt, b_inputs, command_file_digests(command))
    result: dict = {
        "receipt": str(receipt.directory / "receipt.json"),
        "receipt_sha256": hashlib.sha256(receipt.raw).hexdigest(),
        "command": {"a": receipt.command, "b": command, "same": command == receipt.command},
        "inputs": inputs,
        "runs": [],
        "not_checked": [],
        "match": None,
        "environment": collect_env({}),
    }
    timeout = max(MIN_TIMEOUT_S, TIMEOUT_FACTOR * receipt.seconds)  # seconds is bounded by the reader

    def run_b(name: str, settings: dict | None = None) -> tuple[Run, dict]:
        env = environment_with(settings or {})
        work = out / "work" / name
        work.mkdir(parents=True)
        copy_inputs(copies, work)  # checked (check_copies): links never followed
        run = Run(name, work, out / "logs" / f"{name}.log", env, command, out / "probe" / name)
        run.on_progress = lambda seconds: echo(
            f"  {name}: {seconds:.0f} s, running (A's run took {receipt.seconds:.0f} s)"
        )
        echo(one_line(f"  {name}: {' '.join(command)}" + (f" with {settings_text(settings)}" if settings else "")))
        execute(run, [], signal.SIGTERM, timeout)
        result["runs"].append(run.as_dict())
        return run, (_compare(receipt, a_trace, run) if run.exit == 0 else {})

    b, compared = run_b("b")
    if b.exit != 0:
        return _finish(result, out, "command-failed", failure_line(b), started, echo)
    result.update(compared)
    causes = _causes(result, receipt)
    result["causes"] = causes
    differs = _differs(result)
    if differs and match:
        result["match"] = _matched(receipt, result, run_b)
    return _finish(result, out, *_verdict(result, differs), started, echo)


def _verdict(result: dict, differs: str | None) -> tuple[str, str]:
    """The reproduction's verdict and its summary: differs, partly-checked (something not compared, named)
    or bit-identical."""
    if differs:
        return "differs", differs
    compared_text = _compared_text(result)
    if result["not_checked"]:
        return "partly-checked", f"nothing compared differs ({compared_text}); not checked: " + "; ".join(
            result["not_checked"]
        )
    return "bit-identical", f"everything A's receipt records reproduced ({compared_text})"


def _matched(receipt: ScriptReceipt, result: dict, run_b) -> dict:
    """--match: B run once more under A's settings this machine can emulate (ISA caps, thread variables),
    and whether that reproduces A bit for bit; what cannot be emulated, named."""
    plan = session_settings(receipt.env, result["environment"])
    if not plan["settings"]:
        return {
            "settings": {},
            "cannot": plan["cannot"],
            "bit_identical": None,
            "summary": "nothing this machine can emulate differs from A"
            + (f" ({'; '.join(plan['cannot'])})" if plan["cannot"] else ""),
        }
    matched, again = run_b("b-matched", plan["settings"])
    ok = matched.exit == 0 and not _differs({**result, **again})
    shown = settings_text(plan["settings"], result["environment"])
    return {
        "settings": plan["settings"],
        "cannot": plan["cannot"],
        "bit_identical": ok,
        "summary": f"with {shown}, B reproduces A bit for bit" if ok else f"with {shown}, B still differs",
    }


def _a_trace(receipt: ScriptReceipt):
    """A's probe trace, parsed from the very bytes checked against the receipt's sha256 (a link or an
    oversized file is refused by the reader)."""
    if receipt.trace is None:
        return None
    trace = read_trace(receipt.trace_path, expect_sha256=receipt.trace)
    if trace is None:
        raise CheckpointError(f"{receipt.trace_path}: missing, though its receipt records one")
    return trace


def _listed(inputs: dict[str, str], command_files: dict[int, str]) -> dict[str, str]:
    """Inputs by name: the --copy inputs by path, the files a command names by an absolute path as
    "argument N" (their position in the command)."""
    return {**inputs, **{f"argument {i}": digest for i, digest in command_files.items()}}


def _inputs(receipt: ScriptReceipt, b: dict[str, str], b_files: dict[int, str]) -> dict:
    """B's inputs against A's by sha256."""
    a, b = _listed(receipt.inputs, receipt.command_files), _listed(b, b_files)
    return {
        "compared": len(set(a) & set(b)),
        "differ": sorted(name for name in set(a) & set(b) if a[name] != b[name]),
        "only_a": sorted(set(a) - set(b)),
        "only_b": sorted(set(b) - set(a)),
    }


def _compare(receipt: ScriptReceipt, a_trace, run: Run) -> dict:
    """B's probe trace and outputs against A's receipt."""
    compared = {"outputs": _outputs(receipt, run.work), "trace": None}
    if a_trace is None:
        return compared
    try:
        b_trace = read_trace(run.probe_trace(1))
    except CheckpointError as exc:  # B's own process wrote it: not a refused input, a claim not checked
        compared["trace"] = {"unreadable": f"B's probe trace could not be read ({exc})"}
        return compared
    if b_trace is None:
        compared["trace"] = {"error": "B wrote no probe trace (does the command call the probe?)"}
        return compared
    if b_trace.names != a_trace.names:
        only = sorted(set(a_trace.names) ^ set(b_trace.names))[:4] or ["the same names in another order"]
        compared["trace"] = {"error": f"B's probe records other tensors than A's ({', '.join(only)})"}
        return compared
    a_steps, b_steps = steps_of(a_trace, 0), steps_of(b_trace, 0)
    common = set(a_steps) & set(b_steps)
    difference = first_difference(a_steps, b_steps, a_trace.names)
    compared["trace"] = {
        "a_steps": len(a_steps),
        "b_steps": len(b_steps),
        "compared_steps": len(common),
        "missing_steps": len(set(a_steps) - set(b_steps)),
        "extra_steps": len(set(b_steps) - set(a_steps)),
        "first_difference": difference,
    }
    return compared


def _outputs(receipt: ScriptReceipt, work: Path) -> dict:
    """B's outputs against the ones A's receipt names. A name where B has what A had (a regular file or an
    Orbax checkpoint Orbax reads, as A recorded it) is compared by digest; a link or a special file in both
    is not compared; anything else B has there (a directory A recorded as one output, a directory Orbax
    cannot read, a link where A had a file, a file where A had a link, nothing) is a difference, reported
    with what each run had: never a reader's error."""
    found = outputs_named(work, set(receipt.outputs) | set(receipt.unrecorded_outputs), receipt.declared_outputs)
    outputs: dict = {"compared": [], "differ": [], "missing": [], "extra": [], "not_compared": [], "other_kind": {}}
    if found.too_many:  # more than A's reader would ever accept A to list: B's extras, at the least
        outputs["too_many"] = found.too_many
        return outputs
    a_had = {name: "a regular file or an Orbax checkpoint" for name in receipt.outputs}
    a_had.update({name: "a link or a special file (not recorded)" for name in receipt.unrecorded_outputs})
    for name in sorted(a_had):
        kind = found.kinds.get(name, "nothing")
        if kind == "nothing":
            outputs["missing"].append(name)
        elif name in receipt.outputs and kind in DIGESTED:
            outputs["compared"].append(name)
            if found.digests[name] != receipt.outputs[name]:
                outputs["differ"].append(name)
        elif name not in receipt.outputs and kind in NOT_REGULAR:
            outputs["not_compared"].append(name)  # a link or a FIFO in both runs: its bytes are no one's
        else:
            outputs["other_kind"][name] = {"a": a_had[name], "b": kind}
    outputs["extra"] = sorted(n for n in found.digests if n not in a_had)  # B's only, under a declared output
    return outputs


def _causes(result: dict, receipt: ScriptReceipt) -> list[dict]:
    """What differs between A and B besides the bits, the likeliest first: the command, the inputs (the
    source), then the environment (reprocube.formats.env_comparison's order)."""
    causes = []
    if not result["command"]["same"]:
        causes.append({"key": "command", "a": " ".join(receipt.command), "b": " ".join(result["command"]["b"])})
    inputs = result["inputs"]
    listed = _listed(receipt.inputs, receipt.command_files)
    for name in inputs["differ"]:
        causes.append({"key": f"input {name}", "a": listed[name][:12], "b": "another sha256"})
    for name in inputs["only_a"]:
        causes.append({"key": f"input {name}", "a": listed[name][:12], "b": "not given (--copy)"})
    for name in inputs["only_b"]:
        causes.append({"key": f"input {name}", "a": "none", "b": "given"})
    seed = receipt.seed  # check set it for A's run; this process's environment is B's (never set from a file)
    if seed is not None and os.environ.get(seed["variable"]) != seed["value"]:
        given = os.environ.get(seed["variable"])
        causes.append(
            {
                "key": f"seed variable {seed['variable']}",
                "a": seed["value"],
                "b": "unset" if given is None else given[:40],
                "note": f"run as {seed['variable']}={seed['value']} reprocube reproduce ...",
            }
        )
    for row in env_differences(receipt.env, result["environment"]):
        if "not_a_cause" not in row and {} not in (row["a"], row["b"]):  # an empty mapping: its keys are rows
            causes.append({"key": f"env.{row['key']}", "a": row["a"], "b": row["b"]})
    return causes


def _differs(result: dict) -> str | None:
    """What differs, in one sentence (None: nothing compared differs); adds what was not checked."""
    found, trace, outputs = [], result.get("trace"), result.get("outputs") or {}
    not_checked = result["not_checked"]
    if trace is None:
        _note(not_checked, "every update: A's receipt holds no probe trace (the script does not call the probe)")
    elif "unreadable" in trace:
        _note(not_checked, f"every update: {trace['unreadable']}")
    elif "error" in trace:
        found.append(trace["error"])
    else:
        difference = trace["first_difference"]
        if difference is not None:
            found.append(
                f"step {difference['step']} is the first update that differs: "
                f"{describe_difference(difference, 'A', 'B')}"
            )
        if trace["missing_steps"] or trace["extra_steps"]:
            found.append(f"B made {counted(trace['b_steps'], 'update')}, A {trace['a_steps']}")
    if outputs.get("too_many"):
        found.append(
            f"B wrote more than {outputs['too_many']} outputs under the declared ones: not compared one by one"
        )
    if outputs.get("missing"):
        found.append(f"B did not write {outputs['missing'][0]}")
    for name, kinds in list(outputs.get("other_kind", {}).items())[:3]:
        found.append(f"{name} is {kinds['b']} in B, where A had {kinds['a']}")
    if outputs.get("extra"):
        found.append(
            f"B wrote {outputs['extra'][0]}, which A did not"
            + (f" (and {len(outputs['extra']) - 1} more)" if len(outputs["extra"]) > 1 else "")
        )
    if outputs.get("differ"):
        found.append(
            f"{outputs['differ'][0]} differs"
            + (f" (and {len(outputs['differ']) - 1} more)" if len(outputs["differ"]) > 1 else "")
        )
    for name in outputs.get("not_compared", []):
        _note(not_checked, f"{name}: a link or a special file in A and in B: its bytes were not compared")
    # A's receipt claims its inputs and command too: another source or command is a difference, whatever
    # the bits (the same bits from another script prove nothing about A's).
    inputs, command = result["inputs"], result["command"]
    changed = [*inputs["differ"], *inputs["only_a"]]
    if changed:
        found.append(f"B's inputs are not A's ({', '.join(changed[:4])})")
    if not command["same"]:
        found.append("B ran another command than A")
    return "; ".join(found) or None


def _note(lines: list[str], line: str) -> None:
    if line not in lines:
        lines.append(line)


def _compared_text(result: dict) -> str:
    trace, outputs = result.get("trace"), result["outputs"]
    parts = []
    if trace and "error" not in trace:
        parts.append(f"{counted(trace['compared_steps'], 'update')} of {trace['a_steps']}")
    parts.append(f"{counted(len(outputs['compared']), 'output')}")
    return ", ".join(parts)


def _finish(result: dict, out: Path, verdict: str, summary: str, started: float, echo) -> dict:
    notes = []
    if result["inputs"]["only_b"]:
        notes.append(f"inputs A did not have: {', '.join(result['inputs']['only_b'][:4])}")
    result.update(
        verdict=verdict,
        summary=one_line(f"{verdict}: {summary}" + (f" ({'; '.join(notes)})" if notes else "")),
        wall_s=round(time.perf_counter() - started, 1),
    )
    result.setdefault("causes", [])
    result.setdefault("outputs", None)
    result.setdefault("trace", None)
    write_script_reproduce(result, out)
    echo(f"verdict: {result['summary']}")
    if verdict == "differs":
        for cause in result["causes"][:6]:
            echo(one_line(f"  likely cause: {cause['key']}: {cause['a']} -> {cause['b']}"))
    if result["match"]:
        echo(one_line(f"  --match: {result['match']['summary']}"))
    echo(f"written: {out / 'script-reproduce.json'}, {out / 'script-reproduce.md'}")
    return result
