"""The Hydra app behind `reprocube verify verify.launcher=slurm`: one SLURM job per planned check, launched
by Hydra multirun (`--multirun job.member=range(0,N)`) with hydra-submitit-launcher, as the study's runs
are. Its config is written by reprocube.orchestration.verify_runner into VERIFY/slurm/PHASE/hydra/config/."""

from __future__ import annotations

from pathlib import Path

import hydra


@hydra.main(version_base="1.3", config_path=None, config_name=None)
def main(cfg) -> dict:
    from reprocube.orchestration.verify_runner import run_planned

    record = run_planned(Path(cfg.job.plan), Path(cfg.job.logs), cfg.job.member)
    print(
        f"verify check {record['name']}: exit statuses {record['statuses']}"
        + (f": {record['error']}" if "error" in record else "")
    )
    return record


if __name__ == "__main__":
    main()
