"""How a reproduction reads: the verdict line, what to do next, --match's recipe as shell lines, the
signature line, and reproduce.md. The words are shared by the terminal, reproduce.md and the page; they are
apart from reproduce.json's schema and strict reader (reproduce_result), which only check what a file holds."""

from __future__ import annotations

import re
import shlex

from reprocube.results.markdown_text import md_code, md_text
from reprocube.results.wording import first_update_text
from reprocube.runtime.cpu_emulation import INSTALL_HINT, NOT_INSTALLED
from reprocube.terminal import counted, pasteable, shown_value

# How --match's summary begins where A's sessions change settings more often than it follows (match_plan).
TOO_MANY_SESSIONS = "A's sessions change settings"


def recipe_lines(recipe: list[dict]) -> list[str]:
    """Each command as one shell line: `env -u VAR` for a variable to unset, VAR=value for one to set."""
    lines = []
    for command in recipe:
        unset = [f"-u {shlex.quote(k)}" for k, v in sorted(command["env"].items()) if v is None]
        assigned = [f"{k}={shlex.quote(v)}" for k, v in sorted(command["env"].items()) if v is not None]
        prefix = " ".join(["env", *unset] if unset else []) + " " if unset else ""
        lines.append(prefix + " ".join([*assigned, *map(_shell_word, command["argv"])]))
    return lines


def _shell_word(arg: str) -> str:
    """shlex.quote, but a word holding single quotes and nothing a shell expands inside double quotes is
    double-quoted: "key='value'" reads better than 'key='"'"'value'"'"''."""
    if "'" in arg and not re.search(r'[$`\\"!\n]', arg):
        return f'"{arg}"'
    return shlex.quote(arg)


# What each tier means for the result, in a few words (the verdict line's last part).
MATTERS = {
    "within-ulp": "rounding-level differences only",
    "within-seed-spread": "within the seed-to-seed spread: it does not change the result",
    "beyond-seed-spread": "BEYOND the seed-to-seed spread: it changes the result",
    "spread-unknown": "whether that matters was not measured (--seeds N measures it)",
    "metrics-disagree": "A's recorded metrics are not what its own training steps give here",
}


def verdict_line(result: dict) -> str:
    """The answer in one line a person reads in two seconds: what, how big, does it matter (the page's
    and reproduce.md's first line, the terminal's verdict)."""
    first, ulp = result["first_divergence"], result.get("ulp")
    size = f", by at most {ulp['max_ulp']} ULP ({ulp['basis']})" if ulp else ""
    if result["verdict"] == "bit-identical":
        return (
            "Reproduced: B has A's bits at every one of the "
            f"{counted(result['coverage']['compared_steps'], 'step')} compared."
        )
    if result["verdict"] == "losses-only":
        return f"The trained model is bit-identical; only the reported training losses differ{size}."
    if first and first.get("initial_tensors"):
        what = "B differs from A from the start (the initial weights already differ)"
    elif first:
        what = f"B departs from A at update {first['step']}"
    else:
        what = "B differs from A"
    return f"{what}{size}: {MATTERS.get(result['tier'], result['tier'])}."


def what_to_do(result: dict) -> list[str]:
    """The next step, in words, after the verdict: none; the recipe --match proved (recipe_lines follow);
    why this machine cannot give A's bits; or the command that finds out."""
    match = result["match"]
    if result["verdict"] == "bit-identical":
        return ["Nothing: this machine gives A's bits."]
    if result["tier"] == "metrics-disagree":
        return [
            "Ask for A's run directory or a fresh receipt: its recorded metrics are not what its training computes."
        ]
    if match is None:
        return [
            f"Find out whether this machine can give A's bits (and the exact commands if it can): "
            f"reprocube reproduce {_source_word(result['source'])} --match"
        ]
    if match["bit_identical"] and match.get("recipe"):
        return [
            "To get A's bits on this machine (proven by --match), run"
            + (" in turn:" if len(match["recipe"]) > 1 else ":")
        ]
    if match["bit_identical"]:  # a recipe is shown only with the --match run that proved it (match_plan)
        why = match.get("recipe_refused") or "the result records none"
        return [f"{match['summary']}; no command to run is shown: {why}."]
    if match["summary"].startswith(TOO_MANY_SESSIONS):  # --match refused to follow A: nothing was learnt
        return [f"Nothing was emulated: {match['summary']}. Ask for a run of A without so many changes of settings."]
    others = [c for c in match["cannot"] if not c.startswith(NOT_INSTALLED)]
    if len(others) < len(match["cannot"]):  # QEMU would emulate A's CPU: this machine could give A's bits
        lines = [
            f"The ISA caps alone do not give A's bits here ({match['summary']}). Install QEMU ({INSTALL_HINT}) and "
            f"run reprocube reproduce {_source_word(result['source'])} --match again: it then retrains B on "
            "QEMU's model of A's CPU, which gave the AVX2 machine's bits for all three frameworks."
        ]
    else:
        lines = [f"This machine cannot give A's bits: {match['summary']}"]
    lines += [f"It cannot emulate {c}: a machine with A's setting can." for c in others]
    return lines


def _source_word(source: str) -> str:
    """A's receipt as given, as one shell word to copy; one holding a control or format character (a paste
    acts on ^U, a newline, a bidi override) is never offered: RECEIPT stands in its place."""
    if not pasteable(source):
        return "RECEIPT"
    return shlex.quote(source)


def signature_line(signature: dict | None) -> str:
    if signature is None:
        return "not checked (no --public-key): the receipt may come from anyone"
    return f"verified (key {signature.get('key_id')}); it covers receipt.json only"


def claims_table(claims: dict) -> list[str]:
    """A Markdown table: each kind of claim and how many were reproduced, differ or were not checked."""
    rows = ["| claims of A | reproduced | differ | not checked |", "|---|---|---|---|"]
    for kind, counts in claims["kinds"].items():
        why = f" ({md_text('; '.join(counts['why_not_checked']))})" if counts["why_not_checked"] else ""
        rows.append(f"| {kind} | {counts['reproduced']} | {counts['differs']} | {counts['not_checked']}{why} |")
    totals = claims["totals"]
    rows.append(f"| **all** | **{totals['reproduced']}** | **{totals['differs']}** | **{totals['not_checked']}** |")
    return rows


def _sessions_lines(result: dict) -> list[str]:
    if not result["a_sessions"]:
        return []
    lines = ["", "## A's own sessions", "", "A was stopped and resumed under other numeric settings:"]
    return lines + [
        f"- steps {f['steps'][0]}..{f['steps'][1]}: "
        + "; ".join(
            f"{md_code(shown_value(c['key']))} {md_text(shown_value(c['a']))} -> {md_text(shown_value(c['b']))}"
            for c in f["changes"][:6]
        )
        for f in result["a_sessions"]
    ]


def markdown(result: dict) -> str:
    first = result["first_divergence"]
    lines = [
        f"# reprocube reproduce: {md_text(result['run_a'])}",
        "",
        f"**Verdict: {result['verdict']}**" + ("" if result["tier"] == result["verdict"] else f" ({result['tier']})"),
        "",
        f"**{md_text(verdict_line(result))}**",
        "",
        md_text(result["summary"]),
        "",
        f"- receipt: {md_code(result['source'])} (file sha256 {result['subject']['receipt_sha256'][:16]}...)",
        f"- signature: {md_text(signature_line(result['signature']))}",
        *(f"- unsigned: {md_text(line)}" for line in result["unsigned"]),
        f"- B: {md_code(result['run_b'])}",
        f"- compared: {counted(result['coverage']['compared_steps'], 'step')} (every loss bit), "
        f"{counted(result['coverage']['compared_boundaries'], 'weight-digest boundary', 'weight-digest boundaries')} "
        f"after the initial weights, {counted(result['coverage']['a_epochs'], 'epoch')}",
        "",
        "## What to do",
        "",
        *map(md_text, what_to_do(result)),
        *(
            ["", "```sh", *recipe_lines(result["match"]["recipe"]), "```"]
            if (result["match"] or {}).get("recipe")
            else []
        ),
    ]
    lines += _sessions_lines(result)
    if first and first.get("weights_identical"):
        lines += [
            "",
            "## First divergence: the reported losses only",
            "",
            f"- the loss bits first differ at global step **{first['step']}** (epoch {first['epoch']})",
            "- the weights agree wherever both runs recorded them: every trace boundary and epoch digest",
        ]
    elif first:
        lines += [
            "",
            "## First divergence",
            "",
            f"- global step **{first['step']}** (epoch {first['epoch']}), found by its {first['by']}",
            f"- {md_text(first_update_text(first))}",
            "- last boundary where the weights still agree: "
            + ("none before it" if first["last_matching_boundary"] is None else str(first["last_matching_boundary"])),
            f"- first boundary where they differ: {first['first_differing_boundary']}; tensors: "
            + (", ".join(map(md_code, first["tensors"])) or "n/a"),
        ]
    if result.get("claims"):
        lines += ["", "## What was compared", "", *claims_table(result["claims"])]
    operation = result.get("first_operation")
    if operation:
        lines += ["", "## First differing operation", "", md_text(operation["text"])]
        if operation.get("recordings"):
            lines += ["", "recordings: " + ", ".join(map(md_code, operation["recordings"]))]
    if result["self_consistent"] is not None:
        check = result.get("self_check", {})
        lines += [
            "",
            "## Does B agree with itself?",
            "",
            (
                "yes: B is deterministic but computes differently from A"
                if result["self_consistent"]
                else "**no: B is non-deterministic** (a second computation of the same steps differs)"
            )
            + f" (recomputed from {check.get('from')} to step {check.get('to_step')} in a fresh process)",
        ]
    identical = result["verdict"] == "bit-identical"
    heading = "Differences between A and B (none changed a bit)" if identical else "Likely causes (most likely first)"
    lines += ["", f"## {heading}", ""]
    if result["causes"]:
        lines += ["| # | key | A | B | kind | note |", "|---|---|---|---|---|---|"]
        lines += [
            (
                f"| {i} | {md_code(shown_value(c['key']))} | {md_text(shown_value(c['a']))} | "
                f"{md_text(shown_value(c['b']))} | {md_text(c['kind'])} | {md_text(c['note'] or '')} |"
            )
            for i, c in enumerate(result["causes"], 1)
        ]
    else:
        lines.append("none: config, code and recorded environment are the same")
    if result["match"]:
        lines += ["", "## Intervention (--match)", "", md_text(result["match"]["summary"])]
        lines += [f"- cannot emulate: {md_text(c)}" for c in result["match"]["cannot"]]
    lines += ["", "## Does it matter?", "", md_text(result["tier_text"])]
    spread = result.get("seed_spread")
    if spread:
        lines.append(f"(seed spread from {md_text(spread['source'])}, {spread.get('runs')} runs)")
    if result.get("ulp"):
        u = result["ulp"]
        lines.append(
            f"\nULP ({u['basis']}): {u['values_differing']} differ, max {u['max_ulp']}, median {u['median_ulp']:g}, "
            f"p99 {u['p99_ulp']:g}, max relative {u['max_relative']:.3g}, sign flips {u['sign_flips']} (counted apart)"
        )
    lines += ["", f"Wall-clock: {result['wall_s']['total']} s (B's run: {result['wall_s']['run_b']} s)", ""]
    return "\n".join(lines)
