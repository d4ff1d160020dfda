"""The config's validation: every key's type and range checked after composition, number types normalised,
the first bad key named (ConfigError)."""

from __future__ import annotations

import math
import re

from omegaconf import DictConfig, OmegaConf

from reprocube.errors import ConfigError

# More intra-op threads than any CPU has; more CPUs than this process may use is allowed (a config made
# elsewhere must still run here) but reported by the trainers' env.json and warned about by train.
MAX_THREADS = 1024
# The largest batch: a config asking for more is refused before anything is allocated.
MAX_BATCH_SIZE = 1 << 16
MAX_TRACE_AT_STEPS = 1000


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
