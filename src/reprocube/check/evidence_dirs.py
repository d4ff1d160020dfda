"""check's own directories under --out, which the checked command can reach (it runs as the same user):
each one check makes is recorded (device and inode) and, right before check writes into it, opened again
from --out down one name at a time without following a link and matched to the record. A directory the
command replaced with a symbolic link, removed, or planted where check makes one is never written through:
the first one found ends the check (`command-failed`, naming it). And the reference outputs: the digests of
clean-1's declared outputs once the clean runs ended, compared again before anything is judged against
them (another run may change them afterwards)."""

from __future__ import annotations

import os
import threading
from pathlib import Path

from reprocube.analysis.outputs import collect
from reprocube.files import sha256_regular

_OPEN_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


class DirectoryReplaced(Exception):
    """A directory of check's was replaced, removed or planted by the command: nothing is written there."""

    def __init__(self, directory: Path, planted: bool):
        self.directory, self.planted = directory, planted
        if planted:
            text = (
                f"the command put something at {directory} (a symbolic link?) where check makes its own "
                "directory: nothing is written through it"
            )
        else:
            text = (
                f"the command replaced check's directory {directory} with a symbolic link (or removed it): "
                "nothing is written through it"
            )
        super().__init__(text)


class EvidenceDirs:
    """The directories check made under `out` (out itself first), by their path relative to it."""

    _claimed: dict[Path, EvidenceDirs] = {}

    def __init__(self, out: Path):
        self.out = Path(out).absolute()
        self.made: dict[Path, tuple[int, int]] = {}
        self.replaced: DirectoryReplaced | None = None  # the first one found
        self._lock = threading.Lock()
        with self._lock:
            fd = self._open(None, str(self.out), Path("."))
            self.made[Path(".")] = _identity(fd)
            os.close(fd)

    @classmethod
    def claim(cls, out: Path) -> EvidenceDirs:
        """out, just made by check (new or empty): recorded as it is now."""
        dirs = cls._claimed[Path(out).absolute()] = cls(out)
        return dirs

    @classmethod
    def of(cls, out: Path) -> EvidenceDirs:
        dirs = cls._claimed.get(Path(out).absolute())
        return dirs if dirs is not None else cls.claim(out)

    def message(self) -> str:
        return str(self.replaced) if self.replaced is not None else ""

    def open_dir(self, directory: Path) -> int:
        """A descriptor of `directory` (out or below it), each name from out down opened without following
        a link and, where check made it, the very directory it made; DirectoryReplaced otherwise."""
        relative = self._relative(directory)
        with self._lock:
            fd = self._open(None, str(self.out), Path("."))
            try:
                for depth, name in enumerate(relative.parts):
                    inner = self._open(fd, name, Path(*relative.parts[: depth + 1]))
                    os.close(fd)
                    fd = inner
            except BaseException:
                os.close(fd)
                raise
            return fd

    def verify(self, *directories: Path) -> None:
        """Each directory still check's own (DirectoryReplaced for the first that is not)."""
        for directory in directories:
            os.close(self.open_dir(directory))

    def absent(self, path: Path) -> None:
        """Nothing at `path` yet (its directory verified): where check is about to make it, the command
        planted nothing (DirectoryReplaced otherwise)."""
        os.close(self.open_dir(Path(path).absolute().parent))
        if os.path.lexists(path):
            raise self._fail(self._relative(path), planted=True)

    def make(self, directory: Path) -> None:
        """`directory` below out made, and each missing one above it, never through a link; recorded. One
        there already that check did not make (a link the command planted) is DirectoryReplaced."""
        relative = self._relative(directory)
        fd = self.open_dir(self.out)
        with self._lock:
            try:
                for depth, name in enumerate(relative.parts):
                    here = Path(*relative.parts[: depth + 1])
                    try:
                        os.mkdir(name, 0o755, dir_fd=fd)
                        new = True
                    except FileExistsError:
                        if here not in self.made:
                            raise self._fail(here, planted=True) from None
                        new = False
                    inner = self._open(fd, name, here)
                    os.close(fd)
                    fd = inner
                    if new:
                        self.made[here] = _identity(fd)
            finally:
                os.close(fd)

    # --- inside ---------------------------------------------------------------------------------
    def _relative(self, directory: Path) -> Path:
        path = Path(directory).absolute()
        return path.relative_to(self.out) if path != self.out else Path(".")

    def _open(self, parent: int | None, name: str, relative: Path, planted: bool = False) -> int:
        try:
            fd = os.open(name, _OPEN_DIR, dir_fd=parent)
        except OSError:
            raise self._fail(relative, planted) from None
        expected = self.made.get(relative)
        if expected is not None and _identity(fd) != expected:
            os.close(fd)
            raise self._fail(relative, planted)
        return fd

    def _fail(self, relative: Path, planted: bool = False) -> DirectoryReplaced:
        error = DirectoryReplaced(self.out / relative if relative != Path(".") else self.out, planted)
        if self.replaced is None:
            self.replaced = error
        return error


def _identity(fd: int) -> tuple[int, int]:
    status = os.fstat(fd)
    return status.st_dev, status.st_ino


def reference_digests(work: Path, outputs: list[str]) -> dict[str, str | None]:
    """The sha256 of each regular file among the declared outputs under work (None: not a regular file)."""
    return {name: sha256_regular(path) for name, path in collect(work, outputs, []).items()}


def changed_output(work: Path, outputs: list[str], recorded: dict[str, str | None]) -> str | None:
    """Which declared output under work is no longer what `recorded` says (removed, rewritten, or new), in
    words; None where every one is unchanged."""
    now = reference_digests(work, outputs)
    for name, digest in recorded.items():
        if name not in now:
            return f"{name} was removed"
        if now[name] != digest:
            return f"{name} was rewritten"
    added = sorted(set(now) - set(recorded))
    return f"{added[0]} was added" if added else None
