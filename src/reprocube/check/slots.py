"""Where check's runs go: --out claimed for the evidence, each run's environment (a HOME and a TMPDIR of its
own), the slots that run up to --jobs of them at once, and a run's newest line for its progress report."""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from pathlib import Path
from typing import Protocol

from reprocube.check.options import CheckOptions
from reprocube.check.runs import Run, Stop
from reprocube.files import claim_new_or_empty, safe_name


class Conductor(Protocol):
    """What a restart kind (check.swapped_restart, check.moved_weights) asks of the conductor that calls
    its hooks (check.session.CheckSession): where the evidence goes, the runs so far, a run of its own."""

    out: Path
    options: CheckOptions
    clean: list[Run]
    stopped: Run | None
    slurm: list[str] | None
    limit: float
    outputs: list[str]
    ignore: list[str]
    result: dict
    echo: Callable[[str], None]

    def new_run(self, name: str, seed: int = 0) -> Run: ...

    def execute(self, run: Run, stops: list[Stop], limit: float, jobs: dict[str, str]) -> None: ...


def isolated_environment(home: Path, tmp: Path) -> dict[str, str]:
    """This process's environment for a run, with a HOME and a TMPDIR of the run's own (state a script
    keeps under ~ or in the temporary directory cannot pass from one run to another). The XDG base
    directories follow HOME; Python's user site-packages stay where they are (PYTHONUSERBASE), so what
    `pip install --user` put there still imports. PYTHONUNBUFFERED=1: a Python script's line reaches check
    when it is printed, not when a block fills or the script exits (an --at-line stop must come while the
    script is at that line)."""
    import site

    env = {k: v for k, v in os.environ.items() if not re.match(r"^XDG_(CACHE|CONFIG|DATA|STATE)_HOME\Z", k)}
    env.setdefault("PYTHONUSERBASE", site.getuserbase())
    env["PYTHONUNBUFFERED"] = "1"
    absolute = {"HOME": home.absolute(), "TMPDIR": tmp.absolute(), "TMP": tmp.absolute(), "TEMP": tmp.absolute()}
    return env | {name: str(path) for name, path in absolute.items()}


def in_parallel(work, items: list, jobs: int) -> None:
    """work(item) for each item, up to `jobs` at once (threads: each waits on its own processes); after the
    first exception none not yet started starts, and it is raised here once the others have ended."""
    if jobs <= 1 or len(items) <= 1:
        for item in items:
            work(item)
        return
    pool = ThreadPoolExecutor(max_workers=min(jobs, len(items)), thread_name_prefix="check-run")
    futures = [pool.submit(work, item) for item in items]
    pending = set(futures)
    try:
        while pending:  # short waits: a KeyboardInterrupt reaches this thread between them
            done, pending = wait(pending, timeout=0.2, return_when=FIRST_EXCEPTION)
            if any(not f.cancelled() and f.exception() is not None for f in done):
                for future in pending:
                    future.cancel()  # not started: never starts
    finally:
        # Interrupted: the caller ends the runs (end_all_guards); their threads are not waited for here.
        pool.shutdown(wait=not pending, cancel_futures=True)
    errors = [f.exception() for f in futures if not f.cancelled() and f.exception() is not None]
    if errors:
        raise errors[0]


def workspace(out: Path | None, command: list[str]) -> Path:
    out = Path(out) if out is not None else Path(f"check-{safe_name(Path(command[-1]).stem or 'command')}")
    claim_new_or_empty(out, "check")
    return out


def last_line(run: Run) -> str:
    """The command's newest output line (its own words; shown escaped), for a progress line."""
    try:
        with open(run.log, "rb") as log:
            log.seek(max(0, log.seek(0, os.SEEK_END) - 4096))
            lines = [line for line in log.read().decode(errors="replace").splitlines() if line.strip()]
    except OSError:
        return "no output yet"
    return f"its last line: {lines[-1][:120]}" if lines else "no output yet"
