"""A published run reproduced here (`reprocube reproduce RECEIPT`, the command's twin of check_session): A's
receipt read and checked, B trained here under A's config in --out's workspace, the two compared; where
they differ, B's self-check, the causes ranked, --match's intervention and its recipe, the first differing
operation replayed, other seeds' spread; then reproduce.json, reproduce.md, the page (drawn by the function
the command hands in) and the answer on the terminal. Every child is watched (a hang is reported, and
ended after --stall-timeout); a failed attempt's leftovers in --out are cleared by the next one.

Run A is the published run (its receipt), run B is this machine's retraining of A's config."""

from __future__ import annotations

import hashlib
import os
import shutil
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from omegaconf import DictConfig

from reprocube.analysis.match_plan import match_outcome, match_plan, recipe_refusal, settings_text
from reprocube.analysis.receipt_comparison import (
    compare_receipts,
    final_record,
    loss_ulp,
    ranked_causes,
    seed_spread,
    seed_spread_of,
    session_changes,
    steps_per_epoch,
    summary,
    tier,
)
from reprocube.config import MAX_TRACE_AT_STEPS, flatten_keys, load_config, override, result_config
from reprocube.errors import EXIT_OK, EXIT_PREEMPTED, CheckpointError, ConfigError, ReprocubeError
from reprocube.files import refuse_inside_checkpoints, safe_name, write_file_atomic
from reprocube.formats.env import known_hang, threads_warning, usable_cpus
from reprocube.formats.trace import compare_traces
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
from reprocube.orchestration.reproduce_options import ReproduceOptions
from reprocube.results.reproduce_result import (
    A_RECEIPT_COPY,
    B_MATCHED_RUN,
    REPORT_FILES,
    REPRODUCE_RESULT,
    new_result,
    recipe_lines,
    signature_line,
    verdict_line,
    what_to_do,
    write_reproduce,
)
from reprocube.results.study_result import STUDY_RESULT, read_study
from reprocube.runtime.cpu_emulation import EMULATOR, emulated_command, emulator_path
from reprocube.terminal import counted, one_line
from reprocube.training.checkpoint import epoch_name
from reprocube.training.metrics import last_logged_step
from reprocube.training.receipt import RECEIPT, SIGNATURE_FILE, Receipt, read_receipt
from reprocube.training.runs import RunDirectory

# Keys that say where things are or how they are shown here: B may set them freely.
PLACE_KEYS = ("data_dir", "data.source_dir", "device", "log.progress", "log.every_steps", "dataset.mirrors")
# Result keys the user may still set with --allow-config-change; they are then reported as causes.
OWN_KEYS = ("output_dir", "run_name", "resume", "preempt_at_step", "epochs")  # reproduce sets these itself


@dataclass
class _Workspace:
    """The --out directory: B's runs and their logs, and the reports."""

    out: Path

    @property
    def runs(self) -> Path:
        return self.out / "runs"

    @property
    def logs(self) -> Path:
        return self.out / "logs"


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
    _check_options(seeds, ulp, stall_timeout)
    source = Path(source)
    if not source.exists():
        raise ConfigError(f"{source} does not exist (give a receipt.json or a run directory)")
    receipt = read_receipt(source)
    signature, study_path, unsigned = _signature_and_study(receipt, public_key, study)
    spread_study = _read_spread_study(study_path) if study_path is not None else None
    user_overrides, user_config_changes = _check_overrides(overrides, allow_config_change)
    base, b_config = _overrides_for(receipt, user_overrides)
    oversubscribed = threads_warning(b_config.framework.name, b_config.threads, usable_cpus())
    if oversubscribed and not allow_oversubscribe:
        raise ConfigError(f"A's config: {oversubscribed}; pass --allow-oversubscribe to train it anyway")
    stop_at = _stop_step(receipt)
    ws = _workspace(out, receipt)  # only now, with every input accepted, is anything written
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
            result["self_consistent"], result["self_check"] = _self_check(receipt, b, outcome, train)
        if match:
            result["match"] = _match(receipt, b, result["causes"], train, stop_at)
            if result["match"]["bit_identical"]:  # proven: the command lines that give A's bits here
                _add_recipe(result, receipt, base, stop_at, ws)
        result["first_operation"] = _first_operation(result, b_path, user_overrides, ws, stall_timeout, echo)
    if spread_study is None and seeds >= 2 and final_record(receipt) and final_record(b):
        spread_study = _seed_runs(receipt, seeds, train)
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


def _check_options(seeds: int, ulp: int, stall_timeout: float | None) -> None:
    if seeds < 0 or seeds == 1 or seeds > 64:
        raise ConfigError(f"--seeds must be 0 or from 2 to 64 (a standard deviation needs two runs), got {seeds}")
    if ulp < 0:
        raise ConfigError(f"--ulp must be >= 0, got {ulp}")
    if stall_timeout is not None and not (0 < stall_timeout < float("inf")):
        raise ConfigError(f"--stall-timeout must be a number of seconds > 0, got {stall_timeout}")


def _signature_and_study(receipt: Receipt, public_key: Path | None, study: Path | None):
    """The checked signature (None: not asked), the study to measure the spread with (--study, or one
    beside an unsigned receipt), and what lies beside the receipt unsigned or unchecked."""
    signature = None
    if public_key is not None:
        from reprocube.training.signing import verify_receipt_signature  # cryptography: only when asked

        signature = verify_receipt_signature(receipt.raw, receipt.path, public_key)
    study_path, unsigned = study, []
    beside = _study_beside(receipt.path) if study is None else None
    if beside is not None and signature is not None:  # the signature covers receipt.json, nothing beside it
        unsigned.append(
            f"{beside / STUDY_RESULT.name}: beside the signed receipt, not signed: ignored (pass --study to use it)"
        )
    elif beside is not None:
        study_path = beside
    if signature is None and (receipt.path.parent / SIGNATURE_FILE).is_file():
        unsigned.append(
            f"{receipt.path.parent / SIGNATURE_FILE}: a signature beside the receipt, NOT checked (pass --public-key)"
        )
    return signature, study_path, unsigned


def _announce(receipt: Receipt, stop_at, ws: _Workspace, signature, unsigned, oversubscribed, echo) -> None:
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


def _echo_answer(result: dict, ws: _Workspace, echo) -> None:
    """As reproduce.md and the page: the verdict line, the details, what to do (and the recipe, to copy)."""
    echo(one_line(f"verdict: {result['verdict']}: {verdict_line(result)}"))
    echo(f"  {result['summary']}")
    for line in what_to_do(result):
        echo(one_line(line))
    for line in recipe_lines((result["match"] or {}).get("recipe") or []):
        echo(f"  {line}")
    echo(f"written: {ws.out / REPRODUCE_RESULT.name}, {ws.out / REPRODUCE_RESULT.markdown_name}")


# --- inputs ----------------------------------------------------------------------------------------
def _workspace(out: Path | None, receipt: Receipt) -> _Workspace:
    out = Path(out) if out is not None else Path(f"reproduce-{safe_name(receipt.run_name)}")
    source_dir = receipt.path.parent.resolve()
    resolved = out.resolve()
    if resolved == source_dir or source_dir in resolved.parents:
        raise ConfigError(f"--out {out} is inside {source_dir}: reproduce never writes under the published run")
    refuse_inside_checkpoints(out)
    if out.is_symlink() or (out.exists() and not out.is_dir()):
        raise ConfigError(f"--out {out} exists and is not a directory")
    if out.is_dir() and any(out.iterdir()):
        _clear_failed_attempt(out)
    out.mkdir(parents=True, exist_ok=True)
    write_file_atomic(out / ATTEMPT_MARKER, b'{"reprocube_reproduce": 1}\n')  # first: what follows is ours
    return _Workspace(out)


# Written first into --out; with no reproduce.json beside it, the directory holds a reproduce that did not
# finish, and a rerun may replace what it left. Only these names: anything else there is not ours.
ATTEMPT_MARKER = ".reprocube-reproduce"
ATTEMPT_NAMES = {"runs", "logs", "operations", "a", *REPORT_FILES, REPRODUCE_RESULT.markdown_name}


def _clear_failed_attempt(out: Path) -> None:
    """A non-empty --out is refused unless it holds exactly what an unfinished reproduce leaves (its
    marker, no reproduce.json): then those leftovers are removed, links unlinked, never followed."""
    marker = out / ATTEMPT_MARKER
    names = {entry.name for entry in out.iterdir()}
    if not (marker.is_file() and not marker.is_symlink()) or REPRODUCE_RESULT.name in names:
        raise ConfigError(f"--out {out} is not empty (an earlier reproduce?); remove it or choose another --out")
    others = sorted(names - ATTEMPT_NAMES - {ATTEMPT_MARKER})
    if others:
        raise ConfigError(
            f"--out {out} holds an unfinished reproduce and {others[0][:80]!r}, which reproduce did not "
            "write: nothing removed; remove it or choose another --out"
        )
    for name in sorted(names - {ATTEMPT_MARKER}):
        path = out / name
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        else:
            path.unlink()


def _check_overrides(overrides: list[str], allow_config_change: bool) -> tuple[list[str], list[str]]:
    """Place keys pass; any other key is refused unless --allow-config-change, then reported as a cause."""
    allowed, changes = [], []
    for given in overrides:
        key, sep, _ = given.partition("=")
        key = key.strip()
        if not sep or not key or key.startswith(("+", "~")):
            raise ConfigError(f"{given!r}: an override is KEY=VALUE")
        if key.startswith(OWN_KEYS) or key in ("framework", "dataset"):
            raise ConfigError(f"{key}: reproduce sets it itself (A's config, --out); it cannot be overridden")
        if key in PLACE_KEYS:
            allowed.append(given)
        elif allow_config_change:
            allowed.append(given)
            changes.append(key)
        else:
            raise ConfigError(
                f"{key}: only place keys may be overridden ({', '.join(PLACE_KEYS)}); to change A's config "
                f"anyway, and have it reported as a config difference, pass --allow-config-change"
            )
    return allowed, changes


def _overrides_for(receipt: Receipt, user_overrides: list[str]) -> tuple[list[str], DictConfig]:
    """A's exact config as Hydra overrides (the user's place keys last): its framework group, then every
    result-affecting key, then its epochs and cadences (trace.every_steps, so that B's boundaries fall
    where A's did). The receipt is untrusted: each value goes through config.override, as data (quoted;
    a key that is not a dotted name or a value holding an interpolation is refused)."""
    config = receipt.config
    keys = dict(result_config(config))
    flat = flatten_keys(config)
    for key in ("epochs", "trace.every_steps", "checkpoint.every_epochs", "checkpoint.every_steps"):
        if key in flat:
            keys[key] = flat[key]
    keys["epochs"] = _epochs_to_train(receipt)
    try:
        overrides = [override("framework", config["framework"]["name"])]
        overrides += [override(k, v) for k, v in sorted(keys.items())]
    except ConfigError as exc:
        raise CheckpointError(f"{receipt.path}: config: {exc}") from None
    # B digests its weights wherever A's trace holds digests (where A's sessions were stopped and resumed,
    # or where A itself was asked to): every claim of a genuine receipt is then compared.
    at_steps = _boundaries_to_record(receipt)
    if at_steps:
        overrides.append(f"trace.at_steps=[{','.join(str(int(step)) for step in at_steps)}]")
    overrides += user_overrides
    try:
        cfg = load_config(overrides)  # here, not in a child: a key this reprocube does not know is named at once
    except ConfigError as exc:
        raise ConfigError(
            f"{receipt.path}: A's config (with the given place keys) cannot be built here: {exc}"
        ) from None
    return overrides, cfg


def _boundaries_to_record(receipt: Receipt) -> list[int]:
    """A's boundary steps that B's own cadence (trace.every_steps, epoch ends) does not give, at most
    MAX_TRACE_AT_STEPS of them (the first; A's digests beyond stay claims not checked, and say so)."""
    every = receipt.trace.every_steps
    spe = steps_per_epoch(receipt)
    steps = [
        b.step
        for b in receipt.trace.boundaries
        if b.step > 0 and not (every and b.step % every == 0) and not (spe and b.step % spe == 0)
    ]
    return steps[:MAX_TRACE_AT_STEPS]


def _stop_step(receipt: Receipt) -> int | None:
    """A partial receipt (A stopped mid-epoch and never resumed): B stops where A did, so that A's weights
    there are compared and B trains nothing A did not (None: B trains its epochs to their end)."""
    position = receipt.value["position"]
    return receipt.global_step if not receipt.complete and position["step_in_epoch"] else None


def _epochs_to_train(receipt: Receipt) -> int:
    """B trains what A's records show A trained, never more: a receipt's config may claim any number of
    epochs, its trace and epoch records are what A did (a stopped A: to its last, partial epoch)."""
    position = receipt.value["position"]
    return receipt.epoch + (1 if position["step_in_epoch"] else 0) if not receipt.complete else receipt.epoch


def _study_beside(receipt_path: Path) -> Path | None:
    """A study published with the run: beside the receipt, or in a study/ directory there."""
    for directory in (receipt_path.parent, receipt_path.parent / "study"):
        if (directory / STUDY_RESULT.name).is_file():
            return directory
    return None


def _read_spread_study(path: Path) -> dict:
    """The different-seed group of a study (its directory or study.json): the std of the final test
    accuracy and loss, and each run's values (read_study checks every field)."""
    path = Path(path)
    if not path.is_dir() and path.name != STUDY_RESULT.name:
        raise ConfigError(f"--study {path}: give a study directory or its {STUDY_RESULT.name}")
    directory = path if path.is_dir() else path.parent
    study = read_study(directory)
    runs = [r for r in study["runs"] if r["group"] == "different_seeds"]
    group = study["groups"]["different_seeds"]
    spread = {"source": "study", "path": str(directory / STUDY_RESULT.name), "runs": group["runs"]}
    for metric in ("test_accuracy", "test_loss"):
        spread[metric] = {"std": group[metric]["std"], "values": [r[metric] for r in runs]}
    return spread


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


def _match(a: Receipt, b: Receipt, causes: list[dict], train, stop_at: int | None) -> dict:
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


def _add_recipe(result: dict, a: Receipt, base: list[str], stop_at: int | None, ws: _Workspace) -> None:
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


def _first_operation(
    result: dict, b_path: Path, user_overrides: list[str], ws: _Workspace, stall_timeout: float | None, echo
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


def _seed_runs(a: Receipt, seeds: int, train) -> dict:
    """`seeds` runs of A's config with other seeds, trained here: their spread."""
    chosen = [(a.config["seed"] + i) % 2**32 for i in range(1, seeds + 1)]
    finals = [final_record(read_receipt(train(f"seed-{seed}", f"seed={seed}"))) for seed in chosen]
    return seed_spread_of(finals, chosen)


def _self_check(a: Receipt, b: Receipt, outcome: dict, train) -> tuple[bool | None, dict]:
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


def _report(report, ws: _Workspace, receipt: Receipt, b_path: Path, result: dict, echo) -> None:
    """report.html beside reproduce.json (the verdict and causes first, then B - A)."""
    try:
        path = report(ws.out, receipt, b_path, result)
    except (ReprocubeError, OSError) as exc:  # the verdict is written: a failed page must not hide it
        print(f"reprocube: warning: no report.html ({exc})", file=sys.stderr)
        return
    echo(f"report: {path}")
