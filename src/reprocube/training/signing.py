"""Receipt signatures (Ed25519). A receipt's own sha256 catches accidents; a signature says who published
it: `reprocube sign` writes receipt.sig beside receipt.json (only a run's own receipt, or a receipt read
strictly: signable_receipt), and `reprocube reproduce --public-key` refuses a receipt that the given key did
not sign.

receipt.sig is a small JSON object: format, version, algorithm, public_key (base64 of the raw 32 bytes),
key_id (the first 16 hex digits of the public key's sha256), receipt_sha256 and signature (base64, over
the exact bytes of the receipt, not a re-serialisation of its JSON). Its name is fixed, so only a receipt
named receipt.json is signed (one signed receipt a directory), and a receipt.sig there is replaced only
where it signs these very bytes (its receipt_sha256): never another receipt's, or an older one's.

Errors: when signing, a receipt or key that cannot be used is a ConfigError (exit 2: the command's input is
wrong); when verifying, every failure is a SignatureError (exit 4: the receipt cannot be trusted)."""

from __future__ import annotations

import base64
import binascii
import errno
import hashlib
import json
import os
import re
import tempfile
from pathlib import Path

from cryptography.exceptions import InvalidSignature, UnsupportedAlgorithm
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from reprocube.errors import CheckpointError, ConfigError, ReprocubeError, SignatureError
from reprocube.files import current_umask, fsync_dir, write_json_atomic
from reprocube.formats.script_receipt import FORMAT as SCRIPT_RECEIPT_FORMAT
from reprocube.formats.script_receipt import parse_script_receipt
from reprocube.terminal import one_line
from reprocube.training.checkpoint import MANIFEST, NAME_PATTERN
from reprocube.training.receipt import RECEIPT, RECEIPT_FORMAT, SIGNATURE_FILE, parse_receipt
from reprocube.training.receipt_ownership import check_own_receipt, is_run_directory
from reprocube.untrusted import MAX_JSON_BYTES, Fields, parse_json, read_bytes

SIGNATURE_FORMAT = "reprocube-signature"
SIGNATURE_VERSION = 1
ALGORITHM = "ed25519"
MAX_RECEIPT_BYTES = MAX_JSON_BYTES
MAX_SIGNATURE_BYTES = 64 << 10  # the record is about 400 bytes
MAX_KEY_BYTES = 64 << 10  # an Ed25519 PEM key is about 120 bytes
PUBLIC_KEY_BYTES = 32
SIGNATURE_BYTES = 64
_RECORD_KEYS = ("format", "version", "algorithm", "public_key", "key_id", "receipt_sha256", "signature")
_SHA256_HEX = re.compile(r"[0-9a-f]{64}")


def key_id(public_key_raw: bytes) -> str:
    """A short name for a public key, for messages: the first 16 hex digits of its sha256."""
    return hashlib.sha256(public_key_raw).hexdigest()[:16]


def signature_path(receipt_path: Path) -> Path:
    return Path(receipt_path).with_name(SIGNATURE_FILE)


def signable_receipt(source: Path) -> tuple[Path, bytes]:
    """What `reprocube sign SOURCE` may sign: (the receipt's path, the exact bytes checked). SOURCE is a run
    directory whose receipt.json is that run's own (its checkpoints and metrics.jsonl agree with it:
    receipt_ownership.check_own_receipt), or a receipt given as such: a file, or a directory without checkpoints
    holding receipt.json, that reads strictly as a run's receipt or a script's (`check`'s). A receipt.json
    inside a run directory is that run's, and checked as such. Anything else (another run's receipt copied
    into a run, a checkpoint or metrics.jsonl changed since, a file that is no receipt, a symbolic link) is
    one ConfigError line naming the file and why."""
    source = Path(source)
    if source.is_dir():
        receipt_path, run = source / RECEIPT, source if is_run_directory(source) else None
        if not os.path.lexists(receipt_path):
            raise ConfigError(f"{source} holds no {RECEIPT} (train with this reprocube to get one)")
    else:
        receipt_path, run = source, source.parent if is_run_directory(source.parent) else None
        if run is not None and source.name != RECEIPT:
            raise ConfigError(
                f"{source} lies in the run directory {run}, whose receipt is {run / RECEIPT}: "
                f"only that one is signed there (reprocube sign {run})"
            )
    raw = read_bytes(receipt_path, MAX_RECEIPT_BYTES, ConfigError)  # a link, a FIFO, a directory: refused
    value = parse_json(raw, str(receipt_path), ConfigError)
    kind = value.get("format") if isinstance(value, dict) else None
    try:
        if kind == RECEIPT_FORMAT:
            receipt = parse_receipt(raw, receipt_path, ConfigError)
        elif kind == SCRIPT_RECEIPT_FORMAT:
            parse_script_receipt(raw, receipt_path)
        else:
            shown = one_line(json.dumps(kind))[:40]
            raise ConfigError(
                f"{receipt_path} is not a reprocube receipt (its format is {shown}, not {RECEIPT_FORMAT!r} "
                f"or {SCRIPT_RECEIPT_FORMAT!r})"
            )
        if run is not None:
            if kind != RECEIPT_FORMAT:
                raise ConfigError(f"{receipt_path} is a script's receipt, not one of the run {run} it lies in")
            check_own_receipt(run, receipt, ConfigError)
    except CheckpointError as exc:  # a reader's own error class: here the input of `sign`, exit 2
        raise ConfigError(str(exc)) from None
    if receipt_path.name != RECEIPT:  # its signature would be receipt.sig, which is receipt.json's
        raise ConfigError(
            f"{receipt_path}: reprocube signs a receipt named {RECEIPT} only (its signature is always "
            f"{SIGNATURE_FILE} beside it); copy it into a directory of its own as {RECEIPT} and sign that"
        )
    return receipt_path, raw


def sign_receipt(receipt_path: Path, private_key_path: Path, receipt: bytes | None = None) -> Path:
    """Sign the exact bytes of `receipt_path` (or `receipt`, the bytes of it the caller read and checked)
    with an Ed25519 private key (PEM PKCS#8, unencrypted) and write receipt.sig beside it; returns its path.
    A receipt.sig there is replaced only where it signs these very bytes (check_signature_replaceable)."""
    receipt_path, sig_path = Path(receipt_path), signature_path(receipt_path)
    if receipt is None:
        receipt = read_bytes(receipt_path, MAX_RECEIPT_BYTES, ConfigError)
    private_key = _load_private_key(Path(private_key_path))
    check_signature_replaceable(receipt_path, receipt)
    public_raw = _raw(private_key.public_key())
    record = {
        "format": SIGNATURE_FORMAT,
        "version": SIGNATURE_VERSION,
        "algorithm": ALGORITHM,
        "public_key": base64.b64encode(public_raw).decode("ascii"),
        "key_id": key_id(public_raw),
        "receipt_sha256": hashlib.sha256(receipt).hexdigest(),
        "signature": base64.b64encode(private_key.sign(receipt)).decode("ascii"),
    }
    write_json_atomic(sig_path, record, indent=2)
    return sig_path


def read_signature(receipt_path: Path, error: type[ReprocubeError] = SignatureError) -> dict:
    """The record in receipt.sig beside `receipt_path`, every key checked (not yet the signature itself)."""
    sig_path = signature_path(receipt_path)
    if not os.path.lexists(sig_path):
        raise error(f"{receipt_path} is not signed (no {SIGNATURE_FILE} beside it)")
    where = str(sig_path)
    blob = read_bytes(sig_path, MAX_SIGNATURE_BYTES, error)  # a symbolic link is refused
    fields = Fields(parse_json(blob, where, error), where, error)
    unknown = sorted(set(fields.value) - set(_RECORD_KEYS))
    if unknown:
        raise error(f"{where}: unexpected key {unknown[0]!r} (a signature holds {', '.join(_RECORD_KEYS)})")
    _expect(fields, "format", SIGNATURE_FORMAT)
    version = fields.integer("version", 1, 2**31)
    if version != SIGNATURE_VERSION:
        raise error(f"{where}: version {version} is newer than this reprocube reads ({SIGNATURE_VERSION})")
    _expect(fields, "algorithm", ALGORITHM)
    public_raw = _base64_field(fields, "public_key", PUBLIC_KEY_BYTES)
    _base64_field(fields, "signature", SIGNATURE_BYTES)
    _expect(fields, "key_id", key_id(public_raw), "the key_id of its public_key")
    if not _SHA256_HEX.fullmatch(fields.text("receipt_sha256")):
        _wrong(fields, "receipt_sha256", "64 lowercase hex digits")
    return fields.value


def verify_receipt_signature(receipt_bytes: bytes, receipt_path: Path, public_key_path: Path) -> dict:
    """Check that `receipt_bytes` (the receipt as the caller read it from `receipt_path`, so that what is
    verified is exactly what is used) carry a valid signature by the key in `public_key_path` (PEM
    SubjectPublicKeyInfo, or an OpenSSH `ssh-ed25519 AAAA...` line). Returns the signature record; any
    failure is one SignatureError line."""
    receipt_path, public_key_path = Path(receipt_path), Path(public_key_path)
    given = _load_public_key(public_key_path)
    record = read_signature(receipt_path)
    given_raw, signer_raw = _raw(given), base64.b64decode(record["public_key"])
    if signer_raw != given_raw:
        raise SignatureError(
            f"{receipt_path} is signed by key_id {record['key_id']}, not by the given key "
            f"{key_id(given_raw)} ({public_key_path})"
        )
    actual = hashlib.sha256(receipt_bytes).hexdigest()
    if actual != record["receipt_sha256"]:
        other = f", or {signature_path(receipt_path)} is {RECEIPT}'s" if receipt_path.name != RECEIPT else ""
        raise SignatureError(
            f"{receipt_path} has changed since it was signed{other} "
            f"(sha256 {actual[:16]}..., signed {record['receipt_sha256'][:16]}...)"
        )
    try:
        given.verify(base64.b64decode(record["signature"]), receipt_bytes)
    except InvalidSignature:
        raise SignatureError(
            f"{signature_path(receipt_path)}: the signature is not key {record['key_id']}'s over {receipt_path}"
        ) from None
    return record


def generate_key(private_key_path: Path) -> Path:
    """Write a new Ed25519 private key (PEM PKCS#8, unencrypted, mode 0600) at `private_key_path` and its
    public key (PEM) at `<name>.pub` beside it; returns the public key's path. Refuses to replace either."""
    private_key_path = Path(private_key_path)
    if private_key_path.name in ("", ".", "..") or private_key_path.is_dir():
        raise ConfigError(f"--key {private_key_path} is a directory: give the new private key's file name")
    public_key_path = private_key_path.with_name(private_key_path.name + ".pub")
    for path in (private_key_path, public_key_path):
        if os.path.lexists(path):
            raise ConfigError(f"{path} already exists; reprocube does not replace a key")
    key = Ed25519PrivateKey.generate()
    private_pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    public_pem = key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    _write_new_file(private_key_path, private_pem, 0o600)
    try:
        _write_new_file(public_key_path, public_pem, 0o644 & ~current_umask())
    except BaseException:  # no half pair left behind: the private key is ours, just written
        private_key_path.unlink(missing_ok=True)
        raise
    return public_key_path


def _load_private_key(path: Path) -> Ed25519PrivateKey:
    pem = read_bytes(path, MAX_KEY_BYTES, ConfigError, follow_links=True)  # keys may live anywhere
    try:
        key = serialization.load_pem_private_key(pem, password=None)
    except TypeError:  # what cryptography raises for an encrypted key without a password
        raise ConfigError(f"{path} is an encrypted private key; reprocube signs with an unencrypted one") from None
    except (ValueError, UnsupportedAlgorithm):
        hint = ""
        if b"OPENSSH PRIVATE KEY" in pem:
            hint = " (an OpenSSH private key; reprocube sign --new-key makes a PEM one)"
        elif b"PUBLIC KEY" in pem or pem.lstrip().startswith(b"ssh-"):
            hint = " (a public key; sign with its private key)"
        raise ConfigError(f"{path} is not a PEM PKCS#8 private key{hint}") from None
    if not isinstance(key, Ed25519PrivateKey):
        raise ConfigError(f"{path} holds {_kind(key)} key, not Ed25519 (reprocube sign --new-key makes one)")
    return key


def _load_public_key(path: Path) -> Ed25519PublicKey:
    data = read_bytes(path, MAX_KEY_BYTES, SignatureError, follow_links=True)  # keys may live anywhere
    if b"PRIVATE KEY" in data:
        raise SignatureError(f"{path} is a private key; give its public key ({path.name}.pub)")
    try:
        if data.lstrip().startswith(b"ssh-"):
            key = serialization.load_ssh_public_key(data.strip())
        else:
            key = serialization.load_pem_public_key(data)
    except (ValueError, UnsupportedAlgorithm):
        raise SignatureError(f"{path} is not a PEM or OpenSSH (ssh-ed25519) public key") from None
    if not isinstance(key, Ed25519PublicKey):
        raise SignatureError(f"{path} holds {_kind(key)} key, not Ed25519")
    return key


def check_signature_replaceable(receipt_path: Path, receipt: bytes) -> None:
    """That signing `receipt` (the bytes of `receipt_path`) replaces nothing that is not ours: a receipt.sig
    already there is replaced only where it is a signature reprocube wrote (by any key) of these very bytes
    (its receipt_sha256). Another receipt's signature, an older version's, a link or anything else is one
    ConfigError line naming it."""
    sig_path = signature_path(receipt_path)
    if not os.path.lexists(sig_path):
        return
    if sig_path.is_symlink():
        raise ConfigError(f"{sig_path} is a symbolic link; reprocube does not replace it")
    try:
        record = read_signature(receipt_path, ConfigError)
    except ConfigError as exc:
        raise ConfigError(f"{sig_path} exists and is not a signature reprocube wrote ({exc}); move it away") from None
    actual = hashlib.sha256(receipt).hexdigest()
    if record["receipt_sha256"] != actual:
        raise ConfigError(
            f"{sig_path} signs other bytes than {receipt_path} (sha256 {record['receipt_sha256'][:16]}..., "
            f"this receipt {actual[:16]}...: another receipt, or this one before it changed); reprocube does "
            f"not replace it: move it away to sign {receipt_path}"
        )


def check_new_key_place(private_key_path: Path, receipt_path: Path) -> None:
    """That `--new-key` may write the key pair at `private_key_path` (and `<name>.pub`): not inside the
    directory of the receipt being signed (the run, or what one publishes with it: the signature's own path
    included), nor inside a checkpoint (whose manifest would then not hold) or any `checkpoints` directory.
    Checked before anything is written; a refusal is one ConfigError line."""
    private_key_path = Path(private_key_path)
    where = Path(os.path.realpath(private_key_path.parent))
    signed = Path(os.path.realpath(Path(receipt_path).parent))
    if where.is_relative_to(signed):
        raise ConfigError(
            f"--key {private_key_path} lies inside {Path(receipt_path).parent}, the directory of the receipt "
            f"being signed: write the new key pair elsewhere (keep the private key out of what you publish)"
        )
    for directory in (where, *where.parents):
        checkpoint = NAME_PATTERN.match(directory.name) and (
            directory.parent.name == "checkpoints" or os.path.lexists(directory / MANIFEST)
        )
        if checkpoint or directory.name == "checkpoints":
            raise ConfigError(
                f"--key {private_key_path} lies inside {directory}, a checkpoint or a run's checkpoints "
                f"directory (its files would no longer be the checkpoint's): write the new key pair elsewhere"
            )


def _base64_field(fields: Fields, key: str, length: int) -> bytes:
    text = fields.text(key)
    try:
        raw = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        _wrong(fields, key, "base64")
    if len(raw) != length or base64.b64encode(raw).decode("ascii") != text:  # one spelling per value
        _wrong(fields, key, f"the base64 of {length} bytes")
    return raw


def _expect(fields: Fields, key: str, expected: str, described: str | None = None) -> None:
    if fields.text(key) != expected:
        _wrong(fields, key, described or repr(expected))


def _wrong(fields: Fields, key: str, expected: str):
    shown = fields.value[key]
    shown = shown if len(shown) <= 60 else shown[:57] + "..."
    raise fields.error(f"{fields.where}: {key} must be {expected}, got {shown!r}")


def _raw(public_key: Ed25519PublicKey) -> bytes:
    return public_key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)


def _kind(key) -> str:
    name = type(key).__name__.removesuffix("PrivateKey").removesuffix("PublicKey")
    return f"an {name}" if name[:1] in "AEIORX" else f"a {name}"  # an RSA, an EC, an Ed448, a DSA


def _write_new_file(path: Path, data: bytes, mode: int) -> None:
    """Write-then-link, not write_file_atomic: a key is created with its final mode (a private key is never
    readable by others, even for a moment) and never replaces an existing file or link (link() refuses)."""
    try:
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".partial")
    except OSError as exc:
        raise OSError(exc.errno, exc.strerror, str(path)) from None
    tmp = Path(tmp)
    try:
        with os.fdopen(fd, "wb") as f:
            os.fchmod(f.fileno(), mode)
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.link(tmp, path)
    except FileExistsError:
        raise ConfigError(f"{path} already exists; reprocube does not replace a key") from None
    except OSError as exc:
        raise OSError(exc.errno or errno.EIO, exc.strerror, str(path)) from None
    finally:
        tmp.unlink(missing_ok=True)
    fsync_dir(path.parent)
