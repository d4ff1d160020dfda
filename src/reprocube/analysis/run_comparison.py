"""Two run directories compared checkpoint by checkpoint (reprocube compare, verify, report). Reads only
safetensors, JSON and YAML (every checkpoint verified against its manifest first): no framework is
imported, nothing is executed."""

from __future__ import annotations

import sys
from pathlib import Path

from reprocube.analysis.tensors import tensor_differences
from reprocube.config import config_differences
from reprocube.errors import CheckpointError
from reprocube.files import sha256_file
from reprocube.formats.env_comparison import env_differences
from reprocube.results.wording import worst_tensor
from reprocube.training.checkpoint import Checkpoint, epoch_name, read_checkpoint, scan_checkpoints, step_name
from reprocube.training.metrics import DETERMINISTIC_EPOCH_FIELDS, read_epoch_records
from reprocube.untrusted import Fields, read_json

MAX_ENV_BYTES = 16 << 20


def load_run(path: Path) -> dict:
    """A run directory's checkpoints (each verified; an unreadable one is named, with a warning, and
    left out), its epoch records and its environment; a clear error otherwise. What the run must hold is
    judged from its checkpoints alone (hashed: sessions.jsonl is not read): where it can have started
    (started_by_epoch) and the epoch checkpoints its config asks for that it lacks (lacks)."""
    path = Path(path)
    if not (path / "checkpoints").is_dir():
        raise CheckpointError(f"{path} is not a reprocube run directory (no checkpoints/)")
    found, unreadable = scan_checkpoints(path / "checkpoints")
    unreadable = {p.name: str(exc) for p, exc in unreadable.items()}
    checkpoints = {}
    for checkpoint_path in found:
        try:
            checkpoints[checkpoint_path.name] = _named_by_its_position(read_checkpoint(checkpoint_path))
        except CheckpointError as exc:
            unreadable[checkpoint_path.name] = str(exc)
    for reason in unreadable.values():
        print(f"reprocube: warning: {reason}; left out of the comparison", file=sys.stderr)
    if not checkpoints:
        raise CheckpointError(f"{path} holds no readable checkpoint")
    env = read_json(path / "env.json", CheckpointError, MAX_ENV_BYTES) if (path / "env.json").exists() else {}
    metrics = read_epoch_records(path / "metrics.jsonl") if (path / "metrics.jsonl").exists() else []
    started_by = _started_by_epoch(checkpoints, unreadable)
    # What a result drew on, by digest: each checkpoint by its manifest's own sha256 (which names every
    # file's), the records and the environment by their bytes' (read again here: a file swapped between
    # the two reads would show as a digest of other bytes, never as evidence about these).
    inputs = {
        "checkpoints": {name: c.manifest.fields["manifest_sha256"] for name, c in checkpoints.items()},
        **{
            name: sha256_file(path / name) if (path / name).exists() else None for name in ("env.json", "metrics.jsonl")
        },
        "receipt.json": None,  # set where a comparison reads the run's receipt (compare: its trace)
    }
    return {
        "path": path,
        "inputs": inputs,
        "checkpoints": checkpoints,
        "unreadable": unreadable,
        "started_by_epoch": started_by,
        "lacks": _lacks(checkpoints, unreadable, started_by),
        "env": env if isinstance(env, dict) else {},
        "metrics": metrics,
    }


def _named_by_its_position(checkpoint: Checkpoint) -> Checkpoint:
    """A checkpoint whose directory name is the position its verified manifest records (epoch-k: k epochs
    done, at the start of the next; step-n: global step n, within an epoch): the names are how runs are
    matched and counted, so an epoch checkpoint renamed step-n (to hide it) is refused."""
    manifest, name = checkpoint.manifest, checkpoint.path.name
    if name.startswith("epoch-"):
        agrees = name == epoch_name(manifest.epoch) and manifest.step_in_epoch == 0
    else:
        agrees = name == step_name(manifest.global_step) and manifest.step_in_epoch > 0
    if not agrees:
        raise CheckpointError(
            f"checkpoint {checkpoint.path}: its manifest's position (epoch {manifest.epoch}, step "
            f"{manifest.step_in_epoch}, global step {manifest.global_step}) is not the one its name says"
        )
    return checkpoint


def _started_by_epoch(checkpoints: dict[str, Checkpoint], unreadable: dict[str, str]) -> int:
    """The most epochs the run can have had done when its first process started, from its checkpoints'
    verified manifests: an epoch-k checkpoint means the run trained epoch k (it started after at most k - 1
    epochs), a step checkpoint after `epoch` epochs means it started after at most that many. A run
    started from another's epoch-k checkpoint may lack epochs 1..k; a run holding epoch-0001 may lack none."""
    bounds = [c.manifest.epoch - (1 if name.startswith("epoch-") else 0) for name, c in checkpoints.items()]
    bounds += [int(name[len("epoch-") :]) - 1 for name in unreadable if name.startswith("epoch-")]
    return max(min(bounds, default=0), 0)


def _lacks(checkpoints: dict[str, Checkpoint], unreadable: dict[str, str], started_by: int) -> list[str]:
    """The epoch checkpoints the run's own config asks for (from its newest checkpoint's config.json, which
    its manifest hashes: every checkpoint.every_epochs-th epoch and the last, up to `epochs`, or to
    stop_after_epoch for a process told to stop there) after where it can have started, that it lacks."""
    newest = next(reversed(checkpoints.values()))
    config = Fields(newest.content.config, f"checkpoint {newest.path}: config.json", CheckpointError)
    epochs = config.integer("epochs", 1)
    last = epochs if config.value.get("stop_after_epoch") is None else min(epochs, config.integer("stop_after_epoch"))
    checkpoint = config.mapping("checkpoint") if config.has("checkpoint") else None
    every = checkpoint.integer("every_epochs", 1) if checkpoint and checkpoint.has("every_epochs") else epochs
    held = {*checkpoints, *unreadable}
    wanted = [epoch_name(k) for k in range(started_by + 1, last + 1) if k % every == 0 or k == epochs]
    return [name for name in wanted if name not in held]


def run_subject(run: dict) -> dict | None:
    """What evidence about a run (verify.json, compare.json) is about: its final epoch checkpoint's name,
    weights_digest and config_hash, from that checkpoint's verified manifest (None: no epoch checkpoint).
    `reprocube report` shows such evidence as a run's only where the subject is the run's own."""
    epochs = [c for name, c in run["checkpoints"].items() if name.startswith("epoch-")]
    if not epochs:
        return None
    final = max(epochs, key=lambda c: c.manifest.epoch)
    return {
        "checkpoint": final.path.name,
        "config_hash": final.manifest.config_hash,
        "weights_digest": final.manifest.weights_digest,
    }


def subject_of(path: Path) -> dict | None:
    """run_subject of the run directory `path`, its final epoch checkpoint verified whole first (None when
    it holds no epoch checkpoint that reads)."""
    found, _ = scan_checkpoints(Path(path) / "checkpoints")
    epochs = [p for p in found if p.name.startswith("epoch-")]
    if not epochs:
        return None
    try:
        final = _named_by_its_position(read_checkpoint(epochs[-1]))  # scan_checkpoints: oldest first
    except CheckpointError:
        return None
    return run_subject({"checkpoints": {final.path.name: final}})


def compare_runs(a: dict, b: dict, tolerance: float = 0.0) -> dict:
    """Checkpoint by checkpoint (the names both runs hold, in training order). A run that started from
    another's checkpoint of epoch k (as far as its checkpoints' manifests can tell: load_run's
    started_by_epoch) may lack epochs 1..k; any other epoch checkpoint one run lacks, or that its own
    config asks for (load_run's lacks), means not identical."""
    common = [name for name in a["checkpoints"] if name in b["checkpoints"]]
    checkpoints, first = [], None
    for name in common:
        ca, cb = a["checkpoints"][name], b["checkpoints"][name]
        same = ca.manifest.weights_digest == cb.manifest.weights_digest
        tensors = tensor_differences(ca.content.weights, cb.content.weights)
        # Tolerance 0 is bit-exact: +0.0 against -0.0 differs by 0 but is not the same bits.
        within = same or (
            tolerance > 0
            and all("problem" not in t and not t.get("non_finite") and t["max_abs"] <= tolerance for t in tensors)
        )
        row = {
            "checkpoint": name,
            "global_step": ca.manifest.global_step,
            "identical": same,
            "within_tolerance": within,
            "tensors": tensors,
        }
        checkpoints.append(row)
        if not same and first is None:
            worst = worst_tensor(tensors)
            first = {
                "checkpoint": name,
                "tensor": worst["tensor"],
                "max_abs": worst.get("max_abs"),
                "max_ulp": worst.get("max_ulp"),
                "problem": worst.get("problem"),
            }
    metric_diffs = _metric_differences(a["metrics"], b["metrics"])
    unreadable = {"a": sorted(a.get("unreadable", {})), "b": sorted(b.get("unreadable", {}))}
    # An epoch checkpoint one run has and the other lacks (a run that stopped early) was not shown to agree.
    epochs = {
        run: {n for n in [*r["checkpoints"], *r.get("unreadable", {})] if n.startswith("epoch-")}
        for run, r in (("a", a), ("b", b))
    }
    before = {
        run: {epoch_name(k) for k in range(1, r.get("started_by_epoch", 0) + 1)} for run, r in (("a", a), ("b", b))
    }
    missing = {
        "a": sorted((epochs["b"] - epochs["a"] - before["a"]) | set(a.get("lacks", ()))),
        "b": sorted((epochs["a"] - epochs["b"] - before["b"]) | set(b.get("lacks", ()))),
    }
    verdict_ok = (
        bool(common)
        and all(c["within_tolerance"] for c in checkpoints)
        and (tolerance > 0 or not metric_diffs)
        and not (unreadable["a"] or unreadable["b"])  # what could not be read was not shown to agree
        and not (missing["a"] or missing["b"])
    )
    return {
        # What this result is about: each run's final epoch checkpoint compared (see run_subject).
        "subject": {"a": run_subject(a), "b": run_subject(b)},
        "inputs": {"a": a["inputs"], "b": b["inputs"]},
        "run_a": str(a["path"]),
        "run_b": str(b["path"]),
        "compared_checkpoints": common,
        "identical": bool(common) and all(c["identical"] for c in checkpoints) and not metric_diffs and verdict_ok,
        "passed": verdict_ok,
        "tolerance": tolerance,
        "first_difference": first,
        "checkpoints": checkpoints,
        "metric_differences": metric_diffs,
        "config_differences": _config_differences(a, b),
        "env_differences": env_differences(a["env"], b["env"]),
        "unreadable_checkpoints": unreadable,
        "missing_epoch_checkpoints": missing,
        # Checkpoints one run holds and the other lacks, beyond the epoch checkpoints in `missing` (step
        # checkpoints of a stop, or a cadence): their weights were not compared, and the verdict says so.
        "not_compared_checkpoints": {
            run: sorted(
                set(r["checkpoints"]) - set(common) - set(missing[run]) - set(missing["b" if run == "a" else "a"])
            )
            for run, r in (("a", a), ("b", b))
        },
        "max_abs": max((t.get("max_abs", 0.0) for c in checkpoints for t in c["tensors"]), default=0.0),
    }


def _config_differences(a: dict, b: dict) -> list[dict]:
    """Result-affecting config keys that differ between the runs' newest checkpoints (the likeliest
    cause of all: it comes before any environment difference)."""
    config_a = next(reversed(a["checkpoints"].values())).content.config
    config_b = next(reversed(b["checkpoints"].values())).content.config
    rows = []
    for line in config_differences(config_a, config_b):
        key, _, change = line.partition(": ")
        before, _, after = change.partition(" -> ")
        rows.append({"key": key, "a": before, "b": after})
    return rows


def _metric_differences(a: list[dict], b: list[dict]) -> list[dict]:
    epochs_a = {r["epoch"]: r for r in a if r.get("kind") == "epoch"}
    epochs_b = {r["epoch"]: r for r in b if r.get("kind") == "epoch"}
    diffs = []
    for epoch in sorted(set(epochs_a) & set(epochs_b)):
        for field in DETERMINISTIC_EPOCH_FIELDS[2:]:
            va, vb = epochs_a[epoch].get(field), epochs_b[epoch].get(field)
            if va != vb:
                diffs.append({"epoch": epoch, "metric": field, "a": va, "b": vb})
    return diffs
