"""`reprocube report RUN... [--out DIR]`: the HTML report of runs, studies and reproductions
(reprocube.pages.runs_page draws it; a reproduce directory alone gets its reproduction page)."""

from __future__ import annotations

from pathlib import Path

from reprocube.errors import EXIT_OK

HELP = "HTML report with curves, divergence map, verdicts: reprocube report RUN..."


def add_arguments(parser) -> None:
    parser.add_argument("runs", type=Path, nargs="+")
    parser.add_argument("--out", type=Path, default=Path("report"), help="output directory (default: report/)")


def run(args) -> int:
    from reprocube.pages.runs_page import write_report  # matplotlib: imported only when a page is drawn

    print(f"report: {write_report(args.runs, args.out)}")
    return EXIT_OK
