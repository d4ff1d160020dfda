"""`reprocube sign RUN --key KEY.pem`: sign a run's receipt.json with an Ed25519 key, writing receipt.sig
beside it (reprocube.signing). `--new-key` first makes the key pair (KEY and KEY.pub)."""

from __future__ import annotations

import os
from pathlib import Path

from reprocube.errors import EXIT_OK, ConfigError
from reprocube.signing import generate_key, read_signature, sign_receipt

RECEIPT_FILE = "receipt.json"
HELP = "sign a run's receipt with an Ed25519 key: reprocube sign RUN --key KEY.pem"


def add_arguments(parser) -> None:
    parser.add_argument("source", type=Path, help="a run directory or its receipt.json")
    parser.add_argument("--key", type=Path, required=True, help="an Ed25519 private key (PEM, PKCS#8, unencrypted)")
    parser.add_argument(
        "--new-key", action="store_true", help="first make a key pair: KEY and KEY.pub (never replaced)"
    )


def run(args) -> int:
    source, key = Path(args.source), Path(args.key)
    receipt = source / RECEIPT_FILE if source.is_dir() else source
    if not os.path.lexists(receipt):
        raise ConfigError(f"{source} holds no {RECEIPT_FILE} (train with this reprocube to get one)")
    if getattr(args, "new_key", False):
        public_key = generate_key(key)
        print(f"new key pair: {key} (private, keep it) and {public_key} (give it to those who verify)")
    elif not os.path.lexists(key):
        raise ConfigError(f"--key {key} is missing (reprocube sign --new-key --key {key} makes one)")
    sig_path = sign_receipt(receipt, key)
    print(f"signed {receipt} with key {read_signature(receipt)['key_id']}: {sig_path}")
    return EXIT_OK
