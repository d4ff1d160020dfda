"""`reprocube train`: train (or resume) one run (reprocube.training.loop)."""

from __future__ import annotations

from reprocube.orchestration.invocation import add_config_arguments
from reprocube.training.loop import train

HELP = "train (or resume) a model: reprocube train framework=pytorch epochs=4 seed=1"


def add_arguments(parser) -> None:
    add_config_arguments(parser)


def run(args) -> int:
    invocation = args.invocation
    return train(invocation.cfg)
