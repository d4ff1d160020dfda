"""The run's receipt (receipt.json): all another machine needs to retrain a run and to prove, step by step,
that it computes the same numbers, in a few tens of KB instead of the checkpoints' hundreds.

It holds the resolved config, the environment fingerprint (env.json's), reprocube's version and the
sha256 of its installed source, the dataset's payload sha256s (verified when the data was loaded), every
epoch's record (metrics and weights digest), the checkpoints present, and the step trace
(reprocube.formats.trace). It is rewritten after each checkpoint, so it never describes a state no checkpoint
holds, and carries the sha256 of itself like a manifest: that detects accidents, not forgery (a
signature does: reprocube.training.signing)."""

from __future__ import annotations

import functools
import hashlib
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path

from reprocube import __version__
from reprocube.config import NON_RESULT_KEYS, config_hash, config_hash_matches
from reprocube.errors import CheckpointError, ReprocubeError
from reprocube.files import write_json_atomic
from reprocube.formats.trace import FINGERPRINT_KEYS, LOSS_KEYS, TENSOR_DIGEST, StepTrace, tensor_digest
from reprocube.training.backend import WEIGHT_NAMES
from reprocube.training.checkpoint import HEX_DIGEST, NAME_PATTERN, epoch_name, read_checkpoint, step_name
from reprocube.training.metrics import (
    DETERMINISTIC_EPOCH_FIELDS,
    MetricsHistory,
    check_epoch_record,
    read_epoch_records,
)
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


@functools.lru_cache(maxsize=1)
def _source_file_digests() -> dict[str, bytes]:
    """sha256 of each of reprocube's installed source files (every .py and .yaml under the package), by
    relative path."""
    root = Path(__file__).resolve().parents[1]  # the package, above this room
    files = sorted(p for p in root.rglob("*") if p.suffix in (".py", ".yaml") and p.is_file())
    return {path.relative_to(root).as_posix(): hashlib.sha256(path.read_bytes()).digest() for path in files}


def source_sha256() -> str:
    """sha256 over reprocube's installed source, path by path: two installs with equal digests run the same
    reprocube code."""
    digest = hashlib.sha256()
    for name, file_digest in _source_file_digests().items():
        digest.update(name.encode() + b"\0")
        digest.update(file_digest)
    return digest.hexdigest()


def source_files() -> dict[str, str]:
    """64 bits of each source file's sha256, by relative path: which files two installs differ in."""
    return {name: file_digest.hex()[:16] for name, file_digest in _source_file_digests().items()}


def _canonical(body: dict) -> bytes:
    return json.dumps(body, sort_keys=True, separators=(",", ":"), allow_nan=False).encode()


def self_digest(receipt: dict) -> str:
    return hashlib.sha256(_canonical({k: v for k, v in receipt.items() if k != SELF_DIGEST})).hexdigest()


def build_receipt(
    config: dict,
    env: dict,
    history: MetricsHistory,
    trace: StepTrace,
    position,
    checkpoints: Path,
    sessions: list[dict] | None = None,
):
    """`env` is this process's environment; `sessions` every process's ({from_step, env}, this one last)."""
    present = (
        sorted(p.name for p in checkpoints.iterdir() if NAME_PATTERN.match(p.name)) if checkpoints.is_dir() else []
    )
    receipt = {
        "format": RECEIPT_FORMAT,
        "version": RECEIPT_VERSION,
        "reprocube": {"version": __version__, "source_sha256": source_sha256(), "source_files": source_files()},
        "config": config,
        "config_hash": config_hash(config),
        "dataset": {
            "name": config["dataset"]["name"],
            "payload_sha256": {key: spec["sha256"] for key, spec in sorted(config["dataset"]["files"].items())},
        },
        "env": env,
        "position": position.as_dict(),
        "complete": position.epoch >= config["epochs"] and position.step_in_epoch == 0,
        "epochs": history.epochs,
        "checkpoints": present,
        "trace": trace.to_json(),
        "sessions": _session_records(sessions or [{"from_step": trace.first_step, "env": env}], env, position),
    }
    receipt[SELF_DIGEST] = self_digest(receipt)
    return receipt


def _session_records(sessions: list[dict], env: dict, position) -> list[dict]:
    """Each session's steps (from_step + 1 .. to_step) and environment; null where it is the receipt's env
    (the last session's, usually every session's: written once)."""
    ends = [s["from_step"] for s in sessions[1:]] + [position.global_step]
    return [
        {"from_step": s["from_step"], "to_step": end, "env": None if s["env"] == env else s["env"]}
        for s, end in zip(sessions, ends, strict=True)
    ]


def write_receipt(run_path: Path, receipt: dict) -> None:
    # Compact: the trace's base64 is most of it, and indentation would add a fifth to the rest.
    write_json_atomic(run_path / RECEIPT, receipt, indent=None, sort_keys=True, compact=True)


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


def is_run_directory(path: Path) -> bool:
    """A directory a training run wrote (its marker or checkpoints/, as runs.RunDirectory.is_run says): its
    receipt.json describes its checkpoints, not just itself."""
    return os.path.lexists(path / ".reprocube-run") or os.path.lexists(path / "checkpoints")


def check_own_receipt(run: Path, receipt: Receipt, error: type[ReprocubeError]) -> None:
    """That `receipt` (read from run/receipt.json) is the run directory `run`'s own, as its checkpoints and
    metrics.jsonl show: the checkpoints it lists are exactly those run/checkpoints holds; each is whole
    (every file against its verified manifest), at the position its name says, of the receipt's config, with
    the weights the receipt records there (an epoch's weights_digest; the trace's tensor digests at its
    step); the one at the receipt's position holds the receipt's config, trace and epoch records (the
    trainer writes them together); and metrics.jsonl's epoch records are the receipt's. Another run's receipt
    copied in, or a checkpoint or metrics.jsonl changed since, is one line naming the file (`error`)."""
    where = run / RECEIPT
    checkpoints = run / "checkpoints"
    if checkpoints.is_symlink() or not checkpoints.is_dir():
        raise error(f"{run} has no checkpoints/ directory: nothing there shows that {where} is this run's")
    held = sorted(p.name for p in checkpoints.iterdir() if NAME_PATTERN.match(p.name))
    listed = receipt.value["checkpoints"]
    for name in held:
        if name not in listed:
            raise error(
                f"{checkpoints / name} is not a checkpoint {where} lists ({', '.join(listed[-3:]) or 'none'}"
                f"{', ...' if len(listed) > 3 else ''}): the receipt is another run's, or older than this run"
            )
    for name in listed:
        if name not in held:
            raise error(f"{where} lists checkpoint {name}, which {checkpoints} does not hold: it is not this run's")
    position = receipt.value["position"]
    at = epoch_name(receipt.epoch) if position["step_in_epoch"] == 0 else step_name(receipt.global_step)
    if at not in held:
        raise error(f"{where} ends at {at}, which {checkpoints} does not hold: it is not this run's")
    records = {record["epoch"]: record for record in receipt.epochs}
    boundaries = {boundary.step: boundary.tensors for boundary in receipt.trace.boundaries}
    for name in held:
        try:
            checkpoint = read_checkpoint(checkpoints / name)
        except CheckpointError as exc:
            raise error(f"{exc} (so {where} cannot be shown to be this run's)") from None
        manifest, path = checkpoint.manifest, checkpoint.path
        named = epoch_name(manifest.epoch) if manifest.step_in_epoch == 0 else step_name(manifest.global_step)
        if named != name:
            raise error(f"{path}: its manifest is at {named}, not where its name says")
        if manifest.config_hash is not None and not config_hash_matches(receipt.config, manifest.config_hash):
            raise error(f"{path}: its config_hash is not {where}'s config's: the receipt is another run's")
        record = records.get(manifest.epoch) if manifest.step_in_epoch == 0 else None
        if record is not None and record["weights_digest"] != manifest.weights_digest:
            raise error(f"{path}: its weights are not the ones {where} records for epoch {manifest.epoch}")
        expected = boundaries.get(manifest.global_step)
        if expected is None and manifest.global_step > receipt.trace.first_step:
            raise error(f"{path}: {where}'s trace records no weights at its global step {manifest.global_step}")
        weights = checkpoint.content.weights
        if expected is not None and receipt.trace.tensor_names:
            digests = [tensor_digest(weights[n]) if n in weights else None for n in receipt.trace.tensor_names]
            if digests != expected:
                raise error(
                    f"{path}: its weights are not the ones {where}'s trace records at global step "
                    f"{manifest.global_step}: the receipt is another run's"
                )
        if name == at:
            held_epochs = (manifest.fields.get("metrics") or {}).get("epochs")
            state = checkpoint.content.state if isinstance(checkpoint.content.state, dict) else {}
            for what, mine in (
                ("config.json", checkpoint.content.config == receipt.config),
                ("trace (state.json)", state.get("trace") == receipt.value["trace"]),
                ("epoch records (manifest.json)", held_epochs == receipt.epochs),
            ):
                if not mine:
                    raise error(f"{path}: its {what} is not {where}'s: the receipt is another run's")
    _check_own_metrics(run, receipt, error)


def _check_own_metrics(run: Path, receipt: Receipt, error: type[ReprocubeError]) -> None:
    """metrics.jsonl's epoch records (as written: every key) are the receipt's."""
    metrics, where = run / "metrics.jsonl", run / RECEIPT
    if not os.path.lexists(metrics):
        raise error(f"{run} holds no metrics.jsonl: nothing there shows that {where} is this run's")
    logged = [{k: v for k, v in record.items() if k != "kind"} for record in read_epoch_records(metrics, error)]
    for mine, theirs in zip(logged, receipt.epochs, strict=False):
        if mine != theirs:
            raise error(f"{metrics}: the record of epoch {mine['epoch']} is not the one {where} holds")
    if len(logged) != len(receipt.epochs):
        raise error(
            f"{metrics} records {len(logged)} epochs, {where} {len(receipt.epochs)}: the receipt is not "
            "this run's, or the run went on after it (resume it to its end)"
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
