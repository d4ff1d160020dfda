"""`reprocube train`: train (or resume) one run (reprocube.loop)."""

from __future__ import annotations

from reprocube.commands.invocation import Invocation
from reprocube.loop import train


def run(invocation: Invocation) -> int:
    return train(invocation.cfg)
