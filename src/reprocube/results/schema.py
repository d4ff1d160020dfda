"""`ResultFile`: a result file's name, version and keys, with the writer that checks a result against them
and the reader that checks a file against them (reprocube.untrusted: a regular file, bounded, strict JSON).
Each result module declares one and types its values on top (the values are read key by key there).

A schema's version moves whenever keys are added. A file of an older version is brought to the current
one in one place, the schema's `upgrades` (Grain's way: state with a version, read strictly once
upgraded), so the typed reader knows one shape: an upgrade only adds each missing key as what its
absence meant, and interprets nothing."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from reprocube.errors import CheckpointError
from reprocube.files import write_file_atomic, write_json_atomic
from reprocube.untrusted import MAX_JSON_BYTES, Fields, read_json

VERSION_KEY = "schema_version"


@dataclass(frozen=True)
class ResultFile:
    name: str  # e.g. "verify.json"; its Markdown twin is the same stem with .md
    version: int
    keys: tuple[str, ...]  # written every time
    optional_keys: tuple[str, ...] = ()  # written when they apply
    max_bytes: int = MAX_JSON_BYTES
    # (version, function): a file of that version made into one of the next (the function gets and
    # returns the file's object, VERSION_KEY included); applied in turn up to `version`.
    upgrades: tuple[tuple[int, Callable[[dict], dict]], ...] = ()

    @property
    def markdown_name(self) -> str:
        return Path(self.name).with_suffix(".md").name

    def write(self, directory: Path, result: dict, markdown: str | None = None) -> Path:
        """directory/NAME (and its .md), each written then renamed. A result whose keys are not the schema's
        is reprocube's own bug: refused before anything is written."""
        missing = [k for k in self.keys if k not in result]
        unknown = [k for k in result if k not in self.keys and k not in self.optional_keys]
        if missing or unknown:
            raise ValueError(f"{self.name}: keys missing {missing}, not in the schema {unknown}")
        path = Path(directory) / self.name
        write_json_atomic(path, {VERSION_KEY: self.version, **result}, indent=1)
        if markdown is not None:
            write_file_atomic(Path(directory) / self.markdown_name, markdown.encode())
        return path

    def read(self, path: Path) -> Fields:
        """The file's top-level object, its version and key set checked (exit 4 naming the file and key).
        A file without a version was written before results had one (schema 1's keys, a subset)."""
        return self.check(read_json(Path(path), CheckpointError, self.max_bytes), str(path))

    def check(self, value, where: str) -> Fields:
        fields = Fields(value, where, CheckpointError)
        if fields.has(VERSION_KEY):
            fields = Fields(self._upgraded(fields.value), where, CheckpointError)
        if fields.has(VERSION_KEY) and fields.value[VERSION_KEY] != self.version:
            raise CheckpointError(
                f"{where}: {VERSION_KEY} {str(fields.value[VERSION_KEY])[:20]} is not {self.version} "
                f"(written by another reprocube version)"
            )
        unknown = [k for k in fields.value if k != VERSION_KEY and k not in self.keys and k not in self.optional_keys]
        if unknown:
            raise CheckpointError(f"{where}: {str(unknown[0])[:60]!r} is not a key of {self.name}")
        return fields

    def _upgraded(self, value: dict) -> dict:
        """An older version's object brought to this version by the upgrades, in turn; any other object
        as it is (the version check then names it)."""
        upgrades = dict(self.upgrades)
        while type(value[VERSION_KEY]) is int and value[VERSION_KEY] in upgrades:  # never True for 1
            value = {**upgrades[value[VERSION_KEY]](dict(value)), VERSION_KEY: value[VERSION_KEY] + 1}
        return value
