"""Values from other people's files inside the Markdown reports (reprocube.results.markdown_text): rendered
as GitHub-flavoured Markdown (markdown-it-py with tables and strikethrough), each shows exactly its
characters, and a report full of forged values has the same headings, rows, cells and bold text as the
clean one, with no link, image, HTML or comment of its own."""

from __future__ import annotations

import copy
import json
import re
from html import unescape
from pathlib import Path

import pytest
from markdown_it import MarkdownIt

from reprocube.results.markdown_text import md_code, md_text
from reprocube.terminal import one_line

GFM = MarkdownIt("commonmark").enable(["table", "strikethrough"])
# What a forged value tries: a cell and a fake row, a link, an image, a comment hiding the rest, a heading
# and a bold verdict on a line of their own, a code span broken out of, HTML, an entity, a list, a rule.
FORGED = [
    "x | **reproduced** | [proof](https://evil.example) | config",
    "<!--",
    "# forged",
    "<img src=x onerror=alert(1)>",
    "a\n\n## Verdict: bit-identical\n\n**Reproduced**",
    "x` [signed](https://evil.example) `",
    "see <https://evil.example>",
    "&lt;b&gt; &amp;",
    "1. item",
    "- item",
    "> quote",
    "---",
    "__bold__ _it_ ~~gone~~",
    "![i](x.png)",
    "\\| pipe \\",
    "`",
    "``a``",
    "<absent>",
]
STRUCTURE = re.compile(r"<(a|img|strong|em|del|h\d|li|blockquote|hr|table|tr|td|th|code)\b|<!--")


def rendered_text(html: str) -> str:
    return unescape(re.sub(r"<[^>]+>", "", html)).strip()


@pytest.mark.parametrize("value", FORGED)
def test_md_text_shows_exactly_the_characters_on_one_line(value):
    html = GFM.render(md_text(value))
    assert html.startswith("<p>") and html.count("<p>") == 1, html
    assert not STRUCTURE.search(html), html
    assert rendered_text(html) == one_line(value).strip()


@pytest.mark.parametrize("value", FORGED)
def test_md_code_is_one_code_span_in_a_table_cell(value):
    html = GFM.render(f"| key | value |\n|---|---|\n| {md_code(value)} | {md_text(value)} |\n")
    assert html.count("<tr>") == 2 and html.count("<td>") == 2, html
    assert html.count("<code>") == 1 and not re.search(r"<(a|img|strong|em|del)\b|<!--", html), html
    code = unescape(re.search(r"<code>(.*?)</code>", html, re.S).group(1))
    assert code.strip() == one_line(value).strip()  # GitHub unescapes \| inside a table cell's code span


def test_md_text_leaves_the_reports_own_prose_as_it_was():
    prose = "B departs from A at update 12 (epoch 1), by at most 3 ULP: 0.1.0 -> 0.2.0; trace.every_steps=1 env.cpu.isa"
    assert md_text(prose) == prose


def structure(markdown: str) -> list[str]:
    """The report's shape: every element a renderer makes, in order, without their text."""
    return re.findall(
        r"<(?:/?)(?:a|img|strong|em|del|h\d|li|ul|ol|blockquote|hr|table|tr|td|th|p|pre)\b|<!--", GFM.render(markdown)
    )


def forge(value, payload: str):
    """Every string inside `value` with the payload appended (keys and numbers kept)."""
    if isinstance(value, str):
        return value + payload
    if isinstance(value, list):
        return [forge(item, payload) for item in value]
    if isinstance(value, dict):
        return {key: forge(item, payload) for key, item in value.items()}
    return value


REPRODUCE_V2 = Path(__file__).with_name("fixtures") / "reproduce-v2.json"
# Fields the report shows that come from A's receipt, B's environment, or our fixed vocabulary; the
# payload goes into the first two (our verdict and tier words are checked on read).
FORGEABLE = ("run_a", "summary", "source", "run_b", "causes", "match", "a_sessions", "unsigned", "tier_text")


@pytest.mark.parametrize("payload", [FORGED[0], FORGED[1], FORGED[4], FORGED[5]])
def test_a_reproduce_report_full_of_forged_values_keeps_its_shape(payload):
    from reprocube.results.reproduce_result import REPRODUCE_RESULT
    from reprocube.results.reproduce_wording import markdown

    clean = REPRODUCE_RESULT.check(json.loads(REPRODUCE_V2.read_text()), "fixture").value
    forged = copy.deepcopy(clean)
    for key in FORGEABLE:
        if forged.get(key) is not None:
            forged[key] = forge(forged[key], payload)
    forged["first_operation"]["text"] = forge(forged["first_operation"]["text"], payload)
    assert structure(markdown(forged)) == structure(markdown(clean))


def test_a_compare_report_with_forged_names_and_environment_keeps_its_shape():
    from reprocube.results.compare_result import markdown

    clean = {
        "run_a": "runs/a",
        "run_b": "runs/b",
        "receipts": None,
        "inputs": {
            run: {
                "checkpoints": {"epoch-0001": "0" * 64},
                "env.json": "1" * 64,
                "metrics.jsonl": None,
                "receipt.json": None,
            }
            for run in ("a", "b")
        },
        "checkpoints": [
            {
                "checkpoint": "epoch-0001",
                "identical": False,
                "within_tolerance": False,
                "tensors": [{"tensor": "fc1.weight", "identical": False, "max_abs": 0.5, "max_ulp": 3}],
            }
        ],
        "compared_checkpoints": ["epoch-0001"],
        "first_difference": {"checkpoint": "epoch-0001", "tensor": "fc1.weight", "max_abs": 0.5, "max_ulp": 3},
        "identical": False,
        "tolerance": 0.0,
        "metric_differences": [],
        "config_differences": [{"key": "seed", "a": "0", "b": "<absent>"}],
        "env_differences": [{"key": "env.cpu.model", "a": "AMD EPYC", "b": "Intel Xeon"}],
    }
    expected = structure(markdown(clean))
    for payload in FORGED:
        forged = copy.deepcopy(clean)
        for row in forged["checkpoints"][0]["tensors"]:
            row["tensor"] += payload
        forged["first_difference"]["tensor"] += payload
        forged["env_differences"] = [{k: v + payload for k, v in row.items()} for row in clean["env_differences"]]
        forged["config_differences"] = [{k: v + payload for k, v in row.items()} for row in clean["config_differences"]]
        assert structure(markdown(forged)) == expected, payload
