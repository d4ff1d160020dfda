"""A published run reproduced here (`reprocube reproduce RECEIPT`, the command's twin of check_session): A's
receipt read and checked, B trained here under A's config in --out's workspace, the two compared; where
they differ, B's self-check, the causes ranked, --match's intervention and its recipe, the first differing
operation replayed, other seeds' spread; then reproduce.json, reproduce.md, the page (drawn by the function
the command hands in) and the answer on the terminal. Every child is watched (a hang is reported, and
ended after --stall-timeout); a failed attempt's leftovers in --out are cleared by the next one.

Run A is the published run (its receipt), run B is this machine's retraining of A's config. Its inputs are
checked by reproduce_inputs, --out is reproduce_workspace's, and B's further runs where it differs from A
(b-again, b-matched, other seeds) are reproduce_reruns'."""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from pathlib import Path

from reprocube.analysis.match_plan import settings_text
from reprocube.analysis.receipt_comparison import (
    compare_receipts,
    final_record,
    loss_ulp,
    ranked_causes,
    seed_spread,
    session_changes,
    summary,
    tier,
)
from reprocube.config import override
from reprocube.errors import EXIT_OK, EXIT_PREEMPTED, CheckpointError, ConfigError, ReprocubeError
from reprocube.files import write_file_atomic
from reprocube.formats.env import known_hang, threads_warning, usable_cpus
from reprocube.orchestration.children import (
    PROGRESS_EVERY_S,
    Watchdog,
    environment_with,
    last_error_line,
    print_now,
    reprocube_command,
    run_watched,
)
from reprocube.orchestration.operation_replay import first_operation, nondeterministic_operation, unavailable
from reprocube.orchestration.reproduce_inputs import (
    PLACE_KEYS,
    check_options,
    check_overrides,
    overrides_for,
    read_spread_study,
    signature_and_study,
    stop_step,
)
from reprocube.orchestration.reproduce_options import ReproduceOptions
from reprocube.orchestration.reproduce_reruns import add_recipe, run_match, seed_runs, self_check
from reprocube.orchestration.reproduce_workspace import Workspace, workspace
from reprocube.results.reproduce_result import A_RECEIPT_COPY, REPRODUCE_RESULT, new_result, write_reproduce
from reprocube.results.reproduce_wording import recipe_lines, signature_line, verdict_line, what_to_do
from reprocube.runtime.cpu_emulation import emulated_command
from reprocube.terminal import counted, one_line
from reprocube.training.metrics import last_logged_step
from reprocube.training.receipt import Receipt, read_receipt


def reproduce_run(
    source: Path,
    out: Path | None,
    overrides: list[str],
    options: ReproduceOptions,
    echo=print_now,
    report: Callable[[Path, Receipt, Path, dict], Path] | None = None,
) -> dict:
    """A's receipt at `source` retrained here as B, compared, explained (the module's docstring); the result
    written to --out as reproduce.json and .md, and `report(out, A, B's run, result)` draws its page (the
    command passes reprocube.pages' page: orchestration never imports the pages)."""
    match, study, seeds, public_key = options.match, options.study, options.seeds, options.public_key
    allow_config_change, ulp, stall_timeout = options.allow_config_change, options.ulp, options.stall_timeout
    allow_oversubscribe = options.allow_oversubscribe
    started = time.perf_counter()
    check_options(seeds, ulp, stall_timeout)
    source = Path(source)
    if not source.exists():
        raise ConfigError(f"{source} does not exist (give a receipt.json or a run directory)")
    receipt = read_receipt(source)
    signature, study_path, unsigned = signature_and_study(receipt, public_key, study)
    spread_study = read_spread_study(study_path) if study_path is not None else None
    user_overrides, user_config_changes = check_overrides(overrides, allow_config_change)
    base, b_config = overrides_for(receipt, user_overrides)
    oversubscribed = threads_warning(b_config.framework.name, b_config.threads, usable_cpus())
    if oversubscribed and not allow_oversubscribe:
        raise ConfigError(f"A's config: {oversubscribed}; pass --allow-oversubscribe to train it anyway")
    stop_at = stop_step(receipt)
    ws = workspace(out, receipt)  # only now, with every input accepted, is anything written
    _announce(receipt, stop_at, ws, signature, unsigned, oversubscribed, echo)

    a_changed = [o for o in user_overrides if o.partition("=")[0].strip() in user_config_changes]

    def train(
        name: str,
        *extra: str,
        env: dict | None = None,
        cpu: str | None = None,
        expect=(EXIT_OK,),
        stop_at: int | None = None,
    ) -> Path:
        """One training child under A's config (`extra` added), on the emulated CPU model `cpu` if given;
        `stop_at`: stopped there by the drill."""
        if stop_at is not None:
            extra, expect = (*extra, f"preempt_at_step={stop_at}"), (EXIT_PREEMPTED,)
        command = reprocube_command(
            "train", *base, override("output_dir", str(ws.runs)), f"run_name={name}", "log.progress=false", *extra
        )
        if cpu is not None:
            command = emulated_command(command, cpu)
        log = ws.logs / f"{name}.log"
        config = "A's config" + (f" changed by {', '.join(a_changed)}" if a_changed else "")
        echo(
            one_line(
                f"  {name}: reprocube train ({config}{''.join(' ' + e for e in extra)})"
                + (f" with {settings_text(env or {}, cpu=cpu)}" if env or cpu else "")
                + (": an emulated CPU runs 10-30x slower than this one" if cpu else "")
            )
        )
        status = _run_with_env(
            command,
            log,
            env,
            progress=ws.runs / name / "metrics.jsonl",
            stall_timeout=stall_timeout,
            echo=echo,
            total_steps=stop_at or receipt.global_step,
        )
        if status not in expect:
            raise CheckpointError(f"{name} exited {status}: {last_error_line(log)} (log: {log})")
        return ws.runs / name

    b_started = time.perf_counter()
    b_path = train("b", stop_at=stop_at)
    b_wall = time.perf_counter() - b_started
    b = read_receipt(b_path)
    outcome = compare_receipts(receipt, b)
    result = new_result(receipt, b, outcome, signature, unsigned)
    first_step = (outcome["first_divergence"] or {}).get("step")
    result["causes"] = ranked_causes(receipt, b, user_config_changes, at_step=first_step)
    result["a_sessions"] = session_changes(receipt)
    if not outcome["identical"]:
        if outcome["first_divergence"] is not None:
            result["self_consistent"], result["self_check"] = self_check(receipt, b, outcome, train)
        if match:
            result["match"] = run_match(receipt, b, result["causes"], train, stop_at)
            if result["match"]["bit_identical"]:  # proven: the command lines that give A's bits here
                add_recipe(result, receipt, base, stop_at, ws)
        result["first_operation"] = _first_operation(result, b_path, user_overrides, ws, stall_timeout, echo)
    if spread_study is None and seeds >= 2 and final_record(receipt) and final_record(b):
        spread_study = seed_runs(receipt, seeds, train)
    result["seed_spread"] = seed_spread(receipt, b, spread_study)
    result["ulp"] = loss_ulp(receipt, b)
    result["tier"], result["tier_text"] = tier(result, ulp)
    result["summary"] = summary(result)
    result["wall_s"] = {"total": round(time.perf_counter() - started, 1), "run_b": round(b_wall, 1)}
    (ws.out / Path(A_RECEIPT_COPY).parent).mkdir(exist_ok=True)
    write_file_atomic(ws.out / A_RECEIPT_COPY, receipt.raw)
    write_reproduce(result, ws.out)
    if report is not None:
        _report(report, ws, receipt, b_path, result, echo)
    _echo_answer(result, ws, echo)
    return result


def _announce(receipt: Receipt, stop_at, ws: Workspace, signature, unsigned, oversubscribed, echo) -> None:
    """What is reproduced and where its runs go, before anything trains."""
    framework = receipt.config["framework"]["name"]
    trained = f"{counted(receipt.epoch, 'epoch')}, {counted(receipt.global_step, 'step')}"
    if stop_at is not None:
        trained = f"partial: A stopped at global step {stop_at} (epoch {receipt.epoch + 1}); B trains to there"
    echo(
        f"reproduce {one_line(str(receipt.path))}: {framework}, seed {receipt.config['seed']}, {trained}; "
        f"runs and logs in {ws.out}"
    )
    echo(f"  signature: {signature_line(signature)}")
    if oversubscribed:
        echo(f"  warning: {oversubscribed}")
    for line in unsigned:
        echo(f"  unsigned: {line}")


def _echo_answer(result: dict, ws: Workspace, echo) -> None:
    """As reproduce.md and the page: the verdict line, the details, what to do (and the recipe, to copy)."""
    echo(one_line(f"verdict: {result['verdict']}: {verdict_line(result)}"))
    echo(f"  {result['summary']}")
    for line in what_to_do(result):
        echo(one_line(line))
    for line in recipe_lines((result["match"] or {}).get("recipe") or []):
        echo(f"  {line}")
    echo(f"written: {ws.out / REPRODUCE_RESULT.name}, {ws.out / REPRODUCE_RESULT.markdown_name}")


def _run_with_env(
    command: list[str],
    log: Path,
    env: dict | None,
    progress: Path,
    stall_timeout: float | None,
    echo,
    total_steps: int | None = None,
) -> int:
    """A training child, watched (a hang is reported, and ended after --stall-timeout), its progress said
    every PROGRESS_EVERY_S; with A's settings for an intervention: this environment with `env` applied
    (None unsets)."""
    child_env = environment_with(env) if env else None

    def on_stall(seconds: float) -> None:
        hint = known_hang((child_env or os.environ).get("OMP_THREAD_LIMIT"))
        echo(
            f"  {progress.parent.name}: no progress for {seconds:.0f} s (its log and metrics.jsonl unchanged); "
            f"still waiting{f' ({hint})' if hint else ''}; Ctrl-C or --stall-timeout ends it"
        )

    seen: list[tuple[float, int]] = []  # (seconds, global step) when first logged: the rate from there

    def on_progress(seconds: float) -> None:
        if progress.name != "metrics.jsonl":  # a replay: its log is all there is to watch
            echo(f"  {log.stem}: {seconds:.0f} s, running")
            return
        step = last_logged_step(progress)
        if step is None:
            echo(f"  {progress.parent.name}: {seconds:.0f} s, no step logged yet (starting)")
            return
        seen.append((seconds, step))
        (t0, s0), total = seen[0], total_steps
        rate = (step - s0) / (seconds - t0) if seconds > t0 and step > s0 else None
        left = f", about {(total - step) / rate:.0f} s left" if rate and total and total > step else ""
        echo(
            f"  {progress.parent.name}: {seconds:.0f} s, global step {step}"
            + (f" of {total}" if total else "")
            + (f" ({rate:.1f} steps/s{left})" if rate else "")
        )

    watchdog = Watchdog(stop_after_s=stall_timeout, setting=f"--stall-timeout {stall_timeout or 0:g}")
    return run_watched(
        command,
        log,
        [progress],
        on_stall,
        env=child_env,
        watchdog=watchdog,
        on_progress=on_progress,
        progress_every_s=PROGRESS_EVERY_S,
    )


def _first_operation(
    result: dict, b_path: Path, user_overrides: list[str], ws: Workspace, stall_timeout: float | None, echo
) -> dict | None:
    """The operation behind the first differing step: replayed as B ran it and under A's settings, where
    --match showed that B emulates A (bit-identical under A's settings); otherwise why not, plainly."""
    first, match = result["first_divergence"], result["match"]
    if first is None:
        return None  # the training steps agree: no step to replay

    def run_replay(command: list[str], log: Path, env: dict | None) -> int:
        """A replay child: watched like a training child, its log the progress (it logs no metrics)."""
        return _run_with_env(command, log, env, progress=log, stall_timeout=stall_timeout, echo=echo)

    step = first["step"]
    places = [o for o in user_overrides if o.partition("=")[0].strip() in PLACE_KEYS]
    if result.get("self_consistent") is False:  # B differs from itself: which of its operations does?
        step = (result.get("self_check") or {}).get("first_difference") or step
        echo(f"  first non-deterministic operation: recording step {step} twice as B runs it")

        return nondeterministic_operation(
            result["framework"], step, b_path, ws.out / "operations", ws.logs, places, run_replay
        )
    if match is None:
        return unavailable(step, "B must emulate A first: pass --match")
    if not match["bit_identical"]:
        return unavailable(step, "--match did not make B reproduce A bit for bit, so A's step cannot be replayed here")
    settings, cpu = match["settings"], match["cpu"]
    for segment in match["segments"] or []:  # A's settings for the session that computed the step
        if segment["from_step"] < step <= segment["to_step"]:
            settings, cpu = segment["settings"], segment["cpu"]
    echo(f"  first differing operation: replaying step {step} as B ran it and under A's settings")
    return first_operation(
        result["framework"],
        step,
        b_path,
        Path(match["run"]),
        settings,
        ws.out / "operations",
        ws.logs,
        places,
        run_replay,
        weights_identical=bool(first.get("weights_identical")),
        a_command=(lambda command: emulated_command(command, cpu)) if cpu else None,
    )


def _report(report, ws: Workspace, receipt: Receipt, b_path: Path, result: dict, echo) -> None:
    """report.html beside reproduce.json (the verdict and causes first, then B - A)."""
    try:
        path = report(ws.out, receipt, b_path, result)
    except (ReprocubeError, OSError) as exc:  # the verdict is written: a failed page must not hide it
        print(f"reprocube: warning: no report.html ({exc})", file=sys.stderr)
        return
    echo(f"report: {path}")
