"""Reading files that came from elsewhere. Runs, checkpoints, receipts and configs travel between machines
and people, so every file reprocube reads goes through this module:
- only regular files: a FIFO, a device, a socket or a directory is refused (nothing can hang or stream
  forever), and inside runs a symbolic link is refused too (nothing is read from outside the run);
- at most a stated number of bytes (the size a manifest records, else a bound per kind of file);
- JSON strictly: UTF-8, no NaN or Infinity, no integer longer than MAX_INT_DIGITS digits, no duplicate
  keys, nesting at most MAX_DEPTH deep (what reads a value later, OmegaConf, Hydra's grammar or our own
  walks, must never meet a RecursionError);
- YAML with the safe loader, without aliases (an alias bomb is refused, not expanded), without duplicate
  keys (the safe loader kept the last silently: a value hidden), as shallow;
- every value through a typed accessor (Fields) that names the file and the key when it is wrong.
Each failure is one exception of the caller's error class (ConfigError, DataError, CheckpointError, ...),
so that the command ends with one line and its documented exit status."""

from __future__ import annotations

import contextlib
import errno
import json
import math
import os
import re
import stat
from collections.abc import Iterator
from pathlib import Path

import yaml

from reprocube.errors import ReprocubeError

MAX_INT_DIGITS = 40  # a 128-bit integer has 39 digits; nothing reprocube writes is longer
MAX_JSON_BYTES = 64 << 20  # a manifest with a long metrics history is a few MB
MAX_YAML_BYTES = 1 << 20
MAX_JSON_LINE_BYTES = 1 << 20
# Containers inside containers: nothing reprocube writes is deeper than 8 (a receipt's boundaries, a
# loader's state); OmegaConf recursed past Python's limit at 100 nested lists, hydra_literal at 600.
MAX_DEPTH = 32


@contextlib.contextmanager
def _open_regular(path: Path, max_bytes: int, error: type[ReprocubeError], follow_links: bool):
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | (0 if follow_links else os.O_NOFOLLOW)
    try:
        fd = os.open(path, flags)  # O_NONBLOCK: opening a FIFO does not wait for a writer
    except FileNotFoundError:
        raise error(f"{path} is missing") from None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise error(f"{path} is a symbolic link; only regular files are read here") from None
        unreadable_here = error(f"{path}: cannot read it ({exc.strerror})")
        unreadable_here.damaged = False
        raise unreadable_here from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise error(f"{path} is not a regular file")
        if info.st_size > max_bytes:
            raise error(f"{path} is {info.st_size} bytes, more than the {max_bytes} allowed")
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    with os.fdopen(fd, "rb") as file:
        yield file


def read_bytes(path: Path, max_bytes: int, error: type[ReprocubeError], follow_links: bool = False) -> bytes:
    """The content of a regular file of at most `max_bytes` bytes. With follow_links=False a symbolic link
    is refused (run and checkpoint files); with True it is followed, but must lead to a regular file
    (datasets and user configs, which may live anywhere)."""
    with _open_regular(Path(path), max_bytes, error, follow_links) as file:
        data = file.read(max_bytes + 1)
    if len(data) > max_bytes:  # it grew while being read
        raise error(f"{path} is more than the {max_bytes} bytes allowed")
    return data


def read_tail(path: Path, max_bytes: int, error: type[ReprocubeError]) -> tuple[bytes, bool]:
    """The last `max_bytes` bytes of a regular file of any length (a log: only its end is read), never
    through a link; and whether that is the whole file."""
    with _open_regular(Path(path), 1 << 62, error, follow_links=False) as file:
        size = os.fstat(file.fileno()).st_size
        file.seek(max(0, size - max_bytes))
        return file.read(max_bytes), size <= max_bytes


def parse_json(blob: bytes, where: str, error: type[ReprocubeError]):
    """Strict JSON (see the module docstring)."""
    try:
        text = blob.decode("utf-8")
    except UnicodeDecodeError:
        raise error(f"{where} is not UTF-8 text") from None
    try:
        value = json.loads(
            text,
            parse_constant=_refuse_constant,
            parse_int=_bounded_int,
            parse_float=_finite_float,
            object_pairs_hook=_unique_keys,
        )
        if _SURROGATE_ESCAPE.search(text):  # rare: only then walk the value
            _refuse_lone_surrogates(value)
        _refuse_deep(value)
        return value
    except _Refused as exc:
        raise error(f"{where}: {exc}") from None
    except RecursionError:
        raise error(f"{where} is nested too deeply") from None
    except json.JSONDecodeError as exc:
        raise error(f"{where} is not valid JSON ({exc})") from None


def read_json(path: Path, error: type[ReprocubeError], max_bytes: int = MAX_JSON_BYTES):
    return parse_json(read_bytes(path, max_bytes, error), str(path), error)


def iter_json_lines(
    path: Path, error: type[ReprocubeError], max_bytes: int, digest=None
) -> Iterator[tuple[int, object]]:
    """(line number, value) of each non-empty line of a JSON-lines file, read as a stream: a large file
    costs its records, not a copy of its text. `digest` (a hashlib object), if given, is fed every byte
    read: the digest of exactly what was parsed."""
    with _open_regular(Path(path), max_bytes, error, follow_links=False) as file:
        for number, line in enumerate(file, start=1):
            if digest is not None:
                digest.update(line)
            if len(line) > MAX_JSON_LINE_BYTES:
                raise error(f"{path}:{number} is longer than {MAX_JSON_LINE_BYTES} bytes")
            if line.strip():
                yield number, parse_json(line, f"{path}:{number}", error)


def _refuse_deep(value) -> None:
    """Refuse containers nested more than MAX_DEPTH deep (walked without recursion)."""
    stack = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        children = item.values() if isinstance(item, dict) else item if isinstance(item, list) else None
        if children is None:
            continue
        if depth >= MAX_DEPTH:
            raise _Refused(f"nested too deeply (more than {MAX_DEPTH} levels)")
        stack.extend((child, depth + 1) for child in children if isinstance(child, dict | list))


class _NoAliasLoader(yaml.SafeLoader):
    """The safe loader, refusing aliases (a few lines of nested aliases expand to billions of nodes) and
    duplicate keys (the safe loader keeps the last one silently, hiding the other's value)."""

    def compose_node(self, parent, index):
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()
            raise yaml.composer.ComposerError(None, None, "aliases (*name) are not accepted", event.start_mark)
        return super().compose_node(parent, index)

    def construct_mapping(self, node, deep=False):
        if isinstance(node, yaml.MappingNode):
            seen = set()
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":
                    continue  # `<<: {...}` merges: its keys are meant to be overridden
                key = self.construct_object(key_node, deep=True)
                try:
                    duplicate = key in seen
                except TypeError:
                    continue  # unhashable: refused by the constructor below
                if duplicate:
                    raise yaml.constructor.ConstructorError(
                        "while constructing a mapping",
                        node.start_mark,
                        f"found the key {' '.join(repr(key).split())[:60]} twice",
                        key_node.start_mark,
                    )
                seen.add(key)
        return super().construct_mapping(node, deep)


def parse_yaml(blob: bytes, where: str, error: type[ReprocubeError]):
    return _load_yaml(blob, where, error)[0]


def compose_yaml(blob: bytes, where: str, error: type[ReprocubeError]) -> tuple[yaml.Node | None, str]:
    """The node tree of a YAML document (each node with its place in the text) and the text, after the
    document was read as parse_yaml reads it (so refused as it would be)."""
    _, node, text = _load_yaml(blob, where, error)
    return node, text


def _load_yaml(blob: bytes, where: str, error: type[ReprocubeError]):
    try:
        text = blob.decode("utf-8")
    except UnicodeDecodeError:
        raise error(f"{where} is not UTF-8 text") from None
    try:
        loader = _NoAliasLoader(text)
        try:
            node = loader.get_single_node()
            value = None if node is None else loader.construct_document(node)
        finally:
            loader.dispose()
        _refuse_deep(value)
        return value, node, text
    except _Refused as exc:
        raise error(f"{where}: {exc}") from None
    except yaml.YAMLError as exc:
        raise error(f"{where} is not valid yaml: {' '.join(str(exc).split())}") from None
    except RecursionError:
        raise error(f"{where} is nested too deeply") from None
    except (ValueError, LookupError, TypeError, AttributeError, ArithmeticError) as exc:
        # PyYAML's constructors for tagged or implicit values (!!int, !!timestamp, 2001-02-30, ...)
        raise error(
            f"{where}: a value yaml cannot construct ({type(exc).__name__}: {' '.join(str(exc).split())[:80]})"
        ) from None


class Fields:
    """Typed access to a JSON object read from `where`: each accessor checks the type and range of one
    key and names it when it is wrong."""

    def __init__(self, value, where: str, error: type[ReprocubeError]):
        if not isinstance(value, dict):
            raise error(f"{where} is not a JSON object")
        self.value, self.where, self.error = value, where, error

    def fail(self, key: str, expected: str):
        """Raise the reader's error: `key` must be `expected`, and what it holds instead."""
        raise self.error(f"{self.where}: {key} must be {expected}, got {_shown(self.value.get(key, '<absent>'))}")

    def has(self, key: str) -> bool:
        return key in self.value

    def integer(self, key: str, low: int = 0, high: int = 2**63 - 1) -> int:
        value = self.value.get(key)
        if not (isinstance(value, int) and not isinstance(value, bool) and low <= value <= high):
            self.fail(key, f"an integer from {low} to {high}")
        return value

    def number(self, key: str) -> float:
        value = self.value.get(key)
        if not (isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)):
            self.fail(key, "a finite number")
        return float(value)

    def text(self, key: str, optional: bool = False) -> str | None:
        value = self.value.get(key)
        if value is None and optional:
            return None
        if not isinstance(value, str):
            self.fail(key, "a string")
        return value

    def boolean(self, key: str) -> bool:
        value = self.value.get(key)
        if not isinstance(value, bool):
            self.fail(key, "true or false")
        return value

    def mapping(self, key: str) -> Fields:
        value = self.value.get(key)
        if not isinstance(value, dict):
            self.fail(key, "a JSON object")
        return Fields(value, f"{self.where}: {key}", self.error)

    def present(self, key: str) -> object:
        """The value of a key that must be there (any JSON value; the caller shows it as data)."""
        if key not in self.value:
            raise self.error(f"{self.where}: {key} is missing")
        return self.value[key]

    def nullable(self, key: str, read):
        """read(key), or None where the key holds null (the key must be there)."""
        return None if self.present(key) is None else read(key)

    def sha256(self, key: str, nullable: bool = False) -> str | None:
        value = self.value.get(key)
        if value is None and nullable and key in self.value:
            return None
        if not (isinstance(value, str) and _HEX_SHA256.match(value)):
            self.fail(key, "a sha256 (64 lowercase hex digits)" + (" or null" if nullable else ""))
        return value

    def texts(self, key: str) -> list[str]:
        value = self.value.get(key)
        if not (isinstance(value, list) and all(isinstance(v, str) for v in value)):
            self.fail(key, "a list of strings")
        return value

    def numbers(self, key: str) -> list[float]:
        value = self.value.get(key)
        if not (isinstance(value, list) and all(_finite(v) for v in value)):
            self.fail(key, "a list of finite numbers")
        return [float(v) for v in value]

    def step_range(self, key: str) -> list[int]:
        """[first step, last step], both integers >= 0."""
        value = self.value.get(key)
        if not (
            isinstance(value, list)
            and len(value) == 2
            and all(_finite(v) and isinstance(v, int) and v >= 0 for v in value)
        ):
            self.fail(key, "[first step, last step]")
        return value

    def one_of(self, key: str, allowed: tuple[str, ...]) -> str:
        value = self.text(key)
        if value not in allowed:
            self.fail(key, f"one of {', '.join(allowed)}")
        return value

    def records(self, key: str) -> list[Fields]:
        """A list of JSON objects."""
        value = self.value.get(key)
        if not isinstance(value, list):
            self.fail(key, "a list")
        return [Fields(item, f"{self.where}: {key}[{i}]", self.error) for i, item in enumerate(value)]


_HEX_SHA256 = re.compile(r"^[0-9a-f]{64}\Z")


def _finite(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _shown(value) -> str:
    text = json.dumps(value) if not isinstance(value, str) or value != "<absent>" else value
    return text if len(text) <= 60 else text[:57] + "..."


class _Refused(ValueError):
    pass


# A `\ud800`-`\udfff` escape: JSON lets a string hold half a surrogate pair, which is no Unicode text (it
# cannot be printed, written as UTF-8 or used in a path), so a value holding one is refused.
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")


def _refuse_lone_surrogates(value) -> None:
    texts = [value] if isinstance(value, str) else []
    if isinstance(value, dict):
        texts = list(value)
        for item in value.values():
            _refuse_lone_surrogates(item)
    elif isinstance(value, list):
        for item in value:
            _refuse_lone_surrogates(item)
    for text in texts:
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:
            raise _Refused(f"a string holds a lone surrogate ({ascii(text[:20])}...): not Unicode text") from None


def _refuse_constant(name: str):
    raise _Refused(f"{name} is not a number JSON allows")


def _bounded_int(digits: str) -> int:
    if len(digits.lstrip("-")) > MAX_INT_DIGITS:
        raise _Refused(f"an integer of {len(digits)} digits (at most {MAX_INT_DIGITS})")
    return int(digits)


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise _Refused(f"{text[:20]} overflows to infinity")
    return value


def _unique_keys(pairs: list[tuple[str, object]]) -> dict:
    result = dict(pairs)
    if len(result) != len(pairs):
        seen = set()
        duplicate = next(k for k, _ in pairs if k in seen or seen.add(k))
        raise _Refused(f"the key {duplicate!r} appears twice")
    return result
