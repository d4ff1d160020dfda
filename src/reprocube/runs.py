"""Run directories: <output_dir>/<run_name>/ with config.yaml, env.json, sessions.jsonl,
metrics.jsonl and checkpoints/; and which checkpoint, if any, a run starts from."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path

import yaml

from reprocube.checkpoint import MANIFEST, Checkpoint, latest_checkpoint, read_checkpoint
from reprocube.config import config_differences, config_hash, run_name
from reprocube.errors import CheckpointError, ConfigError
from reprocube.files import write_file_atomic
from reprocube.metrics import MetricsFile


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

    def write_config(self, config: dict) -> None:
        write_file_atomic(self.path / "config.yaml", yaml.safe_dump(config, sort_keys=False).encode())

    def initialize(self, config: dict) -> None:
        """Create the directory and write the resolved config (again, when resuming: `epochs` may grow)."""
        self.path.mkdir(parents=True, exist_ok=True)
        self.write_config(config)

    def record_session(self, env: dict, resumed_from: Path | None, position: dict) -> None:
        """env.json describes the first process of the run; every process is in sessions.jsonl."""
        if not (self.path / "env.json").exists():
            write_file_atomic(self.path / "env.json", (json.dumps(env, indent=1, sort_keys=True) + "\n").encode())
        line = {"started_unix": time.time(), "resumed_from": str(resumed_from) if resumed_from else None, "position": position, "env": env}
        with open(self.path / "sessions.jsonl", "a") as f:
            f.write(json.dumps(line, sort_keys=True) + "\n")


def open_run(cfg, config: dict) -> tuple[RunDirectory, Checkpoint | None]:
    """Decide the run directory and the verified checkpoint to resume from, writing nothing yet;
    refuse anything that would overwrite an earlier result or resume under a different config."""
    run = RunDirectory(Path(cfg.output_dir) / run_name(cfg))
    source = _resume_source(cfg, run)
    checkpoint = read_checkpoint(source) if source else None
    if checkpoint:
        _check_compatible(checkpoint, config)
    return run, checkpoint


def _resume_source(cfg, run: RunDirectory) -> Path | None:
    if cfg.resume is None:
        if run.latest_checkpoint():
            raise ConfigError(
                f"run directory {run.path} already holds checkpoints; pass resume=latest to continue it, "
                f"or choose another run_name= or output_dir="
            )
        return None
    if cfg.resume == "latest":
        latest = run.latest_checkpoint()
        if latest is None:
            raise CheckpointError(f"resume=latest: no checkpoint in {run.checkpoints}")
        return latest
    given = Path(cfg.resume)
    if (given / MANIFEST).exists():
        source = given
    elif (given / "checkpoints").is_dir():
        source = latest_checkpoint(given / "checkpoints")
        if source is None:
            raise CheckpointError(f"resume={given}: the run holds no checkpoint")
    else:
        raise CheckpointError(f"resume={given}: not a checkpoint directory (no {MANIFEST}) nor a run directory")
    same_run = source.parent.resolve() == run.checkpoints.resolve()
    if same_run and source.resolve() != run.latest_checkpoint().resolve():
        raise ConfigError(
            f"resume={given} is not the latest checkpoint of {run.path}; continuing it here would overwrite "
            f"later checkpoints: choose another run_name= to branch from it"
        )
    if not same_run and run.latest_checkpoint():
        raise ConfigError(f"run directory {run.path} already holds checkpoints; choose another run_name= to resume {given} into")
    return source


def _check_compatible(checkpoint: Checkpoint, config: dict) -> None:
    saved = checkpoint.content.config
    differences = config_differences(saved, config)
    if differences:
        raise CheckpointError(f"checkpoint {checkpoint.path} was made with a different config: " + "; ".join(differences))
    if checkpoint.manifest.get("config_hash") != config_hash(config):
        raise CheckpointError(f"checkpoint {checkpoint.path}: config_hash does not match its config.json")
    done = checkpoint.manifest.get("epoch", 0)
    if done > config["epochs"]:
        raise ConfigError(f"checkpoint {checkpoint.path} is at epoch {done}, beyond epochs={config['epochs']}")
