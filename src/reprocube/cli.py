"""Command line: `reprocube COMMAND ...`. train, download and verify take Hydra overrides
(KEY=VALUE); compare and report take run directories."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from omegaconf import OmegaConf

from reprocube.errors import EXIT_CONFIG, EXIT_DIFFERENT, EXIT_OK, EXIT_TRAINING, ReprocubeError

CONFIG_COMMANDS = {
    "train": "train (or resume) a model: reprocube train framework=pytorch epochs=4 seed=1",
    "download": "fetch and verify a dataset: reprocube download dataset=fashion_mnist data_dir=data",
    "verify": "prove bit-exact restart and resume: reprocube verify framework=all epochs=3",
    "bench": "time each trainer, determinism on/off, checkpoints, verify: reprocube bench bench.repeats=3",
    "study": "same seed vs different seeds, through Hydra multirun: reprocube study framework=jax runs=5 epochs=3",
}


class _OneLineErrorParser(argparse.ArgumentParser):
    def error(self, message: str):
        self.exit(EXIT_CONFIG, f"reprocube: error: {message} (see reprocube --help)\n")


def _parser() -> argparse.ArgumentParser:
    parser = _OneLineErrorParser(
        prog="reprocube",
        description="Bit-exact restart and resume of deep-learning training.",
        epilog="Overrides use Hydra's grammar (key=value, nested.key=value); see README.md for every key.",
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, help_text in CONFIG_COMMANDS.items():
        sub = commands.add_parser(name, help=help_text, description=help_text)
        sub.add_argument("--config-file", metavar="PATH", action="append", default=[],
                         help="user yaml merged under the command-line overrides (e.g. workspace/train.yaml); repeatable, later files win")
        sub.add_argument("--print-config", action="store_true", help="print the resolved config and exit")
        sub.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="Hydra overrides")
    compare = commands.add_parser("compare", help="compare two runs checkpoint by checkpoint: reprocube compare RUN_A RUN_B")
    compare.add_argument("run_a", type=Path)
    compare.add_argument("run_b", type=Path)
    compare.add_argument("--tolerance", type=float, default=0.0, help="pass when every weight differs by at most this (default 0: bit-exact)")
    compare.add_argument("--out", type=Path, help="directory for compare.json and compare.md (default: RUN_A)")
    report = commands.add_parser("report", help="HTML report with curves, divergence map, verdicts: reprocube report RUN...")
    report.add_argument("runs", type=Path, nargs="+")
    report.add_argument("--out", type=Path, default=Path("report"), help="output directory (default: report/)")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    return main_guarded(lambda: _run(args))


def main_guarded(run) -> int:
    """Run a command; its errors become one `reprocube: error:` line and their exit status."""
    try:
        return run()
    except ReprocubeError as exc:
        print(f"reprocube: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except OSError as exc:  # disk full, permissions, ...: one line, not a traceback
        print(f"reprocube: error: {exc.strerror or exc}: {exc.filename or ''}".rstrip(": "), file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("reprocube: interrupted", file=sys.stderr)
        return 130


def _run(args) -> int:
    if args.command == "compare":
        return _compare(args)
    if args.command == "report":
        from reprocube.report import write_report

        print(f"report: {write_report(args.runs, args.out)}")
        return EXIT_OK
    from reprocube.config import config_files_overrides, load_config  # imports Hydra: keep `--help` fast

    overrides = list(args.overrides)
    if args.command == "study":  # `runs=N` is the study's own word for study.runs=N
        overrides = [f"study.{o}" if o.startswith("runs=") else o for o in overrides]
    if args.command in ("verify", "bench"):
        from reprocube.verify import frameworks_from

        # `framework: all` may come from a config file too (the MLCube verify task's verify.yaml);
        # bench measures every framework unless told otherwise.
        default = "all" if args.command == "bench" else "pytorch"
        frameworks, overrides = frameworks_from(overrides, config_files_overrides(args.config_file), default)
        cfg = load_config([*overrides, f"framework={frameworks[0]}"], args.config_file)
    else:
        cfg = load_config(overrides, args.config_file)
    if args.print_config:
        print(OmegaConf.to_yaml(cfg), end="")
        return EXIT_OK
    if args.command == "download":
        from reprocube.data.download import download_dataset

        download_dataset(cfg)
        return EXIT_OK
    if args.command == "verify":
        from reprocube.verify import verify

        return EXIT_OK if verify(frameworks, cfg, overrides, args.config_file) else EXIT_DIFFERENT
    if args.command == "bench":
        from reprocube.bench import run_bench, write_results

        results = run_bench(frameworks, cfg, overrides, args.config_file)
        print(f"bench: {write_results(results, Path(cfg.bench.out))}")
        return EXIT_OK
    if args.command == "study":
        from reprocube.study import run_study

        result = run_study(cfg, overrides, args.config_file)
        return EXIT_OK if not result["failures"] and not result.get("launcher_error") else EXIT_TRAINING
    from reprocube.loop import train

    return train(cfg)


def _compare(args) -> int:
    from reprocube.compare import compare_markdown, compare_runs, load_run, summary_line, worst_tensor, write_reports

    if args.tolerance < 0:
        raise ReprocubeError("--tolerance must be >= 0")
    result = compare_runs(load_run(args.run_a), load_run(args.run_b), args.tolerance)
    out = args.out or args.run_a
    out.mkdir(parents=True, exist_ok=True)
    write_reports(result, out, "compare", compare_markdown(result))
    print(f"{args.run_a} vs {args.run_b}: {summary_line(result)}")
    for row in result["checkpoints"]:
        worst = worst_tensor(row["tensors"])
        detail = "" if row["identical"] else f"  {worst['tensor']}: max abs {worst.get('max_abs')}, {worst.get('max_ulp')} ULP"
        print(f"  {row['checkpoint']}: {'identical' if row['identical'] else 'DIFFERENT'}{detail}")
    for diff in result["env_differences"][:8]:
        print(f"  env {diff['key']}: {diff['a']} -> {diff['b']}")
    print(f"written: {out / 'compare.json'}, {out / 'compare.md'}")
    return EXIT_OK if result["passed"] else EXIT_DIFFERENT


if __name__ == "__main__":
    sys.exit(main())
