"""bench.json and bench.md (`reprocube bench`): the schema, the statistics over repeated measurements
(min, median, max), what they mean (shares of an epoch, determinism's cost, the reference tutorial's
ratios) and the Markdown. The measuring itself is the command's (fresh processes,
reprocube.orchestration.bench_measure)."""

from __future__ import annotations

import statistics
from pathlib import Path

from reprocube.files import portable_path
from reprocube.results.markdown_text import md_text
from reprocube.results.schema import ResultFile

BENCH_RESULT = ResultFile(
    "bench.json",
    version=1,
    keys=(
        "date",  # when it was measured (UTC)
        "machine",  # python, platform, hostname, cpu, packages, container (env.json's)
        "config",  # the dataset, seed, batch sizes, threads, device, data and bench settings
        "frameworks",  # {framework: {runs, summary: {on, off}, derived, loader?, verify?}}
    ),
    optional_keys=("reference",),  # with bench.reference=FILE: the reference tutorial's epoch times and ratios
)
# Each measurement's figures (reprocube.orchestration.bench_measure), summarised over the repeats.
FIGURES = (
    "first_step_s",
    "epoch_s",
    "samples_per_s",
    "eval_s",
    "checkpoint_write_s",
    "checkpoint_restore_s",
    "traced_epoch_s",
    "trace_fraction",
    "trace_bytes_per_epoch",
    "peak_rss_mb",
    "peak_gpu_mb",
)


def summarise(runs: list[dict]) -> dict:
    """Each figure over repeated measurements: min, median, max and how many."""
    summary = {}
    for figure in FIGURES:
        values = [r[figure] for r in runs if r.get(figure) is not None]
        if values:
            summary[figure] = {
                "min": min(values),
                "median": statistics.median(values),
                "max": max(values),
                "n": len(values),
            }
    return summary


def derived(entry: dict) -> dict:
    """What the medians mean: the checkpoint's, restore's and trace's share of an epoch, determinism's cost."""
    on, off = entry["summary"].get("on"), entry["summary"].get("off")
    derived = {}
    if on:
        epoch = on["epoch_s"]["median"]
        derived["checkpoint_share_of_epoch"] = on["checkpoint_write_s"]["median"] / epoch
        derived["restore_share_of_epoch"] = on["checkpoint_restore_s"]["median"] / epoch
        if "trace_fraction" in on:  # the receipt's trace: loss bits each group, digests every trace.every_steps
            derived["trace_share_of_epoch"] = on["trace_fraction"]["median"]
            derived["traced_epoch_vs_plain"] = on["traced_epoch_s"]["median"] / epoch - 1  # the next epoch, traced
            derived["trace_bytes_per_epoch"] = on["trace_bytes_per_epoch"]["median"]
    if on and off:
        derived["determinism_cost"] = on["epoch_s"]["median"] / off["epoch_s"]["median"] - 1
    return derived


def _kb(value) -> str:
    return "n/a" if value is None else f"{value / 1000:.1f}"


def reference_ratios(path: Path, reference: dict, results: dict) -> dict:
    """The reference tutorial's epoch time per framework (the median of its epochs after the first,
    which holds JAX's compilation; the first when it ran one), and how many times faster we are."""
    ratios = {}
    for framework, entry in results["frameworks"].items():
        theirs = reference["results"].get(framework) or {}
        epochs = theirs.get("train_epoch_s") or []
        reference_s = theirs.get("median_train_s_after_first_epoch") or (statistics.median(epochs) if epochs else None)
        ours = entry["summary"].get("on", {}).get("epoch_s", {}).get("median")
        if reference_s and ours:
            ratios[framework] = {
                "reference_epoch_s": reference_s,
                "reprocube_epoch_s": ours,
                "speedup": reference_s / ours,
                "reference_threads": theirs.get("threads"),
                "reference_epochs": epochs,
            }
    return {
        "source": portable_path(path),
        "date": reference.get("date"),
        "batch_size": reference.get("batch_size_train"),
        "edits": reference.get("edits"),
        "frameworks": ratios,
    }


# ---- bench.md ---------------------------------------------------------------------------------------------


def markdown(results: dict) -> str:
    machine = results["machine"]
    cpu = machine["cpu"]
    lines = [
        f"# reprocube bench, {results['date']}",
        "",
        f"Machine: {cpu.get('model')}, {cpu.get('count')} CPUs ({cpu.get('affinity')} usable), "
        f"{machine['platform']}, Python {machine['python']}.",
        "Versions: " + ", ".join(f"{k} {v}" for k, v in machine["packages"].items()) + ".",
        f"Config: {results['config']['dataset']}, batch {results['config']['batch_size']}, "
        f"{results['config']['threads']} threads, device {results['config']['device']}; "
        f"{results['config']['bench']['repeats']} fresh processes per figure (min / median / max).",
        "",
        "| framework | determinism | epoch s | samples/s | first step s | eval s | "
        "checkpoint write ms | restore ms | peak RSS MB | peak GPU MB |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for framework, entry in results["frameworks"].items():
        for mode, summary in entry["summary"].items():
            lines.append(
                f"| {framework} | {mode} | {_mmm(summary, 'epoch_s', '.2f')} | "
                f"{_mmm(summary, 'samples_per_s', '.0f', median_only=True)} | "
                f"{_mmm(summary, 'first_step_s', '.2f', median_only=True)} | "
                f"{_mmm(summary, 'eval_s', '.2f', median_only=True)} | "
                f"{_mmm(summary, 'checkpoint_write_s', '.1f', scale=1000)} | "
                f"{_mmm(summary, 'checkpoint_restore_s', '.1f', scale=1000, median_only=True)} | "
                f"{_mmm(summary, 'peak_rss_mb', '.0f', median_only=True)} | "
                f"{_mmm(summary, 'peak_gpu_mb', '.0f', median_only=True)} |"
            )
    lines += [
        "",
        "| framework | determinism cost | checkpoint / epoch | restore / epoch | receipt trace / epoch | "
        "traced epoch vs plain | trace KB / epoch | verify / one run |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for framework, entry in results["frameworks"].items():
        d, verify = entry["derived"], entry.get("verify")
        lines.append(
            f"| {framework} | {_pct(d.get('determinism_cost'))} | "
            f"{_pct(d.get('checkpoint_share_of_epoch'))} | {_pct(d.get('restore_share_of_epoch'))} | "
            f"{_pct(d.get('trace_share_of_epoch'))} | {_pct(d.get('traced_epoch_vs_plain'))} | "
            f"{_kb(d.get('trace_bytes_per_epoch'))} | "
            + (
                "; ".join(f"{v['epochs']} epochs {v['ratio']:.2f}x (run=PATH {v['reused_ratio']:.2f}x)" for v in verify)
                + " |"
                if verify
                else "n/a |"
            )
        )
    loaders = {f: e["loader"] for f, e in results["frameworks"].items() if e.get("loader")}
    if loaders:
        names = list(next(iter(loaders.values())))
        lines += [
            "",
            "data.pipeline=loader with data.augment=true against the resident dataset, epoch s (median):",
            "",
            "| framework | " + " | ".join(names) + " |",
            "|---|" + "---|" * len(names),
        ]
        for framework, cost in loaders.items():
            lines.append(f"| {framework} | " + " | ".join(f"{cost[n]:.2f}" for n in names) + " |")
    reference = results.get("reference")
    if reference:
        lines += [
            "",
            f"Reference tutorial ({md_text(reference['source'])}, measured {md_text(reference.get('date'))}, "
            f"batch {md_text(reference.get('batch_size'))}), "
            "determinism on in both; the reference's own per-epoch training time:",
            "",
            "| framework | reference epoch s | reference threads | reprocube epoch s | speed-up |",
            "|---|---|---|---|---|",
        ]
        for framework, r in reference["frameworks"].items():
            lines.append(
                f"| {framework} | {r['reference_epoch_s']:.2f} | {md_text(r['reference_threads'])} | "
                f"{r['reprocube_epoch_s']:.2f} | {r['speedup']:.2f}x |"
            )
    return "\n".join(lines) + "\n"


def _mmm(summary: dict, figure: str, fmt: str, scale: float = 1.0, median_only: bool = False) -> str:
    s = summary.get(figure)
    if not s:
        return "n/a"
    if median_only:
        return format(s["median"] * scale, fmt)
    return " / ".join(format(s[k] * scale, fmt) for k in ("min", "median", "max"))


def _pct(value: float | None) -> str:
    return "n/a" if value is None else f"{value * 100:+.1f}%" if value < 0 else f"{value * 100:.1f}%"


def write_bench(results: dict, out_dir: Path) -> Path:
    """bench.json (checked against its schema) and bench.md; the path of bench.md."""
    out_dir.mkdir(parents=True, exist_ok=True)
    BENCH_RESULT.write(out_dir, results, markdown(results))
    return out_dir / BENCH_RESULT.markdown_name
