"""What the report pages share: their style, figures as embedded PNGs, table cells that show any value
from a file as text (escaped, compact, the whole value in a tooltip)."""

from __future__ import annotations

import base64
import html
import io
import json

from reprocube.pages.plots import plt  # Agg and no mathtext, for every figure

STYLE_RUNS = (
    "<style>body{font-family:sans-serif;max-width:1100px;margin:2em auto}table{border-collapse:collapse;font-size:13px}"
    "td,th{border:1px solid #ccc;padding:3px 8px;text-align:left}.ok{color:#176317}.bad{color:#b00020;font-weight:bold}"
    ".warn{color:#a15c00;font-weight:bold}.finding{font-weight:bold}.dim,.dim td{color:#999;font-weight:normal}</style>"
)
# The reproduce page adds: greyed rows (not a numeric cause), monospace numbers, captions, the verdict's size.
STYLE = (
    STYLE_RUNS[7:-8] + ".dim,.dim td{color:#999;font-weight:normal}td.num{font-family:monospace;text-align:right}"
    "p.caption{color:#555;font-size:13px;margin-top:0}.verdict{font-size:1.5em}h2{margin-top:1.6em}"
    "td{vertical-align:top}td.key{white-space:nowrap}td.value{word-break:break-all;max-width:380px}"
    ".headline{font-size:1.2em;font-weight:bold;margin:.3em 0}pre.recipe{background:#f4f4f4;padding:.6em;"
    "white-space:pre-wrap;word-break:break-all;margin-bottom:.3em}button.copy{font-size:12px}"
)
ENV_ROWS = (
    "python",
    "framework.name",
    "framework.torch",
    "framework.tensorflow",
    "framework.jax",
    "framework.device",
    "framework.gpu",
    "framework.num_threads",
    "framework.intra_op_threads",
    "framework.cpu_affinity",
    "cpu.model",
    "cpu.isa",
    "container",
)


def png(fig, tight: bool = True) -> bytes:
    """The figure as PNG bytes (closed after)."""
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=110, **({"bbox_inches": "tight"} if tight else {}))
    plt.close(fig)
    return buffer.getvalue()


def img(name: str, png: bytes) -> str:
    return (
        f"<img alt='{html.escape(name)}' src='data:image/png;base64,{base64.b64encode(png).decode()}' "
        "style='max-width:100%'>"
    )


# --- the reproduction's HTML -----------------------------------------------------------------------
def compact(value) -> str:
    """A value for a table cell: objects as key=value, lists comma-separated, long hex digests cut to 12."""
    if isinstance(value, dict):
        return ", ".join(f"{k}={compact(v)}" for k, v in sorted(value.items()))
    if isinstance(value, list):
        return ", ".join(compact(v) for v in value)
    if isinstance(value, str) and len(value) > 16 and all(c in "0123456789abcdef" for c in value):
        return value[:12] + "…"
    return value if isinstance(value, str) else json.dumps(value)


def cell(value, limit: int = 90) -> str:
    """A value's cell: compact and at most `limit` characters; the whole value in its tooltip."""
    short, whole = compact(value), value if isinstance(value, str) else json.dumps(value, sort_keys=True)
    short = short if len(short) <= limit else short[: limit - 1] + "…"
    title = f" title='{html.escape(whole)}'" if short != whole else ""
    return f"<td class='value'{title}>{html.escape(short)}</td>"


def number(value) -> str:
    return repr(float(value)) if isinstance(value, float) else str(value)
