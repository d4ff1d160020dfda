"""`reprocube reproduce SOURCE [--out DIR] [KEY=VALUE ...]`: retrain a published run here from its receipt
alone, and say whether it reproduces bit for bit. If it does not: the first diverging step and the
tensors that differ there, whether this machine agrees with itself (a second, independent computation of
the same steps), the likely causes ranked (config, code, then the environment), optionally confirmed by
intervention (--match: re-run with A's emulatable settings), and whether the difference matters in units
of the seed-to-seed spread. SOURCE is read only: nothing is ever written under it.

Run A is the published run (its receipt), run B is this machine's retraining of A's config."""

from __future__ import annotations

import hashlib
import json
import math
import os
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from reprocube.commands.children import last_error_line, reprocube_command, run_child
from reprocube.commands.compare import NOT_NUMERIC, env_differences, ulp_statistics
from reprocube.commands.study_results import STUDY_RESULT, read_study
from reprocube.config import config_differences, flatten_keys, load_config, override, result_config
from reprocube.env import refused_match_setting
from reprocube.errors import EXIT_DIFFERENT, EXIT_OK, EXIT_PREEMPTED, CheckpointError, ConfigError, ReprocubeError
from reprocube.files import refuse_inside_checkpoints, safe_name, write_file_atomic, write_json_atomic
from reprocube.metrics import DETERMINISTIC_EPOCH_FIELDS
from reprocube.receipt import SIGNATURE_FILE, Receipt, read_receipt
from reprocube.terminal import one_line
from reprocube.trace import compare_traces

# Keys that say where things are or how they are shown here: B may set them freely.
PLACE_KEYS = ("data_dir", "data.source_dir", "device", "log.progress", "log.every_steps", "dataset.mirrors")
# Result keys the user may still set with --allow-config-change; they are then reported as causes.
OWN_KEYS = ("output_dir", "run_name", "resume", "preempt_at_step", "epochs")  # reproduce sets these itself
# CPU ISA caps that make oneDNN, ATen, MKL and XLA dispatch to AVX2 kernels on an AVX-512 machine.
AVX2_CAPS = {
    "ONEDNN_MAX_CPU_ISA": "AVX2",
    "ATEN_CPU_CAPABILITY": "avx2",
    "MKL_CBWR": "AVX2",
    "MKL_ENABLE_INSTRUCTIONS": "AVX2",
    "XLA_FLAGS": "--xla_cpu_max_isa=AVX2",
}
SEED_SPREAD_Z = 2.0  # within the seed spread: |B - A| <= 2 standard deviations of different-seed runs


def _print_now(line: str) -> None:
    print(line, flush=True)


def run(args) -> int:
    result = reproduce(
        args.source,
        args.out,
        list(args.overrides),
        match=args.match,
        study=args.study,
        seeds=args.seeds,
        public_key=args.public_key,
        allow_config_change=args.allow_config_change,
        ulp=args.ulp,
    )
    return EXIT_OK if result["verdict"] == "bit-identical" else EXIT_DIFFERENT


@dataclass
class _Workspace:
    """The --out directory: B's runs and their logs, and the reports."""

    out: Path
    source_dir: Path

    @property
    def runs(self) -> Path:
        return self.out / "runs"

    @property
    def logs(self) -> Path:
        return self.out / "logs"


def reproduce(
    source: Path,
    out: Path | None,
    overrides: list[str],
    match: bool = False,
    study: Path | None = None,
    seeds: int = 0,
    public_key: Path | None = None,
    allow_config_change: bool = False,
    ulp: int = 16,
    echo=_print_now,
) -> dict:
    started = time.perf_counter()
    if seeds < 0 or seeds == 1 or seeds > 64:
        raise ConfigError(f"--seeds must be 0 or from 2 to 64 (a standard deviation needs two runs), got {seeds}")
    if ulp < 0:
        raise ConfigError(f"--ulp must be >= 0, got {ulp}")
    source = Path(source)
    if not source.exists():
        raise ConfigError(f"{source} does not exist (give a receipt.json or a run directory)")
    receipt = read_receipt(source)
    signature = None
    if public_key is not None:
        from reprocube.signing import verify_receipt_signature  # cryptography: only when asked

        signature = verify_receipt_signature(receipt.raw, receipt.path, public_key)
    study_path, unsigned = study, []
    beside = _study_beside(receipt.path) if study is None else None
    if beside is not None and signature is not None:  # the signature covers receipt.json, nothing beside it
        unsigned.append(
            f"{beside / STUDY_RESULT}: beside the signed receipt, not signed: ignored (pass --study to use it)"
        )
    elif beside is not None:
        study_path = beside
    if signature is None and (receipt.path.parent / SIGNATURE_FILE).is_file():
        unsigned.append(
            f"{receipt.path.parent / SIGNATURE_FILE}: a signature beside the receipt, NOT checked (pass --public-key)"
        )
    spread_study = _read_spread_study(study_path) if study_path is not None else None
    user_overrides, user_config_changes = _check_overrides(overrides, allow_config_change)
    base = _overrides_for(receipt, user_overrides)
    ws = _workspace(out, receipt)  # only now, with every input accepted, is anything written
    framework = receipt.config["framework"]["name"]
    echo(f"reproduce {one_line(str(receipt.path))}: {framework}, seed {receipt.config['seed']}, {receipt.epoch} epochs, "
         f"{receipt.global_step} steps; runs and logs in {ws.out}")  # fmt: skip
    echo(f"  signature: {_signature_line(signature)}")
    for line in unsigned:
        echo(f"  unsigned: {line}")

    def train(name: str, *extra: str, env: dict | None = None, expect=(EXIT_OK,)) -> Path:
        command = reprocube_command(
            "train", *base, override("output_dir", str(ws.runs)), f"run_name={name}", "log.progress=false", *extra
        )
        log = ws.logs / f"{name}.log"
        echo(
            f"  {name}: reprocube train ({' '.join(extra) or 'A config'})" + (f" with {_settings(env)}" if env else "")
        )
        status = _run_with_env(command, log, env)
        if status not in expect:
            raise CheckpointError(f"{name} exited {status}: {last_error_line(log)} (log: {log})")
        return ws.runs / name

    b_started = time.perf_counter()
    b_path = train("b")
    b_wall = time.perf_counter() - b_started
    b = read_receipt(b_path)
    outcome = _compare_receipts(receipt, b)

    result: dict = {
        # What this result is about: the receipt file's bytes (as sha256sum and the signature see them).
        "subject": {
            "receipt_sha256": hashlib.sha256(receipt.raw).hexdigest(),
            "config_hash": receipt.value["config_hash"],
            "final_weights_digest": receipt.epochs[-1]["weights_digest"] if receipt.epochs else None,
        },
        "source": str(receipt.path),
        "source_sha256": receipt.value["receipt_sha256"],
        "signature": None if signature is None else {"key_id": signature.get("key_id"), "verified": True},
        "unsigned": unsigned,
        "run_a": receipt.run_name,
        "run_b": str(b_path),
        "framework": framework,
        "verdict": "bit-identical" if outcome["identical"] else "differs",
        **outcome,
        "causes": [],
        "self_consistent": None,
        "match": None,
        "seed_spread": None,
    }
    result["causes"] = _ranked_causes(receipt, b, user_config_changes)
    if not outcome["identical"]:
        if outcome["first_divergence"] is not None:
            result["self_consistent"], result["self_check"] = _self_check(receipt, b, outcome, train)
        if match:
            result["match"] = _match(receipt, b, result["causes"], train)
    result["seed_spread"] = _seed_spread(receipt, b, spread_study, seeds, train)
    result["ulp"] = _ulp(receipt, b)
    result["tier"], result["tier_text"] = _tier(result, ulp)
    result["summary"] = _summary(result)
    result["wall_s"] = {"total": round(time.perf_counter() - started, 1), "run_b": round(b_wall, 1)}
    _write(ws.out, result)
    _report(ws, receipt, b_path, result, echo)
    echo(f"verdict: {result['summary']}")
    echo(f"written: {ws.out / 'reproduce.json'}, {ws.out / 'reproduce.md'}")
    return result


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
        raise ConfigError(f"--out {out} is not empty (an earlier reproduce?); remove it or choose another --out")
    out.mkdir(parents=True, exist_ok=True)
    return _Workspace(out, source_dir)


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


def _overrides_for(receipt: Receipt, user_overrides: list[str]) -> list[str]:
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
    overrides += user_overrides
    try:
        load_config(overrides)  # here, not in a child: a key this reprocube does not know is named at once
    except ConfigError as exc:
        raise ConfigError(
            f"{receipt.path}: A's config (with the given place keys) cannot be built here: {exc}"
        ) from None
    return overrides


def _epochs_to_train(receipt: Receipt) -> int:
    """B trains what A's records show A trained, never more: a receipt's config may claim any number of
    epochs, its trace and epoch records are what A did (a stopped A: to its last, partial epoch)."""
    position = receipt.value["position"]
    return receipt.epoch + (1 if position["step_in_epoch"] else 0) if not receipt.complete else receipt.epoch


def _signature_line(signature: dict | None) -> str:
    if signature is None:
        return "not checked (no --public-key): the receipt may come from anyone"
    return f"verified (key {signature.get('key_id')}); it covers receipt.json only"


def _study_beside(receipt_path: Path) -> Path | None:
    """A study published with the run: beside the receipt, or in a study/ directory there."""
    for directory in (receipt_path.parent, receipt_path.parent / "study"):
        if (directory / STUDY_RESULT).is_file():
            return directory
    return None


def _read_spread_study(path: Path) -> dict:
    """The different-seed group of a study (its directory or study.json): the std of the final test
    accuracy and loss, and each run's values (read_study checks every field)."""
    path = Path(path)
    if not path.is_dir() and path.name != STUDY_RESULT:
        raise ConfigError(f"--study {path}: give a study directory or its {STUDY_RESULT}")
    directory = path if path.is_dir() else path.parent
    study = read_study(directory)
    runs = [r for r in study["runs"] if r["group"] == "different_seeds"]
    group = study["groups"]["different_seeds"]
    spread = {"source": "study", "path": str(directory / STUDY_RESULT), "runs": group["runs"]}
    for metric in ("test_accuracy", "test_loss"):
        spread[metric] = {"std": group[metric]["std"], "values": [r[metric] for r in runs]}
    return spread


def _run_with_env(command: list[str], log: Path, env: dict | None) -> int:
    """A child with A's settings for an intervention: this environment with `env` applied (None unsets)."""
    if not env:
        return run_child(command, log)
    child_env = {k: v for k, v in os.environ.items() if k not in env or env[k] is not None}
    child_env.update({k: v for k, v in env.items() if v is not None})
    return run_child(command, log, env=child_env)


# --- the comparison --------------------------------------------------------------------------------
def _steps_per_epoch(receipt: Receipt) -> int | None:
    for record in receipt.epochs:
        if record["epoch"] > 0 and record["global_step"] % record["epoch"] == 0:
            return record["global_step"] // record["epoch"]
    return None


def _compare_receipts(a: Receipt, b: Receipt) -> dict:
    """Bit-identical only when B covers all of A (every step, boundary and epoch) and every bit agrees."""
    divergence = compare_traces(a.trace, b.trace)
    reasons = []
    if b.global_step < a.global_step or b.trace.first_step > a.trace.first_step:
        reasons.append(
            f"B covers steps {b.trace.first_step + 1}..{b.global_step}, A {a.trace.first_step + 1}..{a.global_step}"
        )
    epochs_b = {r["epoch"]: r for r in b.epochs}
    epoch_differences = []
    for record in a.epochs:
        other = epochs_b.get(record["epoch"])
        if other is None:
            reasons.append(f"B has no epoch {record['epoch']}")
            continue
        for key in (*DETERMINISTIC_EPOCH_FIELDS[1:], "weights_digest"):
            if record[key] != other[key]:
                epoch_differences.append({"epoch": record["epoch"], "key": key, "a": record[key], "b": other[key]})
    config_changes = [line for line in config_differences(a.config, b.config) if not line.startswith("device:")]
    if config_changes:
        reasons.append(f"B's config differs ({'; '.join(config_changes)})")
    step = divergence.step
    spe = _steps_per_epoch(a) or _steps_per_epoch(b)
    first = None
    if step is not None:
        first = {
            "step": step,
            "epoch": (step - 1) // spe + 1 if spe else None,
            "by": "loss" if divergence.first_loss_step == step else "weights",
            "first_loss_step": divergence.first_loss_step,  # the first step whose loss bits differ
            "last_matching_boundary": divergence.last_matching_boundary,
            # The first update that made the weights differ lies in this window: at the last matching
            # boundary they agree, and a loss computed from differing weights (or a differing forward
            # pass) differs at `step`. trace.every_steps=1 narrows it to one step.
            "window": [(divergence.last_matching_boundary or max(a.trace.first_step, b.trace.first_step)) + 1, step],
            "first_differing_boundary": divergence.first_boundary.step if divergence.first_boundary else None,
            "tensor": divergence.tensors[0] if divergence.tensors else None,
            "tensors": divergence.tensors,
        }
    elif epoch_differences:
        first = None  # the training steps agree; an evaluation differs (see epoch_differences)
    identical = not reasons and not epoch_differences and step is None
    return {
        "identical": identical,
        "first_divergence": first,
        "epoch_differences": epoch_differences,
        "coverage": {
            "a_steps": [a.trace.first_step + 1, a.global_step],
            "b_steps": [b.trace.first_step + 1, b.global_step],
            "compared_steps": max(divergence.common_last - divergence.common_first, 0),
            "compared_boundaries": divergence.compared_boundaries,
            "a_epochs": len(a.epochs),
            "b_epochs": len(b.epochs),
        },
        "reasons": reasons,
    }


def _self_check(a: Receipt, b: Receipt, outcome: dict, train) -> tuple[bool | None, dict]:
    """Does B agree with itself? Recompute B's steps up to the first divergence in a fresh process, from
    B's last epoch checkpoint before it (or from scratch), stopped there by the preemption drill, and
    compare its trace with B's."""
    step = outcome["first_divergence"]["step"]
    spe = _steps_per_epoch(b)
    resume = []
    if spe:
        epoch = (step - 1) // spe
        checkpoint = Path(b.path).parent / "checkpoints" / f"epoch-{epoch:04d}"
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


# --- causes ----------------------------------------------------------------------------------------
def _ranked_causes(a: Receipt, b: Receipt, user_changes: list[str]) -> list[dict]:
    """Config differences first, then the code, then the environment (most likely first); variables
    known not to affect these trainers last, with the reason."""
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
        causes.append({"key": "reprocube.source_sha256", "a": code_a, "b": code_b, "kind": "code", "note": None})
    rows = env_differences(a.env, b.env)
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


def _code(receipt: Receipt) -> str:
    """reprocube's version and installed-source digest, as one comparable string."""
    code = receipt.value.get("reprocube")
    code = code if isinstance(code, dict) else {}
    return f"{code.get('version')} (source sha256 {str(code.get('source_sha256'))[:16]})"


def _match(a: Receipt, b: Receipt, causes: list[dict], train) -> dict:
    """An intervention: re-run B with A's settings where this machine can emulate them, and see whether
    that restores bit-identity (a proof of the cause, and the recipe to reproduce exactly)."""
    env, cannot, not_applied = {}, [], []
    a_vars = a.env.get("env_vars") if isinstance(a.env.get("env_vars"), dict) else {}
    b_vars = b.env.get("env_vars") if isinstance(b.env.get("env_vars"), dict) else {}
    for key in sorted(set(a_vars) | set(b_vars)):
        if f"env_vars.{key}" in NOT_NUMERIC or a_vars.get(key) == b_vars.get(key):
            continue
        refused = refused_match_setting(key, a_vars.get(key))  # only documented variables, checked values
        if refused:
            not_applied.append({"key": key, "reason": refused})
        else:
            env[key] = a_vars.get(key)  # None: unset it
    isa_a = set(_isa(a.env))
    isa_b = set(_isa(b.env))
    if "avx512f" in isa_b and "avx512f" not in isa_a and isa_a:
        for key, value in AVX2_CAPS.items():
            if key not in a_vars:  # A had none: the cap replaces B's value or B's lack of one
                env[key] = value
    missing = sorted(isa_a - isa_b)
    if missing:
        cannot.append(f"A's CPU had {', '.join(missing)}, which this CPU lacks: its kernels cannot run here")
    affecting = [c["key"] for c in causes if c["kind"] == "config"]
    if affecting:
        cannot.append(
            f"config differences ({', '.join(affecting)}) are not emulated: they are A's config, not settings"
        )
    if not_applied:
        cannot.append(
            f"not applied (reported only; --match sets only documented ISA and thread variables): "
            f"{', '.join(row['key'] for row in not_applied)}"
        )
    if not env:
        return {"settings": {}, "ran": False, "bit_identical": None, "cannot": cannot, "not_applied": not_applied,
                "summary": "nothing this machine can emulate differs from A" + (f" ({'; '.join(cannot)})" if cannot else "")}  # fmt: skip
    path = train("b-matched", env=env)
    matched = read_receipt(path)
    outcome = _compare_receipts(a, matched)
    shown = _settings(env)
    summary = (
        f"with {shown}, B reproduces A bit for bit"
        if outcome["identical"]
        else f"with {shown}, B still differs (first at step {(outcome['first_divergence'] or {}).get('step')})"
    )
    return {"settings": env, "ran": True, "run": str(path), "bit_identical": outcome["identical"],
            "cannot": cannot, "not_applied": not_applied, "summary": summary}  # fmt: skip


def _settings(env: dict) -> str:
    return ", ".join(f"{k}={v}" if v is not None else f"{k} unset" for k, v in env.items())


def _isa(env: dict) -> list[str]:
    cpu = env.get("cpu")
    isa = cpu.get("isa") if isinstance(cpu, dict) else None
    return [f for f in isa if isinstance(f, str)] if isinstance(isa, list) else []


# --- does it matter? -------------------------------------------------------------------------------
def _final(receipt: Receipt) -> dict | None:
    return receipt.epochs[-1] if receipt.epochs else None


def _seed_spread(a: Receipt, b: Receipt, study: dict | None, seeds: int, train) -> dict | None:
    """B - A in units of the seed-to-seed standard deviation of the final test metrics, from a study or
    from `seeds` different-seed runs trained here."""
    fa, fb = _final(a), _final(b)
    if fa is None or fb is None:
        return None
    if study is None and seeds >= 2:
        finals = []
        for i in range(1, seeds + 1):
            seed = (a.config["seed"] + i) % 2**32
            finals.append(_final(read_receipt(train(f"seed-{seed}", f"seed={seed}"))))
        study = {
            "source": "seeds",
            "runs": seeds,
            "seeds": [(a.config["seed"] + i) % 2**32 for i in range(1, seeds + 1)],
        }
        for metric in ("test_accuracy", "test_loss"):
            study[metric] = {"std": statistics.stdev(f[metric] for f in finals), "values": [f[metric] for f in finals]}
    if study is None:
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


def _ulp(a: Receipt, b: Receipt) -> dict | None:
    """ULP statistics of the per-step losses over the last epoch both cover (the receipt holds no weights;
    the trace holds every loss bit): how far apart the two computations ended up."""
    first, last = max(a.trace.first_step, b.trace.first_step), min(a.trace.last_step, b.trace.last_step)
    spe = _steps_per_epoch(a) or 1
    start = max(first, last - spe)
    if last <= start:
        return None
    la = a.trace.losses[start - a.trace.first_step : last - a.trace.first_step]
    lb = b.trace.losses[start - b.trace.first_step : last - b.trace.first_step]
    stats = ulp_statistics(la, lb)
    return {"basis": f"training loss of global steps {start + 1}..{last} (float32)", **stats}


def _tier(result: dict, max_ulp: int) -> tuple[str, str]:
    if result["verdict"] == "bit-identical":
        return "bit-identical", "bit-identical: every loss bit and weight digest of A reproduced"
    ulp = result.get("ulp")
    if (
        ulp
        and ulp["sign_flips"] == 0
        and ulp["max_ulp"] <= max_ulp
        and result["coverage"]["b_steps"][1] >= result["coverage"]["a_steps"][1]
    ):
        return "within-ulp", (
            f"differs within {max_ulp} ULP ({ulp['basis']}: max {ulp['max_ulp']}, median {ulp['median_ulp']:g}, "
            f"p99 {ulp['p99_ulp']:g} ULP, max relative {ulp['max_relative']:.2g})"
        )
    spread = result.get("seed_spread")
    if spread and all(spread[m].get("in_std") is not None for m in ("test_accuracy", "test_loss")):
        z = max(abs(spread[m]["in_std"]) for m in ("test_accuracy", "test_loss"))
        text = (
            f"test accuracy B - A = {spread['test_accuracy']['difference']:+.4g} "
            f"({spread['test_accuracy']['in_std']:+.2f} seed std), test loss {spread['test_loss']['in_std']:+.2f} seed std"
        )
        if z <= SEED_SPREAD_Z:
            return "within-seed-spread", f"differs within the seed spread (|z| <= {SEED_SPREAD_Z:g}): {text}"
        return "beyond-seed-spread", f"differs BEYOND the seed spread (|z| > {SEED_SPREAD_Z:g}): {text}"
    return "spread-unknown", "differs; whether it matters is unknown (pass --study PATH or --seeds N)"


def _summary(result: dict) -> str:
    if result["verdict"] == "bit-identical":
        return f"bit-identical ({result['coverage']['compared_steps']} steps, {result['coverage']['a_epochs']} epochs)"
    parts = []
    first = result["first_divergence"]
    if first:
        tensor = f", tensor {first['tensor']}" if first.get("tensor") else ""
        parts.append(f"differs from global step {first['step']} (epoch {first['epoch']}{tensor})")
    elif result["epoch_differences"]:
        d = result["epoch_differences"][0]
        parts.append(f"training steps agree but epoch {d['epoch']} {d['key']} differs")
    else:
        parts.append("differs")
    parts += result["reasons"]
    if result["self_consistent"] is not None:
        parts.append(
            "B is deterministic but computes differently" if result["self_consistent"] else "B is NON-DETERMINISTIC"
        )
    likely = [c for c in result["causes"] if c["kind"] != "not-numeric"]
    if likely:
        parts.append(f"likely cause: {likely[0]['key']} ({_shown(likely[0]['a'])} -> {_shown(likely[0]['b'])})")
    if result["match"] and result["match"]["ran"]:
        parts.append(result["match"]["summary"])
    parts.append(result["tier_text"])
    return one_line("; ".join(parts))  # one line, whatever A's tensor names and values hold


def _shown(value) -> str:
    text = one_line(value if isinstance(value, str) else json.dumps(value))
    return text if len(text) <= 60 else text[:57] + "..."


# --- outputs ---------------------------------------------------------------------------------------
def _write(out: Path, result: dict) -> None:
    write_json_atomic(out / "reproduce.json", result)
    write_file_atomic(out / "reproduce.md", markdown(result).encode())


def markdown(result: dict) -> str:
    first = result["first_divergence"]
    lines = [
        f"# reprocube reproduce: {result['run_a']}",
        "",
        f"**Verdict: {result['verdict']}** ({result['tier']})",
        "",
        result["summary"],
        "",
        f"- receipt: `{result['source']}` (file sha256 {result['subject']['receipt_sha256'][:16]}...)",
        f"- signature: {_signature_line(result['signature'])}",
        *(f"- unsigned: {line}" for line in result["unsigned"]),
        f"- B: `{result['run_b']}`",
        f"- compared: {result['coverage']['compared_steps']} steps (every loss bit), "
        f"{result['coverage']['compared_boundaries']} weight-digest boundaries, {result['coverage']['a_epochs']} epochs",
    ]
    if first:
        lines += [
            "",
            "## First divergence",
            "",
            f"- global step **{first['step']}** (epoch {first['epoch']}), found by its {first['by']}",
            f"- the first update that made the weights differ is one of steps {first['window'][0]}..{first['window'][1]}"
            " (trace.every_steps=1 pins it to one step)",
            f"- last boundary where the weights still agree: {first['last_matching_boundary']}",
            f"- first boundary where they differ: {first['first_differing_boundary']}; tensors: "
            + (", ".join(f"`{t}`" for t in first["tensors"]) or "n/a"),
        ]
    if result["self_consistent"] is not None:
        check = result.get("self_check", {})
        lines += [
            "",
            "## Does B agree with itself?",
            "",
            ("yes: B is deterministic but computes differently from A" if result["self_consistent"]
             else "**no: B is non-deterministic** (a second computation of the same steps differs)")
            + f" (recomputed from {check.get('from')} to step {check.get('to_step')} in a fresh process)",
        ]  # fmt: skip
    lines += ["", "## Likely causes (most likely first)", ""]
    if result["causes"]:
        lines += ["| # | key | A | B | kind | note |", "|---|---|---|---|---|---|"]
        lines += [
            f"| {i} | `{_shown(c['key'])}` | {_shown(c['a'])} | {_shown(c['b'])} | {c['kind']} | {c['note'] or ''} |"
            for i, c in enumerate(result["causes"], 1)
        ]
    else:
        lines.append("none: config, code and recorded environment are the same")
    if result["match"]:
        lines += ["", "## Intervention (--match)", "", result["match"]["summary"]]
        lines += [f"- cannot emulate: {c}" for c in result["match"]["cannot"]]
    lines += ["", "## Does it matter?", "", result["tier_text"]]
    spread = result.get("seed_spread")
    if spread:
        lines.append(f"(seed spread from {spread['source']}, {spread.get('runs')} runs)")
    if result.get("ulp"):
        u = result["ulp"]
        lines.append(
            f"\nULP ({u['basis']}): {u['values_differing']} differ, max {u['max_ulp']}, median {u['median_ulp']:g}, "
            f"p99 {u['p99_ulp']:g}, max relative {u['max_relative']:.3g}, sign flips {u['sign_flips']} (counted apart)"
        )
    lines += ["", f"Wall-clock: {result['wall_s']['total']} s (B's run: {result['wall_s']['run_b']} s)", ""]
    return "\n".join(lines)


def _report(ws: _Workspace, receipt: Receipt, b_path: Path, result: dict, echo) -> None:
    """report.html beside reproduce.json (the verdict and causes first, then B - A)."""
    from reprocube.commands.report import write_reproduce_report  # matplotlib: imported only now

    try:
        path = write_reproduce_report(ws.out, receipt, b_path, result)
    except (ReprocubeError, OSError) as exc:  # the verdict is written: a failed page must not hide it
        print(f"reprocube: warning: no report.html ({exc})", file=sys.stderr)
        return
    echo(f"report: {path}")
