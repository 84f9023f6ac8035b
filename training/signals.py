"""Stop a run between steps on SIGINT/SIGTERM, so it can save before exiting."""

from __future__ import annotations

import signal
from types import FrameType


class GracefulStop:
    """While active, the first SIGINT or SIGTERM only sets `requested`; the
    training loop checks it after each step, saves a checkpoint and exits.
    A second signal interrupts at once."""

    SIGNALS = (signal.SIGINT, signal.SIGTERM)

    def __init__(self) -> None:
        self.requested: str | None = None
        self._previous = {}

    def __enter__(self) -> GracefulStop:
        for sig in self.SIGNALS:
            self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self.requested:
            raise KeyboardInterrupt
        self.requested = signal.Signals(signum).name
