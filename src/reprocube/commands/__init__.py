"""The user's commands, one module each, as pip's commands/ are: each module holds `HELP`,
`add_arguments(parser)` (its own options) and `run(args) -> int` (the one handler signature; a config
command finds its resolved config in `args.invocation`). Argument handling and orchestration only: the
work is in the engine (reprocube.analysis, reprocube.results, loop, ...), child processes and launchers
in reprocube.orchestration, the HTML pages in reprocube.pages. No command imports another."""

from __future__ import annotations

from typing import NamedTuple


class CommandInfo(NamedTuple):
    module: str  # imported only when the command runs (keeps `reprocube --help` fast)
    summary: str  # `reprocube --help`'s line; the module's HELP says the same at length


COMMANDS = {
    "train": CommandInfo("reprocube.commands.train", "train (or resume) a model"),
    "download": CommandInfo("reprocube.commands.download", "fetch and verify a dataset"),
    "verify": CommandInfo("reprocube.commands.verify", "prove bit-exact restart and resume"),
    "bench": CommandInfo("reprocube.commands.bench", "time each trainer, determinism on/off, checkpoints, verify"),
    "study": CommandInfo("reprocube.commands.study", "same seed vs different seeds, through Hydra multirun"),
    "compare": CommandInfo("reprocube.commands.compare", "compare two runs checkpoint by checkpoint"),
    "report": CommandInfo("reprocube.commands.report", "HTML report with curves, divergence map, verdicts"),
    "reproduce": CommandInfo(
        "reprocube.commands.reproduce",
        "retrain a published run here from its receipt: verdict, first divergence, causes",
    ),
    "check": CommandInfo("reprocube.commands.check", "prove that any training command resumes bit-exactly"),
    "diff": CommandInfo("reprocube.commands.diff", "two checkpoint files or directories, tensor by tensor"),
    "sign": CommandInfo("reprocube.commands.sign", "sign a run's receipt with an Ed25519 key"),
}
