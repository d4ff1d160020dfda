"""The reproduction page (`reprocube reproduce` writes it as DIR/report.html; `reprocube report DIR` draws
it again): the verdict and ranked causes first, then B - A per epoch and per step, the divergence map of
the step trace (global step x tensor), the seed spread, the epoch metrics and the environments. What it
shows of reproduce.json is read strictly (reprocube.results.reproduce_result)."""

from __future__ import annotations

import hashlib
import html
from pathlib import Path

import matplotlib.colors
import matplotlib.patches
import matplotlib.ticker
import numpy as np

from reprocube.analysis.match_plan import recipe_refusal
from reprocube.analysis.tensors import ulp_statistics
from reprocube.config import flatten_keys
from reprocube.errors import CheckpointError
from reprocube.files import write_file_atomic
from reprocube.pages.html import ENV_ROWS, STYLE, cell, img, number, png
from reprocube.pages.plots import plt
from reprocube.results.reproduce_result import (
    A_RECEIPT_COPY,
    DIFFERENCE_FIGURE,
    DIVERGENCE_FIGURE,
    REPORT_PAGE,
    REPRODUCE_RESULT,
    SPREAD_FIGURE,
    check_reproduce,
    check_subject,
    read_reproduce,
    recipe_lines,
    verdict_line,
    what_to_do,
)
from reprocube.results.wording import first_update_text
from reprocube.terminal import counted
from reprocube.training.receipt import Receipt, read_receipt

EPOCH_METRICS = ("train_loss", "train_accuracy", "test_loss", "test_accuracy")
A_COLOUR, B_COLOUR = "#1f77b4", "#d62728"


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


# --- the reproduction's figures --------------------------------------------------------------------
def reproduction_figures(reproduction: dict) -> dict[str, bytes]:
    a, b, result = reproduction["a"], reproduction["b"], reproduction["result"]
    figures = {
        DIFFERENCE_FIGURE: _difference_plot(a, b, result),
        DIVERGENCE_FIGURE: _trace_map(a, b, result),
    }
    spread = result["seed_spread"]
    if spread is not None and (
        reproduction["spread_values"] or any(spread[m]["std"] is not None for m in ("test_accuracy", "test_loss"))
    ):
        figures[SPREAD_FIGURE] = _spread_plot(spread, reproduction["spread_values"])
    return figures


def _common_losses(a: Receipt, b: Receipt) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The global steps both traces cover, and A's and B's float32 losses of those steps."""
    first, last = max(a.trace.first_step, b.trace.first_step), min(a.trace.last_step, b.trace.last_step)
    if last <= first:
        empty = np.zeros(0, np.float32)
        return np.zeros(0, np.int64), empty, empty
    la = a.trace.losses[first - a.trace.first_step : last - a.trace.first_step]
    lb = b.trace.losses[first - b.trace.first_step : last - b.trace.first_step]
    return np.arange(first + 1, last + 1), la, lb


def _difference_plot(a: Receipt, b: Receipt, result: dict) -> bytes:
    """Top: B - A of each epoch's train loss, test loss and test accuracy, each on its own axis around a zero
    line (differences of 1e-7 stay visible). Bottom: B - A of every step's training loss (symlog where the
    differences span decades: a few ULP and a large drift on one axis), the first diverging step marked."""
    fig = plt.figure(figsize=(11, 6.6), layout="constrained")
    grid = fig.add_gridspec(2, 3, height_ratios=(1, 1.25))
    epochs_b = {r["epoch"]: r for r in b.epochs}
    common = [r for r in a.epochs if r["epoch"] in epochs_b]
    for column, metric in enumerate(("train_loss", "test_loss", "test_accuracy")):
        ax = fig.add_subplot(grid[0, column])
        deltas = [epochs_b[r["epoch"]][metric] - r[metric] for r in common]
        ax.axhline(0, color="grey", linewidth=0.8)
        ax.plot([r["epoch"] for r in common], deltas, marker="o", color=B_COLOUR)
        zero = " (all exactly 0)" if not any(deltas) else ""
        ax.set_title(f"{metric.replace('_', ' ')}: B − A{zero}", fontsize=10)
        ax.set_xlabel("epoch")
        ax.xaxis.set_major_locator(matplotlib.ticker.MaxNLocator(integer=True))
        ax.ticklabel_format(axis="y", style="sci", scilimits=(-3, 3), useOffset=False)
        ax.grid(alpha=0.3)
    ax = fig.add_subplot(grid[1, :])
    steps, la, lb = _common_losses(a, b)
    deltas = lb.astype(np.float64) - la.astype(np.float64)
    ax.axhline(0, color="grey", linewidth=0.8)
    ax.plot(steps, deltas, color=B_COLOUR, linewidth=1, marker="." if steps.size <= 400 else None, markersize=3)
    nonzero = np.abs(deltas[np.isfinite(deltas) & (deltas != 0)])
    scale = ""
    if nonzero.size and nonzero.max() > 100 * nonzero.min():  # linear within the smallest difference seen
        ax.set_yscale("symlog", linthresh=float(nonzero.min()), linscale=2)
        scale = f" (symlog: linear within ±{nonzero.min():.2g})"
    else:
        ax.ticklabel_format(axis="y", style="sci", scilimits=(-3, 3), useOffset=False)
    for record in a.epochs:
        if steps.size and steps[0] <= record["global_step"] < steps[-1]:
            ax.axvline(record["global_step"], color="grey", linestyle=":", linewidth=0.8)
            ax.annotate(
                f"end of epoch {record['epoch']}",
                (record["global_step"], 0.02),
                xycoords=("data", "axes fraction"),
                fontsize=7,
                color="grey",
                rotation=90,
                ha="right",
                va="bottom",
            )
    first = result["first_divergence"]
    if first is not None and first["window"] is not None and first["window"][0] < first["window"][1]:
        ax.axvspan(
            first["window"][0] - 0.5,
            first["window"][1] + 0.5,
            color="grey",
            alpha=0.15,
            label="the first differing update lies in here",
        )
        ax.legend(fontsize=8, loc="lower left")
    if first is not None:
        ax.axvline(first["step"], color="black", linestyle="--", linewidth=1.2)
        ax.annotate(
            f"first divergence: global step {first['step']}",
            (first["step"], 0.5),
            xytext=(3, 0),
            textcoords="offset points",
            xycoords=("data", "axes fraction"),
            rotation=90,
            va="center",
            fontsize=9,
            fontweight="bold",
        )
    same = steps.size and not nonzero.size and np.array_equal(la.view(np.uint32), lb.view(np.uint32))
    covered = f"global steps {steps[0]}..{steps[-1]}" if steps.size else "no step in common"
    ax.set_title(
        f"training loss of every step: B − A ({covered}{': bit-identical, all 0' if same else ''})", fontsize=10
    )
    ax.set(xlabel="global step", ylabel=f"B − A{scale}")
    ax.grid(alpha=0.3)
    verdict = "bit-identical: every difference is exactly 0" if result["verdict"] == "bit-identical" else "differs"
    fig.suptitle(f"B (this machine) − A (published): {verdict}", fontsize=11)
    return png(fig)


def _epoch_spans(a: Receipt) -> list[tuple[int, int, int]]:
    """(epoch, first global step done before it, last global step of it) for A's epochs whose start is known."""
    spans, previous = [], None
    for record in a.epochs:
        start = previous if previous is not None else (0 if record["epoch"] == 1 else None)
        if start is not None:
            spans.append((record["epoch"], start, record["global_step"]))
        previous = record["global_step"]
    return spans


def _trace_map(a: Receipt, b: Receipt, result: dict) -> bytes:
    """Top: each tensor's weight digest at every trace boundary both runs hold (x: its global step), same or
    differing. Bottom: per epoch, log10(1 + median ULP distance) of the step losses that differ (sign
    flips are counted apart by ulp_statistics, so one cannot saturate the colour)."""
    same_names = a.trace.tensor_names == b.trace.tensor_names
    names = a.trace.tensor_names if same_names else sorted(set(a.trace.tensor_names) | set(b.trace.tensor_names))
    names = names or ["(no tensor)"]
    b_at = {boundary.step: boundary for boundary in b.trace.boundaries}
    columns = [boundary for boundary in a.trace.boundaries if boundary.step in b_at]
    grid = np.full((len(names), max(len(columns), 1)), np.nan)
    for j, boundary in enumerate(columns):
        digests_a = dict(zip(a.trace.tensor_names, boundary.tensors, strict=True))
        digests_b = dict(zip(b.trace.tensor_names, b_at[boundary.step].tensors, strict=True))
        for i, name in enumerate(names):
            if name in digests_a and name in digests_b:
                grid[i, j] = float(digests_a[name] != digests_b[name])
    spans = _epoch_spans(a)
    steps, la, lb = _common_losses(a, b)
    fig, (top, bottom) = plt.subplots(
        2, 1, figsize=(10, 2.6 + 0.28 * len(names)), height_ratios=(1.2 + 0.28 * len(names), 1.3), layout="constrained"
    )
    colours = matplotlib.colors.ListedColormap(["#cfe8cf", "#b00020"]).with_extremes(bad="#dddddd")
    top.imshow(grid, cmap=colours, vmin=0, vmax=1, aspect="auto", interpolation="nearest")
    top.set_yticks(range(len(names)), names, fontsize=7)
    top.set_xticks(
        range(grid.shape[1]),
        [str(c.step) for c in columns] or [""],
        fontsize=7,
        rotation=90 if len(columns) > 20 else 0,
    )
    top.set_xlabel("global step of the trace boundary (weights digested there; both runs hold it)", fontsize=8)
    top.set_xticks(np.arange(-0.5, grid.shape[1]), minor=True)
    top.set_yticks(np.arange(-0.5, grid.shape[0]), minor=True)
    top.grid(which="minor", color="white", linewidth=1)
    top.tick_params(which="minor", length=0)
    handles = [
        matplotlib.patches.Patch(color="#cfe8cf", label="same digest"),
        matplotlib.patches.Patch(color="#b00020", label="differs"),
    ]
    if np.isnan(grid).any() and columns:
        handles.append(matplotlib.patches.Patch(color="#dddddd", label="tensor in one run only"))
    top.legend(handles=handles, fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1))
    first = result["first_divergence"]
    if not columns:
        title = "no trace boundary in common"
    elif first is None:  # the count the verdict gives: boundaries after the initial weights
        after = sum(1 for c in columns if c.step > 0)
        initial = " and at the initial weights" if len(columns) > after else ""
        title = f"every tensor agrees at all {after} boundaries in common{initial}"
    else:
        # The boundaries are where the trace digests every tensor (trace.every_steps): say that the first
        # red column is the first such digest after the first differing update, not the update itself.
        where = first["first_differing_boundary"]
        title = f"first differing update: step {first['step']}" + (
            f"; the first digest after it (step {where}) is the first red column" if where else ""
        )
    top.set_title(f"weight digests per tensor, B vs A: {title}", fontsize=10)

    medians, labels, notes = [], [], []
    done_before = int(steps[0]) - 1 if steps.size else 0  # la[i], lb[i]: the loss of global step done_before+1+i
    for epoch, start, end in spans:
        lo, hi = max(start, done_before), min(end, done_before + steps.size)  # the part of the epoch both cover
        if hi <= lo:
            continue
        stats = ulp_statistics(la[lo - done_before : hi - done_before], lb[lo - done_before : hi - done_before])
        medians.append(np.log10(1 + stats["median_ulp"]))
        labels.append(f"epoch {epoch}\nsteps {lo + 1}–{hi}")
        flips = f", {stats['sign_flips']} sign flips" if stats["sign_flips"] else ""
        notes.append(f"median {stats['median_ulp']:g} ULP\n{stats['values_differing']}/{hi - lo} differ{flips}")
    row = np.array([medians or [np.nan]])
    image = bottom.imshow(
        row, cmap="magma_r", vmin=0, vmax=max(1.0, float(np.nanmax(row)) if medians else 1.0), aspect="auto"
    )
    for j, note in enumerate(notes):
        dark = medians[j] > 0.55 * max(1.0, max(medians))
        bottom.text(j, 0, note, ha="center", va="center", fontsize=8, color="white" if dark else "black")
    bottom.set_xticks(range(row.shape[1]), labels or ["no epoch in common"], fontsize=8)
    bottom.set_yticks([])
    bottom.set_title("training-loss bits per epoch: median ULP distance B vs A over the steps that differ", fontsize=10)
    fig.colorbar(image, ax=bottom, label="log10(1 + median ULP)", fraction=0.05, pad=0.01)
    return png(fig)


def _spread_plot(spread: dict, values: dict | None) -> bytes:
    """A and B among the seed-to-seed spread of the final test accuracy and loss: a box plot of the seed
    runs when their values are known, else bands of ±1 and ±2 seed std around A."""
    fig, axes = plt.subplots(1, 2, figsize=(10, 4), layout="constrained")
    for ax, metric in zip(axes, ("test_accuracy", "test_loss"), strict=True):
        stats = spread[metric]
        ticks, tick_labels = [1, 2], ["A\n(published)", "B\n(this machine)"]
        if values and values.get(metric):
            seeds = values[metric]
            ax.boxplot([seeds], positions=[0], widths=0.5)
            ax.scatter(np.zeros(len(seeds)), seeds, s=16, color="grey", alpha=0.8, zorder=3, label="a seed run")
            ticks, tick_labels = [0, *ticks], [f"different seeds\n({len(seeds)} runs)", *tick_labels]
        elif stats["std"] is not None:
            std = stats["std"]
            ax.axhspan(stats["a"] - 2 * std, stats["a"] + 2 * std, color=A_COLOUR, alpha=0.1, label="A ± 2 seed std")
            ax.axhspan(stats["a"] - std, stats["a"] + std, color=A_COLOUR, alpha=0.2, label="A ± 1 seed std")
        ax.scatter([1], [stats["a"]], marker="D", s=60, color=A_COLOUR, zorder=4)
        ax.scatter([2], [stats["b"]], marker="*", s=170, color=B_COLOUR, zorder=4)
        for x, value, colour in ((1, stats["a"], A_COLOUR), (2, stats["b"], B_COLOUR)):
            ax.annotate(f"  {value:.6g}", (x, value), fontsize=8, color=colour, va="center")
        ax.set_xticks(ticks, tick_labels, fontsize=8)
        ax.set_xlim(min(ticks) - 0.6, 2.8)
        z = "" if stats["in_std"] is None else f": B − A = {stats['in_std']:+.2f} seed std"
        ax.set_title(f"final {metric.replace('_', ' ')}{z}", fontsize=10)
        ax.grid(alpha=0.3, axis="y")
        ax.margins(y=0.12)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7, loc="best")
    fig.suptitle(
        f"does the difference matter? A and B against the seed-to-seed spread ({spread['source']}, "
        f"{spread['runs']} runs)",
        fontsize=11,
    )
    return png(fig)


def reproduction_html(reproduction: dict, figures: dict[str, bytes], depth: int = 0, prefix: str = "") -> list[str]:
    """The reproduction's sections: verdict, summary, tier, causes, self-check and --match first, then the
    figures, the epoch metrics and the environments. `depth` 1 nests them under a report's own title;
    `prefix` is their PNG files' prefix there."""
    esc = html.escape
    result, a, b = reproduction["result"], reproduction["a"], reproduction["b"]
    h1, h2 = f"h{1 + depth}", f"h{2 + depth}"
    identical = result["verdict"] == "bit-identical"
    unverifiable = result.get("subject") is None  # nothing ties this result to the receipt shown as A
    coverage = result["coverage"]
    losses_only = result["verdict"] == "losses-only"  # the trained model is bit-identical
    verdict_class = "warn" if unverifiable or losses_only else "ok" if identical else "bad"
    parts = [
        f"<{h1}>reprocube reproduce: {esc(result['run_a'])}</{h1}>",
        f"<p class='verdict'>Verdict: <span class='{verdict_class}'>{esc(result['verdict'])}"
        f"{' (unverifiable)' if unverifiable else ''}</span>"
        + (f" <span class='dim'>({esc(result['tier'])})</span>" if result["tier"] != result["verdict"] else "")
        + "</p>",  # "losses-only (losses-only)" said nothing twice
        (
            f"<p class='warn'>Unverifiable: this {REPRODUCE_RESULT.name} names no subject "
            "(written by a reprocube before "
            "results recorded the receipt file they are about): nothing shows that A's receipt here is the one "
            "reproduced.</p>"
            if unverifiable
            else ""
        ),
        f"<p class='headline'>{esc(verdict_line(result))}</p>",
        *_first_update(result, a, b),
        f"<p>{esc(result['summary'])}</p>",
        # The tier's words, unless the summary already ends with them (it does where B differs).
        (f"<p class='caption'>{esc(result['tier_text'])}</p>" if result["tier_text"] not in result["summary"] else ""),
        *_what_to_do(result, h2),
        *_sessions(result, h2),
        f"<p class='caption'>A (published): <code>{esc(result['source'])}</code>"
        + (
            f" (file sha256 <code>{result['subject']['receipt_sha256'][:16]}…</code>, "
            "as sha256sum and a signature see it)"
            if result.get("subject")
            else ""
        )
        + " &middot; B (retrained here): "
        f"<code>{esc(str(b.path.parent))}</code> &middot; compared {counted(coverage['compared_steps'], 'step')} "
        "(every loss bit), "
        f"{counted(coverage['compared_boundaries'], 'weight-digest boundary', 'weight-digest boundaries')} "
        f"after the initial weights, {counted(coverage['a_epochs'], 'epoch')} of A ({coverage['b_epochs']} of B) "
        f"&middot; {result['wall_s']['total']} s in all, B's run {result['wall_s']['run_b']} s</p>",
        (
            f"<{h2}>"
            f"{'Differences between A and B (none changed a bit)' if identical else 'Likely causes, most likely first'}"
            f"</{h2}>"
        ),
    ]
    parts += _causes(result)
    parts += _self_check(result, h2)
    parts += _intervention(result, h2)
    parts += _claims(result, h2)
    parts += _divergence(result, h2)
    parts += _figures(reproduction, figures, h2, prefix)
    parts += _epoch_table(a, b, h2)
    parts += _environment_tables(a, b, result, h2)
    return parts


def _causes(result: dict) -> list[str]:
    esc = html.escape
    parts = []
    causes = sorted(result["causes"], key=lambda c: c["kind"] == "not-numeric")  # stable: reproduce's rank kept
    if causes:
        parts.append("<table><tr><th>#</th><th>key</th><th>A</th><th>B</th><th>kind</th><th>note</th></tr>")
        for number, cause in enumerate(causes, start=1):
            dim = " class='dim'" if cause["kind"] == "not-numeric" else ""
            parts.append(
                f"<tr{dim}><td>{number}</td><td class='key'><code>{esc(cause['key'])}</code></td>{cell(cause['a'])}"
                f"{cell(cause['b'])}<td>{esc(cause['kind'])}</td><td>{esc(cause['note'] or '')}</td></tr>"
            )
        parts.append("</table><p class='caption'>Grey rows: differences known not to change these numbers.</p>")
    else:
        parts.append("<p>none: config, code and recorded environment are the same</p>")
    return parts


def _self_check(result: dict, h2: str) -> list[str]:
    esc = html.escape
    parts = [f"<{h2}>Does B agree with itself?</{h2}>"]
    check = result["self_check"]
    if result["self_consistent"] is None:
        why = "B reproduced A" if result["verdict"] == "bit-identical" else "no diverging step to recompute"
        parts.append(f"<p class='dim'>not checked ({why})</p>")
    else:
        finding = (
            "<span class='ok'>yes</span>: B is deterministic but computes differently from A"
            if result["self_consistent"]
            else "<span class='bad'>no: B is NON-DETERMINISTIC</span> (a second computation of the same steps differs)"
        )
        parts.append(
            f"<p>{finding} (recomputed from {esc(check['from'])} to global step {check['to_step']} in a "
            f"fresh process; {check['compared_steps']} steps compared)</p>"
        )
    return parts


def _intervention(result: dict, h2: str) -> list[str]:
    esc = html.escape
    parts = [f"<{h2}>Intervention (--match)</{h2}>"]
    match = result["match"]
    if match is None:
        parts.append(
            "<p class='dim'>not run (reproduce --match re-runs B with A's settings where this machine can "
            "emulate them)</p>"
        )
    else:
        cls = "ok" if match["bit_identical"] else ("bad" if match["ran"] else "dim")
        parts.append(f"<p class='{cls}'>{esc(match['summary'])}</p>")
        parts += [f"<p class='caption'>cannot emulate: {esc(c)}</p>" for c in match["cannot"]]
    return parts


def _claims(result: dict, h2: str) -> list[str]:
    """Every claim of A's receipt counted: reproduced, differs, not checked (and why); the first operation."""
    esc = html.escape
    claims = result["claims"]
    parts = [f"<{h2}>What was compared: every claim of A's receipt</{h2}>"]
    parts.append("<table><tr><th>claims of A</th><th>reproduced</th><th>differ</th><th>not checked</th></tr>")
    for kind, counts in [*claims["kinds"].items(), ("all", claims["totals"])]:
        why = "; ".join(counts.get("why_not_checked", []))
        parts.append(
            f"<tr><td>{esc(kind)}</td><td>{counts['reproduced']}</td><td>{counts['differs']}</td>"
            f"<td>{counts['not_checked']}{f' ({esc(why)})' if why else ''}</td></tr>"
        )
    parts.append("</table>")
    operation = result.get("first_operation")
    if operation:
        cls = "finding" if operation["status"] == "found" else "dim"  # a finding, not an error: not red
        parts.append(f"<p class='{cls}'>{esc(operation['text'])}</p>")
    return parts


def _divergence(result: dict, h2: str) -> list[str]:
    esc = html.escape
    first = result["first_divergence"]
    parts = [f"<{h2}>B − A: per epoch and per step</{h2}>"]
    if first is not None and first.get("weights_identical"):
        parts.append(
            f"<p>The loss bits first differ at global step <b>{first['step']}</b> (epoch {first['epoch']}); "
            "the weights "
            "agree at every trace boundary and epoch both runs hold: <b>the trained model is bit-identical</b>.</p>"
        )
    elif first is not None:
        tensors = ", ".join(f"<code>{esc(t)}</code>" for t in first["tensors"]) or "n/a"
        agree, differ = first["last_matching_boundary"], first["first_differing_boundary"]
        parts.append(
            f"<p>First divergence: global step <b>{first['step']}</b> (epoch {first['epoch']}), found by its "
            f"{esc(first['by'])}; the weights "
            + (f"last agree at the boundary of step {agree}" if agree is not None else "agree at no boundary before it")
            + (f", first differ at step {differ}: {tensors}" if differ is not None else "")
            + f"; {esc(first_update_text(first))}</p>"
        )
    return parts


def _figures(reproduction: dict, figures: dict[str, bytes], h2: str, prefix: str) -> list[str]:
    """The figures drawn (each with its caption), in the page's order."""
    parts = []
    sections = (
        (
            DIFFERENCE_FIGURE,
            None,
            "Each panel has its own scale around a zero line, so a difference of one float32 ULP is visible. The "
            "dashed line marks the first diverging global step (the first loss, or weight digest, that differs).",
        ),
        (
            DIVERGENCE_FIGURE,
            "Divergence map (global step × tensor)",
            "Top: green where a tensor's weights are bit-identical at that global step, red where they differ. Bottom: "
            "how far apart the losses are per epoch, in float32 units in the last place (sign flips counted apart).",
        ),
        (
            SPREAD_FIGURE,
            "Does it matter? The seed-to-seed spread",
            reproduction["spread_note"] or "A's and B's final test metrics among runs of A's config with other seeds.",
        ),
    )
    for name, heading, caption in sections:
        if name in figures:
            parts += [f"<{h2}>{heading}</{h2}>" if heading else "", img(prefix + name, figures[name])]
            parts.append(f"<p class='caption'>{html.escape(caption)}</p>")
    return parts


# Copies the recipe beside it (its text, never a value put into the script).
COPY_BUTTON = (
    "<button class='copy' onclick=\"navigator.clipboard.writeText(this.previousElementSibling.textContent);"
    "this.textContent='copied'\">copy</button>"
)


def _first_update(result: dict, a: Receipt, b: Receipt) -> list[str]:
    """The headline under the verdict: the first differing update with A's and B's loss there (an edited
    receipt's value beside B's), the tensors, the most likely cause and the first differing operation."""
    first = result["first_divergence"]
    if first is None:
        return []
    steps, la, lb = _common_losses(a, b)
    at = np.flatnonzero(steps == first["step"])
    losses = ""
    if at.size and la[at[0]].tobytes() != lb[at[0]].tobytes():  # an edited receipt's value beside B's
        losses = f" (A's loss {float(la[at[0]])!r}, B's {float(lb[at[0]])!r})"
    elif at.size:
        losses = " (the loss bits agree there; the weights differ)"
    if first.get("initial_tensors"):
        items = [
            "The initial weights already differ, before any update: tensors "
            + ", ".join(f"<code>{html.escape(t)}</code>" for t in first["initial_tensors"])
        ]
    else:
        items = [f"First differing update: <b>step {first['step']}</b>{losses}"]
    if not first.get("initial_tensors") and (first.get("weight_tensors") or first.get("tensors")):
        items.append(
            "tensors "
            + ", ".join(f"<code>{html.escape(t)}</code>" for t in first.get("weight_tensors") or first["tensors"])
        )
    cause = next((c for c in result["causes"] if c["kind"] != "not-numeric"), None)
    match = result["match"]
    if match and match["bit_identical"]:
        items.append(f"the cause, proven: {html.escape(match['summary'])}")
    elif cause:
        items.append(
            f"most likely cause <code>{html.escape(cause['key'])}</code> ({html.escape(str(cause['a']))} "
            f"&rarr; {html.escape(str(cause['b']))})"
        )
    operation = result.get("first_operation")
    if operation and operation["status"] == "found":
        items.append(f"first differing operation: {html.escape(operation['text'])}")
    return ["<p class='first'>" + "; ".join(items) + "</p>"]


def _what_to_do(result: dict, h2: str) -> list[str]:
    """Right under the verdict: the next step (reproduce_result.what_to_do), the proven recipe to copy."""
    parts = [f"<{h2}>What to do</{h2}>"]
    parts += [f"<p>{html.escape(line)}</p>" for line in what_to_do(result)]
    recipe = (result["match"] or {}).get("recipe")
    if recipe:
        parts.append(f"<pre class='recipe'>{html.escape(chr(10).join(recipe_lines(recipe)))}</pre>{COPY_BUTTON}")
    return parts


def _sessions(result: dict, h2: str) -> list[str]:
    """A's sessions that resumed under other numeric settings (a finding about A, before anything of B)."""
    if not result["a_sessions"]:
        return []
    parts = [f"<{h2}>A's own sessions</{h2}>", "<p>A was stopped and resumed under other numeric settings:</p><ul>"]
    for finding in result["a_sessions"]:
        changes = "; ".join(
            f"<code>{html.escape(str(c['key']))}</code> {html.escape(str(c['a']))} &rarr; {html.escape(str(c['b']))}"
            for c in finding["changes"][:6]
        )
        parts.append(f"<li>steps {finding['steps'][0]}..{finding['steps'][1]}: {changes}</li>")
    return [*parts, "</ul>"]


def _epoch_table(a: Receipt, b: Receipt, h2: str) -> list[str]:
    """Every epoch's metrics, A against B, at full float precision; rows that differ in red."""
    esc = html.escape
    parts = [
        f"<{h2}>Epoch metrics, A vs B</{h2}>",
        "<table><tr><th>epoch</th><th>global step</th><th>metric</th><th>A</th><th>B</th><th>B − A</th></tr>",
    ]
    epochs_b = {r["epoch"]: r for r in b.epochs}
    for record in a.epochs:
        other = epochs_b.get(record["epoch"])
        if other is None:
            parts.append(
                f"<tr class='bad'><td>{record['epoch']}</td><td colspan='5'>B has no epoch {record['epoch']}</td></tr>"
            )
            continue
        for metric in (*EPOCH_METRICS, "weights_digest"):
            va, vb = record[metric], other[metric]
            if metric == "weights_digest":
                delta, va, vb = "same" if va == vb else "differs", va[:16] + "…", vb[:16] + "…"
            else:
                delta = "0" if va == vb else f"{vb - va:+.3g}"
            cls = "num" if delta in ("0", "same") else "num bad"
            parts.append(
                f"<tr><td>{record['epoch']}</td><td>{record['global_step']}</td><td>{esc(metric)}</td>"
                f"<td class='num'>{esc(number(va))}</td><td class='num'>{esc(number(vb))}</td>"
                f"<td class='{cls}'>{esc(delta)}</td></tr>"
            )
    parts.append("</table>")
    return parts


def _environment_tables(a: Receipt, b: Receipt, result: dict, h2: str) -> list[str]:
    """The environment rows `reprocube report` shows, A against B, then every environment difference
    reproduce ranked as a cause, with whole values."""
    esc = html.escape
    flat_a, flat_b = flatten_keys(a.env), flatten_keys(b.env)
    parts = [f"<{h2}>Environments</{h2}>", "<table><tr><th>key</th><th>A</th><th>B</th></tr>"]
    for key in ENV_ROWS:
        va, vb = str(flat_a.get(key, "")), str(flat_b.get(key, ""))
        if va or vb:
            cls = "" if va == vb else " class='bad'"
            parts.append(f"<tr{cls}><td>{esc(key)}</td>{cell(va, 200)}{cell(vb, 200)}</tr>")
    parts.append("</table>")
    differences = [c for c in result["causes"] if c["kind"] == "environment"]
    parts.append(f"<{h2}>Environment differences (causes of kind environment, likeliest first)</{h2}>")
    if not differences:
        parts.append("<p>none</p>")
        return parts
    parts.append("<table><tr><th>key</th><th>A</th><th>B</th></tr>")
    parts += [
        f"<tr><td class='key'><code>{esc(c['key'])}</code></td>{cell(c['a'], 400)}{cell(c['b'], 400)}</tr>"
        for c in differences
    ]
    parts.append("</table>")
    return parts
