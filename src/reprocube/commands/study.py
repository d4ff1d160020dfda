"""`reprocube study`: how much of the run-to-run variance comes from non-determinism.

After Morin & Willetts (arXiv:2001.11396): N runs with one seed and N runs with different seeds. With a
fixed seed, only non-determinism can spread the results. They measured, for a TensorFlow ResNet on a
GPU, a test-accuracy std of 0.020 with a fixed seed against 0.027 with different seeds (a ratio of
~74%). Here, with deterministic kernels, the same-seed group should end in one weights_digest.

The runs go through Hydra multirun (reprocube.orchestration.study_job), one job per run: Hydra's basic launcher on
this machine, or the submitit launcher on SLURM. Each run is a plain `reprocube train` in
STUDY/runs/, with its output in STUDY/logs/ and its result in STUDY/results/. The study can be run
again to finish what a failed or interrupted attempt left: finished runs are kept, and interrupted
ones continue (resume=auto). This module drives the study; reprocube.orchestration.study_members runs
and collects the members, reprocube.results.study_result writes study.json."""

from __future__ import annotations

import os
from pathlib import Path

from reprocube.errors import EXIT_OK, EXIT_TRAINING, ConfigError
from reprocube.files import write_file_atomic, write_json_atomic
from reprocube.orchestration.children import child_args
from reprocube.orchestration.invocation import add_config_arguments
from reprocube.orchestration.launcher import check_slurm, hydra_settings, launch_multirun, wait_for_slurm_jobs
from reprocube.orchestration.study_members import collect, members, study_paths
from reprocube.pages.study_figure import box_plot
from reprocube.results.study_result import STUDY_RESULT, summary_lines, write_study
from reprocube.untrusted import read_json

# Overrides the study sets for each run; the user's own values for them are not passed on.
SET_ON_CHILDREN = ("seed=", "output_dir=", "run_name=", "resume=", "study.", "log.progress=")
REQUEST = "study-request.json"
SLURM_CHECK_TIMEOUT_S = 30


# ---- the driver ------------------------------------------------------------------------------------------


HELP = "same seed vs different seeds, through Hydra multirun: reprocube study framework=jax runs=5 epochs=3"


def add_arguments(parser) -> None:
    add_config_arguments(parser, aliases={"runs": "study.runs"})


def run(args) -> int:
    invocation = args.invocation
    result = run_study(invocation.cfg, invocation.overrides, invocation.config_files)
    return EXIT_OK if not result["failures"] and not result.get("launcher_error") else EXIT_TRAINING


def run_study(cfg, overrides: list[str], config_files: list[str], out=print) -> dict:
    study_dir = Path(cfg.study.dir).resolve()
    train_args = child_args(overrides, config_files, SET_ON_CHILDREN)
    request = {
        "framework": cfg.framework.name,
        "runs": cfg.study.runs,
        "seed": cfg.seed,
        "train_args": train_args,
        "cwd": os.getcwd(),
    }
    if cfg.study.launcher == "slurm":
        check_slurm("study.launcher")  # before anything is written
    _claim(study_dir, request)
    plan = members(cfg.study.runs, cfg.seed)
    out(
        f"study: {len(plan)} runs of {cfg.framework.name} "
        f"({cfg.study.runs} with seed {cfg.seed}, {cfg.study.runs} with seeds "
        f"{plan[cfg.study.runs].seed}..{plan[-1].seed}) through Hydra multirun, "
        f"launcher {cfg.study.launcher}, in {study_dir}"
    )
    launcher_error = _launch(study_dir, cfg, request, out)
    if launcher_error and cfg.study.launcher == "slurm":
        # submitit stops waiting at the first failed job: let the study's other jobs finish first.
        wait_for_slurm_jobs(
            study_dir, timeout_s=cfg.study.slurm.timeout_min * 60 + 120, out=lambda line: out(f"study: {line}")
        )
    result = collect(study_dir, cfg.study.runs, cfg.seed, launcher=cfg.study.launcher)
    result["request"] = request
    if launcher_error:
        result["launcher_error"] = launcher_error
    write_study(result, study_dir)
    write_file_atomic(study_dir / "study.png", box_plot(result))
    for line in summary_lines(result):
        out(line)
    out(
        f"written: {study_dir / STUDY_RESULT.name}, {study_dir / STUDY_RESULT.markdown_name}, {study_dir / 'study.png'}"
    )
    return result


def _claim(study_dir: Path, request: dict) -> None:
    """A study directory holds one study: running the same one again finishes it; another is refused."""
    path = study_dir / REQUEST
    if path.exists():
        earlier = read_json(path, ConfigError)
        if not isinstance(earlier, dict):
            raise ConfigError(f"study.dir={study_dir}: {REQUEST} is not a study request; choose another study.dir")
        differing = sorted(k for k in request if k != "cwd" and earlier.get(k) != request[k])
        if differing:
            raise ConfigError(
                f"study.dir={study_dir} holds another study (its {', '.join(differing)} differ); "
                "choose another study.dir"
            )
    elif study_dir.exists() and any(study_dir.iterdir()):
        raise ConfigError(f"study.dir={study_dir} exists and is not a study; choose another study.dir")
    for directory in study_paths(study_dir).values():
        directory.mkdir(parents=True, exist_ok=True)
    write_json_atomic(path, request, indent=2)


def _launch(study_dir: Path, cfg, request: dict, out) -> str | None:
    """Hydra multirun over the members, in a child process; its output goes to the terminal and to
    logs/launcher.log. Returns the launcher's error, if it failed (the runs' results are still read)."""
    settings = hydra_settings(
        study_dir, "study.member", cfg.study.launcher, cfg.study.slurm, f"reprocube-study-{cfg.framework.name}"
    )
    config = {
        **settings,
        "study": {
            "dir": str(study_dir),
            "runs": cfg.study.runs,
            "seed": cfg.seed,
            "member": None,
            "train_args": request["train_args"],
            "cwd": request["cwd"],
        },
        # each member's training child is watched (reprocube.orchestration.children.Watchdog)
        "watchdog": {"warn_minutes": cfg.watchdog.warn_minutes, "stop_minutes": cfg.watchdog.stop_minutes},
    }
    return launch_multirun(
        "reprocube.orchestration.study_job",
        "study",
        study_dir,
        config,
        "study.member",
        2 * cfg.study.runs,
        study_dir / "logs" / "launcher.log",
        echo=lambda line: out(f"  {line}"),
    )
