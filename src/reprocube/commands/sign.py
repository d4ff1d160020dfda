"""`reprocube sign SOURCE --key KEY.pem`: sign a receipt with an Ed25519 key, writing receipt.sig beside it
(reprocube.training.signing). SOURCE is a run directory whose receipt.json is that run's own (its checkpoints and
metrics.jsonl agree with it), or a receipt given as such (a run's or a script's, read strictly); anything
else is one line and exit 2, with nothing written. Only a receipt named receipt.json is signed (the signature's
name is fixed), and a receipt.sig already there is replaced only where it signs these very bytes. `--new-key`
first makes the key pair (KEY and KEY.pub), never inside the receipt's directory nor a checkpoint, and only
once every check passed: a refusal leaves nothing behind."""

from __future__ import annotations

import os
from pathlib import Path

from reprocube.errors import EXIT_OK, ConfigError
from reprocube.training.signing import (
    check_new_key_place,
    check_signature_replaceable,
    generate_key,
    read_signature,
    sign_receipt,
    signable_receipt,
)

HELP = "sign a run's receipt with an Ed25519 key: reprocube sign RUN --key KEY.pem"


def add_arguments(parser) -> None:
    parser.add_argument("source", type=Path, help="a run directory, or a receipt (receipt.json, a run's or a script's)")
    parser.add_argument("--key", type=Path, required=True, help="an Ed25519 private key (PEM, PKCS#8, unencrypted)")
    parser.add_argument(
        "--new-key", action="store_true", help="first make a key pair: KEY and KEY.pub (never replaced)"
    )


def run(args) -> int:
    key = Path(args.key)
    receipt, checked = signable_receipt(Path(args.source))  # before anything is written, the key pair too
    check_signature_replaceable(receipt, checked)
    if getattr(args, "new_key", False):
        check_new_key_place(key, receipt)
        public_key = generate_key(key)
        print(f"new key pair: {key} (private, keep it) and {public_key} (give it to those who verify)")
    elif not os.path.lexists(key):
        raise ConfigError(f"--key {key} is missing (reprocube sign --new-key --key {key} makes one)")
    sig_path = sign_receipt(receipt, key, checked)  # the very bytes checked
    print(f"signed {receipt} with key {read_signature(receipt)['key_id']}: {sig_path}")
    return EXIT_OK
