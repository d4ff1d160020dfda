"""Receipt signatures: `reprocube sign` and reprocube.training.signing, with real Ed25519 keys and a fake receipt."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import shutil
import stat
from pathlib import Path

import numpy as np
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ed25519, rsa

from reprocube.cli import main
from reprocube.errors import EXIT_CHECKPOINT, EXIT_CONFIG, EXIT_OK, ConfigError, SignatureError
from reprocube.formats.script_receipt import write_script_receipt
from reprocube.training import signing
from reprocube.training.receipt import self_digest
from reprocube.training.signing import SIGNATURE_FILE, generate_key, sign_receipt, verify_receipt_signature

from helpers import reprocube, rewrite_checkpoint_file

RECEIPT = b'{"format": "reprocube-receipt", "seed": 1, "digest": "abc"}\n'


@pytest.fixture
def run_dir(tmp_path) -> Path:
    run = tmp_path / "run"
    run.mkdir()
    (run / "receipt.json").write_bytes(RECEIPT)
    (run / "config.yaml").write_text("seed: 1\n")
    return run


@pytest.fixture
def keys(tmp_path) -> tuple[Path, Path]:
    """(private key, public key) made by generate_key."""
    private = tmp_path / "keys" / "signer.pem"
    private.parent.mkdir()
    return private, generate_key(private)


def one_line(exc_info) -> str:
    message = str(exc_info.value)
    assert "\n" not in message and "Traceback" not in message
    return message


def write_pem_private(path: Path, key, encryption=None) -> Path:
    path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            encryption or serialization.NoEncryption(),
        )
    )
    return path


def public_id(public_key_path: Path) -> str:
    key = serialization.load_pem_public_key(public_key_path.read_bytes())
    return signing.key_id(key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw))


def tree_digest(directory: Path) -> dict[str, str]:
    return {
        str(p.relative_to(directory)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(directory.rglob("*"))
        if p.is_file()
    }


def test_a_signed_receipt_verifies(run_dir, keys):
    private, public = keys
    sig_path = sign_receipt(run_dir / "receipt.json", private)
    assert sig_path == run_dir / SIGNATURE_FILE
    record = json.loads(sig_path.read_bytes())
    assert record["format"] == "reprocube-signature" and record["version"] == 1 and record["algorithm"] == "ed25519"
    assert record["receipt_sha256"] == hashlib.sha256(RECEIPT).hexdigest()
    assert record["key_id"] == public_id(public)
    assert len(base64.b64decode(record["public_key"])) == 32
    assert verify_receipt_signature(RECEIPT, run_dir / "receipt.json", public) == record


def test_the_keys_generate_key_writes(tmp_path, keys):
    private, public = keys
    assert public == private.with_name("signer.pem.pub")
    assert stat.S_IMODE(private.stat().st_mode) == 0o600
    assert private.read_bytes().startswith(b"-----BEGIN PRIVATE KEY-----")
    assert public.read_bytes().startswith(b"-----BEGIN PUBLIC KEY-----")
    assert sorted(p.name for p in private.parent.iterdir()) == ["signer.pem", "signer.pem.pub"]  # no temp left
    before = tree_digest(private.parent)
    with pytest.raises(ConfigError, match="already exists") as exc:
        generate_key(private)
    one_line(exc)
    assert tree_digest(private.parent) == before


def test_generate_key_refuses_an_existing_public_key_or_link(tmp_path):
    (tmp_path / "a.pem.pub").write_text("someone else's")
    with pytest.raises(ConfigError, match="a.pem.pub already exists"):
        generate_key(tmp_path / "a.pem")
    assert not (tmp_path / "a.pem").exists()
    (tmp_path / "b.pem").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(ConfigError, match="b.pem already exists"):
        generate_key(tmp_path / "b.pem")
    assert not (tmp_path / "elsewhere").exists()


def test_one_flipped_byte_fails(run_dir, keys):
    private, public = keys
    sign_receipt(run_dir / "receipt.json", private)
    flipped = bytearray(RECEIPT)
    flipped[10] ^= 0x01
    with pytest.raises(SignatureError, match="has changed since it was signed") as exc:
        verify_receipt_signature(bytes(flipped), run_dir / "receipt.json", public)
    one_line(exc)


def test_a_forged_hash_still_fails_on_the_signature(run_dir, keys):
    private, public = keys
    sig_path = sign_receipt(run_dir / "receipt.json", private)
    tampered = RECEIPT.replace(b'"seed": 1', b'"seed": 2')
    record = json.loads(sig_path.read_bytes())
    record["receipt_sha256"] = hashlib.sha256(tampered).hexdigest()
    sig_path.write_text(json.dumps(record))
    with pytest.raises(SignatureError, match="the signature is not key") as exc:
        verify_receipt_signature(tampered, run_dir / "receipt.json", public)
    one_line(exc)


def test_a_signature_by_another_key_names_both_key_ids(tmp_path, run_dir, keys):
    private, public = keys
    other_private = tmp_path / "other.pem"
    other_public = generate_key(other_private)
    sign_receipt(run_dir / "receipt.json", other_private)
    with pytest.raises(SignatureError) as exc:
        verify_receipt_signature(RECEIPT, run_dir / "receipt.json", public)
    message = one_line(exc)
    assert f"signed by key_id {public_id(other_public)}, not by the given key {public_id(public)}" in message


def test_an_openssh_public_key_is_accepted(tmp_path, run_dir, keys):
    private, _ = keys
    key = serialization.load_pem_private_key(private.read_bytes(), password=None)
    ssh_line = key.public_key().public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)
    (tmp_path / "id.pub").write_bytes(ssh_line + b" me@example\n")
    sign_receipt(run_dir / "receipt.json", private)
    assert verify_receipt_signature(RECEIPT, run_dir / "receipt.json", tmp_path / "id.pub")["version"] == 1


def test_a_missing_signature(run_dir, keys):
    with pytest.raises(SignatureError) as exc:
        verify_receipt_signature(RECEIPT, run_dir / "receipt.json", keys[1])
    assert one_line(exc) == f"{run_dir / 'receipt.json'} is not signed (no receipt.sig beside it)"
    assert SignatureError.exit_code == EXIT_CHECKPOINT == 4


def _signed_record(run_dir, keys) -> dict:
    return json.loads(sign_receipt(run_dir / "receipt.json", keys[0]).read_bytes())


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda r: r.update(version="1"), "version must be an integer"),
        (lambda r: r.update(version=2), "version 2 is newer than this reprocube reads"),
        (lambda r: r.update(format="other"), "format must be 'reprocube-signature'"),
        (lambda r: r.update(algorithm="rsa"), "algorithm must be 'ed25519'"),
        (lambda r: r.update(public_key=123), "public_key must be a string"),
        (lambda r: r.update(public_key="not base64!"), "public_key must be base64"),
        (lambda r: r.update(public_key=base64.b64encode(b"x" * 31).decode()), "public_key must be the base64 of 32"),
        (lambda r: r.update(signature=None), "signature must be a string"),
        (lambda r: r.update(signature=r["signature"][:-4]), "signature must be the base64 of 64"),
        (lambda r: r.update(key_id="0" * 16), "key_id must be the key_id of its public_key"),
        (lambda r: r.update(receipt_sha256=["a"]), "receipt_sha256 must be a string"),
        (lambda r: r.update(receipt_sha256="A" * 64), "receipt_sha256 must be 64 lowercase hex digits"),
        (lambda r: r.update(extra=1), "unexpected key 'extra'"),
        (lambda r: r.pop("signature"), "signature must be a string, got <absent>"),
    ],
)
def test_a_signature_with_wrong_types_or_values(run_dir, keys, change, message):
    record = _signed_record(run_dir, keys)
    change(record)
    (run_dir / SIGNATURE_FILE).write_text(json.dumps(record))
    with pytest.raises(SignatureError, match=message) as exc:
        verify_receipt_signature(RECEIPT, run_dir / "receipt.json", keys[1])
    assert str(run_dir / SIGNATURE_FILE) in one_line(exc)


@pytest.mark.parametrize(
    "content, message",
    [
        (b"", "is not valid JSON"),
        (b"\xff\xfe", "is not UTF-8 text"),
        (b"[1, 2]", "is not a JSON object"),
        (b'{"format": "reprocube-signature", "format": "x"}', "appears twice"),
        (b'{"version": NaN}', "NaN is not a number JSON allows"),
        (b"[" * 60_000, "nested too deeply"),
        (b" " * (signing.MAX_SIGNATURE_BYTES + 1), "more than the"),
    ],
)
def test_a_garbled_or_oversized_signature(run_dir, keys, content, message):
    (run_dir / SIGNATURE_FILE).write_bytes(content)
    with pytest.raises(SignatureError, match=message) as exc:
        verify_receipt_signature(RECEIPT, run_dir / "receipt.json", keys[1])
    one_line(exc)


def test_a_symlinked_or_special_signature_is_refused(tmp_path, run_dir, keys):
    real = sign_receipt(run_dir / "receipt.json", keys[0])
    elsewhere = tmp_path / "elsewhere.sig"
    real.rename(elsewhere)
    (run_dir / SIGNATURE_FILE).symlink_to(elsewhere)
    with pytest.raises(SignatureError, match="is a symbolic link") as exc:
        verify_receipt_signature(RECEIPT, run_dir / "receipt.json", keys[1])
    one_line(exc)
    (run_dir / SIGNATURE_FILE).unlink()
    os.mkfifo(run_dir / SIGNATURE_FILE)  # must not hang
    with pytest.raises(SignatureError, match="is not a regular file"):
        verify_receipt_signature(RECEIPT, run_dir / "receipt.json", keys[1])


def test_keys_of_other_types_or_encrypted_are_refused(tmp_path, run_dir, keys):
    rsa_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    rsa_private = write_pem_private(tmp_path / "rsa.pem", rsa_key)
    with pytest.raises(ConfigError, match="rsa.pem holds an RSA key, not Ed25519") as exc:
        sign_receipt(run_dir / "receipt.json", rsa_private)
    one_line(exc)
    encrypted = write_pem_private(
        tmp_path / "enc.pem", ed25519.Ed25519PrivateKey.generate(), serialization.BestAvailableEncryption(b"pw")
    )
    with pytest.raises(ConfigError, match="enc.pem is an encrypted private key") as exc:
        sign_receipt(run_dir / "receipt.json", encrypted)
    one_line(exc)
    (tmp_path / "junk.pem").write_bytes(b"-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n")
    with pytest.raises(ConfigError, match="junk.pem is not a PEM PKCS#8 private key"):
        sign_receipt(run_dir / "receipt.json", tmp_path / "junk.pem")
    with pytest.raises(ConfigError, match="signer.pem.pub is not a PEM PKCS#8 private key \\(a public key"):
        sign_receipt(run_dir / "receipt.json", keys[1])
    (tmp_path / "big.pem").write_bytes(b"x" * (signing.MAX_KEY_BYTES + 1))
    with pytest.raises(ConfigError, match="more than the"):
        sign_receipt(run_dir / "receipt.json", tmp_path / "big.pem")
    assert not (run_dir / SIGNATURE_FILE).exists()

    sign_receipt(run_dir / "receipt.json", keys[0])
    rsa_public = tmp_path / "rsa.pub"
    rsa_public.write_bytes(
        rsa_key.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    )
    for public, message in [
        (rsa_public, "rsa.pub holds an RSA key, not Ed25519"),
        (keys[0], "signer.pem is a private key; give its public key"),
        (tmp_path / "junk.pem", "junk.pem is a private key"),
        (run_dir / "receipt.json", "receipt.json is not a PEM or OpenSSH"),
        (tmp_path / "absent.pub", "absent.pub is missing"),
    ]:
        with pytest.raises(SignatureError, match=message) as exc:
            verify_receipt_signature(RECEIPT, run_dir / "receipt.json", public)
        one_line(exc)


def test_signing_replaces_our_signature_but_nothing_else(tmp_path, run_dir, keys):
    sign_receipt(run_dir / "receipt.json", keys[0])
    other_public = generate_key(tmp_path / "other.pem")
    sign_receipt(run_dir / "receipt.json", tmp_path / "other.pem")  # ours, by another key: replaced
    verify_receipt_signature(RECEIPT, run_dir / "receipt.json", other_public)

    (run_dir / SIGNATURE_FILE).write_text("my notes\n")
    with pytest.raises(ConfigError, match="exists and is not a signature reprocube wrote") as exc:
        sign_receipt(run_dir / "receipt.json", keys[0])
    one_line(exc)
    assert (run_dir / SIGNATURE_FILE).read_text() == "my notes\n"

    (run_dir / SIGNATURE_FILE).unlink()
    (run_dir / SIGNATURE_FILE).symlink_to(tmp_path / "target")
    with pytest.raises(ConfigError, match="is a symbolic link"):
        sign_receipt(run_dir / "receipt.json", keys[0])
    assert not (tmp_path / "target").exists() and (run_dir / SIGNATURE_FILE).is_symlink()


def test_sign_reads_the_receipt_as_untrusted(tmp_path, run_dir, keys):
    (run_dir / "receipt.json").unlink()
    (run_dir / "receipt.json").symlink_to(tmp_path / "elsewhere.json")
    (tmp_path / "elsewhere.json").write_bytes(RECEIPT)
    with pytest.raises(ConfigError, match="is a symbolic link"):
        sign_receipt(run_dir / "receipt.json", keys[0])


# The command line, end to end, on a real run.

REFERENCE = Path(__file__).parent / "receipts" / "avx512" / "pytorch" / "receipt.json"  # another run's, signed


@pytest.fixture(scope="module")
def trained(generated, tmp_path_factory) -> tuple[Path, bytes]:
    """A real PyTorch run of two epochs (checkpoints epoch-0001 and epoch-0002), and the receipt it held
    after its first epoch (an older receipt of the same run)."""
    cwd = tmp_path_factory.mktemp("signed-run")
    common = ("train", "framework=pytorch", *generated.overrides(), "log.every_steps=5", "run_name=r")
    reprocube(*common, "epochs=1", cwd=cwd)
    older = (cwd / "runs" / "r" / "receipt.json").read_bytes()
    reprocube(*common, "epochs=2", "resume=latest", cwd=cwd)
    return cwd / "runs" / "r", older


@pytest.fixture
def run(trained, tmp_path) -> Path:
    """A copy of the trained run, to sign or to spoil."""
    return Path(shutil.copytree(trained[0], tmp_path / "run", symlinks=True))


def forged_receipt(receipt: bytes, change) -> bytes:
    """The receipt changed by `change`, its receipt_sha256 recomputed (as a forger would)."""
    value = json.loads(receipt)
    change(value)
    value["receipt_sha256"] = self_digest(value)
    return json.dumps(value).encode()


def script_receipt(directory: Path) -> Path:
    """A script's receipt (as `check` writes one), in `directory`."""
    return write_script_receipt(
        directory, ["python", "train.py"], {}, [], {}, None, 1.5, {}, {"variable": "SEED", "value": "0"}
    )


@pytest.mark.process
def test_cli_signs_a_run_and_writes_only_receipt_sig(run, keys, capsys):
    before = tree_digest(run)
    assert main(["sign", str(run), "--key", str(keys[0])]) == EXIT_OK
    after = tree_digest(run)
    assert set(after) - set(before) == {SIGNATURE_FILE}
    assert {k: v for k, v in after.items() if k != SIGNATURE_FILE} == before
    out = capsys.readouterr().out
    expected = f"signed {run / 'receipt.json'} with key {public_id(keys[1])}: {run / SIGNATURE_FILE}\n"
    assert out == expected
    verify_receipt_signature((run / "receipt.json").read_bytes(), run / "receipt.json", keys[1])

    # a receipt.json path works as well, and re-signing replaces our own signature
    assert main(["sign", str(run / "receipt.json"), "--key", str(keys[0])]) == EXIT_OK
    assert set(tree_digest(run)) == set(after)


def test_cli_signs_a_receipt_given_as_such_a_runs_or_a_scripts(tmp_path, keys):
    published = tmp_path / "published"
    published.mkdir()
    shutil.copy(REFERENCE, published / "receipt.json")
    script = script_receipt(tmp_path / "check" / "receipt")
    for given, receipt in (
        (published, published / "receipt.json"),  # a directory holding a receipt, without checkpoints
        (published / "receipt.json", published / "receipt.json"),
        (script.parent, script),
        (script, script),
    ):
        assert main(["sign", str(given), "--key", str(keys[0])]) == EXIT_OK, given
        assert verify_receipt_signature(receipt.read_bytes(), receipt, keys[1])["key_id"] == public_id(keys[1])


@pytest.mark.process
def test_cli_new_key(tmp_path, run, capsys):
    key = tmp_path / "new.pem"
    assert main(["sign", str(run), "--key", str(key), "--new-key"]) == EXIT_OK
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 2 and str(key) in lines[0] and f"{key}.pub" in lines[0]
    assert lines[1].startswith(f"signed {run / 'receipt.json'} with key {public_id(tmp_path / 'new.pem.pub')}")
    verify_receipt_signature((run / "receipt.json").read_bytes(), run / "receipt.json", tmp_path / "new.pem.pub")

    before = key.read_bytes()
    assert main(["sign", str(run), "--key", str(key), "--new-key"]) == EXIT_CONFIG
    err = capsys.readouterr().err
    assert err == f"reprocube: error: {key} already exists; reprocube does not replace a key\n"
    assert key.read_bytes() == before


@pytest.mark.process
@pytest.mark.parametrize(
    "setup, status, message",
    [
        ("no receipt", EXIT_CONFIG, "{run} holds no receipt.json (train with this reprocube to get one)"),
        ("no key", EXIT_CONFIG, "--key {key} is missing (reprocube sign --new-key --key {key} makes one)"),
        ("rsa key", EXIT_CONFIG, "{key} holds an RSA key, not Ed25519"),
        ("foreign sig", EXIT_CONFIG, "{run}/receipt.sig exists and is not a signature reprocube wrote"),
    ],
)
def test_cli_bad_input_is_one_line_and_a_status(tmp_path, run, capsys, setup, status, message):
    key = tmp_path / "key.pem"
    if setup == "no receipt":
        (run / "receipt.json").unlink()
        generate_key(key)
    elif setup == "rsa key":
        write_pem_private(key, rsa.generate_private_key(public_exponent=65537, key_size=2048))
    elif setup == "foreign sig":
        generate_key(key)
        (run / SIGNATURE_FILE).write_text("{}")
    before = tree_digest(run)
    assert main(["sign", str(run), "--key", str(key)]) == status
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert err.startswith("reprocube: error: " + message.format(run=run, key=key))
    assert tree_digest(run) == before


def _another_runs_receipt(run: Path, older: bytes) -> tuple[Path, str]:
    shutil.copy(REFERENCE, run / "receipt.json")
    return run, f"{run}/checkpoints/epoch-0001: its config_hash is not {run}/receipt.json's config's"


def _older_receipt(run: Path, older: bytes) -> tuple[Path, str]:
    (run / "receipt.json").write_bytes(older)  # the same run's, from before its second epoch
    return run, f"{run}/checkpoints/epoch-0002 is not a checkpoint {run}/receipt.json lists (epoch-0001)"


def _other_weights(run: Path, older: bytes) -> tuple[Path, str]:
    """The same config, other weights (another machine's run of it, say): its records say so."""
    own = (run / "receipt.json").read_bytes()
    (run / "receipt.json").write_bytes(forged_receipt(own, lambda r: r["epochs"][-1].update(weights_digest="0" * 64)))
    return run, f"{run}/checkpoints/epoch-0002: its weights are not the ones {run}/receipt.json records for epoch 2"


def _metrics_edited(run: Path, older: bytes) -> tuple[Path, str]:
    text = (run / "metrics.jsonl").read_text()
    records = [json.loads(line) for line in text.splitlines()]
    last = max(i for i, r in enumerate(records) if r["kind"] == "epoch")
    records[last]["test_accuracy"] = 0.99
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    return run, f"{run}/metrics.jsonl: the record of epoch 2 is not the one {run}/receipt.json holds"


def _checkpoint_damaged(run: Path, older: bytes) -> tuple[Path, str]:
    weights = run / "checkpoints" / "epoch-0001" / "weights.safetensors"
    blob = bytearray(weights.read_bytes())
    blob[-1] ^= 1
    weights.write_bytes(bytes(blob))
    return run, f"checkpoint {run}/checkpoints/epoch-0001: weights.safetensors does not match its sha256"


def _checkpoint_resealed(run: Path, older: bytes) -> tuple[Path, str]:
    """Other weights in a checkpoint whose manifest was resealed to them: whole, but not the receipt's."""
    from safetensors.numpy import load, save

    from reprocube.training.checkpoint import weights_digest

    checkpoint = run / "checkpoints" / "epoch-0002"
    weights = load((checkpoint / "weights.safetensors").read_bytes())
    first = sorted(weights)[0]
    weights[first] = weights[first] + np.float32(1)
    rewrite_checkpoint_file(checkpoint, "weights.safetensors", save(weights), weights_digest=weights_digest(weights))
    return run, f"{checkpoint}: its weights are not the ones {run}/receipt.json records for epoch 2"


def _state_not_an_object(run: Path, older: bytes) -> tuple[Path, str]:
    """A checkpoint resealed around a state.json that is no object: one line, never a traceback."""
    checkpoint = run / "checkpoints" / "epoch-0002"
    rewrite_checkpoint_file(checkpoint, "state.json", b"[]")
    return run, f"{checkpoint}: its trace (state.json) is not {run}/receipt.json's"


def _linked_receipt(run: Path, older: bytes) -> tuple[Path, str]:
    elsewhere = run.parent / "elsewhere.json"
    (run / "receipt.json").rename(elsewhere)
    (run / "receipt.json").symlink_to(elsewhere)
    return run, f"{run}/receipt.json is a symbolic link"


def _a_script_receipt_in_a_run(run: Path, older: bytes) -> tuple[Path, str]:
    script = script_receipt(run.parent / "script")
    shutil.copy(script, run / "receipt.json")
    return run, f"{run}/receipt.json is a script's receipt, not one of the run {run} it lies in"


def _another_file_in_a_run(run: Path, older: bytes) -> tuple[Path, str]:
    shutil.copy(REFERENCE, run / "published.json")
    return run / "published.json", f"{run}/published.json lies in the run directory {run}"


def _plain_text(run: Path, older: bytes) -> tuple[Path, str]:
    notes = run.parent / "notes" / "notes.txt"
    notes.parent.mkdir()
    notes.write_text("my notes\n")
    return notes, f"{notes} is not valid JSON"


def _json_not_a_receipt(run: Path, older: bytes) -> tuple[Path, str]:
    other = run.parent / "other" / "receipt.json"
    other.parent.mkdir()
    other.write_text('{"format": "reprocube-signature"}')
    return other, f'{other} is not a reprocube receipt (its format is "reprocube-signature"'


def _forged_receipt_alone(run: Path, older: bytes) -> tuple[Path, str]:
    """A receipt given as such is read strictly: one edited without its self-digest is refused."""
    edited = run.parent / "edited" / "receipt.json"
    edited.parent.mkdir()
    edited.write_bytes(REFERENCE.read_bytes().replace(b'"seed":3', b'"seed":4'))
    return edited, f"{edited}: receipt_sha256 does not match its content"


def _directory_without_receipt(run: Path, older: bytes) -> tuple[Path, str]:
    (run.parent / "empty").mkdir()
    return run.parent / "empty", f"{run.parent / 'empty'} holds no receipt.json"


@pytest.mark.process
@pytest.mark.parametrize(
    "spoil",
    [
        _another_runs_receipt,
        _older_receipt,
        _other_weights,
        _metrics_edited,
        _checkpoint_damaged,
        _checkpoint_resealed,
        _state_not_an_object,
        _linked_receipt,
        _a_script_receipt_in_a_run,
        _another_file_in_a_run,
        _plain_text,
        _json_not_a_receipt,
        _forged_receipt_alone,
        _directory_without_receipt,
    ],
)
def test_cli_signs_only_a_runs_own_receipt_or_a_receipt(trained, run, tmp_path, capsys, spoil):
    """What is not a run's own receipt, nor a receipt read strictly, is refused: one line naming the file
    and why, exit 2, nothing written (not even the new key pair)."""
    given, message = spoil(run, trained[1])
    key = tmp_path / "keys" / "new.pem"
    key.parent.mkdir()
    before = tree_digest(tmp_path)
    assert main(["sign", str(given), "--key", str(key), "--new-key"]) == EXIT_CONFIG
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    assert err.startswith(f"reprocube: error: {message}"), err
    assert tree_digest(tmp_path) == before and not any(key.parent.iterdir())
    assert not any(p.name == SIGNATURE_FILE for p in tmp_path.rglob("*"))


def test_cli_without_key_is_a_usage_error(run_dir, capsys):
    with pytest.raises(SystemExit) as exc:
        main(["sign", str(run_dir)])
    assert exc.value.code == EXIT_CONFIG
    assert capsys.readouterr().err.count("\n") == 1


def test_cli_never_replaces_the_signature_of_other_bytes(tmp_path, keys, capsys):
    """receipt.sig is replaced only where it signs the very receipt being signed: never another receipt's
    beside it (a file not named receipt.json is refused: its signature would be receipt.json's), nor the
    signature of the receipt.json there before it changed. One line, exit 2, nothing written."""
    published = tmp_path / "pub"
    published.mkdir()
    shutil.copy(REFERENCE, published / "receipt.json")
    assert main(["sign", str(published), "--key", str(keys[0])]) == EXIT_OK
    capsys.readouterr()
    signed = (published / SIGNATURE_FILE).read_bytes()
    script = script_receipt(tmp_path / "script")
    shutil.copy(script, published / "other-run.json")  # another valid receipt beside the signed one
    new_key = tmp_path / "new" / "k.pem"
    new_key.parent.mkdir()
    message = (
        f"{published / 'other-run.json'}: reprocube signs a receipt named receipt.json only "
        f"(its signature is always {SIGNATURE_FILE} beside it)"
    )
    for extra in ([], ["--new-key"]):
        key = new_key if extra else keys[0]
        before = tree_digest(tmp_path)
        assert main(["sign", str(published / "other-run.json"), "--key", str(key), *extra]) == EXIT_CONFIG
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and err.startswith(f"reprocube: error: {message}"), err
        assert tree_digest(tmp_path) == before and not any(new_key.parent.iterdir())
    receipt = published / "receipt.json"
    verify_receipt_signature(receipt.read_bytes(), receipt, keys[1])  # still the first receipt's signature
    other = published / "other-run.json"
    with pytest.raises(SignatureError, match=f"or {published / SIGNATURE_FILE} is receipt.json's") as exc:
        verify_receipt_signature(other.read_bytes(), other, keys[1])
    one_line(exc)

    (published / "receipt.json").write_bytes(script.read_bytes())  # receipt.json is now another receipt
    digest = json.loads(signed)["receipt_sha256"]
    message = f"{published / SIGNATURE_FILE} signs other bytes than {receipt} (sha256 {digest[:16]}..."
    for extra in ([], ["--new-key"]):
        key = new_key if extra else keys[0]
        before = tree_digest(tmp_path)
        assert main(["sign", str(published), "--key", str(key), *extra]) == EXIT_CONFIG
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and err.startswith(f"reprocube: error: {message}"), err
        assert tree_digest(tmp_path) == before and not any(new_key.parent.iterdir())
    assert (published / SIGNATURE_FILE).read_bytes() == signed

    (published / SIGNATURE_FILE).unlink()  # moved away: then it is signed
    assert main(["sign", str(published), "--key", str(keys[0])]) == EXIT_OK
    verify_receipt_signature(receipt.read_bytes(), receipt, keys[1])


@pytest.mark.process
def test_cli_new_key_is_never_written_where_it_does_damage(tmp_path, run, capsys):
    """--new-key writes no key inside the receipt's directory (the signature's own path included) nor inside
    any checkpoint, and nothing at all before every check passed: one line, exit 2, nothing written."""
    published = tmp_path / "pub"
    published.mkdir()
    shutil.copy(REFERENCE, published / "receipt.json")
    elsewhere = Path(shutil.copytree(run, tmp_path / "another-run", symlinks=True))
    cases = [
        (published, published / SIGNATURE_FILE, f"--key {published / SIGNATURE_FILE} lies inside {published}"),
        (published, published / "keys" / "k.pem", f"--key {published / 'keys' / 'k.pem'} lies inside {published}"),
        (run, run / "k.pem", f"--key {run / 'k.pem'} lies inside {run}"),
    ]
    inside = run / "checkpoints" / "epoch-0001" / "k.pem"  # the run's own checkpoint: inside the run
    cases.append((run, inside, f"--key {inside} lies inside {run}, the directory of the receipt being signed"))
    checkpoint = elsewhere / "checkpoints" / "epoch-0002"  # any other run's checkpoint
    cases.append((run, checkpoint / "k.pem", f"--key {checkpoint / 'k.pem'} lies inside {checkpoint}, a checkpoint"))
    cases.append((run, elsewhere / "checkpoints" / "k.pem", f"lies inside {elsewhere / 'checkpoints'}, a checkpoint"))
    (published / "keys").mkdir()
    for source, key, message in cases:
        before = tree_digest(tmp_path)
        assert main(["sign", str(source), "--key", str(key), "--new-key"]) == EXIT_CONFIG, key
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "Traceback" not in err, err
        assert message in err and err.startswith("reprocube: error: --key"), err
        assert tree_digest(tmp_path) == before, key
        assert not os.path.lexists(key) and not os.path.lexists(f"{key}.pub")
    # the run still is its own, and signs with a key made outside it
    assert main(["sign", str(run), "--key", str(tmp_path / "k.pem"), "--new-key"]) == EXIT_OK
    assert main(["sign", str(elsewhere), "--key", str(tmp_path / "k.pem")]) == EXIT_OK
