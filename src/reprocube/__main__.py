"""The program: `python -m reprocube` and the `reprocube` script (pyproject.toml's [project.scripts]) both
run `run`. Its first act arms reprocube.runtime.process_exit's end, before any other module is imported and can
register an atexit handler, so that the end runs after every other (reprocube.runtime.process_exit); its
second holds SLURM's warning signal until training handles it (reprocube.training.preemption)."""

from typing import NoReturn

from reprocube.runtime.process_exit import arm
from reprocube.training.preemption import hold_early_warnings


def run() -> NoReturn:
    arm()
    hold_early_warnings()
    from reprocube.cli import run as program  # after arm(): cli's imports may register atexit handlers

    program()


if __name__ == "__main__":
    run()
