"""`reprocube bench`: what reproducibility costs. Per framework, with determinism on and off, each figure
measured in a fresh process and repeated: the first step (trace and compile), one warm epoch of training
steps (samples/s), the evaluation, peak RSS (and GPU memory), the time to write and to restore a
checkpoint; and once per framework the wall time of `verify` against one plain run. Writes bench.json
and bench.md; with `bench.reference=FILE` (benchmarks/reference_tutorial.py's JSON) the reference
tutorial's epoch times stand beside ours as ratios."""

from __future__ import annotations

import statistics
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

from reprocube.config import override, to_plain
from reprocube.env import collect_env
from reprocube.errors import EXIT_OK, ConfigError, ReprocubeError
from reprocube.files import portable_path, write_file_atomic, write_json_atomic
from reprocube.orchestration.children import (
    child_args,
    last_error_line,
    python_module_command,
    reprocube_command,
    run_child,
)
from reprocube.orchestration.invocation import add_config_arguments
from reprocube.untrusted import read_json

# Overrides a measurement child must not inherit from the user (the child places its own run).
SET_ON_CHILDREN = ("framework=", "deterministic=", "output_dir=", "run_name=", "resume=", "epochs=", "bench.")
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


HELP = "time each trainer, determinism on/off, checkpoints, verify: reprocube bench bench.repeats=3"


def add_arguments(parser) -> None:
    add_config_arguments(parser, all_frameworks_default="all")


def run(args) -> int:
    invocation = args.invocation
    cfg = invocation.cfg
    results = run_bench(invocation.frameworks, cfg, invocation.overrides, invocation.config_files)
    print(f"bench: {write_results(results, Path(cfg.bench.out))}")
    return EXIT_OK


# ---- the suite: fresh processes, repeats, summary --------------------------------------------------------


def run_bench(frameworks: list[str], cfg, overrides: list[str], config_files: list[str], out=print) -> dict:
    user = child_args(overrides, config_files, SET_ON_CHILDREN)
    reference = (
        _read_reference(Path(cfg.bench.reference)) if cfg.bench.reference else None
    )  # before an hour of measuring
    results = {
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": _machine(),
        "config": _bench_config(cfg),
        "frameworks": {},
    }
    for framework in frameworks:
        entry = {"runs": [], "summary": {}}
        # Settings alternate (on, off, on, off, ...): this VM's speed drifts by ~10% over minutes, which
        # would otherwise pass for a cost of determinism.
        for repeat in range(cfg.bench.repeats):
            for deterministic in cfg.bench.deterministic:
                record = _measure([*user, f"framework={framework}", f"deterministic={str(deterministic).lower()}"])
                out(f"[{framework}] deterministic={deterministic} #{repeat + 1}: epoch {record['epoch_s']:.2f} s, "
                    f"{record['samples_per_s']:.0f} samples/s, first step {record['first_step_s']:.2f} s, "
                    f"checkpoint {record['checkpoint_write_s'] * 1000:.1f} ms")  # fmt: skip
                entry["runs"].append(record)
        for deterministic in cfg.bench.deterministic:
            entry["summary"]["on" if deterministic else "off"] = _summarise(
                [r for r in entry["runs"] if r["deterministic"] == deterministic]
            )
        if cfg.bench.loader_workers:
            entry["loader"] = _loader_cost(framework, user, cfg, out)
        if cfg.bench.verify_epochs:
            entry["verify"] = _verify_cost(framework, user, cfg, out)
        entry["derived"] = _derived(entry)
        results["frameworks"][framework] = entry
    if reference is not None:
        results["reference"] = _reference_ratios(Path(cfg.bench.reference), reference, results)
    return results


def _measure(args: list[str]) -> dict:
    """One measurement in a fresh process (reprocube.orchestration.bench_measure)."""
    with tempfile.TemporaryDirectory(prefix="reprocube-bench-") as scratch:
        result, log = Path(scratch) / "result.json", Path(scratch) / "measure.log"
        status = run_child(
            python_module_command("reprocube.orchestration.bench_measure", "--result", str(result), *args), log
        )
        if status != 0 or not result.exists():
            raise ReprocubeError(f"bench measurement failed (exit {status}): {' '.join(args)}: {last_error_line(log)}")
        return read_json(result, ReprocubeError)


def _loader_cost(framework: str, user: list[str], cfg, out) -> dict:
    """data.pipeline=loader with augmentation, per worker count, against the resident dataset, alternating
    within each repeat (determinism on): epoch seconds, median of the repeats."""
    settings = [("resident", ["data.pipeline=resident"])] + [
        (f"loader-{w}", ["data.pipeline=loader", "data.augment=true", f"data.workers={w}"])
        for w in cfg.bench.loader_workers
    ]
    epochs: dict[str, list[float]] = {name: [] for name, _ in settings}
    for repeat in range(cfg.bench.repeats):
        for name, extra in settings:
            record = _measure([*user, f"framework={framework}", "deterministic=true", *extra])
            epochs[name].append(record["epoch_s"])
            out(f"[{framework}] {name} #{repeat + 1}: epoch {record['epoch_s']:.2f} s")
    return {name: statistics.median(values) for name, values in epochs.items()}


def _verify_cost(framework: str, user: list[str], cfg, out) -> list[dict]:
    """verify's wall time against one plain training run of the same config, for each number of epochs in
    bench.verify_epochs: a verify that trains its reference, and one that reuses the plain run (run=PATH)."""
    rows = []
    for epochs in cfg.bench.verify_epochs:
        with tempfile.TemporaryDirectory(prefix="reprocube-bench-verify-") as scratch:
            common = [*user, f"framework={framework}", f"epochs={epochs}"]
            plain = Path(scratch) / "train" / "plain"
            timings = {}
            for name, command in (
                ("train_s", ["train", *common, override("output_dir", f"{scratch}/train"), "run_name=plain"]),
                ("verify_s", ["verify", *common, override("output_dir", f"{scratch}/verify")]),
                (
                    "verify_reused_s",
                    ["verify", *common, override("output_dir", f"{scratch}/reused"), override("run", str(plain))],
                ),
            ):
                log = Path(scratch) / f"{name}.log"
                started = time.perf_counter()
                status = run_child(reprocube_command(*command), log)
                timings[name] = time.perf_counter() - started
                if status != 0:
                    raise ReprocubeError(f"bench: {command[0]} for {framework} exited {status}: {last_error_line(log)}")
        row = {"epochs": epochs, **timings, "ratio": timings["verify_s"] / timings["train_s"]}
        row["reused_ratio"] = timings["verify_reused_s"] / timings["train_s"]
        out(f"[{framework}] verify ({epochs} epochs): {row['verify_s']:.1f} s = {row['ratio']:.2f}x one training run "
            f"({row['train_s']:.1f} s); with run=PATH {row['verify_reused_s']:.1f} s = {row['reused_ratio']:.2f}x")  # fmt: skip
        rows.append(row)
    return rows


def _summarise(runs: list[dict]) -> dict:
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


def _derived(entry: dict) -> dict:
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


def _read_reference(path: Path) -> dict:
    try:
        reference = read_json(path, ConfigError)
    except ConfigError as exc:
        raise ConfigError(f"bench.reference: {exc}") from None
    if not isinstance(reference, dict) or not isinstance(reference.get("results"), dict):
        raise ConfigError(
            f"bench.reference={path}: not a benchmarks/reference_tutorial.py result (no 'results' mapping)"
        )
    return reference


def _reference_ratios(path: Path, reference: dict, results: dict) -> dict:
    """The reference tutorial's epoch time per framework (the median of its epochs after the first,
    which holds JAX's compilation; the first when it ran one), and how many times faster we are."""
    ratios = {}
    for framework, entry in results["frameworks"].items():
        theirs = reference["results"].get(framework) or {}
        epochs = theirs.get("train_epoch_s") or []
        reference_s = theirs.get("median_train_s_after_first_epoch") or (statistics.median(epochs) if epochs else None)
        ours = entry["summary"].get("on", {}).get("epoch_s", {}).get("median")
        if reference_s and ours:
            ratios[framework] = {"reference_epoch_s": reference_s, "reprocube_epoch_s": ours, "speedup": reference_s / ours,
                                 "reference_threads": theirs.get("threads"), "reference_epochs": epochs}  # fmt: skip
    return {
        "source": portable_path(path),
        "date": reference.get("date"),
        "batch_size": reference.get("batch_size_train"),
        "edits": reference.get("edits"),
        "frameworks": ratios,
    }


def _machine() -> dict:
    env = collect_env({})
    return {k: env[k] for k in ("python", "platform", "hostname", "cpu", "packages", "container")}


def _bench_config(cfg) -> dict:
    plain = to_plain(cfg)
    for key in ("reference", "out"):  # results are committed: no absolute paths of this machine
        if plain["bench"][key] is not None:
            plain["bench"][key] = portable_path(plain["bench"][key])
    for key in ("source_dir",):
        if plain["data"].get(key) is not None:
            plain["data"][key] = portable_path(plain["data"][key])
    return {"dataset": cfg.dataset.name} | {
        k: plain[k] for k in ("seed", "batch_size", "test_batch_size", "threads", "device", "data", "bench")
    }


# ---- reports ---------------------------------------------------------------------------------------------


def markdown(results: dict) -> str:
    machine = results["machine"]
    cpu = machine["cpu"]
    lines = [
        f"# reprocube bench, {results['date']}",
        "",
        f"Machine: {cpu.get('model')}, {cpu.get('count')} CPUs ({cpu.get('affinity')} usable), {machine['platform']}, Python {machine['python']}.",
        "Versions: " + ", ".join(f"{k} {v}" for k, v in machine["packages"].items()) + ".",
        f"Config: {results['config']['dataset']}, batch {results['config']['batch_size']}, {results['config']['threads']} threads, "
        f"device {results['config']['device']}; {results['config']['bench']['repeats']} fresh processes per figure (min / median / max).",
        "",
        "| framework | determinism | epoch s | samples/s | first step s | eval s | checkpoint write ms | restore ms | peak RSS MB | peak GPU MB |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for framework, entry in results["frameworks"].items():
        for mode, summary in entry["summary"].items():
            lines.append(
                f"| {framework} | {mode} | {_mmm(summary, 'epoch_s', '.2f')} | {_mmm(summary, 'samples_per_s', '.0f', median_only=True)} | "
                f"{_mmm(summary, 'first_step_s', '.2f', median_only=True)} | {_mmm(summary, 'eval_s', '.2f', median_only=True)} | "
                f"{_mmm(summary, 'checkpoint_write_s', '.1f', scale=1000)} | {_mmm(summary, 'checkpoint_restore_s', '.1f', scale=1000, median_only=True)} | "
                f"{_mmm(summary, 'peak_rss_mb', '.0f', median_only=True)} | {_mmm(summary, 'peak_gpu_mb', '.0f', median_only=True)} |"
            )
    lines += [
        "",
        "| framework | determinism cost | checkpoint / epoch | restore / epoch | receipt trace / epoch | traced epoch vs plain | trace KB / epoch | verify / one run |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for framework, entry in results["frameworks"].items():
        d, verify = entry["derived"], entry.get("verify")
        lines.append(
            f"| {framework} | {_pct(d.get('determinism_cost'))} | {_pct(d.get('checkpoint_share_of_epoch'))} | {_pct(d.get('restore_share_of_epoch'))} | "
            f"{_pct(d.get('trace_share_of_epoch'))} | {_pct(d.get('traced_epoch_vs_plain'))} | {_kb(d.get('trace_bytes_per_epoch'))} | "
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
        lines += ["", "data.pipeline=loader with data.augment=true against the resident dataset, epoch s (median):", "",
                  "| framework | " + " | ".join(names) + " |", "|---|" + "---|" * len(names)]  # fmt: skip
        for framework, cost in loaders.items():
            lines.append(f"| {framework} | " + " | ".join(f"{cost[n]:.2f}" for n in names) + " |")
    reference = results.get("reference")
    if reference:
        lines += ["", f"Reference tutorial ({reference['source']}, measured {reference.get('date')}, batch {reference.get('batch_size')}), "
                  "determinism on in both; the reference's own per-epoch training time:", "",
                  "| framework | reference epoch s | reference threads | reprocube epoch s | speed-up |", "|---|---|---|---|---|"]  # fmt: skip
        for framework, r in reference["frameworks"].items():
            lines.append(
                f"| {framework} | {r['reference_epoch_s']:.2f} | {r['reference_threads']} | {r['reprocube_epoch_s']:.2f} | {r['speedup']:.2f}x |"
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


def write_results(results: dict, out_dir: Path) -> Path:
    out_dir.mkdir(parents=True, exist_ok=True)
    write_json_atomic(out_dir / "bench.json", results)
    write_file_atomic(out_dir / "bench.md", markdown(results).encode())
    return out_dir / "bench.md"
