"""The reproduction page's HTML sections, in the page's order: the verdict and the first differing
update, what to do (and the recipe to copy), A's own sessions, the causes, B's self-check, --match, the
claims compared, the first divergence, the figures with their captions, the epoch metrics and the
environments. Apart from the figures (reproduction_figures) and from reading and writing the page
(reproduction_page): here only markup is made from a reproduction already read and checked."""

from __future__ import annotations

import html

import numpy as np

from reprocube.config import flatten_keys
from reprocube.pages.html import ENV_ROWS, cell, img, number
from reprocube.pages.reproduction_figures import common_losses
from reprocube.results.reproduce_result import DIFFERENCE_FIGURE, DIVERGENCE_FIGURE, REPRODUCE_RESULT, SPREAD_FIGURE
from reprocube.results.reproduce_wording import recipe_lines, verdict_line, what_to_do
from reprocube.results.wording import first_update_text
from reprocube.terminal import counted
from reprocube.training.receipt import Receipt

EPOCH_METRICS = ("train_loss", "train_accuracy", "test_loss", "test_accuracy")


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
    steps, la, lb = common_losses(a, b)
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
    """Right under the verdict: the next step (reproduce_wording.what_to_do), the proven recipe to copy."""
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
