"""The Hydra app behind `reprocube study`: one job per study member, launched by Hydra multirun
(`--multirun study.member=range(0,2N)`) with the basic launcher or hydra-submitit-launcher's SLURM
launcher. Its config is written by reprocube.commands.study into STUDY/hydra/config/study.yaml."""

from __future__ import annotations

from pathlib import Path

import hydra
from omegaconf import OmegaConf

from reprocube.errors import EXIT_PREEMPTED
from reprocube.orchestration.children import Watchdog


@hydra.main(version_base="1.3", config_path=None, config_name=None)
def main(cfg) -> dict:
    from reprocube.orchestration.study_members import run_member

    study = cfg.study
    record = run_member(
        Path(study.dir),
        study.runs,
        study.seed,
        study.member,
        list(OmegaConf.to_container(study.train_args)),
        study.cwd,
        Watchdog.of_config(cfg),
    )
    print(
        f"study member {record['member']} ({record['group']}, seed {record['seed']}): {record['status']}"
        + (
            f", test accuracy {record['test_accuracy']:.4f}, weights_digest {record['weights_digest'][:16]}"
            if record["status"] == "ok"
            else f": {record['error']}"
        )
    )
    if record["exit_code"] == EXIT_PREEMPTED:
        # The run was stopped by a signal (the study's time is up): stop the sweep here, not start the
        # next run. Running the study again continues this run and the rest.
        raise SystemExit(EXIT_PREEMPTED)
    return record


if __name__ == "__main__":
    main()
