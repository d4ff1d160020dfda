"""Two published runs compared from their receipts alone, without training (`reprocube compare` of two
receipts, and of two run directories beside their checkpoints): the same engine as `reproduce`
(reprocube.analysis.receipt_comparison) with B a second receipt instead of a retraining here. What a
retraining alone can tell is named as not known: whether B is deterministic (its self-check), --match,
the first differing operation."""

from __future__ import annotations

from reprocube.analysis.receipt_comparison import (
    compare_receipts,
    loss_ulp,
    ranked_causes,
    seed_spread,
    session_changes,
    summary,
    tier,
)
from reprocube.training.receipt import Receipt

DEFAULT_ULP = 16


def compare_published(a: Receipt, b: Receipt, max_ulp: int = DEFAULT_ULP) -> dict:
    """The verdict (bit-identical, losses-only, differs), the first differing step, update and tensors,
    the causes ranked from both environments (and configs), the tier and one summary line."""
    outcome = compare_receipts(a, b)
    first_step = (outcome["first_divergence"] or {}).get("step")
    result = {
        **outcome,
        "causes": ranked_causes(a, b, [], at_step=first_step),
        "a_sessions": session_changes(a),
        "self_consistent": None,  # not known without training B again
        "match": None,
        "first_operation": None,
        "seed_spread": seed_spread(a, b, None),
        "ulp": loss_ulp(a, b),
    }
    result["tier"], result["tier_text"] = tier(result, max_ulp)
    result["summary"] = summary(result)
    return {key: result[key] for key in PUBLISHED_KEYS}


# What compare.json keeps of it (the reproduce-only keys are left out: nothing was trained)
PUBLISHED_KEYS = (
    "verdict",
    "identical",
    "first_divergence",
    "coverage",
    "reasons",
    "causes",
    "claims",
    "ulp",
    "tier",
    "tier_text",
    "summary",
)
