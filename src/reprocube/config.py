"""Configuration: Hydra composition, the user yaml, validation, and the config hash.

The config tree lives in reprocube/conf. A user yaml (e.g. workspace/train.yaml for the MLCube tasks)
is turned into Hydra overrides placed before the command line's, so the command line wins.
"""

from __future__ import annotations

import hashlib
import json
import math
from pathlib import Path
from typing import Any

import yaml
from hydra import compose, initialize_config_module
from hydra.errors import HydraException
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from reprocube.errors import ConfigError

# Keys that name places or presentation, not the computation: they may differ between a run and its
# resumption (and `epochs`, which extends a run). Everything else is part of the config hash.
NON_RESULT_KEYS = frozenset(
    {
        "epochs",
        "resume",
        "output_dir",
        "run_name",
        "data_dir",
        "data.source_dir",
        "dataset.mirrors",
        "log.progress",
    }
)


def load_config(overrides: list[str], config_file: str | None = None) -> DictConfig:
    """Compose the resolved, validated config from the package defaults, a user yaml and overrides."""
    all_overrides = (user_yaml_overrides(config_file) if config_file else []) + list(overrides)
    for override in all_overrides:
        if override.startswith(("+", "~")):
            raise ConfigError(f"{override}: adding or deleting keys is not supported (the config schema is fixed); see --print-config")
    try:
        with initialize_config_module(config_module="reprocube.conf", version_base="1.3"):
            cfg = compose(config_name="config", overrides=all_overrides)
        OmegaConf.resolve(cfg)
    except (HydraException, OmegaConfBaseException) as exc:
        raise ConfigError(f"invalid configuration: {_hydra_message(exc)}") from None
    validate(cfg)
    OmegaConf.set_readonly(cfg, True)
    return cfg


def user_yaml_overrides(path: str) -> list[str]:
    """Flatten a user yaml mapping into Hydra override strings (`a.b=value`)."""
    file = Path(path)
    try:
        loaded = yaml.safe_load(file.read_text())
    except OSError as exc:
        raise ConfigError(f"cannot read config file {path}: {exc.strerror}") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"config file {path} is not valid yaml: {_one_line(exc)}") from None
    if loaded is None:
        return []
    if not isinstance(loaded, dict):
        raise ConfigError(f"config file {path} must hold a mapping of config keys, not {type(loaded).__name__}")
    return [f"{key}={_hydra_literal(value)}" for key, value in _flatten(loaded)]


def _flatten(mapping: dict, prefix: str = ""):
    for key, value in mapping.items():
        dotted = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            yield from _flatten(value, dotted + ".")
        else:
            yield dotted, value


def _hydra_literal(value: Any) -> str:
    """Write a yaml value in Hydra's override grammar (strings quoted, so they stay strings)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf") if math.isinf(value) else repr(value)
    if isinstance(value, str):
        return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"
    if isinstance(value, list):
        return "[" + ",".join(_hydra_literal(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ",".join(f"{k}:{_hydra_literal(v)}" for k, v in value.items()) + "}"
    raise ConfigError(f"unsupported value in config file: {value!r}")


def validate(cfg: DictConfig) -> None:
    """Reject values that would fail later, or silently do something else."""

    def check(ok: bool, message: str) -> None:
        if not ok:
            raise ConfigError(message)

    def positive_int(key: str, allow_zero: bool = False, allow_none: bool = False) -> None:
        value = OmegaConf.select(cfg, key)
        if value is None and allow_none:
            return
        low = 0 if allow_zero else 1
        check(
            isinstance(value, int) and not isinstance(value, bool) and value >= low,
            f"{key} must be an integer >= {low}, got {value!r}",
        )

    seed = cfg.seed
    check(isinstance(seed, int) and not isinstance(seed, bool) and 0 <= seed < 2**32, f"seed must be an integer in [0, 2**32), got {seed!r}")
    for key in ("epochs", "batch_size", "test_batch_size", "threads", "checkpoint.every_epochs"):
        positive_int(key)
    for key in ("checkpoint.every_steps", "log.every_steps"):
        positive_int(key, allow_zero=True)
    for key in ("data.train_limit", "data.test_limit"):
        positive_int(key, allow_none=True)
    check(cfg.device in ("auto", "cpu", "cuda"), f"device must be auto, cpu or cuda, got {cfg.device!r}")
    check(isinstance(cfg.deterministic, bool), f"deterministic must be true or false, got {cfg.deterministic!r}")
    check(cfg.log.progress in ("auto", True, False), f"log.progress must be auto, true or false, got {cfg.log.progress!r}")
    check(cfg.optimizer.name == "sgd", f"optimizer.name must be sgd (the only optimizer so far), got {cfg.optimizer.name!r}")
    for key in ("optimizer.lr", "optimizer.momentum"):
        value = OmegaConf.select(cfg, key)
        check(isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value >= 0, f"{key} must be a finite number >= 0, got {value!r}")
    check(cfg.resume is None or isinstance(cfg.resume, str), f"resume must be latest or a path, got {cfg.resume!r}")
    check(cfg.run_name is None or (isinstance(cfg.run_name, str) and cfg.run_name and "/" not in cfg.run_name and cfg.run_name not in (".", "..")), f"run_name must be a plain directory name, got {cfg.run_name!r}")
    for key, spec in cfg.dataset.files.items():
        check(isinstance(spec.sha256, str) and len(spec.sha256) == 64, f"dataset.files.{key}.sha256 must be a sha256 hex digest")


def run_name(cfg: DictConfig) -> str:
    return cfg.run_name or f"{cfg.framework.name}-seed{cfg.seed}"


def to_plain(cfg: DictConfig) -> dict:
    return OmegaConf.to_container(cfg, resolve=True)


def result_config(config: dict) -> dict:
    """The part of a plain config that determines the computation (all but NON_RESULT_KEYS)."""
    return {k: v for k, v in flatten_keys(config).items() if k not in NON_RESULT_KEYS and not _under(k, NON_RESULT_KEYS)}


def config_hash(config: dict) -> str:
    canonical = json.dumps(result_config(config), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()


def config_differences(saved: dict, current: dict) -> list[str]:
    """Human-readable `key: saved -> current` lines for every result-affecting difference."""
    a, b = result_config(saved), result_config(current)
    missing = object()
    lines = []
    for key in sorted(set(a) | set(b)):
        va, vb = a.get(key, missing), b.get(key, missing)
        if va != vb:
            show = lambda v: "<absent>" if v is missing else json.dumps(v)  # noqa: E731
            lines.append(f"{key}: {show(va)} -> {show(vb)}")
    return lines


def flatten_keys(config: dict, prefix: str = "") -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for key, value in config.items():
        dotted = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            flat.update(flatten_keys(value, dotted + "."))
        else:
            flat[dotted] = value
    return flat


def _under(key: str, prefixes: frozenset[str]) -> bool:
    return any(key.startswith(p + ".") for p in prefixes)


def _hydra_message(exc: BaseException) -> str:
    """Hydra's message, minus its hints that do not apply here (adding keys, search paths)."""
    message = _one_line(exc)
    for tail in (" To append to your config use", " Config search path:", " See https://hydra.cc"):
        message = message.split(tail)[0]
    if message.startswith("Could not override"):
        message += " There is no such key (see --print-config for every key)."
    return message


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split())
