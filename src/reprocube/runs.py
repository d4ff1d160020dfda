"""Run directories: <output_dir>/<run_name>/ with config.yaml, env.json, sessions.jsonl,
metrics.jsonl and checkpoints/; which checkpoint, if any, a run starts from; and the lock that keeps
two processes (say, a requeued SLURM job and its still-running predecessor) out of one run."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

import yaml

from reprocube.checkpoint import MANIFEST, Checkpoint, latest_checkpoint, read_checkpoint
from reprocube.config import config_differences, config_hash, run_name
from reprocube.errors import CheckpointError, ConfigError
from reprocube.files import write_file_atomic
from reprocube.metrics import MetricsFile, MetricsHistory


@dataclass(frozen=True)
class RunDirectory:
    path: Path

    @property
    def checkpoints(self) -> Path:
        return self.path / "checkpoints"

    @property
    def metrics(self) -> MetricsFile:
        return MetricsFile(self.path / "metrics.jsonl")

    def latest_checkpoint(self) -> Path | None:
        return latest_checkpoint(self.checkpoints)

    def initialize(
        self, config: dict, history: MetricsHistory, env: dict, resumed_from: Path | None, position: dict
    ) -> None:
        """Write config.yaml (again on resume: epochs may grow), metrics.jsonl from the checkpoint's
        history, and the session. env.json describes the first process of the run (a fresh start
        replaces whatever a run without checkpoints left), sessions.jsonl every process."""
        self.path.mkdir(parents=True, exist_ok=True)
        write_file_atomic(self.path / "config.yaml", yaml.safe_dump(config, sort_keys=False).encode())
        self.metrics.rewrite(history)
        fresh = resumed_from is None
        if fresh or not (self.path / "env.json").exists():
            write_file_atomic(self.path / "env.json", (json.dumps(env, indent=1, sort_keys=True) + "\n").encode())
        session = {
            "started_unix": time.time(),
            "resumed_from": None if fresh else str(resumed_from),
            "position": position,
            "env": env,
        }
        with open(self.path / "sessions.jsonl", "w" if fresh else "a") as f:
            f.write(json.dumps(session, sort_keys=True) + "\n")


@contextlib.contextmanager
def open_run(cfg, config: dict):
    """Lock the run directory, then decide the verified checkpoint to resume from (writing nothing);
    refuse anything that would overwrite an earlier result or resume under a different config.
    Yields (RunDirectory, Checkpoint | None)."""
    run = RunDirectory(Path(cfg.output_dir) / run_name(cfg))
    created = not run.path.exists()
    run.path.mkdir(parents=True, exist_ok=True)
    try:
        with _exclusive_lock(run.path):
            _remove_interrupted_writes(run)
            source = _resume_source(cfg, run)
            checkpoint = read_checkpoint(source) if source else None
            if checkpoint:
                _check_compatible(checkpoint, config)
            yield run, checkpoint
    finally:
        if created:
            with contextlib.suppress(OSError):
                run.path.rmdir()  # only if nothing was written: a refused run leaves no trace


@contextlib.contextmanager
def _exclusive_lock(directory: Path):
    fd = os.open(directory, os.O_RDONLY)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise ConfigError(f"run directory {directory} is in use by another reprocube process") from None
        yield
    finally:
        os.close(fd)


def _remove_interrupted_writes(run: RunDirectory) -> None:
    """Checkpoint temporaries of a process that was killed mid-write (safe: we hold the lock)."""
    if run.checkpoints.is_dir():
        for tmp in run.checkpoints.glob(".tmp-*"):
            shutil.rmtree(tmp, ignore_errors=True)


def _resume_source(cfg, run: RunDirectory) -> Path | None:
    own_latest = run.latest_checkpoint()
    if cfg.resume is None:
        if own_latest:
            raise ConfigError(
                f"run directory {run.path} already holds checkpoints; pass resume=latest to continue it, "
                f"or choose another run_name= or output_dir="
            )
        return None
    if cfg.resume == "auto":  # a requeued batch job: continue this run if it has a checkpoint, else start it
        return own_latest
    if cfg.resume == "latest":
        if own_latest is None:
            raise CheckpointError(f"resume=latest: no checkpoint in {run.checkpoints}")
        return own_latest
    given = Path(cfg.resume)
    if (given / MANIFEST).exists():
        source = given
    elif (given / "checkpoints").is_dir():
        source = latest_checkpoint(given / "checkpoints")
        if source is None:
            raise CheckpointError(f"resume={given}: the run holds no checkpoint")
    else:
        raise CheckpointError(f"resume={given}: not a checkpoint directory (no {MANIFEST}) nor a run directory")
    if source.parent.resolve() == run.checkpoints.resolve():
        if source.resolve() != own_latest.resolve():
            raise ConfigError(
                f"resume={given} is not the latest checkpoint of {run.path}; continuing it here would overwrite "
                f"later checkpoints: choose another run_name= to branch from it"
            )
    elif own_latest:
        raise ConfigError(
            f"run directory {run.path} already holds checkpoints; choose another run_name= to resume {given} into"
        )
    return source


def _check_compatible(checkpoint: Checkpoint, config: dict) -> None:
    saved = checkpoint.content.config
    if not isinstance(saved, dict) or checkpoint.manifest.get("config_hash") != config_hash(saved):
        raise CheckpointError(
            f"checkpoint {checkpoint.path}: its manifest's config_hash does not match its config.json"
        )
    differences = config_differences(saved, config)
    if differences:
        raise CheckpointError(
            f"checkpoint {checkpoint.path} was made with a different config: " + "; ".join(differences)
        )
    done = checkpoint.manifest.get("epoch", 0)
    if done > config["epochs"]:
        raise ConfigError(f"checkpoint {checkpoint.path} is at epoch {done}, beyond epochs={config['epochs']}")
