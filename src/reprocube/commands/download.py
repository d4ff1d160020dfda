"""`reprocube download`: fetch and verify a dataset into data_dir (reprocube.data.download)."""

from __future__ import annotations

from reprocube.commands.invocation import Invocation
from reprocube.data.download import download_dataset
from reprocube.errors import EXIT_OK


def run(invocation: Invocation) -> int:
    download_dataset(invocation.cfg)
    return EXIT_OK
