"""Values from files other people made (a receipt's run name, CPU model, ISA flags, environment values, a
checkpoint's tensor names, a script's output names), inside the Markdown reports. Left live, a value could
open a link, an image, an HTML comment that hides the rest of the page, a bold fake verdict, or a table
cell or row of its own. So every line of a report that holds such a value goes through `md_text`, and
every value shown as code through `md_code`: each is one line (reprocube.terminal.one_line) and renders as
the characters it holds, never as Markdown or HTML (GitHub's flavour: tables, autolinks, strikethrough).

md_text escapes only what can start Markdown, so that the reports' own prose reads the same in the raw
file: a backslash before `\\ ` * [ ] < | ! & ~`, before `_` that is not inside a word, before the `:`
of `://` and the `.` of `www.` (GitHub's bare links), and before a character that would start a heading,
a list (`1. `, not `0.1.0`), a quote or a rule at the start of the line. An e-mail address still renders
as a mailto link (GitHub finds it through any escape); its text is the address itself, so it forges
nothing."""

from __future__ import annotations

import re

from reprocube.terminal import one_line

# Characters that open Markdown or HTML anywhere in a line (CommonMark lets any ASCII punctuation be
# escaped with a backslash; these are the ones that need it mid-line).
_INLINE = re.compile(r"[\\`*\[\]<|!&~]|(?<![A-Za-z0-9])_|_(?![A-Za-z0-9])|:(?=//)|(?<=www)\.", re.IGNORECASE)
# What starts a block at the beginning of a line: a heading, quote, list item, rule or setext underline.
_LINE_START = re.compile(r"^(\s*)([#>+=-]|\d+(?=[.)](\s|$)))")


def md_text(value) -> str:
    """`value` as one line of Markdown text that shows exactly its characters."""
    text = _INLINE.sub(lambda match: "\\" + match.group(), one_line(str(value)))
    return _LINE_START.sub(lambda match: match.group(1) + _escape_block_start(match.group(2)), text)


def _escape_block_start(start: str) -> str:
    return start + "\\" if start.isdigit() else "\\" + start  # `1.` -> `1\.`; `#` -> `\#`


def md_code(value) -> str:
    """`value` as one inline code span: a backtick fence longer than any run of backticks inside it, and
    `|` escaped (GitHub splits a table row at `|` even inside a code span, and unescapes `\\|` there)."""
    text = one_line(str(value)).replace("|", "\\|")
    fence = "`" * (max((len(run) for run in re.findall("`+", text)), default=0) + 1)
    pad = " " if text.startswith("`") or text.endswith("`") or not text.strip() else ""
    return f"{fence}{pad}{text}{pad}{fence}"
