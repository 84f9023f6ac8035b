"""SIGINT and SIGTERM at any moment of a run: a clean message and a meaningful exit code.

Outside the training loop a signal raises Interrupted (exit code 128 + the signal's
number, as a shell reports a process it killed); inside it, GracefulStop turns the first
signal into a request to save at the next step and stop (exit code 0), and a second one
into Interrupted at once.
"""

from __future__ import annotations

import contextlib
import signal
from collections.abc import Iterator
from types import FrameType

SIGNALS = (signal.SIGINT, signal.SIGTERM)


class Interrupted(BaseException):
    """A signal ended the run before it could save. A BaseException, as KeyboardInterrupt
    is, so that no `except Exception` on the way turns it into another error."""

    def __init__(self, signum: int) -> None:
        self.signal = signal.Signals(signum).name
        self.exit_code = 128 + signum
        self.detail = f"{self.signal}: stopped"  # what it leaves behind, when the run knows
        super().__init__(self.signal)

    def __str__(self) -> str:
        return self.detail


def _raise_interrupted(signum: int, frame: FrameType | None) -> None:
    raise Interrupted(signum)


@contextlib.contextmanager
def interrupts_raise() -> Iterator[None]:
    """While active, SIGINT and SIGTERM raise Interrupted (instead of KeyboardInterrupt
    or an instant death), so cleanups run; afterwards both are ignored, so a signal
    during interpreter shutdown cannot turn a finished run's exit code into a failure."""
    for sig in SIGNALS:
        signal.signal(sig, _raise_interrupted)
    try:
        yield
    finally:
        for sig in SIGNALS:
            signal.signal(sig, signal.SIG_IGN)


class GracefulStop:
    """While active, the first SIGINT or SIGTERM only sets `requested`; the
    training loop checks it after each step, saves a checkpoint and exits.
    A second signal raises Interrupted at once."""

    def __init__(self) -> None:
        self.requested: str | None = None
        self._previous = {}

    def __enter__(self) -> GracefulStop:
        for sig in SIGNALS:
            self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self.requested:
            raise Interrupted(signum)
        self.requested = signal.Signals(signum).name
