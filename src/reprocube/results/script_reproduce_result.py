"""script-reproduce.json and script-reproduce.md (`reprocube reproduce SCRIPT_RECEIPT -- CMD`): the schema,
the verdicts with their exit statuses, the writer and the strict reader."""

from __future__ import annotations

from pathlib import Path

from reprocube.errors import EXIT_CHECK_VOID, EXIT_COMMAND_FAILED, EXIT_DIFFERENT, EXIT_OK
from reprocube.results.markdown_text import md_code, md_text
from reprocube.results.schema import ResultFile

SCRIPT_REPRODUCE_RESULT = ResultFile(
    "script-reproduce.json",
    version=1,
    keys=(
        "receipt",  # the script receipt reproduced (its path, as given)
        "receipt_sha256",  # the sha256 of its bytes: what this result is about
        "verdict",  # VERDICTS
        "summary",  # the verdict in one line
        "command",  # {a: A's argv, b: the argv run here, same}
        "inputs",  # {compared, differ, only_a, only_b}: the --copy inputs by sha256 against A's
        "runs",  # each run here: name, work directory, log, command, attempts
        "trace",  # null (A has no probe trace) or {a_steps, b_steps, compared_steps, missing_steps,
        #           first_difference} or {error}
        "outputs",  # {compared, differ, missing, extra, not_compared, other_kind: {name: {a, b}}, too_many?}: the
        #             outputs A's receipt names, by digest, and what B has where it has another kind (null: B failed)
        "causes",  # [{key, a, b}]: what differs besides the bits, the likeliest first
        "match",  # null, or {settings, cannot, bit_identical, summary}
        "not_checked",  # A's claims not compared, in words
        "environment",  # this machine and process, as env.json records it
        "wall_s",
    ),
)
VERDICTS = {
    "bit-identical": EXIT_OK,  # every claim of A's receipt reproduced
    "differs": EXIT_DIFFERENT,
    "partly-checked": EXIT_CHECK_VOID,  # nothing compared differs, but some claims were not compared
    "command-failed": EXIT_COMMAND_FAILED,
}


def write_script_reproduce(result: dict, directory: Path) -> Path:
    return SCRIPT_REPRODUCE_RESULT.write(directory, result, markdown(result))


def read_script_reproduce(path: Path) -> dict:
    """The verdict keys of a script-reproduce.json, typed."""
    fields = SCRIPT_REPRODUCE_RESULT.read(path)
    return {
        "verdict": fields.one_of("verdict", tuple(VERDICTS)),
        "summary": fields.text("summary"),
        "receipt_sha256": fields.sha256("receipt_sha256"),
        "not_checked": fields.texts("not_checked"),
    }


def markdown(result: dict) -> str:
    command = result["command"]
    lines = [
        "# reprocube reproduce (a script's receipt)",
        "",
        f"**{md_text(result['summary'])}**",
        "",
        f"- receipt: {md_code(result['receipt'])} (sha256 `{result['receipt_sha256'][:16]}`)",
        f"- A's command: {md_code(' '.join(command['a']))}",
        f"- B's command: {md_code(' '.join(command['b']))}" + ("" if command["same"] else " (another)"),
    ]
    inputs = result["inputs"]
    differ = md_text(", ".join(inputs["differ"]) or "none")
    lines.append(
        f"- inputs compared by sha256: {inputs['compared']}; differ: {differ}"
        + (f"; only A's: {md_text(', '.join(inputs['only_a']))}" if inputs["only_a"] else "")
        + (f"; only B's: {md_text(', '.join(inputs['only_b']))}" if inputs["only_b"] else "")
    )
    trace = result.get("trace")
    if trace and "first_difference" in trace:
        first = trace["first_difference"]
        lines.append(
            f"- updates (the probe): {trace['compared_steps']} of A's {trace['a_steps']} compared (B made "
            f"{trace['b_steps']}); first differing: {first['step'] if first else 'none'}"
        )
    elif trace:
        lines.append(f"- updates (the probe): {md_text(trace.get('error') or trace.get('unreadable'))}")
    outputs = result.get("outputs")
    if outputs:
        for key, label in (
            ("compared", "outputs compared"),
            ("differ", "differ"),
            ("missing", "missing in B"),
            ("extra", "written by B only"),
            ("not_compared", "not compared (a link or a special file in both)"),
        ):
            if outputs[key] or key in ("compared", "differ"):
                lines.append(f"- {label}: {md_text(', '.join(outputs[key]) or 'none')}")
        for name, kinds in outputs.get("other_kind", {}).items():
            lines.append(f"- another kind in B: {md_code(name)} is {md_text(kinds['b'])}, A had {md_text(kinds['a'])}")
        if outputs.get("too_many"):
            lines.append(f"- B wrote more than {outputs['too_many']} outputs: none compared one by one")
    if result.get("causes"):
        lines += ["", "| likely cause | A | B |", "|---|---|---|"]
        lines += [f"| {md_code(c['key'])} | {md_text(c['a'])} | {md_text(c['b'])} |" for c in result["causes"]]
    if result.get("match"):
        lines += ["", f"--match: {md_text(result['match']['summary'])}"]
    if result["not_checked"]:
        lines += ["", "## Not checked", ""] + [f"- {md_text(line)}" for line in result["not_checked"]]
    return "\n".join(lines) + "\n"
