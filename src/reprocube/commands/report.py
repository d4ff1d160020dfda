"""`reprocube report RUN...`: one self-contained HTML page (PNGs embedded, also written beside it):
loss and accuracy curves of every run overlaid, a divergence map of each run against the first
(checkpoint x tensor, coloured by max ULP distance), verify/compare verdicts, and the environments.
A study directory (`reprocube study`) among the paths adds its box plot and group statistics.

A reproduce directory (`reprocube reproduce --out DIR`, holding reproduce.json) among the paths adds the
reproduction's page: its verdict and ranked causes first, then B - A per epoch and per step, the
divergence map of the step trace (global step x tensor), the seed spread, the epoch metrics and the
environment differences. `reprocube reproduce` writes that same page as DIR/report.html."""

from __future__ import annotations

import base64
import hashlib
import html
import json
from pathlib import Path

import matplotlib.colors
import matplotlib.patches
import matplotlib.ticker
import numpy as np

from reprocube.checkpoint import HEX_DIGEST
from reprocube.commands.compare import compare_runs, load_run, run_subject, summary_line, ulp_statistics
from reprocube.commands.study_results import STUDY_RESULT, box_plot, read_study, summary_lines
from reprocube.config import flatten_keys
from reprocube.errors import EXIT_OK, CheckpointError, ConfigError
from reprocube.files import refuse_inside_checkpoints, write_file_atomic
from reprocube.plots import plt  # Agg and no mathtext, for every figure
from reprocube.receipt import Receipt, read_receipt
from reprocube.untrusted import Fields, read_json

REPRODUCE_RESULT = "reproduce.json"
# Written into every --out directory report makes: a later report may write there again, and only there
# (as runs.RUN_MARKER marks a run directory). A directory without it that holds anything is not ours.
REPORT_MARKER = ".reprocube-report"

STYLE_RUNS = (
    "<style>body{font-family:sans-serif;max-width:1100px;margin:2em auto}table{border-collapse:collapse;font-size:13px}"
    "td,th{border:1px solid #ccc;padding:3px 8px;text-align:left}.ok{color:#176317}.bad{color:#b00020;font-weight:bold}"
    ".warn{color:#a15c00;font-weight:bold}.dim,.dim td{color:#999;font-weight:normal}</style>"
)
# The reproduce page adds: greyed rows (not a numeric cause), monospace numbers, captions, the verdict's size.
STYLE = (
    STYLE_RUNS[7:-8] + ".dim,.dim td{color:#999;font-weight:normal}td.num{font-family:monospace;text-align:right}"
    "p.caption{color:#555;font-size:13px;margin-top:0}.verdict{font-size:1.5em}h2{margin-top:1.6em}"
    "td{vertical-align:top}td.key{white-space:nowrap}td.value{word-break:break-all;max-width:380px}"
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


def run(args) -> int:
    """`reprocube report RUN... [--out DIR]`."""
    print(f"report: {write_report(args.runs, args.out)}")
    return EXIT_OK


def write_report(paths: list[Path], out: Path) -> Path:
    out = Path(out)
    check_out(out)  # before anything is read: a refused --out costs nothing
    reproductions = [read_reproduction(_reproduce_dir(p)) for p in paths if _reproduce_dir(p) is not None]
    paths = [p for p in paths if _reproduce_dir(p) is None]
    studies = [read_study(p) for p in paths if (p / STUDY_RESULT).is_file()]
    run_paths = [p for p in paths if not (p / STUDY_RESULT).is_file()]
    runs = [load_run(p) for p in run_paths]  # verifies every checkpoint first
    for run in runs:  # every input is read and checked before anything is written
        run["verify"] = read_verify(run)
    _claim_out(out)
    if len(reproductions) == 1 and not run_paths and not studies:
        return _write_reproduce_page(out, reproductions[0])  # the page reproduce itself writes
    labels = [_label(r["path"], run_paths) for r in runs]
    figures = {"curves.png": _curves(runs, labels)} if runs else {}
    comparisons = [compare_runs(runs[0], other) for other in runs[1:]]
    if comparisons:
        figures["divergence.png"] = _divergence_map(comparisons, labels)
    for number, study in enumerate(studies, start=1):
        figures[f"study-{number}.png"] = box_plot(study)
    sections = []
    for number, reproduction in enumerate(reproductions, start=1):
        shown = _reproduce_figures(reproduction)
        sections += _reproduce_html(reproduction, shown, depth=1, prefix=f"reproduce-{number}-")
        for name, png in shown.items():
            write_file_atomic(out / f"reproduce-{number}-{name}", png)
    for name, png in figures.items():
        write_file_atomic(out / name, png)
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


def read_verify(run: dict) -> dict | None:
    """A run's verify.json (written by `reprocube verify` into its reference run), strictly: its checks
    (each a string check, a boolean passed, a string summary) and whether it is about this run: its
    subject (the reference's final epoch checkpoint, its weights_digest and config_hash) must be this
    run's own (compare.run_subject). about: True, False (another run's: copied, or this run changed
    since), or None (no subject: an older verify.json, which nothing ties to this run). None: no file."""
    path = run["path"] / "verify.json"
    if not path.exists():
        return None
    verdict = Fields(read_json(path, CheckpointError), str(path), CheckpointError)
    checks = [
        {"check": c.text("check"), "passed": c.boolean("passed"), "summary": c.text("summary")}
        for c in verdict.records("checks")
    ]
    claimed = None if verdict.value.get("subject") is None else _check_subject(verdict.mapping("subject"))
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


def _check_subject(subject: Fields) -> dict:
    """verify.json's subject, every key typed (compare.run_subject's shape)."""
    checked = {
        "checkpoint": subject.text("checkpoint"),
        "config_hash": _sha256(subject, "config_hash", nullable=True),
        "weights_digest": _sha256(subject, "weights_digest"),
    }
    if not checked["checkpoint"].startswith("epoch-"):
        raise CheckpointError(f"{subject.where}: checkpoint must name an epoch checkpoint (epoch-NNNN)")
    return checked


def _sha256(fields: Fields, key: str, nullable: bool = False) -> str | None:
    value = fields.value.get(key)
    if value is None and nullable and key in fields.value:
        return None
    if not (isinstance(value, str) and HEX_DIGEST.match(value)):
        expected = "a sha256 (64 lowercase hex digits)" + (" or null" if nullable else "")
        raise CheckpointError(f"{fields.where}: {key} must be {expected}")
    return value


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
            parts += [f"<h2>{_figure_title(name)}</h2>", _img(name, png), _study_html(studies[int(name[6:-4]) - 1])]
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
            f"<tr><td>compare {esc(label)} vs {esc(labels[0])}</td><td class='{cls}'>{esc(summary_line(comparison))}</td></tr>"
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
                f"</table><h3>{esc(label)} vs {esc(labels[0])}: environment differences, likeliest causes first</h3><table><tr><th>key</th><th>A</th><th>B</th></tr>"
            )
            parts += [
                f"<tr><td>{esc(d['key'])}</td><td>{esc(str(d['a']))}</td><td>{esc(str(d['b']))}</td></tr>"
                for d in comparison["env_differences"][:30]
            ]
    parts.append("</table></body></html>")
    return "\n".join(parts)


def _img(name: str, png: bytes) -> str:
    return (
        f"<img alt='{html.escape(name)}' src='data:image/png;base64,{base64.b64encode(png).decode()}' "
        "style='max-width:100%'>"
    )


# --- a reproduction (reprocube reproduce) ----------------------------------------------------------
CAUSE_KINDS = ("config", "code", "environment", "not-numeric")
EPOCH_METRICS = ("train_loss", "train_accuracy", "test_loss", "test_accuracy")
A_COLOUR, B_COLOUR = "#1f77b4", "#d62728"


def write_reproduce_report(out: Path, receipt: Receipt, b_path: Path, result: dict) -> Path:
    """out/report.html (and its PNGs) for a reproduction just made: A's receipt, B's run, reproduce's result."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    checked = check_reproduce_result(result, str(out / REPRODUCE_RESULT))
    _check_result_subject(checked, receipt, str(out / REPRODUCE_RESULT))
    return _write_reproduce_page(out, _reproduction(out, receipt, read_receipt(Path(b_path)), checked))


def _reproduce_dir(path: Path) -> Path | None:
    """The reproduce output directory `path` names (the directory, or its reproduce.json), else None."""
    path = Path(path)
    if path.name == REPRODUCE_RESULT and path.is_file():
        return path.parent
    return path if (path / REPRODUCE_RESULT).is_file() else None


def read_reproduction(directory: Path) -> dict:
    """A reproduce directory for the page: its reproduce.json (every key shown type-checked), A's receipt
    (result["source"], which must still be the receipt reproduced) and B's run (result["run_b"])."""
    file = directory / REPRODUCE_RESULT
    result = check_reproduce_result(read_json(file, CheckpointError), str(file))
    source = Path(result["source"])
    if not source.exists():
        raise CheckpointError(f"{file}: source {source} (A's receipt) does not exist here")
    a = read_receipt(source)
    if a.value["receipt_sha256"] != result["source_sha256"]:
        raise CheckpointError(f"{file}: source {source} is not the receipt reproduced (its sha256 differs)")
    _check_result_subject(result, a, str(file))
    # B lives in DIR/runs/<name>: found there even when run_b was written relative to another directory.
    local = directory / "runs" / Path(result["run_b"]).name
    b_path = local if local.is_dir() else Path(result["run_b"])
    if not b_path.is_dir():
        raise CheckpointError(f"{file}: run_b {result['run_b']} (B's run directory) does not exist here")
    return _reproduction(directory, a, read_receipt(b_path), result)


def _check_result_subject(result: dict, a: Receipt, where: str) -> None:
    """The receipt read as A must be the one the result is about: the sha256 of its file's bytes (what
    sha256sum and a signature see) is subject.receipt_sha256, and the subject's config_hash and final
    weights digest are the receipt's. A result without a subject (older) is marked unverifiable instead."""
    subject = result["subject"]
    if subject is None:
        return
    if hashlib.sha256(a.raw).hexdigest() != subject["receipt_sha256"]:
        raise CheckpointError(
            f"{where}: {a.path} is not the receipt this result is about (the sha256 of its bytes is not "
            "subject.receipt_sha256)"
        )
    final = a.epochs[-1]["weights_digest"] if a.epochs else None
    if (subject["config_hash"], subject["final_weights_digest"]) != (a.value["config_hash"], final):
        raise CheckpointError(
            f"{where}: subject does not describe {a.path} (its config_hash or final_weights_digest differs)"
        )


def _reproduction(directory: Path, a: Receipt, b: Receipt, result: dict) -> dict:
    """What the page shows of one reproduction; the seed-to-seed values from the result or from its study."""
    spread, values, note = result["seed_spread"], None, None
    if spread is not None:
        if all(spread[m].get("values") for m in ("test_accuracy", "test_loss")):
            values = {m: spread[m]["values"] for m in ("test_accuracy", "test_loss")}
        elif spread.get("path"):
            study_file = Path(spread["path"])
            try:
                study = read_study(study_file.parent if study_file.name == STUDY_RESULT else study_file)
            except CheckpointError as exc:  # the study moved or changed: the std bands still say what matters
                note = f"the study's runs could not be read ({exc}); A and B are shown against A's seed std bands"
            else:
                runs = [r for r in study["runs"] if r["group"] == "different_seeds"]
                values = {m: [float(r[m]) for r in runs] for m in ("test_accuracy", "test_loss")} if runs else None
    return {"dir": directory, "a": a, "b": b, "result": result, "spread_values": values, "spread_note": note}


def _write_reproduce_page(out: Path, reproduction: dict) -> Path:
    figures = _reproduce_figures(reproduction)
    parts = [
        "<!doctype html><html><head><meta charset='utf-8'>",
        f"<title>reprocube reproduce: {html.escape(reproduction['result']['run_a'])}</title>",
        f"<style>{STYLE}</style></head><body>",
        *_reproduce_html(reproduction, figures),
        "</body></html>",
    ]
    for name, png in figures.items():
        write_file_atomic(out / name, png)
    write_file_atomic(out / "report.html", "\n".join(parts).encode())
    return out / "report.html"


# --- reproduce.json, strictly ----------------------------------------------------------------------
def _present(fields: Fields, key: str) -> object:
    if key not in fields.value:
        raise CheckpointError(f"{fields.where}: {key} is missing")
    return fields.value[key]


def _nullable(fields: Fields, key: str, read):
    """read(key), or None where the key holds null (the key must be there)."""
    return None if _present(fields, key) is None else read(key)


def _texts(fields: Fields, key: str) -> list[str]:
    value = fields.value.get(key)
    if not (isinstance(value, list) and all(isinstance(v, str) for v in value)):
        raise CheckpointError(f"{fields.where}: {key} must be a list of strings")
    return value


def _step_range(fields: Fields, key: str) -> list[int]:
    value = fields.value.get(key)
    if not (
        isinstance(value, list)
        and len(value) == 2
        and all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in value)
    ):
        raise CheckpointError(f"{fields.where}: {key} must be [first step, last step]")
    return value


def _one_of(fields: Fields, key: str, allowed: tuple[str, ...]) -> str:
    value = fields.text(key)
    if value not in allowed:
        raise CheckpointError(f"{fields.where}: {key} must be one of {', '.join(allowed)}, got {value[:40]!r}")
    return value


def check_reproduce_result(value, where: str) -> dict:
    """The keys of a reproduce result that the page shows, each type-checked (one line naming the file and
    the key when one is wrong, exit 4); the rest of the result is not used."""
    fields = Fields(value, where, CheckpointError)
    # What the result is about (None: a result written before reproduce recorded it; the page says so).
    subject = None if fields.value.get("subject") is None else fields.mapping("subject")
    result = {
        "subject": subject
        and {
            "receipt_sha256": _sha256(subject, "receipt_sha256"),
            "config_hash": _sha256(subject, "config_hash"),
            "final_weights_digest": _sha256(subject, "final_weights_digest", nullable=True),
        }
    }
    result |= {key: fields.text(key) for key in ("tier", "tier_text", "summary", "run_a", "source", "run_b")}
    result["source_sha256"] = fields.text("source_sha256")
    result["verdict"] = _one_of(fields, "verdict", ("bit-identical", "differs"))
    first = _nullable(fields, "first_divergence", fields.mapping)
    if first is not None:
        integer = lambda key: first.integer(key)  # noqa: E731 (nullable steps)
        first = {
            "step": first.integer("step", 1),
            "epoch": _nullable(first, "epoch", integer),
            "by": first.text("by"),
            "last_matching_boundary": _nullable(first, "last_matching_boundary", integer),
            "first_differing_boundary": _nullable(first, "first_differing_boundary", integer),
            "tensors": _texts(first, "tensors"),
            # where the first differing update lies (older results have no window)
            "window": _step_range(first, "window") if first.value.get("window") is not None else None,
        }
    result["first_divergence"] = first
    result["causes"] = [
        {
            "key": cause.text("key"),
            "a": _present(cause, "a"),
            "b": _present(cause, "b"),
            "kind": _one_of(cause, "kind", CAUSE_KINDS),
            "note": cause.text("note", optional=True),
        }
        for cause in fields.records("causes")
    ]
    result["self_consistent"] = _nullable(fields, "self_consistent", fields.boolean)
    check = fields.mapping("self_check") if result["self_consistent"] is not None else None
    result["self_check"] = check and {
        "from": check.text("from"),
        "to_step": check.integer("to_step"),
        "compared_steps": check.integer("compared_steps"),
    }
    match = _nullable(fields, "match", fields.mapping)
    result["match"] = match and {
        "ran": match.boolean("ran"),
        "bit_identical": _nullable(match, "bit_identical", match.boolean),
        "cannot": _texts(match, "cannot"),
        "summary": match.text("summary"),
    }
    result["seed_spread"] = _nullable(fields, "seed_spread", lambda key: _check_spread(fields.mapping(key)))
    ulp = _nullable(fields, "ulp", fields.mapping)
    if ulp is not None:
        ulp = {
            "basis": ulp.text("basis"),
            **{k: ulp.integer(k) for k in ("values_differing", "sign_flips", "max_ulp")},
            **{k: ulp.number(k) for k in ("median_ulp", "p99_ulp", "max_relative")},
        }
    result["ulp"] = ulp
    coverage = fields.mapping("coverage")
    result["coverage"] = {
        "a_steps": _step_range(coverage, "a_steps"),
        "b_steps": _step_range(coverage, "b_steps"),
        **{k: coverage.integer(k) for k in ("compared_steps", "compared_boundaries", "a_epochs", "b_epochs")},
    }
    wall = fields.mapping("wall_s")
    result["wall_s"] = {"total": wall.number("total"), "run_b": wall.number("run_b")}
    return result


def _check_spread(spread: Fields) -> dict:
    checked = {"source": spread.text("source"), "runs": spread.integer("runs"), "path": spread.text("path", True)}
    for metric in ("test_accuracy", "test_loss"):
        stats = spread.mapping(metric)
        checked[metric] = {
            "std": _nullable(stats, "std", stats.number),
            "in_std": _nullable(stats, "in_std", stats.number),
            **{k: stats.number(k) for k in ("a", "b", "difference")},
        }
        if stats.value.get("values") is not None:
            values = stats.value["values"]
            if not (isinstance(values, list) and all(_finite(v) for v in values)):
                raise CheckpointError(f"{stats.where}: values must be a list of finite numbers")
            checked[metric]["values"] = [float(v) for v in values]
    return checked


def _finite(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and bool(np.isfinite(value))


# --- the reproduction's figures --------------------------------------------------------------------
def _reproduce_figures(reproduction: dict) -> dict[str, bytes]:
    a, b, result = reproduction["a"], reproduction["b"], reproduction["result"]
    figures = {
        "difference.png": _difference_plot(a, b, result),
        "divergence-map.png": _trace_map(a, b, result),
    }
    spread = result["seed_spread"]
    if spread is not None and (
        reproduction["spread_values"] or any(spread[m]["std"] is not None for m in ("test_accuracy", "test_loss"))
    ):
        figures["seed-spread.png"] = _spread_plot(spread, reproduction["spread_values"])
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
            ax.annotate(f"end of epoch {record['epoch']}", (record["global_step"], 0.02), xycoords=("data", "axes fraction"),
                        fontsize=7, color="grey", rotation=90, ha="right", va="bottom")  # fmt: skip
    first = result["first_divergence"]
    if first is not None and first["window"] is not None and first["window"][0] < first["window"][1]:
        ax.axvspan(first["window"][0] - 0.5, first["window"][1] + 0.5, color="grey", alpha=0.15,
                   label="the first differing update lies in here")  # fmt: skip
        ax.legend(fontsize=8, loc="lower left")
    if first is not None:
        ax.axvline(first["step"], color="black", linestyle="--", linewidth=1.2)
        ax.annotate(f"first divergence: global step {first['step']}", (first["step"], 0.5), xytext=(3, 0),
                    textcoords="offset points", xycoords=("data", "axes fraction"), rotation=90, va="center",
                    fontsize=9, fontweight="bold")  # fmt: skip
    same = steps.size and not nonzero.size and np.array_equal(la.view(np.uint32), lb.view(np.uint32))
    covered = f"global steps {steps[0]}..{steps[-1]}" if steps.size else "no step in common"
    ax.set_title(
        f"training loss of every step: B − A ({covered}{': bit-identical, all 0' if same else ''})", fontsize=10
    )
    ax.set(xlabel="global step", ylabel=f"B − A{scale}")
    ax.grid(alpha=0.3)
    verdict = "bit-identical: every difference is exactly 0" if result["verdict"] == "bit-identical" else "differs"
    fig.suptitle(f"B (this machine) − A (published): {verdict}", fontsize=11)
    return _png(fig)


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
        range(len(columns)), [str(c.step) for c in columns] or [""], fontsize=7, rotation=90 if len(columns) > 20 else 0
    )
    top.set_xlabel("global step of the trace boundary (weights digested there; both runs hold it)", fontsize=8)
    top.set_xticks(np.arange(-0.5, grid.shape[1]), minor=True)
    top.set_yticks(np.arange(-0.5, grid.shape[0]), minor=True)
    top.grid(which="minor", color="white", linewidth=1)
    top.tick_params(which="minor", length=0)
    handles = [matplotlib.patches.Patch(color="#cfe8cf", label="same digest"),
               matplotlib.patches.Patch(color="#b00020", label="differs")]  # fmt: skip
    if np.isnan(grid).any() and columns:
        handles.append(matplotlib.patches.Patch(color="#dddddd", label="tensor in one run only"))
    top.legend(handles=handles, fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1))
    first = result["first_divergence"]
    if not columns:
        title = "no trace boundary in common"
    elif first is None:
        title = f"every tensor agrees at all {len(columns)} boundaries in common"
    else:
        where = first["first_differing_boundary"]
        title = f"first diverging step {first['step']}" + (
            f"; weights first differ at boundary {where}" if where else ""
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
    bottom.set_xticks(range(len(labels)), labels or ["no epoch in common"], fontsize=8)
    bottom.set_yticks([])
    bottom.set_title("training-loss bits per epoch: median ULP distance B vs A over the steps that differ", fontsize=10)
    fig.colorbar(image, ax=bottom, label="log10(1 + median ULP)", fraction=0.05, pad=0.01)
    return _png(fig)


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
    fig.suptitle(f"does the difference matter? A and B against the seed-to-seed spread ({spread['source']}, "
                 f"{spread['runs']} runs)", fontsize=11)  # fmt: skip
    return _png(fig)


# --- the reproduction's HTML -----------------------------------------------------------------------
def _compact(value) -> str:
    """A value for a table cell: objects as key=value, lists comma-separated, long hex digests cut to 12."""
    if isinstance(value, dict):
        return ", ".join(f"{k}={_compact(v)}" for k, v in sorted(value.items()))
    if isinstance(value, list):
        return ", ".join(_compact(v) for v in value)
    if isinstance(value, str) and len(value) > 16 and all(c in "0123456789abcdef" for c in value):
        return value[:12] + "…"
    return value if isinstance(value, str) else json.dumps(value)


def _cell(value, limit: int = 90) -> str:
    """A value's cell: compact and at most `limit` characters; the whole value in its tooltip."""
    short, whole = _compact(value), value if isinstance(value, str) else json.dumps(value, sort_keys=True)
    short = short if len(short) <= limit else short[: limit - 1] + "…"
    title = f" title='{html.escape(whole)}'" if short != whole else ""
    return f"<td class='value'{title}>{html.escape(short)}</td>"


def _number(value) -> str:
    return repr(float(value)) if isinstance(value, float) else str(value)


def _reproduce_html(reproduction: dict, figures: dict[str, bytes], depth: int = 0, prefix: str = "") -> list[str]:
    """The reproduction's sections: verdict, summary, tier, causes, self-check and --match first, then the
    figures, the epoch metrics and the environments. `depth` 1 nests them under a report's own title;
    `prefix` is their PNG files' prefix there."""
    esc = html.escape
    result, a, b = reproduction["result"], reproduction["a"], reproduction["b"]
    h1, h2 = f"h{1 + depth}", f"h{2 + depth}"
    identical = result["verdict"] == "bit-identical"
    unverifiable = result.get("subject") is None  # nothing ties this result to the receipt shown as A
    coverage = result["coverage"]
    verdict_class = "warn" if unverifiable else "ok" if identical else "bad"
    parts = [
        f"<{h1}>reprocube reproduce: {esc(result['run_a'])}</{h1}>",
        f"<p class='verdict'>Verdict: <span class='{verdict_class}'>{esc(result['verdict'])}"
        f"{' (unverifiable)' if unverifiable else ''}</span> <span class='dim'>({esc(result['tier'])})</span></p>",
        (
            f"<p class='warn'>Unverifiable: this {REPRODUCE_RESULT} names no subject (written by a reprocube before "
            "results recorded the receipt file they are about): nothing shows that A's receipt here is the one "
            "reproduced.</p>"
            if unverifiable
            else ""
        ),
        f"<p><b>{esc(result['summary'])}</b></p>",
        f"<p>Does it matter? {esc(result['tier_text'])}</p>",
        f"<p class='caption'>A (published): <code>{esc(result['source'])}</code> &middot; B (retrained here): "
        f"<code>{esc(str(b.path.parent))}</code> &middot; compared {coverage['compared_steps']} steps (every loss bit), "
        f"{coverage['compared_boundaries']} weight-digest boundaries, {coverage['a_epochs']} epochs of A "
        f"({coverage['b_epochs']} of B) &middot; {result['wall_s']['total']} s in all, B's run {result['wall_s']['run_b']} s</p>",
        f"<{h2}>{'Differences between A and B (none changed a bit)' if identical else 'Likely causes, most likely first'}</{h2}>",
    ]
    causes = sorted(result["causes"], key=lambda c: c["kind"] == "not-numeric")  # stable: reproduce's rank kept
    if causes:
        parts.append("<table><tr><th>#</th><th>key</th><th>A</th><th>B</th><th>kind</th><th>note</th></tr>")
        for number, cause in enumerate(causes, start=1):
            dim = " class='dim'" if cause["kind"] == "not-numeric" else ""
            parts.append(f"<tr{dim}><td>{number}</td><td class='key'><code>{esc(cause['key'])}</code></td>{_cell(cause['a'])}"
                         f"{_cell(cause['b'])}<td>{esc(cause['kind'])}</td><td>{esc(cause['note'] or '')}</td></tr>")  # fmt: skip
        parts.append("</table><p class='caption'>Grey rows: differences known not to change these numbers.</p>")
    else:
        parts.append("<p>none: config, code and recorded environment are the same</p>")
    parts.append(f"<{h2}>Does B agree with itself?</{h2}>")
    check = result["self_check"]
    if result["self_consistent"] is None:
        why = "B reproduced A" if identical else "no diverging step to recompute"
        parts.append(f"<p class='dim'>not checked ({why})</p>")
    else:
        finding = (
            "<span class='ok'>yes</span>: B is deterministic but computes differently from A"
            if result["self_consistent"]
            else "<span class='bad'>no: B is NON-DETERMINISTIC</span> (a second computation of the same steps differs)"
        )
        parts.append(f"<p>{finding} (recomputed from {esc(check['from'])} to global step {check['to_step']} in a "
                     f"fresh process; {check['compared_steps']} steps compared)</p>")  # fmt: skip
    parts.append(f"<{h2}>Intervention (--match)</{h2}>")
    match = result["match"]
    if match is None:
        parts.append("<p class='dim'>not run (reproduce --match re-runs B with A's settings where this machine can "
                     "emulate them)</p>")  # fmt: skip
    else:
        cls = "ok" if match["bit_identical"] else ("bad" if match["ran"] else "dim")
        parts.append(f"<p class='{cls}'>{esc(match['summary'])}</p>")
        parts += [f"<p class='caption'>cannot emulate: {esc(c)}</p>" for c in match["cannot"]]

    first = result["first_divergence"]
    parts.append(f"<{h2}>B − A: per epoch and per step</{h2}>")
    if first is not None:
        tensors = ", ".join(f"<code>{esc(t)}</code>" for t in first["tensors"]) or "n/a"
        agree, differ = first["last_matching_boundary"], first["first_differing_boundary"]
        parts.append(
            f"<p>First divergence: global step <b>{first['step']}</b> (epoch {first['epoch']}), found by its "
            f"{esc(first['by'])}; the weights "
            + (f"last agree at the boundary of step {agree}" if agree is not None else "agree at no boundary before it")
            + (f", first differ at step {differ}: {tensors}" if differ is not None else "")
            + (
                f"; the first update that made them differ is one of steps {first['window'][0]}..{first['window'][1]}"
                if first["window"] is not None
                else ""
            )
            + "</p>"
        )
    sections = (
        ("difference.png", None,
         "Each panel has its own scale around a zero line, so a difference of one float32 ULP is visible. The "
         "dashed line marks the first diverging global step (the first loss, or weight digest, that differs)."),
        ("divergence-map.png", "Divergence map (global step × tensor)",
         "Top: green where a tensor's weights are bit-identical at that global step, red where they differ. Bottom: "
         "how far apart the losses are per epoch, in float32 units in the last place (sign flips counted apart)."),
        ("seed-spread.png", "Does it matter? The seed-to-seed spread",
         reproduction["spread_note"] or "A's and B's final test metrics among runs of A's config with other seeds."),
    )  # fmt: skip
    for name, heading, caption in sections:
        if name in figures:
            parts += [f"<{h2}>{heading}</{h2}>" if heading else "", _img(prefix + name, figures[name])]
            parts.append(f"<p class='caption'>{esc(caption)}</p>")
    parts += _epoch_table(a, b, h2)
    parts += _environment_tables(a, b, result, h2)
    return parts


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
            parts.append(f"<tr><td>{record['epoch']}</td><td>{record['global_step']}</td><td>{esc(metric)}</td>"
                         f"<td class='num'>{esc(_number(va))}</td><td class='num'>{esc(_number(vb))}</td>"
                         f"<td class='{cls}'>{esc(delta)}</td></tr>")  # fmt: skip
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
            parts.append(f"<tr{cls}><td>{esc(key)}</td>{_cell(va, 200)}{_cell(vb, 200)}</tr>")
    parts.append("</table>")
    differences = [c for c in result["causes"] if c["kind"] == "environment"]
    parts.append(f"<{h2}>Environment differences (causes of kind environment, likeliest first)</{h2}>")
    if not differences:
        parts.append("<p>none</p>")
        return parts
    parts.append("<table><tr><th>key</th><th>A</th><th>B</th></tr>")
    parts += [
        f"<tr><td class='key'><code>{esc(c['key'])}</code></td>{_cell(c['a'], 400)}{_cell(c['b'], 400)}</tr>"
        for c in differences
    ]
    parts.append("</table>")
    return parts
