"""The reproduction page (`reprocube reproduce` writes it as DIR/report.html; `reprocube report DIR` draws
it again): the verdict and ranked causes first, then B - A per epoch and per step, the divergence map of
the step trace (global step x tensor), the seed spread, the epoch metrics and the environments. What it
shows of reproduce.json is read strictly (reprocube.results.reproduce_result). Here: a reproduce directory
read for the page (its receipts bound by digest, the recipe vetted) and the page written; its sections are
drawn by reproduction_sections, its figures by reproduction_figures."""

from __future__ import annotations

import hashlib
import html
from pathlib import Path

from reprocube.analysis.match_plan import recipe_refusal
from reprocube.errors import CheckpointError
from reprocube.files import write_file_atomic
from reprocube.pages.html import STYLE
from reprocube.pages.reproduction_figures import reproduction_figures
from reprocube.pages.reproduction_sections import reproduction_html
from reprocube.results.reproduce_result import (
    A_RECEIPT_COPY,
    REPORT_PAGE,
    REPRODUCE_RESULT,
    check_reproduce,
    check_subject,
    read_reproduce,
)
from reprocube.training.receipt import Receipt, read_receipt


def write_reproduce_report(out: Path, receipt: Receipt, b_path: Path, result: dict) -> Path:
    """out/report.html (and its PNGs) for a reproduction just made: A's receipt, B's run, reproduce's result."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    checked = check_reproduce(result, str(out / REPRODUCE_RESULT.name))
    check_subject(checked, receipt, str(out / REPRODUCE_RESULT.name))
    matched = _bound_receipts(out, checked, out / REPRODUCE_RESULT.name).get("b_matched_receipt")
    _vet_recipe(checked, receipt, matched)
    return write_reproduction_page(out, _reproduction(out, receipt, read_receipt(Path(b_path)), checked))


def reproduction_dir(path: Path) -> Path | None:
    """The reproduce output directory `path` names (the directory, or its reproduce.json), else None."""
    path = Path(path)
    if path.name == REPRODUCE_RESULT.name and path.is_file():
        return path.parent
    return path if (path / REPRODUCE_RESULT.name).is_file() else None


def read_reproduction(directory: Path) -> dict:
    """A reproduce directory for the page: its reproduce.json (every key shown type-checked), and the two
    receipts it names under `inputs`, read only inside the directory (A's copy, B's run) and each bound by
    the sha256 of its bytes: a result cannot send the reader to any other file on this machine."""
    file = directory / REPRODUCE_RESULT.name
    result = read_reproduce(file)
    receipts = _bound_receipts(directory, result, file)
    a = receipts["a_receipt"]
    if a.value["receipt_sha256"] != result["source_sha256"]:
        raise CheckpointError(
            f"{file}: {directory / A_RECEIPT_COPY} is not the receipt reproduced (its sha256 differs)"
        )
    check_subject(result, a, str(file))
    _vet_recipe(result, a, receipts.get("b_matched_receipt"))
    return _reproduction(directory, a, receipts["b_receipt"], result)


def _bound_receipts(directory: Path, result: dict, file: Path) -> dict[str, Receipt]:
    """The receipts the result names under `inputs`, each at its fixed place inside `directory` and bound by
    the sha256 of its bytes."""
    receipts = {}
    for name, entry in result["inputs"].items():
        path = directory / entry["path"]  # a fixed relative path (check_reproduce), never one from the file
        inside = [p for p in path.relative_to(directory).parents if p != Path(".")]
        linked = next((p for p in inside if (directory / p).is_symlink()), None)
        if linked is not None:  # read only inside the directory: never through a link out of it
            raise CheckpointError(
                f"{file}: {directory / linked} is a symbolic link (the receipts are read inside it only)"
            )
        receipt = read_receipt(path.parent)  # a run directory's receipt: a symbolic link is refused
        if hashlib.sha256(receipt.raw).hexdigest() != entry["sha256"]:
            raise CheckpointError(f"{file}: {path} is not the receipt this result compared (inputs.{name}.sha256)")
        receipts[name] = receipt
    return receipts


def _vet_recipe(result: dict, a: Receipt, matched: Receipt | None) -> None:
    """The recorded recipe stays only where the --match run behind it proves it (match_plan.recipe_refusal);
    otherwise the page shows no command to copy, and says why."""
    match = result["match"]
    if match and match["recipe"]:
        refused = recipe_refusal(match["recipe"], a, matched)
        if refused:
            match["recipe"], match["recipe_refused"] = None, refused


def _reproduction(directory: Path, a: Receipt, b: Receipt, result: dict) -> dict:
    """What the page shows of one reproduction; the seed-to-seed values from the result itself (a study
    named by the result is never read: report reads only inside the directory it is given)."""
    spread, values, note = result["seed_spread"], None, None
    if spread is not None:
        if all(spread[m].get("values") for m in ("test_accuracy", "test_loss")):
            values = {m: spread[m]["values"] for m in ("test_accuracy", "test_loss")}
        else:
            note = "the result holds no per-run values of the spread; A and B are shown against A's seed std bands"
    return {"dir": directory, "a": a, "b": b, "result": result, "spread_values": values, "spread_note": note}


def write_reproduction_page(out: Path, reproduction: dict) -> Path:
    figures = reproduction_figures(reproduction)
    parts = [
        "<!doctype html><html><head><meta charset='utf-8'>",
        f"<title>reprocube reproduce: {html.escape(reproduction['result']['run_a'])}</title>",
        f"<style>{STYLE}</style></head><body>",
        *reproduction_html(reproduction, figures),
        "</body></html>",
    ]
    for name, figure in figures.items():
        write_file_atomic(out / name, figure)
    write_file_atomic(out / REPORT_PAGE, "\n".join(parts).encode())
    return out / REPORT_PAGE
