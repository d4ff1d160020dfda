"""Run directories: <output_dir>/<run_name>/ with .reprocube-run, config.yaml, env.json, sessions.jsonl, receipt.json,
metrics.jsonl and checkpoints/; which checkpoint, if any, a run starts from; and the lock that keeps
two processes (say, a requeued SLURM job and its still-running predecessor) out of one run.

A directory is written only if it is empty or is a reprocube run (it holds the .reprocube-run marker or
checkpoints/): a run_name that happens to name someone's directory is refused, never overwritten. A
checkpoint whose files cannot be read is set aside (renamed .unreadable-NAME, never deleted) when
resume=auto or latest looks for the newest usable one."""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from reprocube.config import config_differences, run_name
from reprocube.errors import CheckpointError, ConfigError
from reprocube.files import append_line, json_text, write_file_atomic, write_json_atomic
from reprocube.training.checkpoint import MANIFEST, Checkpoint, read_checkpoint, scan_checkpoints
from reprocube.training.metrics import MetricsFile, MetricsHistory

RUN_MARKER = ".reprocube-run"
RUN_FILES = (RUN_MARKER, "config.yaml", "env.json", "sessions.jsonl", "metrics.jsonl", "receipt.json", "checkpoints")


@dataclass(frozen=True)
class RunDirectory:
    path: Path
    # Damaged checkpoints to rename .unreadable-NAME once the run is accepted (initialize): {path: reason}
    set_aside: dict = field(default_factory=dict, compare=False)

    @property
    def checkpoints(self) -> Path:
        return self.path / "checkpoints"

    @property
    def metrics(self) -> MetricsFile:
        return MetricsFile(self.path / "metrics.jsonl")

    def is_run(self) -> bool:
        return (self.path / RUN_MARKER).is_file() or self.checkpoints.is_dir()

    def initialize(
        self, config: dict, history: MetricsHistory, env: dict, resumed_from: Path | None, position: dict
    ) -> None:
        """Write config.yaml (again on resume: epochs may grow), metrics.jsonl from the checkpoint's
        history, and the session. env.json describes the first process of the run (a fresh start
        replaces whatever a run without checkpoints left), sessions.jsonl every process."""
        self.path.mkdir(parents=True, exist_ok=True)
        for damaged, reason in self.set_aside.items():
            _set_aside(damaged, reason)
        write_file_atomic(self.path / RUN_MARKER, b'{"reprocube_run": 1}\n')
        write_file_atomic(self.path / "config.yaml", yaml.safe_dump(config, sort_keys=False).encode())
        self.metrics.rewrite(history)
        fresh = resumed_from is None
        if fresh or not (self.path / "env.json").exists():
            write_json_atomic(self.path / "env.json", env, sort_keys=True)
        session = {
            "started_unix": time.time(),
            "resumed_from": None if fresh else str(resumed_from),
            "position": position,
            "env": env,
        }
        line = json_text(session, indent=None, sort_keys=True)
        if fresh:
            write_file_atomic(self.path / "sessions.jsonl", (line + "\n").encode())
        else:
            append_line(self.path / "sessions.jsonl", line)


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
            held = sorted(p.name for p in run.path.iterdir() if not _is_own_temporary(p.name))
            if not created and not run.is_run() and held:
                held = ", ".join(held[:4])
                raise ConfigError(
                    f"{run.path} exists and is not a reprocube run (it holds {held}); "
                    f"choose another run_name= or output_dir=, or empty it"
                )
            for name in RUN_FILES:
                if (run.path / name).is_symlink():
                    raise ConfigError(f"{run.path / name} is a symbolic link; reprocube does not write through links")
            _remove_interrupted_writes(run)
            checkpoint = _resume_checkpoint(cfg, run)
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
    """Temporaries of a process that was killed mid-write (safe: we hold the lock): checkpoint
    directories (.tmp-*) and the run's own files (.NAME.*.partial, files.write_file_atomic's)."""
    if run.checkpoints.is_dir():
        for tmp in run.checkpoints.glob(".tmp-*"):
            shutil.rmtree(tmp, ignore_errors=True)
    for tmp in run.path.iterdir():
        if _is_own_temporary(tmp.name) and tmp.is_file() and not tmp.is_symlink():
            tmp.unlink()


def _resume_checkpoint(cfg, run: RunDirectory) -> Checkpoint | None:
    """The verified checkpoint this run starts from, or None for a fresh start."""
    own, unreadable = scan_checkpoints(run.checkpoints)
    if cfg.resume is None:
        if own or unreadable:
            raise ConfigError(
                f"run directory {run.path} already holds checkpoints; pass resume=latest to continue it, "
                f"or choose another run_name= or output_dir="
            )
        return None
    if cfg.resume in ("auto", "latest"):
        if not own and not unreadable:
            if cfg.resume == "latest":
                raise CheckpointError(f"resume=latest: no checkpoint in {run.checkpoints}")
            return None  # auto, a requeued batch job's first start
        return _newest_usable(run, own, unreadable)
    given = Path(cfg.resume)
    if (given / MANIFEST).exists():
        source = given
    elif (given / "checkpoints").is_dir():
        found, _ = scan_checkpoints(given / "checkpoints")
        if not found:
            raise CheckpointError(f"resume={given}: the run holds no readable checkpoint")
        source = found[-1]
    else:
        raise CheckpointError(f"resume={given}: not a checkpoint directory (no {MANIFEST}) nor a run directory")
    if source.parent.resolve() == run.checkpoints.resolve():
        if not own or source.resolve() != own[-1].resolve():
            raise ConfigError(
                f"resume={given} is not the latest checkpoint of {run.path}; continuing it here would overwrite "
                f"later checkpoints: choose another run_name= to branch from it"
            )
    elif own or unreadable:
        raise ConfigError(
            f"run directory {run.path} already holds checkpoints; choose another run_name= to resume {given} into"
        )
    return read_checkpoint(source)


def _newest_usable(run: RunDirectory, own: list[Path], unreadable: dict[Path, CheckpointError]) -> Checkpoint:
    """The newest checkpoint that reads whole. The damaged ones are set aside (renamed .unreadable-NAME,
    never deleted, with a warning) once the run is accepted, so that a requeued job resumes instead of
    failing on the same file at every attempt. A checkpoint that may be fine but cannot be read here (a
    permission, a newer format) stops the resume, as does having no usable checkpoint at all: a run
    that had checkpoints is never started again from scratch."""
    for exc in unreadable.values():
        if not exc.damaged:
            raise exc
    damaged = {path: str(exc) for path, exc in unreadable.items()}
    for path in reversed(own):
        try:
            checkpoint = read_checkpoint(path)
        except CheckpointError as exc:
            if not exc.damaged:
                raise
            damaged[path] = str(exc)
            continue
        run.set_aside.update(damaged)
        return checkpoint
    reasons = "; ".join(list(damaged.values())[:2])
    raise CheckpointError(f"no usable checkpoint in {run.checkpoints} ({reasons}); nothing was changed")


def _set_aside(path: Path, reason: str) -> None:
    target = path.with_name(f".unreadable-{path.name}")
    suffix = 1
    while target.exists():
        suffix += 1
        target = path.with_name(f".unreadable-{path.name}-{suffix}")
    try:
        os.rename(path, target)
    except OSError as exc:
        raise CheckpointError(f"{reason}; could not set it aside as {target} ({exc.strerror})") from None
    print(f"reprocube: warning: {reason}; set aside as {target}", file=sys.stderr)


def _is_own_temporary(name: str) -> bool:
    """A file write_file_atomic left behind when killed (.NAME.*.partial of a run file)."""
    return any(name.startswith(f".{own}.") and name.endswith(".partial") for own in RUN_FILES)


def _check_compatible(checkpoint: Checkpoint, config: dict) -> None:
    saved = checkpoint.content.config  # read_checkpoint checked it against the manifest's config_hash
    if checkpoint.manifest.config_hash is None:
        raise CheckpointError(f"checkpoint {checkpoint.path}: its manifest has no config_hash")
    differences = config_differences(saved, config)
    if differences:
        raise CheckpointError(
            f"checkpoint {checkpoint.path} was made with a different config: " + "; ".join(differences)
        )
    done = checkpoint.manifest.epoch
    if done > config["epochs"]:
        raise ConfigError(f"checkpoint {checkpoint.path} is at epoch {done}, beyond epochs={config['epochs']}")
