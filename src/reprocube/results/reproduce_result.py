"""reproduce.json and reproduce.md (`reprocube reproduce`): the schema, the writer and the strict reader
that `reprocube report` draws the reproduction page from (every key it shows typed; one line naming
the file and the key when one is wrong, exit 4). reproduce.md's words are reproduce_wording's."""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

from reprocube.errors import CheckpointError
from reprocube.results.reproduce_wording import markdown
from reprocube.results.schema import ResultFile
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


def _recipe_command(command) -> dict:
    env = command.mapping("env")
    return {
        "env": {key: env.nullable(key, env.text) for key in env.value},
        "argv": command.texts("argv"),
    }


B_RUN = "runs/b"
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
