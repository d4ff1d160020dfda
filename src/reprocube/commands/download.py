"""`reprocube download`: fetch and verify a dataset into data_dir (reprocube.data.download)."""

from __future__ import annotations

from reprocube.data.download import download_dataset
from reprocube.errors import EXIT_OK
from reprocube.orchestration.invocation import add_config_arguments

HELP = "fetch and verify a dataset: reprocube download dataset=fashion_mnist data_dir=data"


def add_arguments(parser) -> None:
    add_config_arguments(parser)


def run(args) -> int:
    invocation = args.invocation
    download_dataset(invocation.cfg)
    return EXIT_OK
