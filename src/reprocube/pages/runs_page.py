"""The runs page (`reprocube report RUN...`): one self-contained HTML page (PNGs embedded, also written
beside it) with the loss and accuracy curves of every run overlaid, a divergence map of each run against
the first (checkpoint x tensor, coloured by max ULP distance), verify/compare verdicts (a verify.json
shown only where it is about the run it lies in) and the environments; a study directory adds its box
plot and group statistics, a reproduce directory its reproduction's sections."""

from __future__ import annotations

import base64
import html
from pathlib import Path

import matplotlib.ticker
import numpy as np

from reprocube.analysis.run_comparison import compare_runs, load_run, run_subject
from reprocube.config import flatten_keys
from reprocube.errors import ConfigError
from reprocube.files import refuse_inside_checkpoints, write_file_atomic
from reprocube.pages.check_page import is_check_dir, read_check_dir, write_check_page
from reprocube.pages.html import ENV_ROWS, STYLE, STYLE_RUNS, img, png
from reprocube.pages.plots import plt
from reprocube.pages.reproduction_figures import reproduction_figures
from reprocube.pages.reproduction_page import read_reproduction, reproduction_dir, write_reproduction_page
from reprocube.pages.reproduction_sections import reproduction_html
from reprocube.pages.study_figure import box_plot
from reprocube.results.compare_result import summary_line
from reprocube.results.study_result import STUDY_RESULT, read_study, summary_lines
from reprocube.results.verify_result import VERIFY_RESULT, read_verify

# Written into every --out directory report makes: a later report may write there again, and only there
# (as runs.RUN_MARKER marks a run directory). A directory without it that holds anything is not ours.
REPORT_MARKER = ".reprocube-report"


def write_report(paths: list[Path], out: Path) -> Path:
    out = Path(out)
    check_out(out)  # before anything is read: a refused --out costs nothing
    checks = [p for p in paths if is_check_dir(p)]
    if checks:  # a check's page is its own: the script is not one of our runs
        if len(paths) != 1:
            raise ConfigError(f"{checks[0]} is a check directory: report draws one check alone, without runs")
        evidence = read_check_dir(checks[0])
        _claim_out(out)
        return write_check_page(out, evidence)
    reproductions = [read_reproduction(reproduction_dir(p)) for p in paths if reproduction_dir(p) is not None]
    paths = [p for p in paths if reproduction_dir(p) is None]
    studies = [read_study(p) for p in paths if (p / STUDY_RESULT.name).is_file()]
    run_paths = [p for p in paths if not (p / STUDY_RESULT.name).is_file()]
    runs = [load_run(p) for p in run_paths]  # verifies every checkpoint first
    for run in runs:  # every input is read and checked before anything is written
        run["verify"] = verify_evidence(run)
    _claim_out(out)
    if len(reproductions) == 1 and not run_paths and not studies:
        return write_reproduction_page(out, reproductions[0])  # the page reproduce itself writes
    labels = [_label(r["path"], run_paths) for r in runs]
    figures = {"curves.png": _curves(runs, labels)} if runs else {}
    comparisons = [compare_runs(runs[0], other) for other in runs[1:]]
    if comparisons:
        figures["divergence.png"] = _divergence_map(comparisons, labels)
    for number, study in enumerate(studies, start=1):
        figures[f"study-{number}.png"] = box_plot(study)
    sections = []
    for number, reproduction in enumerate(reproductions, start=1):
        shown = reproduction_figures(reproduction)
        sections += reproduction_html(reproduction, shown, depth=1, prefix=f"reproduce-{number}-")
        for name, figure in shown.items():
            write_file_atomic(out / f"reproduce-{number}-{name}", figure)
    for name, figure in figures.items():
        write_file_atomic(out / name, figure)
    page = _html(runs, labels, comparisons, figures, studies, sections)
    write_file_atomic(out / "report.html", page.encode())
    return out / "report.html"


def check_out(out: Path) -> None:
    """--out must be a new or empty directory, or one an earlier report made (it holds REPORT_MARKER):
    never a symbolic link, a file, a run's checkpoints/, or someone's directory. ConfigError (exit 2)."""
    refuse_inside_checkpoints(out)
    if out.is_symlink():
        raise ConfigError(f"--out {out} is a symbolic link; report does not write through links")
    if out.exists() and not out.is_dir():
        raise ConfigError(f"--out {out} exists and is not a directory")
    marker = out / REPORT_MARKER
    ours = marker.is_file() and not marker.is_symlink()
    if out.is_dir() and not ours and any(out.iterdir()):
        raise ConfigError(
            f"--out {out} is not empty and was not made by reprocube report (no {REPORT_MARKER}); "
            "remove it or choose another --out"
        )


def _claim_out(out: Path) -> None:
    """Make --out (checked again: it may have changed while the inputs were read) and mark it as ours."""
    check_out(out)
    out.mkdir(parents=True, exist_ok=True)
    if out.is_symlink():  # made a link between the check and mkdir
        raise ConfigError(f"--out {out} is a symbolic link; report does not write through links")
    write_file_atomic(out / REPORT_MARKER, b'{"reprocube_report": 1}\n')


def verify_evidence(run: dict) -> dict | None:
    """A run's verify.json (written by `reprocube verify` into its reference run) and whether it is about
    this run: its subject must be this run's own (run_subject). about: True, False (another run's: copied,
    or this run changed since), or None (no subject: an older verify.json, which nothing ties to this
    run). None: no file."""
    path = run["path"] / VERIFY_RESULT.name
    if not path.exists():
        return None
    verdict = read_verify(path)
    checks, claimed = verdict["checks"], verdict["subject"]
    own = run_subject(run)
    if claimed is None:
        about = None
        note = (
            f"unverifiable: {path.name} names no subject (written by a reprocube before verify recorded which "
            f"run it is about), so its {len(checks)} checks cannot be tied to this run"
        )
    elif claimed == own:
        about = True
        note = f"about {own['checkpoint']} (weights {own['weights_digest'][:12]}…)"
    else:
        about = False
        mine = f"{own['checkpoint']} (weights {own['weights_digest'][:12]}…)" if own else "no epoch checkpoint"
        note = (
            f"NOT about this run: {path.name} is about {claimed['checkpoint']} (weights "
            f"{claimed['weights_digest'][:12]}…, config {str(claimed['config_hash'])[:12]}…), this run's final "
            f"epoch checkpoint is {mine}: copied from another run, or the run changed since; its "
            f"{len(checks)} checks are not shown"
        )
    return {"about": about, "note": note, "checks": checks, "subject": claimed}


def _label(path: Path, all_paths: list[Path]) -> str:
    names = [p.name for p in all_paths]
    return path.name if names.count(path.name) == 1 else f"{path.parent.name}/{path.name}"


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
    return png(fig)


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
    return png(fig)


def _figure_title(name: str) -> str:
    if name == "curves.png":
        return "Curves"
    if name == "divergence.png":
        return "Divergence map (each run against the first)"
    return "Variance study: same seed vs different seeds"


def _study_html(study: dict) -> str:
    esc = html.escape
    rows = [
        (
            "<table><tr><th>group</th><th>runs</th><th>test accuracy mean</th><th>std</th>"
            "<th>test loss mean</th><th>std</th><th>distinct weights_digest</th></tr>"
        )
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


def _html(runs, labels, comparisons, figures, studies=(), reproductions=()) -> str:
    """The page for runs and studies; `reproductions` (HTML sections of reproduce directories) come first."""
    esc = html.escape
    parts = [
        "<!doctype html><html><head><meta charset='utf-8'><title>reprocube report</title>",
        f"<style>{STYLE}</style>" if reproductions else STYLE_RUNS,
        "</head><body><h1>reprocube report</h1>",
        *reproductions,
    ]
    if reproductions and not runs:
        for name, png in figures.items():  # studies only (a page without runs has no verdicts or environments)
            parts += [f"<h2>{_figure_title(name)}</h2>", img(name, png), _study_html(studies[int(name[6:-4]) - 1])]
        return "\n".join([*parts, "</body></html>"])
    parts.append("<p>Runs: " + ", ".join(f"<code>{esc(str(r['path']))}</code>" for r in runs) + "</p>")
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
            f"<tr><td>compare {esc(label)} vs {esc(labels[0])}</td>"
            f"<td class='{cls}'>{esc(summary_line(comparison))}</td></tr>"
        )
    for run, label in zip(runs, labels, strict=True):
        verify = run.get("verify")
        if verify is None:
            continue
        if verify["about"] is not True:  # another run's verdict, or one nothing ties to this run: never green
            cls = "bad" if verify["about"] is False else "warn"
            parts.append(f"<tr><td>verify {esc(label)}</td><td class='{cls}'>{esc(verify['note'])}</td></tr>")
        if verify["about"] is False:
            continue
        for check in verify["checks"]:
            cls = ("ok" if check["passed"] else "bad") if verify["about"] else "dim"
            summary = check["summary"] if verify["about"] else f"unverifiable: {check['summary']}"
            parts.append(
                f"<tr><td>verify {esc(label)}: {esc(check['check'])}</td><td class='{cls}'>{esc(summary)}</td></tr>"
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
                f"</table><h3>{esc(label)} vs {esc(labels[0])}: environment differences, likeliest causes first</h3>"
                "<table><tr><th>key</th><th>A</th><th>B</th></tr>"
            )
            parts += [
                f"<tr><td>{esc(d['key'])}</td><td>{esc(str(d['a']))}</td><td>{esc(str(d['b']))}</td></tr>"
                for d in comparison["env_differences"][:30]
            ]
    parts.append("</table></body></html>")
    return "\n".join(parts)
