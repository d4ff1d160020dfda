"""What any command writes in check's directories that hold the runs' own (work/, home/, tmp/ under --out,
"../" from a work directory), their trees unwatched. Nothing but the runs' directories belongs there (--out
was new or empty): whatever is written there, even if removed later, is a run's state kept outside its own
directories, which every attempt here finds and a restart on another machine does not."""

from __future__ import annotations

from pathlib import Path

from reprocube.check.evidence_dirs import DirectoryReplaced, EvidenceDirs
from reprocube.check.file_activity import FileActivity


class BesideRuns:
    """A context: watched while the runs go; `written()` afterwards."""

    def __init__(self, out: Path, run_names: frozenset[str]):
        self.out, self.run_names = out, run_names
        self.activity: FileActivity | None = None

    def __enter__(self) -> BesideRuns:
        dirs, places = EvidenceDirs.of(self.out), {p: self.out / p for p in ("work", "home", "tmp")}
        try:
            for directory in places.values():
                dirs.make(directory)
        except DirectoryReplaced:  # the verdict names it (the runs find it before they start)
            return self
        self.activity = FileActivity(places, unwatched=self.run_names)
        self.activity.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        if self.activity is not None:
            self.activity.__exit__(*exc)

    def written(self) -> tuple[str, ...]:
        """What the commands wrote beside the runs' directories, as out-relative paths."""
        if self.activity is None:
            return ()
        return tuple(sorted({e.path for e in self.activity.writes() if e.path.split("/")[1] not in self.run_names}))
