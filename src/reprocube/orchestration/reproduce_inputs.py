"""reproduce's inputs, checked before anything is written: its options' ranges, A's signature and the study
beside it, the overrides the user may give (place keys; others only with --allow-config-change), B's
config built from A's receipt (every value as data), where a partial A stopped, and a study's seed spread.
Apart from run_reproduction, which trains and compares: here nothing runs."""

from __future__ import annotations

from pathlib import Path

from omegaconf import DictConfig

from reprocube.analysis.receipt_comparison import steps_per_epoch
from reprocube.config import flatten_keys, load_config, override, result_config
from reprocube.config_validation import MAX_TRACE_AT_STEPS
from reprocube.errors import CheckpointError, ConfigError
from reprocube.results.study_result import STUDY_RESULT, read_study
from reprocube.training.receipt import SIGNATURE_FILE, Receipt

# Keys that say where things are or how they are shown here: B may set them freely.
PLACE_KEYS = ("data_dir", "data.source_dir", "device", "log.progress", "log.every_steps", "dataset.mirrors")
# Result keys the user may still set with --allow-config-change; they are then reported as causes.
OWN_KEYS = ("output_dir", "run_name", "resume", "preempt_at_step", "epochs")  # reproduce sets these itself


def check_options(seeds: int, ulp: int, stall_timeout: float | None) -> None:
    if seeds < 0 or seeds == 1 or seeds > 64:
        raise ConfigError(f"--seeds must be 0 or from 2 to 64 (a standard deviation needs two runs), got {seeds}")
    if ulp < 0:
        raise ConfigError(f"--ulp must be >= 0, got {ulp}")
    if stall_timeout is not None and not (0 < stall_timeout < float("inf")):
        raise ConfigError(f"--stall-timeout must be a number of seconds > 0, got {stall_timeout}")


def signature_and_study(receipt: Receipt, public_key: Path | None, study: Path | None):
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


def check_overrides(overrides: list[str], allow_config_change: bool) -> tuple[list[str], list[str]]:
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


def overrides_for(receipt: Receipt, user_overrides: list[str]) -> tuple[list[str], DictConfig]:
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


def stop_step(receipt: Receipt) -> int | None:
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


def read_spread_study(path: Path) -> dict:
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
