"""OPS.json, the recording of one replayed step's operations (written by reprocube.training.replay, compared by
reprocube.analysis.first_differing_operation): the format's version, the marker of a step's input and its
strict reader (read_ops), here beside the writer and below the engine that judges it, so that no trainer
imports that engine."""

from __future__ import annotations

import re
from pathlib import Path

from reprocube.errors import CheckpointError
from reprocube.untrusted import Fields, read_json

OPS_VERSION = 1
# JAX's and TensorFlow's recordings hold the step's inputs (one STEP_INPUT entry each) and its kernels only.
STEP_INPUT = "reprocube.step_input"


MAX_OPS_BYTES = 64 << 20


MAX_OPS = 1_000_000


MAX_TENSORS_PER_OP = 10_000


DIGEST = re.compile(r"^[0-9a-f]{16}\Z")


LOSS_BITS = re.compile(r"^[0-9a-f]{8}\Z")


OP_NAME = re.compile(r"^[A-Za-z0-9_.]{1,200}\Z")


MAX_TEXT = 500


TOP_KEYS = (
    "version",
    "framework",
    "step",
    "run",
    "resumed_from",
    "start_step",
    "framework_info",
    "env_vars",
    "loss_f32",
    "run_loss_f32",
    "loss_matches_run",
    "weights_match_run",
    "recording_changed_nothing",
    "ops",
)


OP_KEYS = ("index", "op", "where", "params", "inputs", "outputs")


def read_ops(path: Path) -> dict:
    """OPS.json, every key checked: a regular file (no link) of at most MAX_OPS_BYTES, strict JSON, the
    keys TOP_KEYS and OP_KEYS exactly, each typed; anything else is one CheckpointError line."""
    value = read_json(Path(path), CheckpointError, MAX_OPS_BYTES)
    where = str(path)
    fields = Fields(value, where, CheckpointError)
    _exact_keys(value, TOP_KEYS, where)
    version = fields.integer("version")
    if version != OPS_VERSION:
        raise CheckpointError(f"{where}: version {version} is not one this reprocube reads ({OPS_VERSION})")
    fields.text("framework")
    fields.integer("step", 1)
    fields.text("run")
    fields.nullable("resumed_from", fields.text)
    if fields.integer("start_step") >= value["step"]:
        raise CheckpointError(f"{where}: start_step must be before step")
    info = fields.mapping("framework_info")
    for key, item in info.value.items():
        if not (item is None or isinstance(item, (str, int, float, bool))):
            raise CheckpointError(f"{where}: framework_info.{key} must be a string, number, true, false or null")
    env = fields.mapping("env_vars")
    for key in env.value:
        env.text(key)
    _pattern(fields, "loss_f32", LOSS_BITS, "8 hex digits (a float32's bits)")
    if fields.present("run_loss_f32") is not None:
        _pattern(fields, "run_loss_f32", LOSS_BITS, "8 hex digits (a float32's bits) or null")
    fields.nullable("loss_matches_run", fields.boolean)
    fields.nullable("weights_match_run", fields.boolean)
    fields.boolean("recording_changed_nothing")
    ops = fields.records("ops")
    if len(ops) > MAX_OPS:
        raise CheckpointError(f"{where}: ops holds {len(ops)} operations, more than the {MAX_OPS} allowed")
    for i, op in enumerate(ops):
        _exact_keys(op.value, OP_KEYS, op.where)
        if op.integer("index") != i:
            raise CheckpointError(f"{op.where}: index must be {i} (operations in order)")
        _pattern(op, "op", OP_NAME, "an operation name (letters, digits, _ and .)")
        if len(op.text("where")) > MAX_TEXT:
            raise CheckpointError(f"{op.where}: where is longer than {MAX_TEXT} characters")
        _pattern(op, "params", DIGEST, "16 hex digits")
        for key in ("inputs", "outputs"):
            digests = op.texts(key)
            if len(digests) > MAX_TENSORS_PER_OP or not all(DIGEST.match(d) for d in digests):
                raise CheckpointError(
                    f"{op.where}: {key} must be a list of 16-hex digests (at most {MAX_TENSORS_PER_OP})"
                )
    return value


def _exact_keys(value: dict, keys: tuple[str, ...], where: str) -> None:
    unknown, missing = sorted(set(value) - set(keys)), [k for k in keys if k not in value]
    if unknown or missing:
        problem = f"unknown key {unknown[0]!r}" if unknown else f"{missing[0]} is missing"
        raise CheckpointError(f"{where}: {problem}")


def _pattern(fields: Fields, key: str, pattern: re.Pattern, expected: str) -> str:
    value = fields.value.get(key)
    if not (isinstance(value, str) and pattern.match(value)):
        fields.fail(key, expected)
    return value
