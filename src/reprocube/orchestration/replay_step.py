"""`python -m reprocube.orchestration.replay_step --run RUN_DIR --step N --out OPS.json [--config-file F]
[KEY=VALUE ...]`: replay global step N of a run in this process and environment with every operation
recorded (reprocube.training.replay), and write OPS.json (read and compared by reprocube.analysis.first_differing_operation).
The overrides may only change places (data_dir=...): the run's own config is replayed. Exit 0 when
written; 2 for a run whose framework is not one of reprocube's three, a step outside the run, an override
that is not a place or a bad argument; 3 data, 4 checkpoint, as `reprocube train`. Run it in a fresh process under the environment to test
(ONEDNN_MAX_CPU_ISA=..., ATEN_CPU_CAPABILITY=...): those are read when the framework loads."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from reprocube.errors import EXIT_CONFIG, exit_status_of
from reprocube.files import write_json_atomic


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m reprocube.orchestration.replay_step",
        description="replay one step of a run with every operation recorded (OPS.json)",
    )
    p.add_argument("--run", required=True, type=Path, metavar="RUN_DIR", help="the run directory")
    p.add_argument("--step", required=True, type=int, metavar="N", help="the global step to record (1 = the first)")
    p.add_argument("--out", required=True, type=Path, metavar="OPS.json", help="where to write the recording")
    p.add_argument("--config-file", metavar="PATH", action="append", default=[], help="user yaml (place keys)")
    p.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="place overrides, e.g. data_dir=...")
    return p


def main(argv: list[str]) -> int:
    try:
        args = parser().parse_args(argv)
    except SystemExit as exc:  # argparse's usage error: exit 2 (EXIT_CONFIG), its message already printed
        return EXIT_CONFIG if exc.code else 0

    def run() -> int:
        from reprocube.formats.ops_format import read_ops
        from reprocube.training.replay import plan_replay, replay

        plan = plan_replay(args.run, args.step, args.overrides, args.config_file)
        ops = replay(plan)
        write_json_atomic(args.out, ops, indent=None)
        read_ops(args.out)  # what is written is what the strict reader accepts
        print(
            f"replay_step: {len(ops['ops'])} operations of step {args.step} written to {args.out} "
            f"(loss {ops['loss_f32']}, run's {ops['run_loss_f32']}; recording changed nothing: "
            f"{ops['recording_changed_nothing']})"
        )
        return 0

    return exit_status_of(run)


if __name__ == "__main__":
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    sys.exit(main(sys.argv[1:]))
