"""The reproduction page's figures (PNG bytes, drawn with matplotlib through pages.plots): B - A per
epoch and per step, the divergence map of the step trace (global step x tensor) and the seed spread.
Apart from the page's HTML (reproduction_sections) and from reading and writing it (reproduction_page):
here only pictures are drawn, from a reproduction already read and checked."""

from __future__ import annotations

import matplotlib.colors
import matplotlib.patches
import matplotlib.ticker
import numpy as np

from reprocube.analysis.tensors import ulp_statistics
from reprocube.pages.html import png
from reprocube.pages.plots import plt
from reprocube.results.reproduce_result import DIFFERENCE_FIGURE, DIVERGENCE_FIGURE, SPREAD_FIGURE
from reprocube.training.receipt import Receipt

A_COLOUR, B_COLOUR = "#1f77b4", "#d62728"


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


def common_losses(a: Receipt, b: Receipt) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
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
    steps, la, lb = common_losses(a, b)
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
    steps, la, lb = common_losses(a, b)
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
