"""The variance study's box plot: final test metrics, same seed against different seeds (study.png and
the report's study section)."""

from __future__ import annotations

from reprocube.pages.html import png
from reprocube.pages.plots import plt
from reprocube.results.study_result import GROUPS


def box_plot(result: dict) -> bytes:
    fig, axes = plt.subplots(1, 2, figsize=(9, 4), layout="constrained")
    for ax, key in zip(axes, ("test_accuracy", "test_loss"), strict=True):
        data = [[float(r[key]) for r in result["runs"] if r["group"] == group] for group in GROUPS]
        ax.boxplot(
            [d or [float("nan")] for d in data],
            tick_labels=[f"{g}\n({len(d)} runs)" for g, d in zip(GROUPS, data, strict=True)],
        )
        for position, values in enumerate(data, start=1):
            ax.scatter([position] * len(values), values, s=14, alpha=0.7, zorder=3)
        ax.set_title(key.replace("_", " "))
        ax.grid(alpha=0.3)
    fig.suptitle("final test metrics: same seed vs different seeds")
    return png(fig, tight=False)
