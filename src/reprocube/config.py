"""Configuration: Hydra composition, the user yaml, validation, and the config hash.

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

from reprocube.errors import ConfigError
from reprocube.untrusted import MAX_YAML_BYTES, parse_yaml, read_bytes

# More intra-op threads than any CPU has; more CPUs than this process may use is allowed (a config made
# elsewhere must still run here) but reported by the trainers' env.json and warned about by train.
MAX_THREADS = 1024

# `${` not escaped by an odd number of backslashes: where OmegaConf starts an interpolation.
UNESCAPED_INTERPOLATION = re.compile(r"(?<!\\)(\\\\)*\$\{")
DOTTED_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*")  # used with fullmatch
# The largest batch: a config asking for more is refused before anything is allocated.
MAX_BATCH_SIZE = 1 << 16

# Keys that name places, cadences or presentation, not the computation: they may differ between a run
# and its resumption (and `epochs`, which extends a run). Everything else is part of the config hash.
MAX_TRACE_AT_STEPS = 1000
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


def validate(cfg: DictConfig) -> None:
    """Reject values that would fail later, or silently do something else; normalise number types
    (so that momentum=0 and momentum=0.0 are one config, with one hash). The first bad key is named."""
    check = _Checks(cfg)
    for section in SECTIONS:
        if not OmegaConf.is_dict(OmegaConf.select(cfg, section)):
            raise ConfigError(f"{section} must be a mapping of its keys, got {OmegaConf.select(cfg, section)!r}")
    _validate_counts(check)
    _validate_bench(check)
    _validate_jobs(check)
    _validate_training(check)
    _validate_dataset(check)


# The config's sections: each must be a mapping before its keys are checked.
SECTIONS = (
    "data",
    "optimizer",
    "checkpoint",
    "log",
    "trace",
    "verify",
    "bench",
    "study",
    "study.slurm",
    "verify.slurm",
    "watchdog",
    "dataset",
    "dataset.files",
    "framework",
)


class _Checks:
    """One check per kind of value, each naming the key and what it must be (ConfigError)."""

    def __init__(self, cfg: DictConfig) -> None:
        self.cfg = cfg

    def fail(self, key: str, expected: str) -> None:
        raise ConfigError(f"{key} must be {expected}, got {OmegaConf.select(self.cfg, key)!r}")

    def integer(self, key: str, low: int, high: int | None = None, allow_none: bool = False) -> None:
        value = OmegaConf.select(self.cfg, key)
        if value is None and allow_none:
            return
        if not (_is_int(value) and value >= low and (high is None or value < high)):
            self.fail(key, f"an integer >= {low}" + (f" and < {high}" if high is not None else ""))

    def number(self, key: str, positive: bool = False) -> None:
        value = OmegaConf.select(self.cfg, key)
        if not (_is_number(value) and math.isfinite(value) and (value > 0 if positive else value >= 0)):
            self.fail(key, "a finite number " + ("> 0" if positive else ">= 0"))
        OmegaConf.update(self.cfg, key, float(value))

    def boolean(self, key: str) -> None:
        if not isinstance(OmegaConf.select(self.cfg, key), bool):
            self.fail(key, "true or false")

    def text(self, key: str, allow_none: bool = False) -> None:
        value = OmegaConf.select(self.cfg, key)
        if not ((value is None and allow_none) or _is_clean_text(value)):
            self.fail(key, "a non-empty string without control characters or surrounding spaces")

    def plain_name(self, key: str) -> None:  # a file or directory name under data_dir, never a path elsewhere
        value = OmegaConf.select(self.cfg, key)
        if not (_is_clean_text(value) and "/" not in value and value not in (".", "..")):
            self.fail(key, "a plain file name (no / and not . or ..)")

    def one_of(self, key: str, choices: tuple, expected: str) -> None:
        if OmegaConf.select(self.cfg, key) not in choices:
            self.fail(key, expected)

    def int_list(self, key: str, fits, expected: str, max_length: int | None = None) -> None:
        value = OmegaConf.select(self.cfg, key)
        if not (
            OmegaConf.is_list(value)
            and (max_length is None or len(value) <= max_length)
            and all(_is_int(n) and fits(n) for n in value)
        ):
            self.fail(key, expected)


def _validate_counts(check: _Checks) -> None:
    """The seed, epochs, batch sizes, threads and every step or epoch count."""
    check.integer("seed", 0, 2**32)
    for key in ("epochs", "checkpoint.every_epochs"):
        check.integer(key, 1)
    for key in ("batch_size", "test_batch_size"):
        check.integer(key, 1, MAX_BATCH_SIZE + 1)
    check.integer("threads", 1, MAX_THREADS + 1)
    for key in ("checkpoint.every_steps", "log.every_steps", "trace.every_steps"):
        check.integer(key, 0)
    for key in ("data.train_limit", "data.test_limit", "preempt_at_step", "stop_after_epoch", "verify.mid_epoch_step"):
        check.integer(key, 1, allow_none=True)
    check.boolean("verify.mid_epoch")
    check.boolean("verify.full")
    check.integer("verify.jobs", 1, MAX_THREADS + 1, allow_none=True)
    check.integer("bench.repeats", 1)
    check.int_list(
        "trace.at_steps",
        lambda n: 1 <= n < 2**62,
        f"a list of at most {MAX_TRACE_AT_STEPS} global steps >= 1, e.g. [40,90]",
        MAX_TRACE_AT_STEPS,
    )


def _validate_bench(check: _Checks) -> None:
    check.int_list("bench.verify_epochs", lambda n: 1 <= n <= 1000, "a list of epoch counts, e.g. [2,4,8] ([] to skip)")
    check.int_list("bench.loader_workers", lambda w: 0 <= w <= 64, "a list of worker counts from 0 to 64, e.g. [1,2,4]")
    modes = OmegaConf.select(check.cfg, "bench.deterministic")
    if not (
        OmegaConf.is_list(modes)
        and len(modes) > 0
        and all(isinstance(m, bool) for m in modes)
        and len(set(modes)) == len(modes)
    ):
        check.fail("bench.deterministic", "a list of distinct true/false values, e.g. [true,false]")
    check.text("bench.reference", allow_none=True)
    check.text("bench.out")


def _validate_jobs(check: _Checks) -> None:
    """verify's tolerance, the watchdog, the study, and the launchers of the study's and verify's jobs."""
    cfg = check.cfg
    check.number("verify.tolerance")
    check.number("watchdog.warn_minutes", positive=True)
    if OmegaConf.select(cfg, "watchdog.stop_minutes") is not None:
        check.number("watchdog.stop_minutes", positive=True)
    check.integer("study.runs", 2)  # a standard deviation needs two runs per group
    check.text("study.dir")
    check.integer("study.member", 0, 2 * cfg.study.runs, allow_none=True)
    for section in ("study", "verify"):
        check.one_of(f"{section}.launcher", ("local", "slurm"), "local or slurm")
        check.text(f"{section}.slurm.partition", allow_none=True)
        check.integer(f"{section}.slurm.timeout_min", 1)
        check.integer(f"{section}.slurm.cpus_per_task", 1)
        check.integer(f"{section}.slurm.gpus_per_node", 0)
        check.integer(f"{section}.slurm.mem_gb", 1, allow_none=True)
        extra = OmegaConf.select(cfg, f"{section}.slurm.additional_parameters")
        if not (extra is None or OmegaConf.is_dict(extra)):
            check.fail(f"{section}.slurm.additional_parameters", "a mapping of sbatch options, e.g. {account: myproj}")
    check.text("run", allow_none=True)


def _validate_training(check: _Checks) -> None:
    """The device, the data pipeline, logging, the optimizer, and the places: directories and names."""
    cfg = check.cfg
    check.one_of("device", ("auto", "cpu", "cuda"), "auto, cpu or cuda")
    check.boolean("deterministic")
    check.boolean("data.drop_last")
    check.boolean("data.augment")
    check.integer("data.workers", 0, 65)
    check.one_of("data.pipeline", ("resident", "loader"), "resident or loader")
    check.one_of("data.augment_rng", ("stateless", "stateful"), "stateless or stateful")
    if cfg.data.pipeline == "resident" and (cfg.data.augment or cfg.data.workers):
        raise ConfigError(
            "data.augment and data.workers need data.pipeline=loader (the resident dataset has no loader)"
        )
    if not (cfg.log.progress == "auto" or isinstance(cfg.log.progress, bool)):
        check.fail("log.progress", "auto, true or false")
    check.one_of("optimizer.name", ("sgd",), "sgd (the only optimizer so far)")
    check.number("optimizer.lr")
    check.number("optimizer.momentum")
    if cfg.framework.name == "pytorch":
        check.one_of("framework.memory_format", ("channels_last", "contiguous"), "channels_last or contiguous")
        check.boolean("framework.cuda_graph")
    if cfg.framework.name == "jax":
        check.one_of("framework.conv2", ("matmul", "convolution"), "matmul or convolution")
        check.boolean("framework.device_loop")
    if cfg.framework.name == "tensorflow":
        check.integer("framework.towers", 1, 65)
        check.integer("framework.inter_op_threads", 1, 1025)
        towers, batch = cfg.framework.towers, cfg.batch_size
        if batch < towers:  # every tower needs an example: oneDNN's convolution refuses an empty batch
            raise ConfigError(
                f"framework.towers={towers} needs at least {towers} examples in every batch, and batch_size={batch}"
                f" holds {batch}: set batch_size>={towers} or framework.towers<={batch}"
            )
    for key in ("output_dir", "data_dir"):
        check.text(key)
    check.text("data.source_dir", allow_none=True)
    check.text("resume", allow_none=True)
    if _is_int(cfg.run_name):
        cfg.run_name = str(cfg.run_name)  # run_name=123 is a name, not a number
    name = cfg.run_name
    if not (name is None or (_is_clean_text(name) and "/" not in name and name not in (".", ".."))):
        check.fail("run_name", "a plain directory name")


def _validate_dataset(check: _Checks) -> None:
    """The dataset's name, classes, normalisation and its four files, each pinned by size and sha256."""
    cfg = check.cfg
    check.plain_name("dataset.name")
    check.integer("dataset.num_classes", 2, 257)  # IDX labels are bytes; more classes only cost memory
    check.number("dataset.mean")
    check.number("dataset.std", positive=True)
    for key in ("train_images", "train_labels", "test_images", "test_labels"):
        if key not in cfg.dataset.files:
            raise ConfigError(f"dataset.files.{key} is missing")
    for key, spec in cfg.dataset.files.items():
        check.plain_name(f"dataset.files.{key}.name")
        check.integer(f"dataset.files.{key}.bytes", 1)
        if not (isinstance(spec.sha256, str) and re.fullmatch(r"[0-9a-f]{64}", spec.sha256)):
            check.fail(f"dataset.files.{key}.sha256", "a sha256 hex digest (64 lowercase hex digits)")


def _is_clean_text(value) -> bool:
    """A non-empty string a path or name can be made of: no control characters (a NUL would end it), no
    leading or trailing spaces (invisible in every listing)."""
    return (
        isinstance(value, str)
        and bool(value)
        and value == value.strip()
        and not any(ord(c) < 32 or ord(c) == 127 for c in value)
    )


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


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
