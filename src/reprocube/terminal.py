"""What reaches the terminal. Run names, tensor names, environment values and error lines come from files
other people made; printed raw, an escape sequence in one could clear the screen, move the cursor up and
overwrite a verdict, or a lone surrogate could crash the print. So every line reprocube prints goes
through `printable` (the CLI wraps stdout and stderr in EscapingStream): control characters other than a
newline or a tab, C1 controls, Unicode's bidirectional overrides and lone surrogates are shown as
escapes (`\\x1b`, `\\u202e`), never interpreted."""

from __future__ import annotations

import contextlib
import json
import os
import re
import sys
import unicodedata

# C0 controls but \t and \n, DEL, C1 controls, bidi embeddings/overrides/isolates, lone surrogates.
_UNSAFE = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069\ud800-\udfff]")


def _escape(match: re.Match) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def printable(text: str) -> str:
    """`text` with every character that a terminal would interpret shown as an escape."""
    return _UNSAFE.sub(_escape, text)


def pasteable(text: str) -> bool:
    """Whether `text` may go into a command offered to copy: every character printable and none a format
    character (a paste acts on a control character such as ^U or a newline; a bidi override reorders
    what a reader sees)."""
    return text.isprintable() and not any(unicodedata.category(c) == "Cf" for c in text)


def one_line(text: str) -> str:
    """printable(text) with newlines and tabs escaped too: a value from a file shown inside a line (a
    cause, a tensor name, a path) cannot start a line of its own, such as a forged `verdict:` line."""
    return printable(text).replace("\n", "\\n").replace("\t", "\\t")


class EscapingStream:
    """A text stream that writes `printable(text)` to `raw`. `unescaped` writes to `raw` as it is, for
    reprocube's own progress bar, which moves the cursor on purpose and prints no value from a file.

    Output never ends a command: where `raw` cannot be written (its reader went away, `| head -1`; a full
    disk; a stream closed) the stream is `lost`, its file descriptor is pointed at /dev/null (so the
    progress bar, C libraries and children started later write nowhere instead of failing too) and the
    rest is dropped. The command does its work to the end; cli.main turns a lost stdout into its status."""

    def __init__(self, raw):
        self.raw = raw
        self.lost = False
        self.unescaped = _Unescaped(self)

    def write(self, text: str) -> int:
        self._guarded(lambda: self.raw.write(printable(text)))
        return len(text)

    def flush(self) -> None:
        self._guarded(lambda: self.raw.flush())

    def _guarded(self, operation) -> None:
        if self.lost or self.raw is None:
            return
        try:
            operation()
        except (OSError, ValueError):  # EPIPE, ENOSPC, EBADF; ValueError: a file closed
            self.lost = True
            _point_at_null(self.raw)

    def __getattr__(self, name: str):  # isatty, fileno, encoding, ...
        return getattr(self.raw, name)


class _Unescaped:
    """`raw` as it is, for the progress bar: its carriage returns reach the terminal, and a write that
    fails loses the stream as one through EscapingStream does."""

    def __init__(self, owner: EscapingStream):
        self.owner = owner

    def write(self, text: str) -> int:
        self.owner._guarded(lambda: self.owner.raw.write(text))
        return len(text)

    def flush(self) -> None:
        self.owner.flush()

    def __getattr__(self, name: str):
        return getattr(self.owner.raw, name)


def _point_at_null(stream) -> None:
    """fd 1 or 2 under `stream` reopened on /dev/null (what Python buffered for it then goes there)."""
    try:
        fd = stream.fileno()
    except (AttributeError, OSError, ValueError):
        return
    if fd in (1, 2):
        null = os.open(os.devnull, os.O_WRONLY)
        os.dup2(null, fd)
        os.close(null)


def standard_streams_opened() -> None:
    """At the program's start: fd 0, 1 and 2 opened on /dev/null where the program was started without
    them (`>&-`, `2>&-`), and Python's stdout and stderr (None then) made streams on them. Otherwise the
    next file reprocube opens would become fd 1 or 2, and what a C library or a child process writes to
    its stdout or stderr would land in that file; and every print would fail. What is printed then goes
    nowhere, and the status is the command's own."""
    for fd in (0, 1, 2):
        try:
            os.fstat(fd)
        except OSError:
            null = os.open(os.devnull, os.O_RDWR)  # the lowest free descriptor: fd itself
            if null != fd:
                os.dup2(null, fd)
                os.close(null)
            os.set_inheritable(fd, True)  # the children's too
    if sys.stdout is None:
        sys.stdout = open(1, "w", encoding="utf-8", errors="replace", closefd=False)
    if sys.stderr is None:
        sys.stderr = open(2, "w", encoding="utf-8", errors="replace", closefd=False)


def raw_stderr():
    """The terminal's stderr itself, for the progress bar (carriage returns are its job)."""
    return getattr(sys.stderr, "unescaped", sys.stderr)


@contextlib.contextmanager
def escaped_output():
    """stdout and stderr escaped for the duration of a command; yields the two streams (their `lost`)."""
    saved = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = streams = EscapingStream(sys.stdout), EscapingStream(sys.stderr)
    try:
        yield streams
    finally:
        sys.stdout, sys.stderr = saved


def shown_value(value, limit: int = 60) -> str:
    """A value inside a line of text (a string as is, anything else as JSON): one line, at most `limit`."""
    text = one_line(value if isinstance(value, str) else json.dumps(value))
    return text if len(text) <= limit else text[: limit - 3] + "..."


def counted(count: int, noun: str, plural: str | None = None) -> str:
    """ "1 epoch", "2 epochs": a count and its noun, plural where it is not one."""
    return f"{count} {noun if count == 1 else plural or noun + 's'}"
