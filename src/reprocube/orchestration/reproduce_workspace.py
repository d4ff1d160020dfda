"""reproduce's --out directory (its workspace): B's runs and their logs beside the results. It is made only
once every input is accepted, its marker written first; a failed attempt's leftovers there, and only
they, are cleared by the next. Apart from run_reproduction, which decides what trains: here only the
directory's own rules."""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

from reprocube.errors import ConfigError
from reprocube.files import refuse_inside_checkpoints, safe_name, write_file_atomic
from reprocube.results.reproduce_result import REPORT_FILES, REPRODUCE_RESULT
from reprocube.training.receipt import Receipt


@dataclass
class Workspace:
    """The --out directory: B's runs and their logs, and the reports."""

    out: Path

    @property
    def runs(self) -> Path:
        return self.out / "runs"

    @property
    def logs(self) -> Path:
        return self.out / "logs"


def workspace(out: Path | None, receipt: Receipt) -> Workspace:
    out = Path(out) if out is not None else Path(f"reproduce-{safe_name(receipt.run_name)}")
    source_dir = receipt.path.parent.resolve()
    resolved = out.resolve()
    if resolved == source_dir or source_dir in resolved.parents:
        raise ConfigError(f"--out {out} is inside {source_dir}: reproduce never writes under the published run")
    refuse_inside_checkpoints(out)
    if out.is_symlink() or (out.exists() and not out.is_dir()):
        raise ConfigError(f"--out {out} exists and is not a directory")
    if out.is_dir() and any(out.iterdir()):
        _clear_failed_attempt(out)
    out.mkdir(parents=True, exist_ok=True)
    write_file_atomic(out / ATTEMPT_MARKER, b'{"reprocube_reproduce": 1}\n')  # first: what follows is ours
    return Workspace(out)


# Written first into --out; with no reproduce.json beside it, the directory holds a reproduce that did not
# finish, and a rerun may replace what it left. Only these names: anything else there is not ours.
ATTEMPT_MARKER = ".reprocube-reproduce"
ATTEMPT_NAMES = {"runs", "logs", "operations", "a", *REPORT_FILES, REPRODUCE_RESULT.markdown_name}


def _clear_failed_attempt(out: Path) -> None:
    """A non-empty --out is refused unless it holds exactly what an unfinished reproduce leaves (its
    marker, no reproduce.json): then those leftovers are removed, links unlinked, never followed."""
    marker = out / ATTEMPT_MARKER
    names = {entry.name for entry in out.iterdir()}
    if not (marker.is_file() and not marker.is_symlink()) or REPRODUCE_RESULT.name in names:
        raise ConfigError(f"--out {out} is not empty (an earlier reproduce?); remove it or choose another --out")
    others = sorted(names - ATTEMPT_NAMES - {ATTEMPT_MARKER})
    if others:
        raise ConfigError(
            f"--out {out} holds an unfinished reproduce and {others[0][:80]!r}, which reproduce did not "
            "write: nothing removed; remove it or choose another --out"
        )
    for name in sorted(names - {ATTEMPT_MARKER}):
        path = out / name
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        else:
            path.unlink()
