"""`reprocube report RUN...`: one self-contained HTML page (PNGs embedded, also written beside it):
loss and accuracy curves of every run overlaid, a divergence map of each run against the first
(checkpoint x tensor, coloured by max ULP distance), verify/compare verdicts, and the environments.
A study directory (`reprocube study`) among the paths adds its box plot and group statistics."""

from __future__ import annotations

import base64
import html
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only, no display
import matplotlib.pyplot as plt  # noqa: E402
import matplotlib.ticker  # noqa: E402
import numpy as np  # noqa: E402

from reprocube.commands.compare import compare_runs, load_run, summary_line  # noqa: E402
from reprocube.commands.study_results import STUDY_RESULT, box_plot, read_study, summary_lines  # noqa: E402
from reprocube.config import flatten_keys  # noqa: E402
from reprocube.errors import EXIT_OK, CheckpointError  # noqa: E402
from reprocube.files import refuse_inside_checkpoints, write_file_atomic  # noqa: E402
from reprocube.untrusted import Fields, read_json  # noqa: E402

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


def run(args) -> int:
    """`reprocube report RUN... [--out DIR]`."""
    refuse_inside_checkpoints(args.out)
    print(f"report: {write_report(args.runs, args.out)}")
    return EXIT_OK


def write_report(paths: list[Path], out: Path) -> Path:
    studies = [read_study(p) for p in paths if (p / STUDY_RESULT).is_file()]
    run_paths = [p for p in paths if not (p / STUDY_RESULT).is_file()]
    runs = [load_run(p) for p in run_paths]  # verifies every checkpoint first
    for run in runs:  # every input is read and checked before anything is written
        run["verify_checks"] = read_verify_checks(run["path"])
    out.mkdir(parents=True, exist_ok=True)
    labels = [_label(r["path"], run_paths) for r in runs]
    figures = {"curves.png": _curves(runs, labels)} if runs else {}
    comparisons = [compare_runs(runs[0], other) for other in runs[1:]]
    if comparisons:
        figures["divergence.png"] = _divergence_map(comparisons, labels)
    for number, study in enumerate(studies, start=1):
        figures[f"study-{number}.png"] = box_plot(study)
    for name, png in figures.items():
        write_file_atomic(out / name, png)
    page = _html(runs, labels, comparisons, figures, studies)
    write_file_atomic(out / "report.html", page.encode())
    return out / "report.html"


def read_verify_checks(run_path: Path) -> list[dict]:
    """The checks of a run's verify.json (written by `reprocube verify` into its reference run), each
    with a string check, a boolean passed and a string summary; none if there is no verify.json."""
    path = run_path / "verify.json"
    if not path.exists():
        return []
    verdict = Fields(read_json(path, CheckpointError), str(path), CheckpointError)
    return [
        {"check": c.text("check"), "passed": c.boolean("passed"), "summary": c.text("summary")}
        for c in verdict.records("checks")
    ]


def _label(path: Path, all_paths: list[Path]) -> str:
    names = [p.name for p in all_paths]
    return path.name if names.count(path.name) == 1 else f"{path.parent.name}/{path.name}"


def _png(fig) -> bytes:
    import io

    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=110, bbox_inches="tight")
    plt.close(fig)
    return buffer.getvalue()


def _curves(runs, labels) -> bytes:
    fig, (loss_ax, acc_ax) = plt.subplots(1, 2, figsize=(11, 4))
    for run, label in zip(runs, labels, strict=True):
        epochs = [r for r in run["metrics"] if r.get("kind") == "epoch"]
        x = [r["epoch"] for r in epochs]
        loss_ax.plot(x, [r["train_loss"] for r in epochs], marker="o", label=f"{label} train")
        loss_ax.plot(x, [r["test_loss"] for r in epochs], marker="s", linestyle="--", label=f"{label} test")
        acc_ax.plot(x, [r["test_accuracy"] for r in epochs], marker="o", label=label)
    loss_ax.set(title="loss", xlabel="epoch", ylabel="mean NLL")
    acc_ax.set(title="test accuracy", xlabel="epoch", ylabel="accuracy")
    for ax in (loss_ax, acc_ax):
        ax.xaxis.set_major_locator(matplotlib.ticker.MaxNLocator(integer=True))
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    return _png(fig)


def _divergence_map(comparisons, labels) -> bytes:
    height = sum(2.2 + 0.4 * len(c["checkpoints"]) for c in comparisons)  # room for each panel's tensor names
    fig, axes = plt.subplots(len(comparisons), 1, figsize=(9, height), squeeze=False, layout="constrained")
    for ax, comparison, label in zip(axes[:, 0], comparisons, labels[1:], strict=True):
        tensors = sorted({t["tensor"] for c in comparison["checkpoints"] for t in c["tensors"]}) or ["(none)"]
        grid = np.zeros((max(len(comparison["checkpoints"]), 1), len(tensors)))
        for i, c in enumerate(comparison["checkpoints"]):
            for t in c["tensors"]:
                grid[i, tensors.index(t["tensor"])] = (
                    np.log10(1 + t.get("max_ulp", 0)) if "problem" not in t else np.nan
                )
        image = ax.imshow(
            grid, cmap="magma_r", vmin=0, vmax=max(10.0, float(np.nanmax(grid)) if grid.size else 10.0), aspect="auto"
        )
        ax.set_yticks(
            range(len(comparison["checkpoints"])),
            [c["checkpoint"] for c in comparison["checkpoints"]] or ["none"],
            fontsize=7,
        )
        ax.set_xticks(range(len(tensors)), tensors, rotation=45, ha="right", fontsize=7)
        missing = " (white: tensor in one run only)" if np.isnan(grid).any() else ""
        ax.set_title(f"{label} vs {labels[0]}: {summary_line(comparison)}{missing}", fontsize=8)
        fig.colorbar(image, ax=ax, label="log10(1 + max ULP)")
    return _png(fig)


def _figure_title(name: str) -> str:
    if name == "curves.png":
        return "Curves"
    if name == "divergence.png":
        return "Divergence map (each run against the first)"
    return "Variance study: same seed vs different seeds"


def _study_html(study: dict) -> str:
    esc = html.escape
    rows = [
        "<table><tr><th>group</th><th>runs</th><th>test accuracy mean</th><th>std</th><th>test loss mean</th><th>std</th><th>distinct weights_digest</th></tr>"
    ]
    for group, s in study["groups"].items():
        cells = [
            group,
            s["runs"],
            s["test_accuracy"]["mean"],
            s["test_accuracy"]["std"],
            s["test_loss"]["mean"],
            s["test_loss"]["std"],
            s["distinct_weights_digests"],
        ]
        rows.append("<tr>" + "".join(f"<td>{esc('n/a' if c is None else str(c))}</td>" for c in cells) + "</tr>")
    rows.append("</table><ul>" + "".join(f"<li>{esc(line)}</li>" for line in summary_lines(study)[2:]) + "</ul>")
    return f"<p>Study <code>{esc(str(study.get('study_dir')))}</code></p>" + "".join(rows)


def _html(runs, labels, comparisons, figures, studies=()) -> str:
    esc = html.escape
    parts = [
        "<!doctype html><html><head><meta charset='utf-8'><title>reprocube report</title>",
        "<style>body{font-family:sans-serif;max-width:1100px;margin:2em auto}table{border-collapse:collapse;font-size:13px}"
        "td,th{border:1px solid #ccc;padding:3px 8px;text-align:left}.ok{color:#176317}.bad{color:#b00020;font-weight:bold}</style>",
        "</head><body><h1>reprocube report</h1>",
        "<p>Runs: " + ", ".join(f"<code>{esc(str(r['path']))}</code>" for r in runs) + "</p>",
    ]
    for name, png in figures.items():
        parts.append(f"<h2>{_figure_title(name)}</h2>")
        parts.append(
            f"<img alt='{name}' src='data:image/png;base64,{base64.b64encode(png).decode()}' style='max-width:100%'>"
        )
        if name.startswith("study-"):
            parts.append(_study_html(studies[int(name[6:-4]) - 1]))
    parts.append("<h2>Verdicts</h2><table><tr><th>what</th><th>verdict</th></tr>")
    for comparison, label in zip(comparisons, labels[1:], strict=True):
        cls = "ok" if comparison["identical"] else "bad"
        parts.append(
            f"<tr><td>compare {esc(label)} vs {esc(labels[0])}</td><td class='{cls}'>{esc(summary_line(comparison))}</td></tr>"
        )
    for run, label in zip(runs, labels, strict=True):
        for check in run["verify_checks"]:
            cls = "ok" if check["passed"] else "bad"
            parts.append(
                f"<tr><td>verify {esc(label)}: {esc(check['check'])}</td><td class='{cls}'>{esc(check['summary'])}</td></tr>"
            )
    parts.append(
        "</table><h2>Environments</h2><table><tr><th>key</th>"
        + "".join(f"<th>{esc(label)}</th>" for label in labels)
        + "</tr>"
    )
    flat = [flatten_keys(r["env"]) for r in runs]
    for key in ENV_ROWS:
        values = [str(f.get(key, "")) for f in flat]
        if any(values):
            cls = "" if len(set(values)) == 1 else " class='bad'"
            parts.append(f"<tr{cls}><td>{esc(key)}</td>" + "".join(f"<td>{esc(v)}</td>" for v in values) + "</tr>")
    for comparison, label in zip(comparisons, labels[1:], strict=True):
        if comparison["env_differences"]:
            parts.append(
                f"</table><h3>{esc(label)} vs {esc(labels[0])}: environment differences, likeliest causes first</h3><table><tr><th>key</th><th>A</th><th>B</th></tr>"
            )
            parts += [
                f"<tr><td>{esc(d['key'])}</td><td>{esc(str(d['a']))}</td><td>{esc(str(d['b']))}</td></tr>"
                for d in comparison["env_differences"][:30]
            ]
    parts.append("</table></body></html>")
    return "\n".join(parts)
