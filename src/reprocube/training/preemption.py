"""Preemption: SIGTERM, SIGUSR1 (SLURM's warning signal) and SIGINT ask the training loop to stop after
the current step, write a mid-epoch checkpoint and exit with EXIT_PREEMPTED. A second SIGINT aborts."""

from __future__ import annotations

import signal

STOP_SIGNALS = (signal.SIGTERM, signal.SIGUSR1, signal.SIGINT)


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
        return self

    def __exit__(self, *exc) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
