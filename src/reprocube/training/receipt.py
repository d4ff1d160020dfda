"""The run's receipt (receipt.json): all another machine needs to retrain a run and to prove, step by step,
that it computes the same numbers, in a few tens of KB instead of the checkpoints' hundreds.

It holds the resolved config, the environment fingerprint (env.json's), reprocube's version and the
sha256 of its installed source, the dataset's payload sha256s (verified when the data was loaded), every
epoch's record (metrics and weights digest), the checkpoints present, and the step trace
(reprocube.formats.trace). It is rewritten after each checkpoint, so it never describes a state no checkpoint
holds, and carries the sha256 of itself like a manifest: that detects accidents, not forgery (a
signature does: reprocube.training.signing)."""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from pathlib import Path

from reprocube.config import NON_RESULT_KEYS, config_hash_matches
from reprocube.errors import CheckpointError
from reprocube.formats.trace import FINGERPRINT_KEYS, LOSS_KEYS, TENSOR_DIGEST, StepTrace
from reprocube.training.backend import WEIGHT_NAMES
from reprocube.training.checkpoint import HEX_DIGEST, NAME_PATTERN
from reprocube.training.metrics import DETERMINISTIC_EPOCH_FIELDS, check_epoch_record
from reprocube.untrusted import Fields, parse_json, read_bytes

RECEIPT = "receipt.json"
RECEIPT_FORMAT = "reprocube-receipt"
# 2: every key required (RECEIPT_KEYS; reprocube's version, source_sha256 and source_files). Version 1 may
# lack sessions and reprocube.source_files: read as version 2 by _upgraded, in memory (the file's bytes,
# which a signature signs, are never rewritten).
RECEIPT_VERSION = 2
READ_VERSIONS = (1, RECEIPT_VERSION)
MAX_RECEIPT_BYTES = 64 << 20  # a long run's trace: 4 bytes a step
SELF_DIGEST = "receipt_sha256"
SIGNATURE_FILE = "receipt.sig"  # beside the receipt (reprocube.training.signing)


# What a receipt holds that is NOT a claim about A's computation, with the reason: every other leaf is
# evidence, compared by reprocube.analysis.claims or checked by read_receipt (tests/test_receipt_mutations
# changes each leaf of real receipts and holds the verdicts to this). A path is a tuple of keys, "*" for
# any list index or key; under "config", the keys outside the result (NON_RESULT_KEYS) and the device.
_DESCRIBED = "A's environment, described: compared as a cause of a difference (reproduce's causes), never as a claim"
NOT_EVIDENCE = {
    ("version",): "the format's version: which keys the receipt holds, checked by read_receipt; not a claim",
    ("env",): _DESCRIBED,
    ("sessions", "*", "env"): _DESCRIBED,
    ("reprocube",): "the code that ran, described by its version and digests: a cause, not a claim of numbers",
    ("checkpoints",): "the names of the checkpoints A kept: no content to compare (their weights are in the trace)",
    ("epochs", "*", "wall_s"): "a timing: machines and loads differ",
    ("epochs", "*", "samples_per_s"): "a timing: machines and loads differ",
    ("trace", "every_steps"): "a cadence: where A's weights were digested is trace.boundaries itself",
    ("config", "device"): "where it ran: the device used is in env, a cause",
    (
        "config",
        "NON_RESULT_KEYS",
    ): "a place, cadence or presentation key (config.NON_RESULT_KEYS): not what it computed",
}


def not_evidence(path: tuple) -> str | None:
    """Why the receipt's leaf at `path` is not evidence (NOT_EVIDENCE), or None: it is a claim."""
    for pattern, reason in NOT_EVIDENCE.items():
        if pattern == ("config", "NON_RESULT_KEYS"):
            dotted = ".".join(str(part) for part in path[1:])
            if path[:1] == ("config",) and any(dotted == k or dotted.startswith(k + ".") for k in NON_RESULT_KEYS):
                return reason
        elif len(path) >= len(pattern) and all(p in ("*", part) for p, part in zip(pattern, path, strict=False)):
            return reason
    return None


def _canonical(body: dict) -> bytes:
    return json.dumps(body, sort_keys=True, separators=(",", ":"), allow_nan=False).encode()


def self_digest(receipt: dict) -> str:
    return hashlib.sha256(_canonical({k: v for k, v in receipt.items() if k != SELF_DIGEST})).hexdigest()


@dataclass
class Receipt:
    path: Path
    raw: bytes  # the exact bytes read (a signature is checked over these)
    value: dict
    config: dict
    env: dict
    epochs: list[dict]
    trace: StepTrace
    complete: bool
    global_step: int
    epoch: int
    sessions: list[dict]  # [{from_step, to_step, env}], each env an object (a null in the file: env)

    @property
    def run_name(self) -> str:
        return self.config.get("run_name") or f"{self.config['framework']['name']}-seed{self.config['seed']}"


def find_receipt(source: Path) -> Path:
    """SOURCE is a receipt file or a run directory holding one."""
    return source / RECEIPT if source.is_dir() else source


def read_receipt(source: Path, error: type[CheckpointError] = CheckpointError) -> Receipt:
    """Read and check a receipt (a regular file, bounded, strict JSON, its self-digest, every key typed):
    one line naming the file and the key when anything is wrong."""
    path = find_receipt(source)
    if source.is_dir() and not path.exists():
        raise error(f"{source} holds no {RECEIPT} (a run trained by reprocube before receipts existed?)")
    return parse_receipt(read_bytes(path, MAX_RECEIPT_BYTES, error, follow_links=not source.is_dir()), path, error)


def parse_receipt(raw: bytes, path: Path, error: type[CheckpointError] = CheckpointError) -> Receipt:
    """A receipt from the bytes already read from `path` (read_receipt's checks, on exactly these bytes)."""
    if len(raw) > MAX_RECEIPT_BYTES:
        raise error(f"{path} is {len(raw)} bytes, more than the {MAX_RECEIPT_BYTES} allowed")
    value = parse_json(raw, str(path), error)
    fields = Fields(value, str(path), error)
    _refuse_unknown_keys(value, path, error)
    if fields.text("format") != RECEIPT_FORMAT:
        raise error(f"{path}: format is not {RECEIPT_FORMAT!r}: not a reprocube receipt")
    version = fields.integer("version")
    if version not in READ_VERSIONS:
        raise error(
            f"{path}: receipt version {version} is not one this reprocube reads ({', '.join(map(str, READ_VERSIONS))})"
        )
    recorded = fields.text(SELF_DIGEST)
    if not HEX_DIGEST.match(recorded) or recorded != self_digest(value):
        raise error(f"{path}: {SELF_DIGEST} does not match its content (damaged or edited)")
    value = _upgraded(value, version)  # after the digest: it is over the file as written
    fields = Fields(value, str(path), error)
    for key in sorted(RECEIPT_KEYS):
        fields.present(key)  # "PATH: KEY is missing"
    code = fields.mapping("reprocube")
    for key in CODE_KEYS:
        code.present(key)
    code.text("version")
    code.sha256("source_sha256")
    config = fields.mapping("config").value
    _check_config(config, path, error)
    if not config_hash_matches(config, fields.text("config_hash")):
        raise error(f"{path}: config_hash does not match its config")
    expected_dataset = {
        "name": config["dataset"]["name"],
        "payload_sha256": {key: spec["sha256"] for key, spec in sorted(config["dataset"]["files"].items())},
    }
    if value.get("dataset") != expected_dataset:
        raise error(f"{path}: dataset must name config.dataset's name and payload sha256s, as it was written")
    env = fields.mapping("env").value
    position = fields.mapping("position")
    epoch, global_step = position.integer("epoch"), position.integer("global_step")
    position.integer("step_in_epoch")
    epochs = [check_epoch_record(record) for record in fields.records("epochs")]
    for record in epochs:
        if not HEX_DIGEST.match(record["weights_digest"]):
            raise error(f"{path}: epochs[{record['epoch']}].weights_digest is not a sha256")
    if [r["epoch"] for r in epochs] != list(range(epoch - len(epochs) + 1, epoch + 1)):
        raise error(f"{path}: epochs must be consecutive and end at position.epoch {epoch}")
    trace = StepTrace.from_json(value.get("trace"), f"{path}: trace", error)
    expected_names = WEIGHT_NAMES.get(config["framework"]["name"])
    if trace.tensor_names and (expected_names is None or tuple(trace.tensor_names) != expected_names):
        raise error(
            f"{path}: trace.tensor_names are not the weight tensors of the {config['framework']['name'][:40]!r} "
            f"model ({', '.join(expected_names or ('no such framework',))})"
        )
    if trace.last_step != global_step:
        raise error(f"{path}: trace ends at global step {trace.last_step}, not at position.global_step {global_step}")
    _check_env_vars(env, path, error)
    _check_source_files(code.value["source_files"], path, error)
    _check_records_agree(config, fields.boolean("complete"), position.value, epochs, path, error)
    checkpoints = value.get("checkpoints")
    if not (isinstance(checkpoints, list) and all(isinstance(c, str) and NAME_PATTERN.match(c) for c in checkpoints)):
        raise error(f"{path}: checkpoints must be a list of checkpoint names")
    sessions = _sessions(value["sessions"], env, trace.first_step, global_step, path, error)
    return Receipt(
        path, raw, value, config, env, epochs, trace, fields.boolean("complete"), global_step, epoch, sessions
    )


MAX_SESSIONS = 1000
# Every key a receipt holds (each required since version 2; version 1's upgrade fills those it may lack): a
# key this reader does not know would be a claim nobody compares, so it is refused.
RECEIPT_KEYS = frozenset(
    {
        "format",
        "version",
        "reprocube",
        "config",
        "config_hash",
        "dataset",
        "env",
        "position",
        "complete",
        "epochs",
        "checkpoints",
        "trace",
        "sessions",
        SELF_DIGEST,
    }
)
CODE_KEYS = ("version", "source_sha256", "source_files")  # reprocube's
POSITION_KEYS = frozenset({"epoch", "global_step", "step_in_epoch"})
EPOCH_RECORD_KEYS = frozenset({*DETERMINISTIC_EPOCH_FIELDS, "wall_s", "samples_per_s", "weights_digest"})
TRACE_KEYS = frozenset(
    {
        "version",
        "every_steps",
        "first_step",
        "steps",
        "tensor_names",
        "boundaries",
        *LOSS_KEYS.values(),
        *FINGERPRINT_KEYS,
    }
)
CONFIG_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,63}")  # one level: "optimizer.lr" would shadow a nested lr


def _refuse_unknown_keys(value, path: Path, error) -> None:
    if not isinstance(value, dict):
        return  # Fields names what is wrong
    where = {(): RECEIPT_KEYS, ("position",): POSITION_KEYS, ("trace",): TRACE_KEYS}
    for place, allowed in where.items():
        item = value.get(place[0]) if place else value
        unknown = sorted(str(k) for k in item if k not in allowed) if isinstance(item, dict) else []
        if unknown:
            raise error(f"{path}: {'.'.join(place) or 'the receipt'} holds {unknown[0][:40]!r}, not a key of a receipt")
    for i, record in enumerate(value.get("epochs") if isinstance(value.get("epochs"), list) else []):
        unknown = sorted(str(k) for k in record if k not in EPOCH_RECORD_KEYS) if isinstance(record, dict) else []
        if unknown:
            raise error(f"{path}: epochs[{i}] holds {unknown[0][:40]!r}, not a key of an epoch record")
    stack = [(value.get("config"), "config")]
    while stack:
        item, where_ = stack.pop()
        if isinstance(item, dict):
            for key, child in item.items():
                if not CONFIG_KEY.fullmatch(key):
                    raise error(f"{path}: {where_} holds the key {key[:40]!r}, which is not a config key name")
                stack.append((child, f"{where_}.{key}"))


def _upgraded(value: dict, version: int) -> dict:
    """A version-1 receipt as version 2, in memory only: each key a version-1 writer could leave out, as
    what its absence meant; nothing else changes. Version 2 is as it is: there a missing key is an error
    the reader names. The values filled are read later as any receipt's are (checked there, so a value of
    the wrong type is named where it is checked, never here)."""
    if version == RECEIPT_VERSION:
        return value
    upgraded = {**value, "version": RECEIPT_VERSION}
    trace, position = value.get("trace"), value.get("position")
    if "sessions" not in value:
        # Written before sessions were recorded: one session, the whole trace, under the receipt's env (null).
        upgraded["sessions"] = [
            {
                "from_step": trace.get("first_step") if isinstance(trace, dict) else None,
                "to_step": position.get("global_step") if isinstance(position, dict) else None,
                "env": None,
            }
        ]
    code = value.get("reprocube")
    if isinstance(code, dict) and "source_files" not in code:
        # Written before each source file's digest was recorded: null, not recorded (no file is named as differing).
        upgraded["reprocube"] = {**code, "source_files": None}
    return upgraded


def _sessions(value, env: dict, first_step: int, global_step: int, path: Path, error) -> list[dict]:
    """The receipt's sessions, consecutive and covering the trace to position.global_step; each env an
    object whose variables are checked as env's are (null: the receipt's env)."""
    where = f"{path}: sessions"
    if not (isinstance(value, list) and 1 <= len(value) <= MAX_SESSIONS):
        raise error(f"{where} must be a list of 1 to {MAX_SESSIONS} sessions")
    sessions = []
    for i, item in enumerate(value):
        session = Fields(item, f"{where}[{i}]", error)
        if set(item) != {"from_step", "to_step", "env"}:
            raise error(f"{where}[{i}] must hold exactly from_step, to_step and env")
        start, end = session.integer("from_step"), session.integer("to_step")
        expected_start = sessions[-1]["to_step"] if sessions else start
        if start != expected_start or end < start:
            raise error(f"{where}[{i}]: sessions must be consecutive (from_step {start}, to_step {end})")
        own = item["env"] if item["env"] is not None else env
        if not isinstance(own, dict):
            raise error(f"{where}[{i}].env must be an object or null")
        _check_env_vars(own, path, error)
        sessions.append({"from_step": start, "to_step": end, "env": own})
    if sessions[0]["from_step"] > first_step or sessions[-1]["to_step"] != global_step:
        raise error(
            f"{where} must cover the trace: from step {first_step} or before to position.global_step {global_step}"
        )
    return sessions


SOURCE_FILE_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_./-]{0,199}")
MAX_SOURCE_FILES = 1000


def _check_source_files(files, path: Path, error) -> None:
    """reprocube.source_files: relative source paths (no `..`, no leading `/`) to 16 hex digits, at most
    MAX_SOURCE_FILES; or null, not recorded (a version-1 receipt written before it, upgraded)."""
    if files is None:
        return
    if not (isinstance(files, dict) and len(files) <= MAX_SOURCE_FILES):
        raise error(f"{path}: reprocube.source_files must be an object of at most {MAX_SOURCE_FILES} files")
    for name, digest in files.items():
        if not (SOURCE_FILE_NAME.fullmatch(name) and ".." not in name.split("/")):
            raise error(f"{path}: reprocube.source_files: {name[:60]!r} is not a relative source path")
        if not (isinstance(digest, str) and TENSOR_DIGEST.match(digest)):
            raise error(f"{path}: reprocube.source_files[{name!r}] must be 16 hex digits")


ENV_VAR_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}")
MAX_ENV_VALUE = 4096


def _check_env_vars(env: dict, path: Path, error) -> None:
    """env.env_vars: variable names and text values (a name holding `=` or a value holding a NUL cannot be
    an environment variable; reproduce reports them and --match sets only documented ones)."""
    env_vars = env.get("env_vars", {})
    if not isinstance(env_vars, dict):
        raise error(f"{path}: env.env_vars must be a JSON object")
    for name, value in env_vars.items():
        if not ENV_VAR_NAME.fullmatch(name):
            raise error(f"{path}: env.env_vars holds {name[:40]!r}, which is not a variable name")
        if not (isinstance(value, str) and len(value) <= MAX_ENV_VALUE and "\0" not in value):
            raise error(f"{path}: env.env_vars.{name} must be text of at most {MAX_ENV_VALUE} characters without NUL")


def _check_records_agree(config: dict, complete: bool, position: dict, epochs: list[dict], path: Path, error) -> None:
    """The config must agree with what the receipt says A did, before anyone retrains it: its epochs with
    `complete` and the position, one number of steps per epoch across the records, and no more steps per
    epoch than its data and batch size allow. So a receipt cannot ask for more work than it records."""
    epoch, step_in_epoch, global_step = position["epoch"], position["step_in_epoch"], position["global_step"]
    if complete != (epoch == config["epochs"] and step_in_epoch == 0) or epoch > config["epochs"]:
        raise error(
            f"{path}: config.epochs {config['epochs']} disagrees with position epoch {epoch} step {step_in_epoch} "
            f"(complete: {str(complete).lower()})"
        )
    numbered = [r["epoch"] for r in epochs if r["epoch"]]
    if len(numbered) != epoch or numbered != list(range(1, epoch + 1)):  # the length first: epoch may be 10**9
        raise error(f"{path}: epochs must hold one record for each of epochs 1..{epoch} (position.epoch)")
    per_epoch = {record["global_step"] // record["epoch"] for record in epochs if record["epoch"]}
    if any(r["global_step"] % r["epoch"] for r in epochs if r["epoch"]) or len(per_epoch) > 1 or 0 in per_epoch:
        raise error(f"{path}: epochs[].global_step are not one number of steps per epoch")
    if per_epoch:
        steps = per_epoch.pop()
        if global_step != epoch * steps + step_in_epoch or step_in_epoch >= steps:
            raise error(f"{path}: position.global_step {global_step} disagrees with {steps} steps per epoch")
        most = -(-_most_examples(config) // _batch_size(config, path, error))
        if steps > most:
            raise error(f"{path}: {steps} steps per epoch is more than its data and batch_size allow ({most})")


def _batch_size(config: dict, path: Path, error) -> int:
    return Fields(config, f"{path}: config", error).integer("batch_size", 1)


def _most_examples(config: dict) -> int:
    """An upper bound of the training examples: data.train_limit, else the training images' bytes."""
    limit = (config.get("data") or {}).get("train_limit") if isinstance(config.get("data"), dict) else None
    files = config["dataset"]["files"]
    size = files.get("train_images", {}).get("bytes") if isinstance(files.get("train_images"), dict) else None
    bounds = [n for n in (limit, size) if isinstance(n, int) and not isinstance(n, bool) and n > 0]
    return min(bounds) if bounds else 2**63


def _check_config(config: dict, path: Path, error) -> None:
    """The keys reproduce uses to rebuild the run; the rest is checked by validating the rebuilt config."""
    fields = Fields(config, f"{path}: config", error)
    fields.mapping("framework").text("name")
    dataset = fields.mapping("dataset")
    dataset.text("name")
    for key, spec in dataset.mapping("files").value.items():
        sha = Fields(spec, f"{path}: config.dataset.files.{key}", error).text("sha256")
        if not HEX_DIGEST.match(sha):
            raise error(f"{path}: config.dataset.files.{key}.sha256 is not a sha256")
    fields.integer("seed")
    fields.integer("epochs", 1)
    fields.text("run_name", optional=True)  # absent or null: the default name (Receipt.run_name)
