"""What reaches the terminal. Run names, tensor names, environment values and error lines come from files
other people made; printed raw, an escape sequence in one could clear the screen, move the cursor up and
overwrite a verdict, or a lone surrogate could crash the print. So every line reprocube prints goes
through `printable` (the CLI wraps stdout and stderr in EscapingStream): control characters other than a
newline or a tab, C1 controls, Unicode's bidirectional overrides and lone surrogates are shown as
escapes (`\\x1b`, `\\u202e`), never interpreted."""

from __future__ import annotations

import contextlib
import json
import re
import sys

# C0 controls but \t and \n, DEL, C1 controls, bidi embeddings/overrides/isolates, lone surrogates.
_UNSAFE = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069\ud800-\udfff]")


def _escape(match: re.Match) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def printable(text: str) -> str:
    """`text` with every character that a terminal would interpret shown as an escape."""
    return _UNSAFE.sub(_escape, text)


def one_line(text: str) -> str:
    """printable(text) with newlines and tabs escaped too: a value from a file shown inside a line (a
    cause, a tensor name, a path) cannot start a line of its own, such as a forged `verdict:` line."""
    return printable(text).replace("\n", "\\n").replace("\t", "\\t")


class EscapingStream:
    """A text stream that writes `printable(text)` to `raw`. `raw` stays reachable for reprocube's own
    progress bar, which moves the cursor on purpose and prints no value from a file."""

    def __init__(self, raw):
        self.raw = raw

    def write(self, text: str) -> int:
        self.raw.write(printable(text))
        return len(text)

    def __getattr__(self, name: str):  # flush, isatty, fileno, encoding, ...
        return getattr(self.raw, name)


def raw_stderr():
    """The terminal's stderr itself, for the progress bar (carriage returns are its job)."""
    return getattr(sys.stderr, "raw", sys.stderr)


@contextlib.contextmanager
def escaped_output():
    """stdout and stderr escaped for the duration of a command."""
    saved = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = EscapingStream(sys.stdout), EscapingStream(sys.stderr)
    try:
        yield
    finally:
        sys.stdout, sys.stderr = saved


def shown_value(value, limit: int = 60) -> str:
    """A value inside a line of text (a string as is, anything else as JSON): one line, at most `limit`."""
    text = one_line(value if isinstance(value, str) else json.dumps(value))
    return text if len(text) <= limit else text[: limit - 3] + "..."


def counted(count: int, noun: str, plural: str | None = None) -> str:
    """ "1 epoch", "2 epochs": a count and its noun, plural where it is not one."""
    return f"{count} {noun if count == 1 else plural or noun + 's'}"
