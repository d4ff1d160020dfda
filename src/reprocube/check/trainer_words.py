"""What a trainer itself says when it resumes badly: known messages of the trainers docs/frameworks.md
measured, looked for in the restarts' log, so that a verdict names the cause in the trainer's own words
(and the table's row that measured it) instead of the general suspects. Only check's own fixed words are
ever shown: the log is the command's output, read from its end, never quoted or interpreted."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from reprocube.errors import CheckpointError
from reprocube.untrusted import read_tail

MAX_LOG_BYTES = 4 << 20  # of a stopped run's log, its end: the restarts' messages


@dataclass(frozen=True)
class TrainerMessage:
    pattern: re.Pattern[str]  # a phrase of the trainer's own message
    says: str  # what it means, in check's words (quoted in the verdict)


KNOWN = (
    TrainerMessage(
        re.compile(
            r"resuming from a checkpoint that ended before the epoch ended and your dataloader is not resumable"
        ),
        "Lightning warned in the restart that its dataloader is not resumable: a restart from a mid-epoch "
        "checkpoint starts the epoch's loader over (docs/frameworks.md, row lightning-save-rng-mid-epoch; "
        "an epoch-end checkpoint, or a loader with state_dict/load_state_dict, resumes it)",
    ),
)


def restarts_said(log: Path) -> tuple[str, ...]:
    """The known messages the restarts (every attempt after the first, each after its `$ command` line in
    the log) printed, in check's words; none where the log cannot be read."""
    try:
        data, _ = read_tail(log, MAX_LOG_BYTES, CheckpointError)
    except CheckpointError:
        return ()
    # The first part is the first attempt (the log begins with its `$ command` line) or, where only the
    # log's end was read, part of an attempt that cannot be told: left out either way.
    restarts = "\n".join(data.decode("utf-8", "replace").split("\n$ ")[1:])
    return tuple(message.says for message in KNOWN if message.pattern.search(restarts))
