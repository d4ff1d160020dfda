"""B's further runs where it differs from A, each a training child `train` (run_reproduction's) starts:
b-again (does B agree with itself?), b-matched (--match: A's settings emulated where this machine can,
and the recipe of commands it proves), and other seeds (the seed-to-seed spread). Apart from
run_reproduction, which runs B and writes the result: here what each further run asks and finds."""

from __future__ import annotations

import hashlib
import sys
from pathlib import Path

from reprocube.analysis.match_plan import match_outcome, match_plan, recipe_refusal
from reprocube.analysis.receipt_comparison import final_record, seed_spread_of, steps_per_epoch
from reprocube.config import override
from reprocube.errors import EXIT_OK, EXIT_PREEMPTED
from reprocube.formats.trace import compare_traces
from reprocube.orchestration.children import reprocube_command
from reprocube.orchestration.reproduce_workspace import Workspace
from reprocube.results.reproduce_result import B_MATCHED_RUN
from reprocube.runtime.cpu_emulation import EMULATOR, emulator_path
from reprocube.training.checkpoint import epoch_name
from reprocube.training.receipt import RECEIPT, Receipt, read_receipt
from reprocube.training.runs import RunDirectory


def run_match(a: Receipt, b: Receipt, causes: list[dict], train, stop_at: int | None) -> dict:
    """An intervention: re-run B with A's settings where this machine can emulate them, and see whether
    that restores bit-identity (a proof of the cause, and the recipe to reproduce exactly). One process per
    change of settings: A's consecutive sessions under equal settings are one segment (match_plan)."""
    plan = match_plan(a, b, causes, emulator=emulator_path() is not None)
    if plan["segments"]:  # A's sessions ran under different settings: B stops and resumes where A did
        for i, segment in enumerate(plan["segments"]):
            last = i == len(plan["segments"]) - 1
            path = train(
                "b-matched",
                *([] if i == 0 else ["resume=latest"]),
                env=segment["settings"],
                cpu=segment["cpu"],
                stop_at=stop_at if last else segment["to_step"],
            )
        return match_outcome(plan, a, read_receipt(path))
    matched = None
    if plan["settings"] or plan["cpu"]:
        matched = read_receipt(train("b-matched", env=plan["settings"], cpu=plan["cpu"], stop_at=stop_at))
    return match_outcome(plan, a, matched)


def add_recipe(result: dict, a: Receipt, base: list[str], stop_at: int | None, ws: Workspace) -> None:
    """The recipe of a --match that gave A's bits, bound to the run that proved it (inputs.b_matched_receipt):
    report shows it only with that run behind it, under the rule the page applies (match_plan.recipe_refusal)."""
    matched = read_receipt(ws.out / B_MATCHED_RUN)
    recipe = match_recipe(result["match"], base, stop_at)
    refused = recipe_refusal(recipe, a, matched)
    if refused:  # reprocube's own commands: never expected; the result then holds no recipe
        print(f"reprocube: warning: no recipe recorded: {refused}", file=sys.stderr)
        return
    result["match"]["recipe"] = recipe
    result["inputs"]["b_matched_receipt"] = {
        "path": f"{B_MATCHED_RUN}/{RECEIPT}",
        "sha256": hashlib.sha256(matched.raw).hexdigest(),
    }


def match_recipe(match: dict, base: list[str], stop_at: int | None) -> list[dict]:
    """The commands --match ran that gave A's bits, for a person to run: each {env, argv} (env: a value, or
    None to unset), A's config as the overrides reproduce built (every value quoted as data), one command
    per change of settings, stopped and resumed where A was."""
    segments = match["segments"] or [{"settings": match["settings"], "cpu": match["cpu"], "to_step": None}]
    # The emulator runs an interpreter (it does not search PATH): where any step is emulated, every command
    # names this interpreter, so that all of them run the one reprocube that --match ran
    reprocube = reprocube_command() if any(s["cpu"] for s in segments) else ["reprocube"]
    commands = []
    for i, segment in enumerate(segments):
        last = i == len(segments) - 1
        stop = stop_at if last else segment["to_step"]
        program = [EMULATOR, "-cpu", segment["cpu"], *reprocube] if segment["cpu"] else reprocube
        argv = [
            *program,
            "train",
            *base,
            "output_dir=runs",
            "run_name=a-bits",
            *(["resume=latest"] if i else []),
            *([f"preempt_at_step={stop}"] if stop is not None else []),
        ]
        commands.append({"env": dict(segment["settings"]), "argv": argv})
    return commands


def seed_runs(a: Receipt, seeds: int, train) -> dict:
    """`seeds` runs of A's config with other seeds, trained here: their spread."""
    chosen = [(a.config["seed"] + i) % 2**32 for i in range(1, seeds + 1)]
    finals = [final_record(read_receipt(train(f"seed-{seed}", f"seed={seed}"))) for seed in chosen]
    return seed_spread_of(finals, chosen)


def self_check(a: Receipt, b: Receipt, outcome: dict, train) -> tuple[bool | None, dict]:
    """Does B agree with itself? Recompute B's steps up to the first divergence in a fresh process, from
    B's last epoch checkpoint before it (or from scratch), stopped there by the preemption drill, and
    compare its trace with B's."""
    step = outcome["first_divergence"]["step"]
    spe = steps_per_epoch(b)
    resume = []
    if spe:
        epoch = (step - 1) // spe
        checkpoint = RunDirectory(Path(b.path).parent).checkpoints / epoch_name(epoch)
        if epoch > 0 and checkpoint.is_dir():
            resume = [override("resume", str(checkpoint))]
    path = train("b-again", *resume, f"preempt_at_step={step}", expect=(EXIT_OK, EXIT_PREEMPTED))
    again = read_receipt(path)
    divergence = compare_traces(b.trace, again.trace)
    agrees = divergence.step is None and divergence.common_last >= step
    return agrees, {
        "run": str(path),
        "from": str(checkpoint) if resume else "scratch",
        "to_step": step,
        "compared_steps": max(divergence.common_last - divergence.common_first, 0),
        "first_difference": divergence.step,
    }
