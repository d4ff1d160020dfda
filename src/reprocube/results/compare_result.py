"""compare.json and compare.md (`reprocube compare`): the schema, the writer and the strict reader."""

from __future__ import annotations

from pathlib import Path

from reprocube.results.markdown_text import md_code, md_text
from reprocube.results.schema import ResultFile
from reprocube.results.subject import read_run_subject
from reprocube.results.wording import difference_size, worst_tensor
from reprocube.terminal import counted

COMPARE_RESULT = ResultFile(
    "compare.json",
    version=3,  # 2: not_compared_checkpoints; 3: inputs
    keys=(
        "subject",  # {"a": run subject, "b": run subject}: what the result is about (each may be null)
        # {"a": RUN_INPUTS, "b": ...}: what was read of each run, by digest: {"checkpoints": {name: the
        # manifest's own sha256}, "env.json", "metrics.jsonl", "receipt.json": sha256 or null}
        "inputs",
        # null, or the two receipts compared from their traces (analysis.receipt_pair.PUBLISHED_KEYS):
        # a receipt given alone, or two run directories that hold one each
        "receipts",
        "run_a",
        "run_b",
        "compared_checkpoints",
        "identical",
        "passed",
        "tolerance",
        "first_difference",
        "checkpoints",
        "metric_differences",
        "config_differences",
        "env_differences",
        "unreadable_checkpoints",
        "missing_epoch_checkpoints",
        "not_compared_checkpoints",  # {"a": [...], "b": [...]}: held by one run only, not compared
        "max_abs",
    ),
)


def write_compare(result: dict, directory: Path) -> Path:
    return COMPARE_RESULT.write(directory, result, markdown(result))


def read_compare(path: Path) -> dict:
    """The verdict keys of a compare.json, typed: subject, runs, compared checkpoints, identical, passed."""
    fields = COMPARE_RESULT.read(path)
    subject = fields.mapping("subject")
    return {
        "subject": {
            run: subject.nullable(run, lambda key: read_run_subject(subject.mapping(key))) for run in ("a", "b")
        },
        "inputs": {run: _read_run_inputs(fields.mapping("inputs").mapping(run)) for run in ("a", "b")},
        "run_a": fields.text("run_a"),
        "run_b": fields.text("run_b"),
        "compared_checkpoints": fields.texts("compared_checkpoints"),
        "identical": fields.boolean("identical"),
        "passed": fields.boolean("passed"),
        "tolerance": fields.number("tolerance"),
        "receipts": fields.nullable("receipts", lambda key: _read_receipts(fields.mapping(key))),
    }


def receipts_line(receipts: dict) -> str:
    """What two run directories' receipts say, beside their checkpoints: where they differ, or that they
    claim the same steps (never "identical": the checkpoints are what the runs hold, the receipts claims)."""
    if receipts["verdict"] != "bit-identical":
        return f"from their receipts' traces: {receipts['summary']}"
    coverage = receipts["coverage"]
    return (
        f"their receipts' traces claim the same {counted(coverage['compared_steps'], 'step')} and "
        f"{counted(coverage['a_epochs'], 'epoch record')} (what the receipts claim; the checkpoints are compared above)"
    )


def _read_receipts(receipts) -> dict:
    return {
        "verdict": receipts.one_of("verdict", ("bit-identical", "losses-only", "differs")),
        "summary": receipts.text("summary"),
        "tier": receipts.text("tier"),
    }


def _read_run_inputs(inputs) -> dict:
    checkpoints = inputs.mapping("checkpoints")
    return {
        "checkpoints": {name: checkpoints.sha256(name) for name in checkpoints.value},
        **{name: inputs.sha256(name, nullable=True) for name in ("env.json", "metrics.jsonl", "receipt.json")},
    }


def markdown(result: dict) -> str:
    lines = [
        "# reprocube compare",
        "",
        f"- A: {md_code(result['run_a'])}",
        f"- B: {md_code(result['run_b'])}",
        f"- verdict: **{md_text(summary_line(result))}**",
        "",
    ]
    if result.get("receipts"):
        lines += [f"- {md_text(receipts_line(result['receipts']))}", ""]
    for run in ("a", "b"):
        inputs = result["inputs"][run]
        bound = ", ".join(f"{md_text(name)} `{digest[:12]}`" for name, digest in inputs["checkpoints"].items())
        names = ("env.json", "metrics.jsonl", "receipt.json")
        records = ", ".join(f"{name} `{inputs[name][:12]}`" for name in names if inputs[name])
        lines.append(f"- read of {run.upper()} (sha256): {bound}" + (f"; {records}" if records else ""))
    lines.append("")
    lines += ["| checkpoint | identical | worst tensor | max abs | max ULP |", "|---|---|---|---|---|"]
    for c in result["checkpoints"]:
        worst = worst_tensor(c["tensors"])
        lines.append(
            f"| {c['checkpoint']} | {'yes' if c['identical'] else 'no'} | "
            f"{md_code(worst['tensor']) if worst else ''} | "
            f"{worst.get('max_abs', '') if worst else ''} | "
            f"{worst.get('max_ulp', '') if worst else ''} |"
        )
    if result["metric_differences"]:
        lines += ["", "| epoch | metric | A | B |", "|---|---|---|---|"] + [
            f"| {d['epoch']} | {md_text(d['metric'])} | {md_text(d['a'])} | {md_text(d['b'])} |"
            for d in result["metric_differences"]
        ]
    lines += _key_table("Config differences (result-affecting keys)", result["config_differences"])
    lines += _key_table("Environment differences (most likely causes first)", result["env_differences"])
    return "\n".join(lines) + "\n"


def _key_table(title: str, rows: list[dict]) -> list[str]:
    """A section of {key, a, b} rows (or "none")."""
    table = ["| key | A | B |", "|---|---|---|"] + [
        f"| {md_code(d['key'])} | {md_text(d['a'])} | {md_text(d['b'])} |" for d in rows
    ]
    return ["", f"## {title}", "", *(table if rows else ["none"])]


def summary_line(result: dict) -> str:
    """The verdict in one line: what differs first, then every other reason the runs do not pass."""
    missing, unreadable = result.get("missing_epoch_checkpoints", {}), result.get("unreadable_checkpoints", {})
    reasons = [f"{run.upper()} lacks {', '.join(missing[run])}" for run in ("a", "b") if missing.get(run)]
    skipped = [f"{run.upper()}:{name}" for run in ("a", "b") for name in unreadable.get(run, [])]
    if skipped:
        reasons.append(f"unreadable checkpoints {', '.join(skipped)}")
    common = len(result["compared_checkpoints"])
    first = result["first_difference"]
    if not common:
        return "no checkpoint in common: nothing could be compared" + "".join(f"; {r}" for r in reasons)
    others = result.get("not_compared_checkpoints", {})
    uncompared = [f"{run.upper()}:{name}" for run in ("a", "b") for name in others.get(run, [])]
    if uncompared:  # said in every verdict: they hold weights this comparison did not look at
        reasons.append(f"not compared (one run only): {', '.join(uncompared)}")
    if result["identical"]:
        return f"identical ({counted(common, 'checkpoint')})" + "".join(f"; {r}" for r in reasons)
    if first is not None:
        within = (
            " (within tolerance)"
            if result["tolerance"] > 0 and all(c["within_tolerance"] for c in result["checkpoints"])
            else ""
        )
        head = f"differs from {first['checkpoint']}: {first['tensor']} ({difference_size(first)}){within}"
    elif result["metric_differences"]:
        head = "weights identical, metrics differ: " + ", ".join(
            f"epoch {d['epoch']} {d['metric']}" for d in result["metric_differences"][:3]
        )
    else:
        verdict = "not verified" if skipped and not missing.get("a") and not missing.get("b") else "not identical"
        return f"{verdict}: {'; '.join(reasons)} (the {common} in common agree)"
    return head + "".join(f"; {r}" for r in reasons)
