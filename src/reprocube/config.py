"""Configuration: Hydra composition, the user yaml, and the config hash (validation: reprocube.config_validation).

The config tree lives in reprocube/conf. A user yaml (e.g. workspace/train.yaml for the MLCube tasks)
is turned into Hydra overrides placed before the command line's, so the command line wins.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from pathlib import Path
from typing import Any

from hydra import compose, initialize_config_module
from hydra.errors import HydraException
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from reprocube.config_validation import validate
from reprocube.errors import ConfigError
from reprocube.untrusted import MAX_YAML_BYTES, parse_yaml, read_bytes

# `${` not escaped by an odd number of backslashes: where OmegaConf starts an interpolation.
UNESCAPED_INTERPOLATION = re.compile(r"(?<!\\)(\\\\)*\$\{")
DOTTED_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*")  # used with fullmatch

# Keys that name places, cadences or presentation, not the computation: they may differ between a run
# and its resumption (and `epochs`, which extends a run). Everything else is part of the config hash.
NON_RESULT_KEYS = frozenset(
    {
        "epochs",
        "resume",
        "output_dir",
        "run_name",
        "data_dir",
        "data.source_dir",
        "data.workers",
        "framework.inter_op_threads",  # TensorFlow: schedules whole kernels, never splits one (same bits)
        "dataset.mirrors",
        "checkpoint.every_epochs",
        "checkpoint.every_steps",
        "log.every_steps",
        "log.progress",
        "trace.every_steps",
        "trace.at_steps",
        "preempt_at_step",
        "stop_after_epoch",
        "run",
        "verify",
        "bench",
        "study",
        "watchdog",
    }
)

# Keys that were result keys when earlier checkpoints and receipts were written: their recorded
# config_hash includes them, which config_hash_matches accepts.
FORMER_RESULT_KEYS = ("framework.inter_op_threads",)
# Result keys added after runs were made: a config written before holds none of them, and computed what
# the value here gives (framework name -> key -> value). A saved config is read with it filled in, so that
# an old run resumes, and an old receipt is reproduced, as it was computed; its config_hash stays the
# hash of the config as written.
ADDED_RESULT_KEYS = {
    "pytorch": {"framework.memory_format": "contiguous", "framework.cuda_graph": False},
    "jax": {"framework.conv2": "convolution", "framework.device_loop": False},
    "tensorflow": {"framework.towers": 1},
}
GROUPS = ("framework", "dataset")  # the config groups: conf/GROUP/NAME.yaml, chosen by GROUP=NAME


def load_config(overrides: list[str], config_files: list[str] = ()) -> DictConfig:
    """Compose the resolved, validated config from the package defaults, user yamls and overrides
    (in that order: a later file overrides an earlier one, the command line overrides them all)."""
    all_overrides = config_files_overrides(config_files) + list(overrides)
    for override in all_overrides:
        if override.startswith(("+", "~")):
            raise ConfigError(
                f"{override}: adding or deleting keys is not supported (the config schema is fixed); see --print-config"
            )
        key, _, value = (part.strip() for part in override.partition("="))
        if not key:
            raise ConfigError(f"{override!r}: an override is KEY=VALUE (see --print-config for every key)")
        if key in GROUPS and not PLAIN_WORD.fullmatch(value):  # Hydra fails on a list or number here
            raise ConfigError(f"{override!r}: {key} takes the name of one of its configs (conf/{key}/NAME.yaml)")
    try:
        with initialize_config_module(config_module="reprocube.conf", version_base="1.3"):
            cfg = compose(config_name="config", overrides=all_overrides)
    except (HydraException, OmegaConfBaseException, ValueError) as exc:  # ValueError: e.g. a group given 3
        raise ConfigError(f"invalid configuration: {_hydra_message(exc)}") from None
    try:
        OmegaConf.resolve(cfg)
    except (OmegaConfBaseException, ValueError) as exc:
        raise ConfigError(f"invalid configuration: {_unresolvable_key(cfg)}{_hydra_message(exc)}") from None
    _refuse_unresolved_interpolations(cfg)
    validate(cfg)
    OmegaConf.set_readonly(cfg, True)
    return cfg


def _escape_interpolations(text: str) -> str:
    r"""`text` with each `${` escaped for OmegaConf (`\${`), the backslashes just before it doubled."""
    return re.sub(r"(\\*)\$\{", lambda m: m.group(1) * 2 + "\\${", text)


def _refuse_unresolved_interpolations(cfg: DictConfig) -> None:
    r"""After resolution no stored value may hold an unescaped `${`: a command line's `\${x}` resolves to
    the text `${x}`, which every later read of the config would try to resolve again (and fail)."""
    for key, value in flatten_keys(OmegaConf.to_container(cfg, resolve=False)).items():
        if isinstance(value, str) and UNESCAPED_INTERPOLATION.search(value):
            raise ConfigError(f"{key}: holds an interpolation that resolution left unresolved (write \\\\${{ for ${{)")


def config_files_overrides(paths: list[str]) -> list[str]:
    return [line for path in paths for line in user_yaml_overrides(path)]


def user_yaml_overrides(path: str) -> list[str]:
    """Flatten a user yaml mapping into Hydra override strings (`a.b=value`)."""
    loaded = parse_yaml(
        read_bytes(Path(path), MAX_YAML_BYTES, ConfigError, follow_links=True), f"config file {path}", ConfigError
    )
    if loaded is None:
        return []
    if not isinstance(loaded, dict):
        raise ConfigError(f"config file {path} must hold a mapping of config keys, not {type(loaded).__name__}")
    return [_override_from(path, key, value) for key, value in flatten_keys(loaded).items()]


def _override_from(path: str, key: str, value: Any) -> str:
    try:
        return override(key, value)
    except ConfigError as exc:
        raise ConfigError(f"config file {path}: {key}: {exc}") from None


def override(key: str, value: Any) -> str:
    """`key=value` for a child's (or Hydra's) command line with `value` as data: quoted, so that a path
    holding `,` `'` `=` or spaces stays one string. Every override built from a value reprocube did not
    type itself (a path, a receipt's or a run's config, a user yaml's value) is built here."""
    if not (isinstance(key, str) and DOTTED_NAME.fullmatch(key)) or key.split(".")[0] == "hydra":
        # hydra.*: Hydra's own settings (a searchpath loads config groups from anywhere) are never data
        raise ConfigError(f"{_shown(str(key))} cannot be a reprocube config key (dotted names of letters, digits, _)")
    return f"{key}={hydra_literal(value)}"


PLAIN_WORD = re.compile(r"[A-Za-z_][A-Za-z0-9_-]{0,63}")  # no quote, $, paren, comma, dot or space: never grammar
HYDRA_WORDS = {"null", "true", "false", "nan", "inf"}  # unquoted, Hydra reads these as other types


def hydra_literal(value: Any) -> str:
    """Write a value in Hydra's override grammar so that it reaches the config as that very value:
    strings quoted (inside quotes no `,` `=` `[` or space is grammar) and every `${` escaped, twice, for
    OmegaConf (load_config resolves the composed config, which unescapes once, and OmegaConf parses the
    stored string again on every read): a string is never an interpolation (`${oc.env:X}` would read this
    machine's environment). run.sh's hydra_path does the same in bash."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf") if math.isinf(value) else repr(value)
    if isinstance(value, str) and PLAIN_WORD.fullmatch(value) and value.lower() not in HYDRA_WORDS:
        return value  # a plain word is a string in Hydra's grammar too: recipes a person reads stay readable
    if isinstance(value, str):
        escaped = _escape_interpolations(_escape_interpolations(value))
        # In Hydra's quoted strings only a quote, and the backslashes before a quote or the closing
        # quote, need escaping.
        escaped = re.sub(r"(\\*)'", lambda m: m.group(1) * 2 + "\\'", escaped)
        return "'" + re.sub(r"(\\+)$", lambda m: m.group(1) * 2, escaped) + "'"
    if isinstance(value, list):
        return "[" + ",".join(hydra_literal(v) for v in value) + "]"
    if isinstance(value, dict):
        if not all(isinstance(k, str) and DOTTED_NAME.fullmatch(k) and "." not in k for k in value):
            raise ConfigError(f"{_shown(str(list(value)))}: a mapping's keys must be plain names")
        return "{" + ",".join(f"{k}:{hydra_literal(v)}" for k, v in value.items()) + "}"
    raise ConfigError(f"unsupported value in config file: {value!r}")


def run_name(cfg: DictConfig) -> str:
    return cfg.run_name or f"{cfg.framework.name}-seed{cfg.seed}"


def to_plain(cfg: DictConfig) -> dict:
    return OmegaConf.to_container(cfg, resolve=True)


def result_config(config: dict, keep: tuple[str, ...] = ()) -> dict:
    """The part of a plain config that determines the computation (all but NON_RESULT_KEYS, save `keep`),
    with the ADDED_RESULT_KEYS a config written before them lacks filled in as they computed."""
    keys = _result_keys_as_written(config, keep)
    framework = config.get("framework")
    name = framework.get("name") if isinstance(framework, dict) else None
    for key, value in ADDED_RESULT_KEYS.get(name, {}).items() if isinstance(name, str) else ():
        keys.setdefault(key, value)
    return keys


def _result_keys_as_written(config: dict, keep: tuple[str, ...] = ()) -> dict:
    return {
        k: v
        for k, v in flatten_keys(config).items()
        if k in keep or (k not in NON_RESULT_KEYS and not _under(k, NON_RESULT_KEYS))
    }


def config_hash(config: dict, keep: tuple[str, ...] = ()) -> str:
    """The sha256 of the result keys as the config holds them (nothing filled in: a hash recorded before a
    key was added still matches its config)."""
    canonical = json.dumps(_result_keys_as_written(config, keep), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()


def config_hash_matches(config: dict, recorded: str) -> bool:
    """Whether `recorded` is the config's hash, as written now or before FORMER_RESULT_KEYS left the hash."""
    return recorded in (config_hash(config), config_hash(config, keep=FORMER_RESULT_KEYS))


def config_differences(saved: dict, current: dict) -> list[str]:
    """Human-readable `key: saved -> current` lines for every result-affecting difference."""
    a, b = result_config(saved), result_config(current)
    missing = object()
    lines = []
    for key in sorted(set(a) | set(b)):
        va, vb = a.get(key, missing), b.get(key, missing)
        if va is missing or vb is missing or json.dumps(va, sort_keys=True) != json.dumps(vb, sort_keys=True):
            show = lambda v: "<absent>" if v is missing else json.dumps(v)
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


def _unresolvable_key(cfg: DictConfig) -> str:
    """The first interpolated key that does not resolve to a plain value, as "key: " (OmegaConf's error
    does not always say)."""
    for key, raw in flatten_keys(OmegaConf.to_container(cfg, resolve=False)).items():
        if not (isinstance(raw, str) and "${" in raw):
            continue
        try:
            value = OmegaConf.select(cfg, key, throw_on_resolution_failure=True)
        except (OmegaConfBaseException, ValueError):
            return f"{key}: "
        if not (value is None or isinstance(value, (str, int, float, bool))):
            return f"{key}: "
    return ""


def _hydra_message(exc: BaseException) -> str:
    """Hydra's message, minus its hints that do not apply here (adding keys, search paths)."""
    message = _one_line(exc)
    key = getattr(exc, "full_key", None)  # OmegaConf's errors know the key they are about
    if key and key not in message:
        message = f"{key}: {message}"
    for tail in (" To append to your config use", " Config search path:", " See https://hydra.cc"):
        message = message.split(tail)[0]
    if message.startswith("Could not override"):
        message += " There is no such key (see --print-config for every key)."
    return message


def _shown(value: str) -> str:
    return repr(value if len(value) <= 60 else value[:57] + "...")


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split())
