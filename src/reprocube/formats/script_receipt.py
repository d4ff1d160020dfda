"""A receipt for a training script that is not ours (`reprocube check` writes it, `reprocube reproduce`
retrains it): a directory holding receipt.json and, where the script called the probe, trace.jsonl (its
uninterrupted run's every update: loss bits and weight fingerprints, reprocube.probe).

receipt.json records what is needed to run the script again and to tell where another run departs: the
command (argv), every input copied into its work directory by sha256, its declared outputs by sha256,
the probe trace by sha256, how long the run took, and the environment (reprocube.formats.env). The command is
never run from the receipt: `reproduce` runs the command its user gives and compares it with this one.

It travels between machines and people: read strictly (reprocube.untrusted), bounded, every value typed,
damage caught by its own sha256 (receipt_sha256), forgery by a signature (`reprocube sign`)."""

from __future__ import annotations

import hashlib
import json
import os
import re
import stat
from dataclasses import dataclass
from pathlib import Path

from reprocube.errors import CheckpointError, ConfigError
from reprocube.files import names_regular_file, sha256_file, sha256_regular, write_file_atomic
from reprocube.formats.env import MATCHABLE_ENV_VARS
from reprocube.formats.output_files import (  # JAX and Orbax: imported in load_orbax only
    files_below,
    is_orbax,
    load_orbax,
)
from reprocube.terminal import one_line
from reprocube.untrusted import Fields, parse_json, read_bytes

FORMAT = "reprocube-script-receipt"
VERSION = 1
RECEIPT = "receipt.json"
TRACE = "trace.jsonl"
MAX_RECEIPT_BYTES = 8 << 20
MAX_FILES = 10_000  # inputs or outputs listed
KEYS = (
    "format",
    "version",
    "command",
    "command_files",
    "inputs",
    "declared_outputs",
    "outputs",
    "unrecorded_outputs",
    "trace",
    "seconds",
    "env",
    "seed",
    "receipt_sha256",
)
POSITION = re.compile(r"^[0-9]{1,9}\Z")
MAX_SECONDS = 10**7  # 116 days: a B that hangs is still ended by its watchdog (10x this)
SEED_VALUE = re.compile(r"^[0-9]{1,20}\Z")

# The seed variable (`check --seed-env VAR`, a script receipt's seed.variable): check sets it for its runs
# and `reproduce` advises "run as VAR=VALUE reprocube reproduce ...", so it must be a name that only the
# script reads. The rule, here only (check's option and the receipt reader both ask refused_seed_variable):
# letters, digits and _, not starting with a digit, at most 64, holding SEED (a list of the variables
# programs read is never complete: OPENSSL_CONF=0 loads ./0 too); and no name, in any case, that one of these
# readers takes from the environment (its value is digits, but PYTHONSTARTUP=0 runs ./0, LD_PRELOAD=0
# loads it, BASH_ENV=0 sources it, PYTHONINSPECT=1 leaves the next Python at a prompt, OMP_NUM_THREADS=1
# changes the numbers, HOME=0 or TMPDIR=0 moves where programs write).
SEED_VARIABLE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,63}\Z")
SEED_VARIABLE_READERS = {
    "the Python interpreter": (("PYTHON",), ()),
    "the dynamic loader or the C library": (
        ("LD_", "GLIBC_", "MALLOC_", "LC_"),
        ("GCONV_PATH", "GETCONF_DIR", "HOSTALIASES", "LANG", "LANGUAGE", "LOCALDOMAIN", "LOCPATH", "NIS_PATH")
        + ("NLSPATH", "RES_OPTIONS", "RESOLV_HOST_CONF", "TMPDIR", "TZ", "TZDIR"),
    ),
    "a shell": (
        ("BASH_", "BASHOPTS"),
        ("CDPATH", "ENV", "GLOBIGNORE", "HISTFILE", "HOME", "IFS", "LOGNAME", "MAIL", "MAILPATH", "OLDPWD", "PATH")
        + ("POSIXLY_CORRECT", "PROMPT_COMMAND", "PS1", "PS2", "PS3", "PS4", "PWD", "SHELL", "SHELLOPTS", "TEMP")
        + ("TERM", "TMP", "USER"),
    ),
    "a numeric or machine-learning library": (
        ("OMP_", "KMP_", "GOMP_", "MKL_", "OPENBLAS_", "GOTO_", "BLIS_", "VECLIB_", "NUMEXPR_", "ONEDNN_", "DNNL_")
        + ("ATEN_", "TORCH", "PYTORCH_", "TF_", "XLA_", "JAX_", "CUDA_", "CUBLAS_", "CUDNN_", "NCCL_", "NVIDIA_")
        + ("NUMBA_", "HF_", "KERAS_", "TPU_", "ROCM_", "HIP_", "HSA_"),
        tuple(MATCHABLE_ENV_VARS),
    ),
    "another interpreter or tool": (
        ("PERL5", "PERLLIB", "PERL_", "RUBYOPT", "RUBYLIB", "RUBY_", "NODE_", "JAVA_", "_JAVA_", "JDK_", "GIT_")
        + ("SSH_", "PIP_", "CONDA_", "UV_", "XDG_", "APPTAINER", "SINGULARITY", "OPENSSL_", "QEMU_"),
        ("ALL_PROXY", "BROWSER", "CLASSPATH", "CURL_CA_BUNDLE", "DISPLAY", "EDITOR", "FTP_PROXY", "HTTP_PROXY")
        + ("HTTPS_PROXY", "NO_PROXY", "PAGER", "REQUESTS_CA_BUNDLE", "SSL_CERT_DIR", "SSL_CERT_FILE", "VISUAL")
        + ("VIRTUAL_ENV",),
    ),
    "reprocube": (("REPROCUBE_",), ()),
}


def refused_seed_variable(name: str) -> str | None:
    """Why `name` cannot be a seed variable (the rule above), in words that follow the name ("is ..."); None
    where it can."""
    if not SEED_VARIABLE.match(name):
        return "is not a variable name (letters, digits and _, not starting with a digit, at most 64)"
    upper = name.upper()
    for reader, (prefixes, names) in SEED_VARIABLE_READERS.items():
        if upper in names or upper.startswith(prefixes):
            return f"is refused: {reader} reads it (a seed variable must be one only the script reads)"
    if "SEED" not in upper:  # no list of what programs read is ever whole (OPENSSL_CONF, APPTAINERENV_...)
        return (
            "is refused: a seed variable's name holds SEED (SEED, TRAIN_SEED, MY_SEED_1), so that no program "
            "reads it for anything else"
        )
    return None


@dataclass(frozen=True)
class ScriptReceipt:
    directory: Path
    command: list[str]
    command_files: dict[int, str]  # the command's arguments that name a file outside the work directory -> sha256
    inputs: dict[str, str]  # path relative to the work directory -> sha256
    declared_outputs: list[str]  # the --output paths check was given
    outputs: dict[str, str]  # each output file -> sha256 (of its bytes; of its tensors' digests for Orbax)
    unrecorded_outputs: list[str]  # outputs A wrote that are not regular files (links, FIFOs): not recorded
    trace: str | None  # trace.jsonl's sha256; None: the script did not call the probe
    seconds: float  # the uninterrupted run's wall time
    env: dict
    seed: dict | None  # {variable, value}: the seed variable check set for the run (--seed-env), or None
    raw: bytes

    @property
    def trace_path(self) -> Path:
        return self.directory / TRACE


def receipt_format(path: Path) -> str | None:
    """The "format" a receipt (a directory or its receipt.json) says it has, read strictly; None where it
    cannot be read or says none (its reader then names why)."""
    path = Path(path)
    target = path / RECEIPT if path.is_dir() else path
    try:
        value = parse_json(read_bytes(target, 64 << 20, CheckpointError), str(target), CheckpointError)
    except CheckpointError:
        return None
    found = value.get("format") if isinstance(value, dict) else None
    return found if isinstance(found, str) else None


def is_script_receipt(path: Path) -> bool:
    return receipt_format(path) == FORMAT


def input_digests(copies: list[Path]) -> dict[str, str]:
    """What --copy puts into a work directory, by path inside it: every regular file's sha256 (a link or
    a special file inside a copied directory is refused: its bytes are not the input's)."""
    digests: dict[str, str] = {}
    for top in copies:
        paths = [top] if not top.is_dir() or top.is_symlink() else []
        for directory, dirs, files in os.walk(top, followlinks=False) if not paths else ():
            paths += [Path(directory) / name for name in sorted(files)]
            paths += [Path(directory) / d for d in sorted(dirs) if (Path(directory) / d).is_symlink()]
            if len(paths) > MAX_FILES:
                raise ConfigError(f"--copy {top}: more than {MAX_FILES} files")
        for path in paths:
            digest = sha256_regular(path)
            if digest is None:
                raise ConfigError(f"--copy {path}: not a regular file (a link, a FIFO or a device)")
            digests[(Path(top.name) / path.relative_to(top)).as_posix() if path != top else top.name] = digest
    return dict(sorted(digests.items()))


MAX_SOURCE_BYTES = 16 << 20  # a script or a config; larger arguments are data, not the command's source


def command_file_digests(command: list[str]) -> dict[int, str]:
    """The command's arguments that name a source file by an absolute path (`python /home/me/train.py`):
    by their position in argv, its sha256. Not a program (an ELF binary, the interpreter: the environment
    records its version) nor a link, nor a file larger than MAX_SOURCE_BYTES (a dataset passed by its
    path: hashing it would take as long as reading it) or under /proc, /sys or /dev (no size to trust); a
    relative path names a --copy input, hashed with the inputs."""
    digests = {}
    for i, arg in enumerate(command):
        path = Path(arg)
        if path.parts[1:2] in (("proc",), ("sys",), ("dev",)):
            continue
        if path.is_absolute() and names_regular_file(arg) and path.stat().st_size <= MAX_SOURCE_BYTES:
            with open(path, "rb") as stream:
                if stream.read(4) == b"\x7fELF":
                    continue
            digests[i] = sha256_file(path)
    return digests


def output_digests(found: dict[str, Path], notes: list[str] | None = None) -> dict[str, str | None]:
    """The declared outputs as reprocube.formats.output_files lists them: each regular file's sha256;
    an Orbax checkpoint directory (its bytes hold timestamps and random names) by its tensors: the sha256
    of each tensor's digest, by name; None for a link or a special file (not compared: not checked). An
    Orbax checkpoint that Orbax cannot read is recorded file by file (NAME/FILE: its sha256), and why is
    one line appended to `notes`, if given: never a traceback."""
    digests: dict[str, str | None] = {}
    # An Orbax checkpoint is recorded by its tensors only: the files beside them in its directory (which
    # `check` compares between its own runs) are not in a receipt (B lists outputs as A's receipt names them).
    checkpoints = [f"{name}/" for name, path in found.items() if path.is_dir() and not path.is_symlink()]
    for name, path in found.items():
        if name.startswith(tuple(checkpoints)):
            continue
        if not path.is_dir() or path.is_symlink():
            digests[name] = sha256_regular(path)
            continue
        try:
            digests[name] = _tensors_digest(path)
        except Exception as exc:  # Orbax and TensorStore meeting someone else's files
            digests.update({f"{name}/{inner}": sha256_regular(file) for inner, file in files_below(path).items()})
            if notes is not None:
                notes.append(
                    f"{one_line(name)}: could not be read as an Orbax checkpoint ({type(exc).__name__}: "
                    f"{one_line(str(exc))[:200]}): its files recorded one by one"
                )
    return digests


# What B can have at a name A's receipt lists (outputs_named's kinds): only the first two are compared by
# digest; a link or a special file is compared with nothing (its bytes are not the run's own).
REGULAR, ORBAX, DIRECTORY, LINK = "a regular file", "an Orbax checkpoint", "a directory", "a symbolic link"
DIGESTED = (REGULAR, ORBAX)
NOT_REGULAR = (LINK, "a FIFO", "a socket", "a device")


@dataclass(frozen=True)
class FoundOutputs:
    """B's outputs as outputs_named found them."""

    digests: dict[str, str | None]  # name -> digest, as output_digests gives, of what can be compared
    kinds: dict[str, str]  # each name A lists that B has: what B has there (REGULAR, ORBAX, DIRECTORY, ...)
    too_many: int  # B wrote more than this many outputs (MAX_FILES), where the walk stopped; 0: it did not


def outputs_named(work: Path, names: set[str], declared: list[str]) -> FoundOutputs:
    """B's outputs: every entry of B's work directory (walked, links never followed) whose relative name is
    one A's receipt lists or lies under a declared output (--output, as A's check was given it), matched
    as strings: a name read from a receipt is compared, never opened as a path. What B has at each name A
    lists is in `kinds`; where that is a regular file or an Orbax checkpoint Orbax reads, its digest is in
    `digests` (a directory A lists as one output, a link or a special file, or a directory that Orbax cannot
    read, is a kind of its own, never entered and never a reader's error); names A does not list are B's
    extra outputs, digested as output_digests does."""
    found: dict[str, Path] = {}
    kinds: dict[str, str] = {}
    prefixes = tuple(f"{d.rstrip('/')}/" for d in declared)
    for directory, dirs, files in os.walk(work, followlinks=False):
        whole = set()  # directories that are one output (or one named kind): not entered
        for name in [*dirs, *files]:
            path = Path(directory) / name
            relative = path.relative_to(work).as_posix()
            named = relative in names
            if not (named or relative in declared or relative.startswith(prefixes)):
                continue
            kind = _kind(path)
            if kind == DIRECTORY:
                if is_orbax(path):
                    kind = ORBAX
                    found[relative] = path
                    whole.add(name)
                elif named:
                    whole.add(name)  # A recorded one output here, B wrote a directory: that is the difference
            else:
                found[relative] = path
            if named:
                kinds[relative] = kind
        dirs[:] = [d for d in dirs if d not in whole]
        if len(found) > MAX_FILES:
            return FoundOutputs({}, {}, too_many=MAX_FILES)  # bounded: none of it is compared (a difference)
    digests: dict[str, str | None] = {}
    for relative, path in found.items():
        if relative not in names:
            digests.update(output_digests({relative: path}))  # B's extra: as A's check would record it
        elif kinds[relative] == ORBAX:
            try:
                digests[relative] = _tensors_digest(path)
            except Exception as exc:  # Orbax and TensorStore meeting someone else's files
                why = f"{type(exc).__name__}: {one_line(str(exc))[:200]}"
                kinds[relative] = f"a directory that Orbax cannot read ({why})"
        elif kinds[relative] == REGULAR:
            digests[relative] = sha256_regular(path)  # None: no longer a regular file (replaced while B ran)
            if digests[relative] is None:
                kinds[relative] = "a file that could not be read"
    return FoundOutputs(digests, kinds, too_many=0)


def _kind(path: Path) -> str:
    """What is at `path`, not following a link."""
    try:
        mode = os.lstat(path).st_mode
    except OSError:
        return "nothing"
    if stat.S_ISREG(mode):
        return REGULAR
    if stat.S_ISDIR(mode):
        return DIRECTORY
    if stat.S_ISLNK(mode):
        return LINK
    return "a FIFO" if stat.S_ISFIFO(mode) else "a socket" if stat.S_ISSOCK(mode) else "a device"


def _tensors_digest(path: Path) -> str:
    from reprocube.formats.trace import tensor_digest

    tensors = {name: tensor_digest(array) for name, array in load_orbax(path).items()}
    return hashlib.sha256(json.dumps(tensors, sort_keys=True).encode()).hexdigest()


def write_script_receipt(
    directory: Path,
    command: list[str],
    inputs: dict[str, str],
    declared: list[str],
    outputs: dict,
    trace: Path | None,
    seconds: float,
    env: dict,
    seed: dict | None,
) -> Path:
    """receipt.json (and trace.jsonl, copied) into `directory`, which must be new. A seed variable is held
    to the rule its reader applies (refused_seed_variable), before anything is written."""
    refused = refused_seed_variable(seed["variable"]) if seed is not None else None
    if refused:
        raise ConfigError(f"seed variable {one_line(seed['variable'])[:64]!r} {refused}")
    directory.mkdir(parents=True)
    trace_sha = None
    if trace is not None and trace.is_file() and not trace.is_symlink():
        data = read_bytes(trace, 512 << 20, CheckpointError)
        write_file_atomic(directory / TRACE, data)
        trace_sha = hashlib.sha256(data).hexdigest()
    body = {
        "format": FORMAT,
        "version": VERSION,
        "command": command,
        "command_files": {str(i): digest for i, digest in command_file_digests(command).items()},
        "inputs": inputs,
        "declared_outputs": declared,
        "outputs": {name: digest for name, digest in outputs.items() if digest is not None},
        "unrecorded_outputs": sorted(name for name, digest in outputs.items() if digest is None),
        "trace": trace_sha,
        "seconds": round(seconds, 3),
        "env": env,
        "seed": seed,
    }
    body["receipt_sha256"] = _self_digest(body)
    path = directory / RECEIPT
    write_file_atomic(path, (json.dumps(body, sort_keys=True, indent=1) + "\n").encode())
    return path


def _self_digest(body: dict) -> str:
    canonical = {k: v for k, v in body.items() if k != "receipt_sha256"}
    return hashlib.sha256(json.dumps(canonical, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def read_script_receipt(path: Path) -> ScriptReceipt:
    """A script receipt (its directory or its receipt.json), every key checked; CheckpointError (exit 4)
    naming the file and key otherwise. The trace is not read here: analysis.probe_trace reads it, after
    its sha256 is checked against this receipt's."""
    path = Path(path)
    target = path / RECEIPT if path.is_dir() else path
    return parse_script_receipt(read_bytes(target, MAX_RECEIPT_BYTES, CheckpointError), target)


def parse_script_receipt(raw: bytes, target: Path) -> ScriptReceipt:
    """A script receipt from the bytes already read from `target` (read_script_receipt's checks, on exactly
    these bytes)."""
    where = str(target)
    if len(raw) > MAX_RECEIPT_BYTES:
        raise CheckpointError(f"{where} is {len(raw)} bytes, more than the {MAX_RECEIPT_BYTES} allowed")
    value = parse_json(raw, where, CheckpointError)
    if not isinstance(value, dict):
        raise CheckpointError(f"{where}: not a JSON object")
    fields = Fields(value, where, CheckpointError)
    unknown = sorted(k for k in value if k not in KEYS)
    if unknown:
        raise CheckpointError(f"{where}: {str(unknown[0])[:60]!r} is not a key of a script receipt")
    if fields.text("format") != FORMAT:
        raise CheckpointError(f"{where}: format must be {FORMAT!r}")
    fields.integer("version", VERSION, VERSION)
    if fields.sha256("receipt_sha256") != _self_digest(value):
        raise CheckpointError(f"{where} was modified: its receipt_sha256 does not match its content")
    command = fields.texts("command")
    if not command or any("\0" in arg for arg in command):
        raise CheckpointError(f"{where}: command must be a non-empty list of strings without NUL")
    files = fields.mapping("command_files")
    if not all(POSITION.match(key) and int(key) < len(command) for key in files.value):
        raise CheckpointError(f"{where}: command_files must be keyed by positions in command (0, 1, ...)")
    inputs, outputs = fields.mapping("inputs"), fields.mapping("outputs")
    for name, listed in (("inputs", inputs.value), ("outputs", outputs.value)):
        if len(listed) > MAX_FILES:
            raise CheckpointError(f"{where}: {name} lists more than {MAX_FILES} files")
        for key in listed:
            _relative(key, f"{where}: {name}")
    seconds = fields.number("seconds")
    if not 0 <= seconds <= MAX_SECONDS:
        raise CheckpointError(f"{where}: seconds must be from 0 to {MAX_SECONDS}")
    declared, unrecorded = fields.texts("declared_outputs"), fields.texts("unrecorded_outputs")
    for name in [*declared, *unrecorded]:
        _relative(name, f"{where}: outputs")
    env = fields.mapping("env")
    _check_env(env)
    seed = fields.nullable("seed", fields.mapping)
    if seed is not None:
        if sorted(seed.value) != ["value", "variable"]:
            raise CheckpointError(f"{where}: seed must hold variable and value")
        variable = seed.text("variable")
        refused = refused_seed_variable(variable)
        if refused:
            raise CheckpointError(f"{where}: seed.variable {one_line(variable)[:64]!r} {refused}")
        if not SEED_VALUE.match(seed.text("value")):
            raise CheckpointError(f"{where}: seed.value must be digits (1 to 20)")
    return ScriptReceipt(
        directory=target.parent,
        command=command,
        command_files={int(key): files.sha256(key) for key in files.value},
        inputs={key: inputs.sha256(key) for key in inputs.value},
        outputs={key: outputs.sha256(key) for key in outputs.value},
        trace=fields.sha256("trace", nullable=True),
        seconds=seconds,
        env=env.value,
        declared_outputs=declared,
        unrecorded_outputs=unrecorded,
        seed=None if seed is None else dict(seed.value),
        raw=raw,
    )


def _check_env(env: Fields) -> None:
    """The parts of A's environment that are acted on, typed: env_vars (text values: --match may set a
    documented few) and cpu.isa (a list of names). The rest is described only (shown as a cause)."""
    if env.has("env_vars"):
        variables = env.mapping("env_vars")
        for key in variables.value:
            variables.text(key)
    if env.has("cpu"):
        cpu = env.mapping("cpu")
        if cpu.has("isa"):
            cpu.texts("isa")


def _relative(name: str, where: str) -> None:
    """A listed file is only ever a name to compare, never opened: still, only relative paths inside a
    work directory are valid names."""
    parts = Path(name).parts
    if not name or "\0" in name or Path(name).is_absolute() or ".." in parts or len(name) > 4096:
        raise CheckpointError(f"{where}: {name[:60]!r} is not a path inside a work directory")
