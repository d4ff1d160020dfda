"""verify's judgement: each check's run directory against the reference, after the checks ran (a link's
checkpoint must equal the reference's in every byte of its state; a negative control must differ; a
whole run is compared checkpoint by checkpoint). A row per check for verify's table and verify.json."""

from __future__ import annotations

from pathlib import Path

from reprocube.analysis.run_comparison import compare_runs, load_run
from reprocube.errors import CheckpointError
from reprocube.formats.trace import compare_traces
from reprocube.orchestration.verify_runner import Check
from reprocube.results.compare_result import summary_line
from reprocube.training.checkpoint import weights_digest
from reprocube.training.state import TrainState


def _row(check: Check, passed: bool, summary: str, detail: dict | None = None) -> dict:
    """One row of verify's table and of verify.json's checks."""
    return {"name": check.name, "check": check.label, "passed": passed, "summary": summary, "detail": detail}


def judge(plan: list[Check], reference: Path, base: Path, tolerance: float) -> list[dict]:
    rows = []
    try:
        ref = load_run(reference)
    except CheckpointError as exc:
        first = plan[0] if plan and plan[0].judge == "reference" else None
        reason = first.error if first is not None and first.error else str(exc)
        return [_row(Check("reference", "reference", [], "reference"), False, f"failed: {reason}")]
    for check in plan:
        if check.error:
            rows.append(_row(check, False, f"failed: {check.error}"))
            continue
        if check.judge == "reference":
            final = max((n for n in ref["checkpoints"] if n.startswith("epoch-")), default=None)
            summary = f"trained ({final})" if final else "wrote no epoch checkpoint"
            rows.append(_row(check, final is not None, summary, {"inputs": ref["inputs"]}))
            continue
        try:
            rows.append(_judge_one(check, ref, base, tolerance))
        except CheckpointError as exc:  # a run directory (or trace) that cannot be read fails its check
            rows.append(_row(check, False, f"failed: {exc}"))
    return rows


def _judge_one(check: Check, ref: dict, base: Path, tolerance: float) -> dict:
    def row(passed: bool, summary: str, detail: dict | None = None) -> dict:
        return _row(check, passed, summary, detail)

    run = load_run(base / check.name)
    if check.judge == "link":
        # What was read of the link's run, by digest (the reference's is in its own row).
        detail = compare_link(ref, run, check.compare_at, tolerance) | {"inputs": run["inputs"]}
        stopped = len(check.stages) == 1 or any(n.startswith("step-") for n in run["checkpoints"])
        return row(
            detail["passed"] and stopped,
            detail["summary"] if stopped else "the SIGTERM left no step checkpoint",
            detail,
        )
    if check.judge == "control":
        divergence = compare_traces(_trace(ref), _trace(run))
        differs = divergence.step is not None
        summary = (
            f"differs from global step {divergence.step}, as it must"
            if differs
            else "IDENTICAL: the verdict is meaningless"
        )
        return row(
            differs,
            summary,
            {"first_differing_step": divergence.step, "identical": not differs, "inputs": run["inputs"]},
        )
    result = compare_runs(ref, run, tolerance)
    if check.judge == "other-seed":
        differs = not result["identical"]
        return row(differs, "differs, as it must" if differs else "IDENTICAL: the verdict is meaningless", result)
    return row(result["passed"], summary_line(result), result)


def compare_link(ref: dict, run: dict, name: str, tolerance: float) -> dict:
    """A link's checkpoint `name` against the reference's: the weights (as compare does: tensor by tensor,
    with ULPs), then the rest of the state a resume depends on (optimizer, every RNG, every step's loss and
    the trace's weight digests, the epoch records)."""
    if name not in run["checkpoints"]:
        return {"passed": False, "identical": False, "summary": f"wrote no {name}", "state_differences": []}
    result = compare_runs(
        {**ref, "checkpoints": {name: ref["checkpoints"][name]}, "unreadable": {}},
        {**run, "checkpoints": {name: run["checkpoints"][name]}},
        tolerance,
    )
    a, b = ref["checkpoints"][name], run["checkpoints"][name]
    state = [
        part
        for part, x, y in (
            ("optimizer state", a.content.optimizer, b.content.optimizer),
            ("RNG state", a.content.rng, b.content.rng),
        )
        if weights_digest(x) != weights_digest(y)
    ]
    divergence = compare_traces(_trace(ref, name), _trace(run, name))
    if divergence.step is not None:
        state.append(f"step trace from global step {divergence.step}")
    identical = result["identical"] and not state
    steps = a.manifest.global_step
    if identical:
        summary = f"identical at {name} (weights, optimizer, RNG, {steps} step losses)"
    else:
        summary = summary_line(result) if not result["identical"] else f"weights identical at {name}"
        summary += "".join(f"; {part} differs" for part in state)
    passed = identical or (tolerance > 0 and result["passed"])
    return {**result, "passed": passed, "identical": identical, "summary": summary, "state_differences": state}


def _trace(run: dict, name: str | None = None):
    """The step trace a run's checkpoint holds (the newest if no name is given)."""
    checkpoint = run["checkpoints"][name] if name else next(reversed(run["checkpoints"].values()))
    trace = TrainState.from_checkpoint(checkpoint, checkpoint.manifest.steps_per_epoch).trace
    if trace is None:
        raise CheckpointError(f"checkpoint {checkpoint.path} holds no step trace (made before reprocube traced steps)")
    return trace
