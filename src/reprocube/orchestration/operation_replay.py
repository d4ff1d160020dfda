"""The first differing operation of a reproduction: the first differing global step replayed twice in
fresh processes (`python -m reprocube.orchestration.replay_step`), once as B ran it (this environment,
from B's run) and once under A's settings (as --match emulated them, from the matched run, which is A
bit for bit), each recording every operation of the step; the two recordings compared operation by
operation (reprocube.analysis.first_differing_operation).

Both replays start from the same state: every step before the first differing one agrees. Each replay
must give its own run's loss bits at that step (B's and A's): otherwise the replay did not compute what
the run computed, and no operation is named.

Where B is non-deterministic (its self-check computed other bits), A cannot be emulated and the question
is another one: which operation of B gives other results from the same inputs? `nondeterministic_operation`
records the step twice as B runs it and names the first operation whose inputs agree and whose output
does not (an H100 without the determinism flags: the first use of a non-deterministic kernel)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from reprocube.analysis.first_differing_operation import KERNELS_ONLY, first_differing_operation
from reprocube.errors import ReprocubeError
from reprocube.formats.ops_format import read_ops
from reprocube.orchestration.children import last_error_line, python_module_command
from reprocube.training.backend import FRAMEWORKS

# run_replay(command, log, env) -> exit status: a child run watched like reproduce's training children
RunChild = Callable[[list[str], Path, dict | None], int]


def unavailable(step: int | None, why: str) -> dict:
    return {"status": "unavailable", "step": step, "text": f"first differing operation: not found: {why}"}


def _record(
    framework: str,
    step: int,
    replays,
    out: Path,
    logs: Path,
    place_overrides: list[str],
    run_child: RunChild,
    label: str,
) -> dict:
    """Each (name, run, env) of `replays`: `step` of that run recorded in a fresh process under env, read
    back strictly. {name: recording}, or an entry of reproduce.json (status unavailable or failed) saying
    why not, in `label`'s words."""
    if framework not in FRAMEWORKS:  # every trainer of ours records (Backend.record_ops)
        return unavailable(
            step, f"recording each operation of a step is implemented for {', '.join(FRAMEWORKS)} only, not {framework}"
        )
    out.mkdir(parents=True, exist_ok=True)
    recordings = {}
    for name, run, env, wrap in replays:
        path = out / f"step-{step}-{name}.json"
        log = logs / f"replay-{name}.log"
        command = python_module_command(
            "reprocube.orchestration.replay_step",
            "--run",
            str(run),
            "--step",
            str(step),
            "--out",
            str(path),
            *place_overrides,
        )
        status = run_child(wrap(command) if wrap else command, log, env)
        if status != 0:
            return {
                "status": "failed",
                "step": step,
                "text": f"{label}: the replay as {name} exited {status}: {last_error_line(log)}",
            }
        try:
            recordings[name] = read_ops(path)
        except ReprocubeError as exc:
            return {"status": "failed", "step": step, "text": f"{label}: {exc}"}
    return recordings


def first_operation(
    framework: str,
    step: int,
    b_run: Path,
    matched_run: Path,
    a_settings: dict,
    out: Path,
    logs: Path,
    place_overrides: list[str],
    run_child: RunChild,
    weights_identical: bool = False,
    a_command: Callable[[list[str]], list[str]] | None = None,
) -> dict:
    """Replay `step` as B ran it and under A's settings, and name the first operation whose output
    differs (with its inputs' agreement). One entry of reproduce.json: status in STATUSES, step, text.
    `weights_identical`: the runs' weights are proven equal after every step (losses-only), so an
    unrecorded operation that differs can only be the loss's reduction, never the update. `a_command`:
    how the replay under A's settings is run (on A's emulated CPU: reprocube.runtime.cpu_emulation)."""
    replays = (("b", b_run, None, None), ("a-settings", matched_run, a_settings, a_command))
    recordings = _record(framework, step, replays, out, logs, place_overrides, run_child, "first differing operation")
    if "status" in recordings:  # unavailable or failed
        return recordings
    b_ops, a_ops = recordings["b"], recordings["a-settings"]
    faithful = [
        n for n, ops in recordings.items() if ops["loss_matches_run"] is True and ops["recording_changed_nothing"]
    ]
    entry = {
        "step": step,
        "recordings": [str(out / f"step-{step}-{name}.json") for name in recordings],
        "operations": len(a_ops["ops"]),
    }
    if len(faithful) != len(recordings):
        unfaithful = ", ".join(sorted(set(recordings) - set(faithful)))
        return entry | {
            "status": "failed",
            "text": f"first differing operation: the replay as {unfaithful} did not give its run's loss bits at step "
            f"{step} (or recording it changed the step): no operation is named",
        }
    found = first_differing_operation(a_ops, b_ops)
    if found is None and framework in KERNELS_ONLY:
        candidate = (
            "the loss's reduction to the reported mean (the weights agree after every step, so not the update)"
            if weights_identical
            else "the optimizer's update or the totals: elementwise, fused in the compiled step"
        )
        return entry | {
            "status": "none",
            "text": f"first differing operation: step {step}'s inputs and every one of its kernels agree when "
            "replayed under A's settings and as B ran it: an operation after the last kernel that is not recorded "
            f"({candidate}) computes differently",
        }
    if found is None:
        return entry | {
            "status": "none",
            "text": f"first differing operation: none: every one of the {len(a_ops['ops'])} operations of step {step} "
            "agrees when replayed under A's settings and as B ran it",
        }
    return _found(
        entry, found, f"first differing operation (step {step}, operation {found['index'] + 1} of {len(a_ops['ops'])})"
    )


def nondeterministic_operation(
    framework: str, step: int, b_run: Path, out: Path, logs: Path, place_overrides: list[str], run_child: RunChild
) -> dict:
    """Record `step` twice as B runs it (two fresh processes, this environment, from B's run) and name the
    first operation whose results differ. Neither replay need give B's loss bits: a non-deterministic
    step need not compute what B's run computed, only the same thing from the same inputs; where the two
    replays already enter the step with other state, that is said instead (an earlier step differed)."""
    replays = (("b", b_run, None, None), ("b-again", b_run, None, None))
    label = "first non-deterministic operation"
    recordings = _record(framework, step, replays, out, logs, place_overrides, run_child, label)
    if "status" in recordings:  # unavailable or failed
        return recordings
    first, again = recordings["b"], recordings["b-again"]
    entry = {
        "step": step,
        "recordings": [str(out / f"step-{step}-{name}.json") for name in recordings],
        "operations": len(first["ops"]),
    }
    try:
        found = first_differing_operation(first, again)
    except ValueError as exc:
        return entry | {"status": "failed", "text": f"first non-deterministic operation: {exc}"}
    if found is None:
        within = [n for n, ops in recordings.items() if ops["recording_changed_nothing"] is False]
        hint = (
            f"; but within the replay as {', '.join(within)}, computing the step a second time gave other bits"
            if within
            else ""
        )
        return entry | {
            "status": "none",
            "text": f"first non-deterministic operation: none seen: step {step} recorded twice as B runs it agrees "
            f"in every one of its {len(first['ops'])} operations (the non-determinism did not recur){hint}",
        }
    where = f"step {step} recorded twice as B runs it, operation {found['index'] + 1} of {len(first['ops'])}"
    return _found(entry, found, f"first non-deterministic operation ({where})")


def _found(entry: dict, found: dict, heading: str) -> dict:
    """reproduce.json's entry for a named operation (first_differing_operation's answer)."""
    keys = ("index", "op", "where", "kind", "inputs_equal")
    return entry | {"status": "found"} | {key: found[key] for key in keys} | {"text": f"{heading}: {found['text']}"}
