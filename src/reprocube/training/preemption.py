"""Preemption: SIGTERM, SIGUSR1 (SLURM's warning signal) and SIGINT ask the training loop to stop after
the current step, write a mid-epoch checkpoint and exit with EXIT_PREEMPTED. A second SIGINT aborts."""

from __future__ import annotations

import signal

STOP_SIGNALS = (signal.SIGTERM, signal.SIGUSR1, signal.SIGINT)


_early_warning: str | None = None  # SIGUSR1's name once it came before StopRequest's handler


def hold_early_warnings() -> None:
    """SLURM's warning (SIGUSR1) held from the program's first line: it can come during start-up, and by
    default it kills (a job warned while Python imported died, 138). hpc/preemptible.sh starts reprocube
    with USR1 ignored, but Apptainer's starter does not pass an ignored signal on, so inside a SIF only this
    holds it. A handler, not an ignore: a command reprocube starts (check's) gets USR1 as it would anyway;
    the training's StopRequest takes a warning held here as its own (a checkpoint after the first step)."""
    if signal.getsignal(signal.SIGUSR1) == signal.SIG_DFL:
        signal.signal(signal.SIGUSR1, _hold)


def _hold(_signum, _frame) -> None:
    global _early_warning
    _early_warning = signal.SIGUSR1.name


class StopRequest:
    """Installs the handlers for its `with` block; `requested` tells the loop to stop."""

    def __init__(self):
        self.signal_name: str | None = None
        self._previous = {}

    @property
    def requested(self) -> bool:
        return self.signal_name is not None

    def _handle(self, signum, _frame) -> None:
        # The first signal names the stop (SLURM's USR1 warning, then its TERM, is a USR1 stop).
        self.signal_name = self.signal_name or signal.Signals(signum).name
        if signum == signal.SIGINT:
            signal.signal(signal.SIGINT, signal.default_int_handler)  # Ctrl-C twice: abort now

    def __enter__(self) -> StopRequest:
        for sig in STOP_SIGNALS:
            self._previous[sig] = signal.signal(sig, self._handle)
        # Taken after the handlers: a warning that came while they were installed went to _hold.
        self.signal_name = self.signal_name or _early_warning
        return self

    def __exit__(self, *exc) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
