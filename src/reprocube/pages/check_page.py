"""The check page (`reprocube report CHECK_DIR`): a `reprocube check` directory drawn for a person: the
verdict and what to do next first, then every update's loss of the uninterrupted and the stopped run
(with the probe: each restart and the first differing update marked), the attempts, each declared
output's comparison and what was not checked.

A check directory travels like a run: check.json is read through its strict reader, the probe's traces
from their fixed places in the directory (probe/clean-1, probe/stopped: never a path named in a file),
and every value from them is escaped text on the page, never markup and never in a figure's text."""

from __future__ import annotations

import html
from pathlib import Path

from reprocube.analysis.probe_trace import loss_value, read_trace, steps_of
from reprocube.errors import CheckpointError
from reprocube.files import write_file_atomic
from reprocube.pages.html import STYLE, img, png
from reprocube.pages.plots import plt
from reprocube.results.check_result import CHECK_RESULT, VERDICTS, read_check_page

MAX_ATTEMPTS = 21  # --stops is at most 20
NEXT_STEP = {
    "resume-exact": ("ok", "Nothing to fix: the script resumes bit for bit from its checkpoints at these stops."),
    "resume-differs": (
        "bad",
        "Compare what the checkpoint holds with what the loop uses after a restart: the "
        "generators (torch.get_rng_state, a JAX key, NumPy's bit_generator.state), the position in "
        "the data, the scheduler's step and the optimizer's state.",
    ),
    "not-deterministic": (
        "bad",
        "Make two uninterrupted runs agree first (seeds, PYTHONHASHSEED, deterministic "
        "kernels, thread counts, loader workers); resume was not tested.",
    ),
    "control-void": (
        "warn",
        "The outputs do not depend on the seed: declare the outputs that the training "
        "writes (weights, metrics), or the variable the script really reads its seed from.",
    ),
    "no-stop-landed": ("warn", "Stop earlier: --at SECONDS, --at-file GLOB (a checkpoint) or --at-line REGEX."),
    "not-resumed": (
        "warn",
        "A stop proved nothing: it came before the script had saved anything, or the restart began again "
        "instead of loading what was saved. Make it load its latest checkpoint when one is there, or stop "
        "after a save (--at-file GLOB, --at-line REGEX), then check again.",
    ),
    "not-proven": (
        "warn",
        "What was compared is identical, but the resume is not proven: call the probe (two lines, or a "
        "trainer's callback: docs/check.md) so that each restart's first update shows where it resumed, and "
        "declare outputs that are the run's own regular files.",
    ),
    "state-leaked": (
        "warn",
        "A run started from state another run left: keep checkpoints in the working directory (or under "
        "HOME or TMPDIR, which check gives each run), not at a fixed absolute path, then check again.",
    ),
    "command-failed": ("bad", "The script failed: its log (under logs/) has the error."),
    "save-interrupted": (
        "bad",
        "A stop during a checkpoint's write left a run that cannot resume: write each checkpoint elsewhere "
        "and rename it into place once whole (or have the restart skip an incomplete one), then check again.",
    ),
}


def is_check_dir(path: Path) -> bool:
    return Path(path).is_dir() and (Path(path) / CHECK_RESULT.name).is_file()


def read_check_dir(path: Path) -> dict:
    """check.json typed, and the probe's traces of the uninterrupted and the stopped run (if any)."""
    path = Path(path)
    check = read_check_page(path / CHECK_RESULT.name)
    # the stopped run whose evidence check.json details: --sweep's chosen save's run
    swept = next((line["run"] for line in check["sweep"] if line["chosen"]), "stopped")
    stopped = next((r for r in check["runs"] if r["name"] == swept), None)
    attempts = min(len(stopped["attempts"]), MAX_ATTEMPTS) if stopped else 0
    traces = {"clean": None, "stopped": []}
    if check["probe"] is not None and "error" not in check["probe"]:
        try:
            for directory in (path / "probe", path / "probe" / "clean-1", path / "probe" / swept):
                if directory.is_symlink():  # the traces are read from inside the directory only
                    raise CheckpointError(f"{directory} is a symbolic link")
            traces["clean"] = read_trace(path / "probe" / "clean-1" / "attempt-1.jsonl")
            traces["stopped"] = [
                read_trace(path / "probe" / swept / f"attempt-{n}.jsonl") for n in range(1, attempts + 1)
            ]
        except CheckpointError as exc:
            check["not_checked"] = [*check["not_checked"], f"the probe's traces, unreadable: {exc}"]
            traces = {"clean": None, "stopped": []}
    return {"path": path, "check": check, "traces": traces}


def write_check_page(out: Path, evidence: dict) -> Path:
    check, figures = evidence["check"], {}
    if evidence["traces"]["clean"] is not None:
        figures["losses.png"] = _losses_figure(evidence["traces"], check["probe"])
    esc = html.escape
    tone, next_step = NEXT_STEP[check["verdict"]]
    parts = [
        "<!doctype html><html><head><meta charset='utf-8'>",
        f"<title>reprocube check: {esc(check['verdict'])}</title><style>{STYLE}</style></head><body>",
        "<h1>reprocube check</h1>",
        f"<p class='verdict {tone}'>Verdict: {esc(check['verdict'])} (exit {VERDICTS[check['verdict']]})</p>",
        f"<p>{esc(check['summary'])}</p>",
        f"<p><b>Next:</b> {esc(next_step)}</p>",
        f"<p>Command: <code>{esc(' '.join(check['command']))}</code> &middot; replay the stops: "
        f"<code>--stop-seed {check['stop_seed']}</code></p>",
    ]
    if check["not_checked"]:
        parts.append("<h2>Not checked</h2><ul>" + "".join(f"<li>{esc(t)}</li>" for t in check["not_checked"]) + "</ul>")
    if check["sweep"]:  # check --sweep: a verdict per save; the details below are the chosen save's
        parts.append(
            "<h2>Each save (--sweep)</h2><table><tr><th>save</th><th>its restart took save</th>"
            "<th>restart resumed at update</th><th>verdict</th><th>first differing update</th></tr>"
        )
        for line in check["sweep"]:
            shown = {k: "" if line[k] is None else line[k] for k in ("tested_save", "resumed_at", "first_difference")}
            tone = (
                "ok" if line["verdict"] == "resume-exact" else "bad" if line["verdict"] == "resume-differs" else "warn"
            )
            parts.append(
                f"<tr><td class='num'>{line['save']}{' (details below)' if line['chosen'] else ''}</td>"
                f"<td class='num'>{shown['tested_save']}</td><td class='num'>{shown['resumed_at']}</td>"
                f"<td class='{tone}'>{esc(line['verdict'])}</td><td class='num'>{shown['first_difference']}</td></tr>"
            )
        parts.append("</table>")
    if check["stop_evidence"]:  # what each stop proved: the verdict stands on these
        parts.append(
            "<h2>Each stop</h2><table><tr><th>stop</th><th>landed</th><th>effective</th><th>how told</th></tr>"
        )
        for e in check["stop_evidence"]:
            landed = "<td class='ok'>yes</td>" if e["landed"] else "<td class='warn'>no</td>"
            effective = "<td class='ok'>yes</td>" if e["effective"] else "<td class='bad'>proved nothing</td>"
            parts.append(f"<tr><td class='num'>{e['stop']}</td>{landed}{effective}<td>{esc(e['how'])}</td></tr>")
        parts.append("</table>")
    for name, figure in figures.items():
        parts += ["<h2>Every update's loss</h2>", img(name, figure), _caption(check["probe"])]
    parts.append("<h2>The stopped run's outputs against the uninterrupted run's</h2>")
    if check["files"]:
        parts.append("<table><tr><th>output</th><th>bit-identical</th><th>where it differs</th></tr>")
        for f in check["files"]:
            same = (
                "<td class='bad'>no</td>"
                if not f["same"]
                else "<td class='warn'>the same but for ignored fields</td>"
                if f["bytes_differ"]
                else "<td class='ok'>yes</td>"
            )
            parts.append(f"<tr><td><code>{esc(f['path'])}</code></td>{same}<td>{esc(f['detail'] or '')}</td></tr>")
        parts.append("</table>")
    else:
        parts.append("<p class='dim'>Not compared: the check ended before the stopped run.</p>")
    parts.append(
        "<h2>Runs and attempts</h2><table><tr><th>run</th><th>attempt</th><th>started (s)</th>"
        "<th>seconds</th><th>exit</th><th>stop</th></tr>"
    )
    for run in check["runs"]:
        for number, a in enumerate(run["attempts"], start=1):
            stop = (a["stop"] or "") + (" (ended before it)" if a["stopped_early"] else "")
            parts.append(
                f"<tr><td>{esc(run['name'])}</td><td>{number}</td><td class='num'>{a['started_s']:.2f}</td>"
                f"<td class='num'>{a['seconds']:.2f}</td><td class='num'>{a['exit']}</td>"
                f"<td>{esc(stop)}</td></tr>"
            )
    parts += ["</table>", "</body></html>"]
    for name, figure in figures.items():
        write_file_atomic(out / name, figure)
    write_file_atomic(out / "report.html", "\n".join(parts).encode())
    return out / "report.html"


def _caption(probe: dict) -> str:
    first = probe["first_difference"]
    said = (
        f"{probe['compared_steps']} of {probe['reference_steps']} updates compared (loss bits and weight fingerprints)"
    )
    if first is not None:
        said += f"; the first that differs is step {first['step']}, after stop {first['after_stop']} (red line)"
    return f"<p class='caption'>{html.escape(said)}. Grey lines: where each restart resumed.</p>"


def _losses_figure(traces: dict, probe: dict) -> bytes:
    """The uninterrupted run's loss at every update (black), the stopped run's attempts over it (coloured),
    a grey line where each restart resumed and a red one at the first differing update."""
    fig, ax = plt.subplots(figsize=(9, 3.6))
    clean = steps_of(traces["clean"], 0)
    steps = sorted(clean)
    ax.plot(steps, [float(loss_value(clean[s])) for s in steps], color="black", lw=1.4, label="uninterrupted")
    colours = plt.get_cmap("tab10").colors
    by_attempt = {a["attempt"]: a for a in probe["attempts"] if a["steps"]}
    for number, trace in enumerate(traces["stopped"], start=1):
        if trace is None or number not in by_attempt:
            continue
        resumed_at = by_attempt[number]["resumed_at"]
        updates = steps_of(trace, resumed_at)
        xs = sorted(updates)
        ax.plot(
            xs,
            [float(loss_value(updates[s])) for s in xs],
            color=colours[number % 10],
            lw=1,
            alpha=0.85,
            ls="--",
            label=f"stopped run, attempt {number}",
        )
        if number > 1:
            ax.axvline(resumed_at + 0.5, color="grey", lw=0.8)
    first = probe["first_difference"]
    if first is not None:
        ax.axvline(first["step"], color="#b00020", lw=1.2, label=f"first differing update (step {first['step']})")
    ax.set_xlabel("global step")
    ax.set_ylabel("loss")
    ax.set_xlim(0.5, max(steps[-1] if steps else 1, 1) + 0.5)
    ax.legend(fontsize=8, loc="upper right")
    return png(fig)
