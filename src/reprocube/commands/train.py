"""`reprocube train`: train (or resume) one run (reprocube.loop)."""

from __future__ import annotations

from reprocube.loop import train
from reprocube.orchestration.invocation import add_config_arguments

HELP = "train (or resume) a model: reprocube train framework=pytorch epochs=4 seed=1"


def add_arguments(parser) -> None:
    add_config_arguments(parser)


def run(args) -> int:
    invocation = args.invocation
    return train(invocation.cfg)
