"""What `reprocube check` says before its runs: what it will run, and what the command will not find in its
fresh directories (your HOME's configuration, a relative path given but not copied)."""

from __future__ import annotations

from pathlib import Path

from reprocube.check.options import CheckOptions
from reprocube.files import names_regular_file
from reprocube.terminal import counted, one_line


def announce(options: CheckOptions, how: str, out: Path, echo) -> None:
    command = list(options.command)
    quick = " (--quick: no control, no restart given other state)" if options.quick else ""
    echo(
        one_line(
            f"check {' '.join(command)}: {counted(options.repeat, 'clean run')}, {counted(options.stops, 'stop')} "
            f"by {how}{quick}; evidence in {out}"
        )
    )
    echo(
        "  note: each run has an empty HOME and TMPDIR of its own: configuration read from your ~ "
        "(~/.keras/keras.json, accelerate's default_config.yaml, rc files) is not there (docs/check.md)"
    )
    copied = {path.name for path in options.copy}
    for arg in command:  # a relative path the user meant from here: the command runs in a fresh directory
        if not Path(arg).is_absolute() and names_regular_file(arg) and Path(arg).name not in copied:
            echo(
                one_line(
                    f"  note: {arg} is here but the command runs in an empty work directory: pass "
                    f"--copy {arg}, or give its absolute path"
                )
            )
