"""`reprocube sign RUN --key KEY.pem`: sign a run's receipt.json with an Ed25519 key, writing receipt.sig
beside it (reprocube.signing). `--new-key` first makes the key pair (KEY and KEY.pub)."""

from __future__ import annotations

import os
from pathlib import Path

from reprocube.errors import EXIT_OK, ConfigError
from reprocube.signing import generate_key, read_signature, sign_receipt

RECEIPT_FILE = "receipt.json"


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
