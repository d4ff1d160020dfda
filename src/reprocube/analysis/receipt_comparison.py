"""A published run's receipt (A) against this machine's retraining of it (B): does every loss bit, weight
digest and epoch record agree, where do they first differ, which differences in config, code and
environment most likely explain it, and does the difference matter (ULP distance, the seed-to-seed
spread). Pure functions of two checked receipts (reprocube.training.receipt); what --match sets to emulate A is
analysis.match_plan."""

from __future__ import annotations

import math
import statistics

from reprocube.analysis.claims import (
    DIFFERS,
    KINDS,
    LOSS_KINDS,
    NOT_CHECKED,
    REPRODUCED,
    TRAINING_FIELDS,
    WEIGHT_KINDS,
    account,
)
from reprocube.analysis.tensors import ulp_statistics
from reprocube.config import config_differences
from reprocube.formats.env_comparison import NUMERIC_SETTINGS, env_differences
from reprocube.formats.trace import StepTrace, compare_traces
from reprocube.results.wording import first_update_text, tensor_list
from reprocube.terminal import counted, one_line, shown_value
from reprocube.training.metrics import DETERMINISTIC_EPOCH_FIELDS
from reprocube.training.receipt import Receipt

SEED_SPREAD_Z = 2.0  # within the seed spread: |B - A| <= 2 standard deviations of different-seed runs


# --- the comparison --------------------------------------------------------------------------------
def _fingerprints_lacking(a: StepTrace, b: StepTrace) -> str | None:
    """What B fingerprints within A's steps that A's trace does not: None where A holds all of it."""
    first, last = max(a.first_step, b.first_step), min(a.last_step, b.last_step)
    if b.fingerprint_first_step is None or last <= max(first, b.fingerprint_first_step):
        return None
    b_first = max(first, b.fingerprint_first_step)
    if a.fingerprint_first_step is None or a.fingerprint_first_step > b_first:
        return f"weight fingerprints of global steps {b_first + 1}..{last}"
    b_tensor_last = min(b.tensor_fingerprint_last, last)
    if a.tensor_fingerprint_last < b_tensor_last:
        return f"per-tensor fingerprints of global steps {a.tensor_fingerprint_last + 1}..{b_tensor_last}"
    return None


def steps_per_epoch(receipt: Receipt) -> int | None:
    for record in receipt.epochs:
        if record["epoch"] > 0 and record["global_step"] % record["epoch"] == 0:
            return record["global_step"] // record["epoch"]
    return None


def compare_receipts(a: Receipt, b: Receipt) -> dict:
    """Bit-identical only when B covers all of A (every step, boundary and epoch) and every bit agrees."""
    divergence = compare_traces(a.trace, b.trace)
    reasons = []
    if b.global_step < a.global_step or b.trace.first_step > a.trace.first_step:
        reasons.append(
            f"B covers steps {b.trace.first_step + 1}..{b.global_step}, A {a.trace.first_step + 1}..{a.global_step}"
        )
    epoch_differences = _epoch_differences(a, b, reasons)
    reasons += _claims_lacking(a, b)
    first = _first_divergence(a, b, divergence)
    return _verdict(a, b, divergence, first, epoch_differences, reasons)


def _epoch_differences(a: Receipt, b: Receipt, reasons: list[str]) -> list[dict]:
    """Each value of A's epoch records that B's differs in; an epoch B lacks goes to `reasons`."""
    epochs_b = {r["epoch"]: r for r in b.epochs}
    differences = []
    for record in a.epochs:
        other = epochs_b.get(record["epoch"])
        if other is None:
            reasons.append(f"B has no epoch {record['epoch']}")
            continue
        for key in (*DETERMINISTIC_EPOCH_FIELDS[1:], "weights_digest"):
            if record[key] != other[key]:
                differences.append({"epoch": record["epoch"], "key": key, "a": record[key], "b": other[key]})
    return differences


def _claims_lacking(a: Receipt, b: Receipt) -> list[str]:
    """What keeps A and B from being compared in full: the digests and fingerprints A lacks where B, trained
    from its config, records them, and a config of B's that differs (a device apart)."""
    reasons = []
    # B, trained from A's config, digests its weights at these steps of A's range: a receipt without them
    # claims less than its config's run records (claims removed, or a receipt of an older reprocube).
    a_steps = {boundary.step for boundary in a.trace.boundaries}
    lacking = [
        boundary.step
        for boundary in b.trace.boundaries
        if a.trace.first_step <= boundary.step <= a.global_step and boundary.step not in a_steps
    ]
    if lacking:
        shown = ", ".join(map(str, lacking[:8])) + (", ..." if len(lacking) > 8 else "")
        reasons.append(
            f"A's receipt holds no weight digests at global steps {shown}, where B, trained from its config, "
            "records them (claims removed from the receipt, or one written by an older reprocube)"
        )
    lacking = _fingerprints_lacking(a.trace, b.trace)
    if lacking:
        reasons.append(
            f"A's receipt holds no {lacking}, where B, trained from its config, records them (claims removed from "
            "the receipt, or one written by an older reprocube)"
        )
    config_changes = [line for line in config_differences(a.config, b.config) if not line.startswith("device:")]
    if config_changes:
        reasons.append(f"B's config differs ({'; '.join(config_changes)})")
    return reasons


def _first_divergence(a: Receipt, b: Receipt, divergence) -> dict | None:
    """Where B first departs from A: the step, its epoch, whether a loss or the weights show it, the first
    update that changed the weights (or the window it lies in), the initial weights and the tensors."""
    step = divergence.step
    spe = steps_per_epoch(a) or steps_per_epoch(b)
    first = None
    # The weight fingerprints cover every step both traces hold: the first update that changed the weights
    # is known to the step (None: it is none of them); otherwise only a window between two boundaries.
    fingerprinted = divergence.fingerprinted_steps > 0 and divergence.fingerprinted_steps == max(
        divergence.common_last - divergence.common_first, 0
    )
    if step is not None:
        weight_step = divergence.first_weight_step
        first = {
            "step": step,
            "epoch": (step - 1) // spe + 1 if spe else None,
            "by": "loss" if divergence.first_loss_step == step else "weights",
            "first_loss_step": divergence.first_loss_step,  # the first step whose loss bits differ
            # The first update after which the weights differ, by the per-step fingerprints, and the
            # tensors it changed (None: no per-tensor fingerprints that far).
            "first_weight_step": weight_step,
            "weight_tensors": divergence.first_weight_tensors if weight_step is not None else None,
            # The initial weights, before any update: the tensors that differ ([]: none; None: A's trace
            # has no digests of them, as receipts written before they were recorded).
            "initial_tensors": divergence.initial_tensors,
            "fingerprinted": fingerprinted,
            "last_matching_boundary": divergence.last_matching_boundary,
            # Without fingerprints, the first update that made the weights differ lies in this window: at
            # the last matching boundary they agree, and a loss computed from differing weights (or a
            # differing forward pass) differs at `step`. trace.every_steps=1 narrows it to one step.
            "window": [weight_step, weight_step]
            if weight_step is not None
            else [(divergence.last_matching_boundary or max(a.trace.first_step, b.trace.first_step)) + 1, step],
            "first_differing_boundary": divergence.first_boundary.step if divergence.first_boundary else None,
            "tensor": divergence.tensors[0] if divergence.tensors else None,
            "tensors": divergence.tensors,
            "weights_identical": False,  # losses-only (_verdict): every weight digest agrees
        }
    return first


def _verdict(a: Receipt, b: Receipt, divergence, first: dict | None, epoch_differences: list, reasons: list) -> dict:
    """The verdict, as A's ledger of claims allows it, and the keys of reproduce.json it decides."""
    step = divergence.step
    # The ledger of A's claims decides what may be said: bit-identical only when every claim was compared
    # and reproduced; losses-only only when every weight claim was compared and reproduced, one of them
    # at or after A's last step, and only loss claims differ.
    ledger = account(a, b)
    nothing_unchecked = ledger.count(NOT_CHECKED) == 0
    unchecked = [
        f"{t.not_checked} {kind} ({'; '.join(t.why_not_checked)})"
        for kind, t in ledger.tallies.items()
        if t.not_checked
    ]
    if unchecked:
        reasons.append(f"not checked: {', '.join(unchecked)}")
    last_weight = ledger.last_reproduced_weight_step
    if step is not None and ledger.count(DIFFERS, WEIGHT_KINDS) == 0 and (last_weight or -1) < a.global_step:
        reasons.append(
            f"A's weights are compared only up to global step {last_weight if last_weight is not None else 0}, "
            f"not at its last step {a.global_step}: whether the trained model is the same is not known"
        )
    identical = (
        not reasons
        and not epoch_differences
        and step is None
        and nothing_unchecked
        and ledger.count(DIFFERS) == 0
        and ledger.count(REPRODUCED) > 0
    )
    losses_only = (
        not identical
        and not reasons
        and first is not None
        and nothing_unchecked
        and ledger.count(DIFFERS, [k for k in KINDS if k not in LOSS_KINDS]) == 0
        and (last_weight or -1) >= a.global_step
        and divergence.first_boundary is None
        and divergence.weights_identical
        and all(d["key"] in TRAINING_FIELDS for d in epoch_differences)
    )
    if losses_only:
        first |= {"by": "loss", "window": None, "weights_identical": True}
    verdict = "bit-identical" if identical else "losses-only" if losses_only else "differs"
    return {
        "verdict": verdict,
        "identical": identical,
        "first_divergence": first,
        "epoch_differences": epoch_differences,
        "coverage": {
            "a_steps": [a.trace.first_step + 1, a.global_step],
            "b_steps": [b.trace.first_step + 1, b.global_step],
            "compared_steps": max(divergence.common_last - divergence.common_first, 0),
            "compared_boundaries": divergence.compared_boundaries,
            "a_epochs": len(a.epochs),
            "a_complete": a.complete,  # False: A stopped before its last epoch and was never resumed
            "b_epochs": len(b.epochs),
        },
        "reasons": reasons,
        "claims": ledger.as_dict(),
    }


# --- causes ----------------------------------------------------------------------------------------
def session_env(a: Receipt, step: int | None) -> dict:
    """The environment of A's session that computed global step `step` (None: the first session's)."""
    if step is not None:
        for session in a.sessions:
            if session["from_step"] < step <= session["to_step"]:
                return session["env"]
    return a.sessions[0]["env"]


def session_changes(a: Receipt) -> list[dict]:
    """A finding about A itself: each session whose settings that change numbers differ from the previous
    session's (the steps it trained and what changed): A's steps were computed under mixed settings."""
    findings = []
    for before, after in zip(a.sessions, a.sessions[1:], strict=False):
        rows = [r for r in env_differences(before["env"], after["env"]) if "not_a_cause" not in r]
        rows = [r for r in rows if r["key"].startswith(NUMERIC_SETTINGS)]
        if rows:
            findings.append({"steps": [after["from_step"] + 1, after["to_step"]], "changes": rows})
    return findings


def ranked_causes(a: Receipt, b: Receipt, user_changes: list[str], at_step: int | None = None) -> list[dict]:
    """Config differences first, then the code, then the environment (most likely first) of A's session
    that computed `at_step` (the first divergence) against B's; variables known not to affect these
    trainers last, with the reason."""
    causes = []
    for line in config_differences(a.config, b.config):
        key, _, change = line.partition(": ")
        if key == "device":
            continue  # where it runs: the device actually used is in the environment (framework.device)
        before, _, after = change.partition(" -> ")
        note = "overridden with --allow-config-change" if key in user_changes else None
        causes.append({"key": f"config.{key}", "a": before, "b": after, "kind": "config", "note": note})
    code_a, code_b = _code(a), _code(b)
    if code_a != code_b:
        causes.append(
            {"key": "reprocube.source_sha256", "a": code_a, "b": code_b, "kind": "code", "note": _differing_files(a, b)}
        )
    rows = env_differences(session_env(a, at_step), b.env)
    numeric = [r for r in rows if "not_a_cause" not in r]
    for row in numeric:
        causes.append({"key": f"env.{row['key']}", "a": row["a"], "b": row["b"], "kind": "environment", "note": None})
    for row in rows:
        if "not_a_cause" in row:
            causes.append(
                {
                    "key": f"env.{row['key']}",
                    "a": row["a"],
                    "b": row["b"],
                    "kind": "not-numeric",
                    "note": row["not_a_cause"],
                }
            )
    return causes


def _differing_files(a: Receipt, b: Receipt, shown: int = 8) -> str | None:
    """The source files the two installs differ in (receipts record each file's digest), or None."""
    files_a, files_b = _source_files(a), _source_files(b)
    if files_a is None or files_b is None:
        return None
    names = sorted(n for n in set(files_a) | set(files_b) if files_a.get(n) != files_b.get(n))
    if not names:
        return None
    listed = [n + (" (only in A)" if n not in files_b else " (only in B)" if n not in files_a else "") for n in names]
    more = f" and {len(listed) - shown} more" if len(listed) > shown else ""
    return f"files that differ: {', '.join(listed[:shown])}{more}"


def _source_files(receipt: Receipt) -> dict | None:
    """Each source file's digest, or None: not recorded (a version-1 receipt from before them)."""
    return receipt.value["reprocube"]["source_files"]


def _code(receipt: Receipt) -> str:
    """reprocube's version and installed-source digest, as one comparable string."""
    code = receipt.value["reprocube"]
    return f"{code['version']} (source sha256 {code['source_sha256'][:16]})"


# --- does it matter? -------------------------------------------------------------------------------
def final_record(receipt: Receipt) -> dict | None:
    return receipt.epochs[-1] if receipt.epochs else None


def seed_spread_of(finals: list[dict], seeds: list[int]) -> dict:
    """The spread of the final test metrics of runs of A's config with other seeds, trained here."""
    spread = {"source": "seeds", "runs": len(finals), "seeds": seeds}
    for metric in ("test_accuracy", "test_loss"):
        spread[metric] = {"std": statistics.stdev(f[metric] for f in finals), "values": [f[metric] for f in finals]}
    return spread


def seed_spread(a: Receipt, b: Receipt, study: dict | None) -> dict | None:
    """B - A in units of the seed-to-seed standard deviation of the final test metrics (from a study, or
    seed_spread_of runs trained here); None without one or without final records."""
    fa, fb = final_record(a), final_record(b)
    if fa is None or fb is None or study is None:
        return None
    spread = dict(study)
    for metric in ("test_accuracy", "test_loss"):
        difference = fb[metric] - fa[metric]
        std = study[metric]["std"]
        spread[metric] = {
            **study[metric],
            "a": fa[metric],
            "b": fb[metric],
            "difference": difference,
            "in_std": _ratio(difference, std),
        }
    return spread


def _ratio(difference: float, std: float) -> float | None:
    """difference / std, or None where it is not a finite number (no std, or a std so small it overflows)."""
    ratio = difference / std if std else None
    return ratio if ratio is not None and math.isfinite(ratio) else None


def loss_ulp(a: Receipt, b: Receipt) -> dict | None:
    """ULP statistics of the per-step losses over the last epoch both cover (the receipt holds no weights;
    the trace holds every loss bit): how far apart the two computations ended up."""
    first, last = max(a.trace.first_step, b.trace.first_step), min(a.trace.last_step, b.trace.last_step)
    spe = steps_per_epoch(a) or 1
    start = max(first, last - spe)
    if last <= start:
        return None
    la = a.trace.losses[start - a.trace.first_step : last - a.trace.first_step]
    lb = b.trace.losses[start - b.trace.first_step : last - b.trace.first_step]
    stats = ulp_statistics(la, lb)
    return {"basis": f"training loss of global steps {start + 1}..{last} (float32)", **stats}


def _partial(coverage: dict) -> str:
    """What a partial receipt (A stopped and never resumed to its last epoch) limits, or ''."""
    if coverage.get("a_complete", True):
        return ""
    return (
        f"A stopped at global step {coverage['a_steps'][1]} and was never resumed to its last epoch (a partial "
        "receipt): B was trained and compared up to there"
    )


def tier(result: dict, max_ulp: int) -> tuple[str, str]:
    """The tier and its sentence; a partial receipt's sentence says so, whatever the verdict."""
    name, text = _tier(result, max_ulp)
    partial = _partial(result["coverage"])
    return name, text + (f"; {partial}" if partial else "")


def claims_text(claims: dict) -> str:
    """ "N claims: R reproduced, D differ, U not checked": the ledger's totals in words."""
    totals = claims["totals"]
    return (
        f"{sum(totals.values())} claims of A's receipt: {totals['reproduced']} reproduced, {totals['differs']} "
        f"differ, {totals['not_checked']} not checked"
    )


def _tier(result: dict, max_ulp: int) -> tuple[str, str]:
    coverage = result["coverage"]
    if result["verdict"] == "bit-identical":
        compared = (
            f"{counted(coverage['compared_steps'], 'step')} (every loss bit), "
            f"{counted(coverage['compared_boundaries'], 'weight-digest boundary', 'weight-digest boundaries')} "
            "after the initial weights, "
            f"{counted(coverage['a_epochs'], 'epoch record')}; {claims_text(result['claims'])}"
        )
        return "bit-identical", f"bit-identical: everything A's receipt records reproduced ({compared})"
    if result["verdict"] == "losses-only":
        return "losses-only", (
            f"the trained model is bit-identical (every weight digest at "
            f"{counted(coverage['compared_boundaries'], 'boundary', 'boundaries')} and "
            f"{counted(coverage['a_epochs'], 'epoch')}); "
            "only the reported training losses differ"
            + (f" (max {result['ulp']['max_ulp']} ULP)" if result.get("ulp") else "")
            + ": the loss is computed in another order here, the updates are not"
        )
    if result["first_divergence"] is None and result["epoch_differences"] and not result["reasons"]:
        # Every step and weight digest agrees, yet A's recorded epoch metrics are not B's: never "within ULP".
        keys = sorted({d["key"] for d in result["epoch_differences"]})
        return "metrics-disagree", (
            f"A's recorded epoch metrics ({', '.join(keys)}) differ from B's although every training step and "
            "weight digest agrees: either the evaluation computes differently here, or A's metrics were not "
            "produced by the training its trace records (an edited or damaged receipt)"
        )
    ulp = result.get("ulp")
    spread = result.get("seed_spread")
    measured = spread and all(spread[m].get("in_std") is not None for m in ("test_accuracy", "test_loss"))
    text = (
        f"test accuracy B - A = {spread['test_accuracy']['difference']:+.4g} "
        f"({spread['test_accuracy']['in_std']:+.2f} seed std), test loss {spread['test_loss']['in_std']:+.2f} seed std"
        if measured
        else ""
    )
    if (
        ulp
        and ulp["sign_flips"] == 0
        and ulp["max_ulp"] <= max_ulp
        and result["coverage"]["b_steps"][1] >= result["coverage"]["a_steps"][1]
    ):
        return "within-ulp", (
            f"differs within {max_ulp} ULP ({ulp['basis']}: max {ulp['max_ulp']}, median {ulp['median_ulp']:g}, "
            f"p99 {ulp['p99_ulp']:g} ULP, max relative {ulp['max_relative']:.2g})"
            + (f"; the seed spread, measured: {text}" if measured else "")  # --seeds asked for it: shown
        )
    if measured:
        z = max(abs(spread[m]["in_std"]) for m in ("test_accuracy", "test_loss"))
        if z <= SEED_SPREAD_Z:
            return "within-seed-spread", f"differs within the seed spread (|z| <= {SEED_SPREAD_Z:g}): {text}"
        return "beyond-seed-spread", f"differs BEYOND the seed spread (|z| > {SEED_SPREAD_Z:g}): {text}"
    return "spread-unknown", "differs; whether it matters is unknown (pass --study PATH or --seeds N)"


def _sessions_finding(result: dict) -> str:
    findings = result.get("a_sessions") or []
    if not findings:
        return ""
    first = findings[0]
    change = first["changes"][0]
    return (
        f"A itself was resumed under other numeric settings at step {first['steps'][0]} ({change['key']}: "
        f"{shown_value(change['a'])} -> {shown_value(change['b'])}{', ...' if len(first['changes']) > 1 else ''})"
        + (f" and {len(findings) - 1} more time(s)" if len(findings) > 1 else "")
    )


def summary(result: dict) -> str:
    if result["verdict"] == "bit-identical":
        coverage = result["coverage"]
        partial = _partial(coverage)
        sessions = _sessions_finding(result)
        return one_line(
            f"bit-identical ({counted(coverage['compared_steps'], 'step')}, {counted(coverage['a_epochs'], 'epoch')})"
            + (f"; partial: {partial}" if partial else "")
            + (f"; {sessions}" if sessions else "")
        )
    parts = []
    first = result["first_divergence"]
    if result["verdict"] == "losses-only":
        parts.append(
            f"the trained model is bit-identical; only the reported losses differ (from global step {first['step']})"
        )
    elif first and (first.get("initial_tensors") or first.get("first_weight_step") is not None):
        parts.append(f"differs from global step {first['step']} (epoch {first['epoch']}); {first_update_text(first)}")
    elif first:
        tensor = (
            f"; at the boundary of step {first['first_differing_boundary']}: {tensor_list(first['tensors'])}"
            if first.get("tensors")
            else ""
        )
        parts.append(f"differs from global step {first['step']} (epoch {first['epoch']}){tensor}")
    elif result["epoch_differences"]:
        d = result["epoch_differences"][0]
        parts.append(f"training steps agree but epoch {d['epoch']} {d['key']} differs")
    else:
        parts.append("differs")
    partial = _partial(result["coverage"])
    if partial:
        parts.append(f"partial: {partial}")
    parts += result["reasons"]
    if _sessions_finding(result):
        parts.append(_sessions_finding(result))
    if result["self_consistent"] is not None:
        parts.append(
            "B is deterministic but computes differently" if result["self_consistent"] else "B is NON-DETERMINISTIC"
        )
    likely = [c for c in result["causes"] if c["kind"] != "not-numeric"]
    proven = result["match"] and result["match"]["bit_identical"]  # then the match's summary names the cause
    if likely and not proven:
        parts.append(
            f"likely cause: {likely[0]['key']} ({shown_value(likely[0]['a'])} -> {shown_value(likely[0]['b'])})"
        )
    if result["match"] and result["match"]["ran"]:
        parts.append(result["match"]["summary"])
    operation = result.get("first_operation")
    if operation and operation["status"] == "found":
        parts.append(operation["text"])
    parts.append(result["tier_text"])
    return one_line("; ".join(parts))  # one line, whatever A's tensor names and values hold
