"""reproduce.json and reproduce.md (`reprocube reproduce`): the schema, the writer and the strict reader
that `reprocube report` draws the reproduction page from (every key it shows typed; one line naming
the file and the key when one is wrong, exit 4)."""

from __future__ import annotations

import hashlib
import re
import shlex
from pathlib import Path

from reprocube.errors import CheckpointError
from reprocube.results.markdown_text import md_code, md_text
from reprocube.results.schema import ResultFile
from reprocube.results.wording import first_update_text
from reprocube.runtime.cpu_emulation import INSTALL_HINT, NOT_INSTALLED
from reprocube.terminal import counted, pasteable, shown_value
from reprocube.training.receipt import RECEIPT, Receipt
from reprocube.untrusted import Fields

# Version 2: `inputs` binds A's receipt (copied here) and B's by digest; run_b is B_RUN, inside the
# reproduce directory (version 1 named any path). Version 3: every key below is written every time
# (first_operation; first_divergence's fingerprint, initial-weight, window and weights_identical keys;
# match.recipe); a version-2 file lacking some is upgraded (_from_version_2).
# What a version-2 file's first_divergence meant by each key it lacked (written before the key existed).
V2_FIRST_DIVERGENCE = {
    "first_weight_step": None,  # no per-step weight fingerprints
    "weight_tensors": None,
    "fingerprinted": False,
    "initial_tensors": None,  # no digests of the initial weights
    "window": None,
    "weights_identical": False,
}


def _from_version_2(value: dict) -> dict:
    """A version-2 reproduce.json as version 3: each key it may lack, as what its absence meant."""
    if isinstance(value.get("first_divergence"), dict):
        value["first_divergence"] = {**V2_FIRST_DIVERGENCE, **value["first_divergence"]}
    if isinstance(value.get("match"), dict):
        value["match"] = {"recipe": None, **value["match"]}  # no recipe: written before --match gave one
    value.setdefault("first_operation", None)  # written before the first operation was looked for
    return value


REPRODUCE_RESULT = ResultFile(
    "reproduce.json",
    version=3,
    upgrades=((2, _from_version_2),),
    keys=(
        "subject",  # the receipt file's sha256, its config_hash and final weights digest
        "source",  # A's receipt as given
        "source_sha256",  # the receipt's self-hash
        "signature",  # null, or {key_id, verified}
        "unsigned",  # what lies beside the receipt unsigned or unchecked
        "run_a",
        "run_b",  # B_RUN: B's run directory, relative to the reproduce directory
        "inputs",  # {a_receipt, b_receipt[, b_matched_receipt]}: {path (relative), sha256 of its bytes}
        "framework",
        "verdict",  # VERDICTS
        "identical",
        "first_divergence",
        "epoch_differences",
        "coverage",  # steps, boundaries and epochs compared; a_complete: false for a partial receipt
        "reasons",
        "causes",  # ranked: kind in CAUSE_KINDS
        "a_sessions",  # A's sessions whose numeric settings differ from the previous one's (a finding about A)
        "self_consistent",
        "match",
        "seed_spread",
        "ulp",
        "tier",
        "tier_text",
        "summary",
        "wall_s",
        "claims",  # A's claims counted per kind: reproduced, differs, not checked (analysis.claims)
        # the operation behind the first differing step (reprocube.orchestration.operation_replay), null
        # where the training steps agree
        "first_operation",
    ),
    optional_keys=("self_check",),  # where self_consistent is not null
)
VERDICTS = ("bit-identical", "losses-only", "differs")


def new_result(a: Receipt, b: Receipt, outcome: dict, signature: dict | None, unsigned: list[str]) -> dict:
    """reproduce.json as it stands once B is compared with A (`outcome`: analysis.receipt_comparison's
    verdict keys); the findings that need more training (causes, self_check, match, seed spread, the
    first operation) and the tiers and summary are filled in after."""
    return {
        # What this result is about: the receipt file's bytes (as sha256sum and the signature see them).
        "subject": {
            "receipt_sha256": hashlib.sha256(a.raw).hexdigest(),
            "config_hash": a.value["config_hash"],
            "final_weights_digest": a.epochs[-1]["weights_digest"] if a.epochs else None,
        },
        "source": str(a.path),
        "source_sha256": a.value["receipt_sha256"],
        "signature": None if signature is None else {"key_id": signature.get("key_id"), "verified": True},
        "unsigned": unsigned,
        "run_a": a.run_name,
        "run_b": B_RUN,
        # Every file the result draws on, inside this directory and bound by the sha256 of its bytes:
        # `report` reads these and nothing else.
        "inputs": {
            "a_receipt": {"path": A_RECEIPT_COPY, "sha256": hashlib.sha256(a.raw).hexdigest()},
            "b_receipt": {"path": f"{B_RUN}/{RECEIPT}", "sha256": hashlib.sha256(b.raw).hexdigest()},
        },
        "framework": a.config["framework"]["name"],
        **outcome,  # verdict, identical, first_divergence, epoch_differences, coverage, reasons, claims
        "causes": [],
        "self_consistent": None,
        "match": None,
        "seed_spread": None,
        "first_operation": None,
    }


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


def _read_first_divergence(fields: Fields) -> dict | None:
    """first_divergence, each key typed (version 3: every key there; older versions were upgraded)."""
    first = fields.nullable("first_divergence", fields.mapping)
    if first is None:
        return None
    integer = lambda key: first.integer(key)  # nullable steps
    return {
        "step": first.integer("step", 1),
        "epoch": first.nullable("epoch", integer),
        "by": first.text("by"),
        "last_matching_boundary": first.nullable("last_matching_boundary", integer),
        "first_differing_boundary": first.nullable("first_differing_boundary", integer),
        "tensors": first.texts("tensors"),
        # the per-step weight fingerprints
        "first_weight_step": first.nullable("first_weight_step", integer),
        "weight_tensors": first.nullable("weight_tensors", first.texts),
        "fingerprinted": first.boolean("fingerprinted"),
        # the initial weights' digests (None: A's receipt has none)
        "initial_tensors": first.nullable("initial_tensors", first.texts),
        # where the first differing update lies
        "window": first.nullable("window", first.step_range),
        # losses-only: every weight digest agrees
        "weights_identical": first.boolean("weights_identical"),
    }


def _source_word(source: str) -> str:
    """A's receipt as given, as one shell word to copy; one holding a control or format character (a paste
    acts on ^U, a newline, a bidi override) is never offered: RECEIPT stands in its place."""
    if not pasteable(source):
        return "RECEIPT"
    return shlex.quote(source)


def _recipe_command(command) -> dict:
    env = command.mapping("env")
    return {
        "env": {key: env.nullable(key, env.text) for key in env.value},
        "argv": command.texts("argv"),
    }


B_RUN = "runs/b"
# How --match's summary begins where A's sessions change settings more often than it follows (match_plan).
TOO_MANY_SESSIONS = "A's sessions change settings"
B_MATCHED_RUN = "runs/b-matched"  # B retrained by --match under A's settings
# The page reproduce draws beside reproduce.json (reprocube.pages.reproduction_page) and its figures
REPORT_PAGE = "report.html"
DIFFERENCE_FIGURE, DIVERGENCE_FIGURE, SPREAD_FIGURE = "difference.png", "divergence-map.png", "seed-spread.png"
REPORT_FILES = (REPORT_PAGE, DIFFERENCE_FIGURE, DIVERGENCE_FIGURE, SPREAD_FIGURE)
A_RECEIPT_COPY = "a/receipt.json"  # A's receipt, its exact bytes
CAUSE_KINDS = ("config", "code", "environment", "not-numeric")
OPERATION_STATUSES = ("found", "none", "unavailable", "failed")  # first_operation.status


def write_reproduce(result: dict, directory: Path) -> Path:
    return REPRODUCE_RESULT.write(directory, result, markdown(result))


def signature_line(signature: dict | None) -> str:
    if signature is None:
        return "not checked (no --public-key): the receipt may come from anyone"
    return f"verified (key {signature.get('key_id')}); it covers receipt.json only"


def read_reproduce(path: Path) -> dict:
    return check_reproduce(REPRODUCE_RESULT.read(path).value, str(path))


def check_reproduce(value, where: str) -> dict:
    """The keys of a reproduce result that the page shows, each type-checked; the rest is not used."""
    fields = REPRODUCE_RESULT.check(value, where)
    # What the result is about (None: a result written before reproduce recorded it; the page says so).
    subject = None if fields.value.get("subject") is None else fields.mapping("subject")
    result = {
        "subject": subject
        and {
            "receipt_sha256": subject.sha256("receipt_sha256"),
            "config_hash": subject.sha256("config_hash"),
            "final_weights_digest": subject.sha256("final_weights_digest", nullable=True),
        }
    }
    result |= {key: fields.text(key) for key in ("tier", "tier_text", "summary", "run_a", "source", "run_b")}
    result["source_sha256"] = fields.text("source_sha256")
    if result["run_b"] != B_RUN:
        raise CheckpointError(f"{where}: run_b must be {B_RUN!r} (B's run inside the reproduce directory)")
    inputs = fields.mapping("inputs")
    result["inputs"] = {}
    named = [("a_receipt", A_RECEIPT_COPY), ("b_receipt", f"{B_RUN}/receipt.json")]
    if "b_matched_receipt" in inputs.value:  # the --match run, where it gave A's bits (its recipe's proof)
        named.append(("b_matched_receipt", f"{B_MATCHED_RUN}/receipt.json"))
    for name, path in named:
        entry = inputs.mapping(name)
        if entry.text("path") != path:
            raise CheckpointError(f"{where}: inputs.{name}.path must be {path!r}")
        result["inputs"][name] = {"path": path, "sha256": entry.sha256("sha256")}
    result["verdict"] = fields.one_of("verdict", VERDICTS)
    result["first_divergence"] = _read_first_divergence(fields)
    result["causes"] = [
        {
            "key": cause.text("key"),
            "a": cause.present("a"),
            "b": cause.present("b"),
            "kind": cause.one_of("kind", CAUSE_KINDS),
            "note": cause.text("note", optional=True),
        }
        for cause in fields.records("causes")
    ]
    result["a_sessions"] = [
        {
            "steps": session.step_range("steps"),
            "changes": [
                {"key": c.text("key"), "a": c.present("a"), "b": c.present("b")} for c in session.records("changes")
            ],
        }
        for session in fields.records("a_sessions")
    ]
    result["self_consistent"] = fields.nullable("self_consistent", fields.boolean)
    check = fields.mapping("self_check") if result["self_consistent"] is not None else None
    result["self_check"] = check and {
        "from": check.text("from"),
        "to_step": check.integer("to_step"),
        "compared_steps": check.integer("compared_steps"),
    }
    match = fields.nullable("match", fields.mapping)
    result["match"] = match and {
        "ran": match.boolean("ran"),
        "bit_identical": match.nullable("bit_identical", match.boolean),
        "cannot": match.texts("cannot"),
        "summary": match.text("summary"),
        # the commands that gave A's bits here (None: --match did not prove them)
        "recipe": match.nullable("recipe", lambda key: [_recipe_command(c) for c in match.records(key)]),
    }
    operation = fields.nullable("first_operation", fields.mapping)
    result["first_operation"] = operation and {
        "status": operation.one_of("status", OPERATION_STATUSES),
        "step": operation.nullable("step", operation.integer),
        "text": operation.text("text"),
    }
    result["seed_spread"] = fields.nullable("seed_spread", lambda key: _check_spread(fields.mapping(key)))
    ulp = fields.nullable("ulp", fields.mapping)
    if ulp is not None:
        ulp = {
            "basis": ulp.text("basis"),
            **{k: ulp.integer(k) for k in ("values_differing", "sign_flips", "max_ulp")},
            **{k: ulp.number(k) for k in ("median_ulp", "p99_ulp", "max_relative")},
        }
    result["ulp"] = ulp
    coverage = fields.mapping("coverage")
    result["coverage"] = {
        "a_steps": coverage.step_range("a_steps"),
        "b_steps": coverage.step_range("b_steps"),
        **{k: coverage.integer(k) for k in ("compared_steps", "compared_boundaries", "a_epochs", "b_epochs")},
    }
    wall = fields.mapping("wall_s")
    result["wall_s"] = {"total": wall.number("total"), "run_b": wall.number("run_b")}
    result["claims"] = _check_claims(fields.mapping("claims"))
    return result


CLAIM_OUTCOMES = ("reproduced", "differs", "not_checked")
CLAIM_KIND = re.compile(r"[a-z][a-z ]{0,39}")  # "loss bits", "boundary weight digests" (analysis.claims.KINDS)


def _check_claims(claims: Fields) -> dict:
    """The ledger's counts: per kind of claim (a name from analysis.claims.KINDS) and in total."""
    kinds = claims.mapping("kinds")
    checked = {}
    for kind in kinds.value:
        if not CLAIM_KIND.fullmatch(kind):
            raise CheckpointError(f"{kinds.where}: {str(kind)[:40]!r} is not a kind of claim")
        counts = kinds.mapping(kind)
        checked[kind] = {o: counts.integer(o, 0) for o in CLAIM_OUTCOMES} | {
            "why_not_checked": counts.texts("why_not_checked")
        }
    totals = claims.mapping("totals")
    return {"kinds": checked, "totals": {o: totals.integer(o, 0) for o in CLAIM_OUTCOMES}}


def claims_table(claims: dict) -> list[str]:
    """A Markdown table: each kind of claim and how many were reproduced, differ or were not checked."""
    rows = ["| claims of A | reproduced | differ | not checked |", "|---|---|---|---|"]
    for kind, counts in claims["kinds"].items():
        why = f" ({md_text('; '.join(counts['why_not_checked']))})" if counts["why_not_checked"] else ""
        rows.append(f"| {kind} | {counts['reproduced']} | {counts['differs']} | {counts['not_checked']}{why} |")
    totals = claims["totals"]
    rows.append(f"| **all** | **{totals['reproduced']}** | **{totals['differs']}** | **{totals['not_checked']}** |")
    return rows


def _check_spread(spread: Fields) -> dict:
    checked = {"source": spread.text("source"), "runs": spread.integer("runs"), "path": spread.text("path", True)}
    for metric in ("test_accuracy", "test_loss"):
        stats = spread.mapping(metric)
        checked[metric] = {
            "std": stats.nullable("std", stats.number),
            "in_std": stats.nullable("in_std", stats.number),
            **{k: stats.number(k) for k in ("a", "b", "difference")},
        }
        if stats.value.get("values") is not None:
            checked[metric]["values"] = stats.numbers("values")
    return checked


def check_subject(result: dict, a: Receipt, where: str) -> None:
    """The receipt read as A must be the one the result is about: the sha256 of its file's bytes (what
    sha256sum and a signature see) is subject.receipt_sha256, and the subject's config_hash and final
    weights digest are the receipt's. A result without a subject (older) is marked unverifiable instead."""
    subject = result["subject"]
    if subject is None:
        return
    if hashlib.sha256(a.raw).hexdigest() != subject["receipt_sha256"]:
        raise CheckpointError(
            f"{where}: {a.path} is not the receipt this result is about (the sha256 of its bytes is not "
            "subject.receipt_sha256)"
        )
    final = a.epochs[-1]["weights_digest"] if a.epochs else None
    if (subject["config_hash"], subject["final_weights_digest"]) != (a.value["config_hash"], final):
        raise CheckpointError(
            f"{where}: subject does not describe {a.path} (its config_hash or final_weights_digest differs)"
        )


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
