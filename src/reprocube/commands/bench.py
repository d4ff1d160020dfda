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
from reprocube.errors import EXIT_OK, ConfigError, ReprocubeError
from reprocube.files import portable_path
from reprocube.formats.env import collect_env
from reprocube.orchestration.children import (
    child_args,
    last_error_line,
    python_module_command,
    reprocube_command,
    run_child,
)
from reprocube.orchestration.invocation import add_config_arguments
from reprocube.results.bench_result import derived, reference_ratios, summarise, write_bench
from reprocube.untrusted import read_json

# Overrides a measurement child must not inherit from the user (the child places its own run).
SET_ON_CHILDREN = ("framework=", "deterministic=", "output_dir=", "run_name=", "resume=", "epochs=", "bench.")


HELP = "time each trainer, determinism on/off, checkpoints, verify: reprocube bench bench.repeats=3"


def add_arguments(parser) -> None:
    add_config_arguments(parser, all_frameworks_default="all")


def run(args) -> int:
    invocation = args.invocation
    cfg = invocation.cfg
    results = run_bench(invocation.frameworks, cfg, invocation.overrides, invocation.config_files)
    print(f"bench: {write_bench(results, Path(cfg.bench.out))}")
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
                out(
                    f"[{framework}] deterministic={deterministic} #{repeat + 1}: epoch {record['epoch_s']:.2f} s, "
                    f"{record['samples_per_s']:.0f} samples/s, first step {record['first_step_s']:.2f} s, "
                    f"checkpoint {record['checkpoint_write_s'] * 1000:.1f} ms"
                )
                entry["runs"].append(record)
        for deterministic in cfg.bench.deterministic:
            entry["summary"]["on" if deterministic else "off"] = summarise(
                [r for r in entry["runs"] if r["deterministic"] == deterministic]
            )
        if cfg.bench.loader_workers:
            entry["loader"] = _loader_cost(framework, user, cfg, out)
        if cfg.bench.verify_epochs:
            entry["verify"] = _verify_cost(framework, user, cfg, out)
        entry["derived"] = derived(entry)
        results["frameworks"][framework] = entry
    if reference is not None:
        results["reference"] = reference_ratios(Path(cfg.bench.reference), reference, results)
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
        out(
            f"[{framework}] verify ({epochs} epochs): {row['verify_s']:.1f} s = {row['ratio']:.2f}x one training run "
            f"({row['train_s']:.1f} s); with run=PATH {row['verify_reused_s']:.1f} s = {row['reused_ratio']:.2f}x"
        )
        rows.append(row)
    return rows


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
