"""What every command (train.py, sample.py, report.py, export.py, prepare.py) shares
with the operating system: how it ends on an error, how it takes a signal and how it
replaces a file, each in one place. (Locks are the `filelock` package's.)

    with exits(out_of_memory="lower batch_size"):  # the body of a command's main()
        ...
"""

from __future__ import annotations

import contextlib
import io
import os
import shutil
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from types import FrameType

SIGNALS = (signal.SIGINT, signal.SIGTERM)
TEMP_MARK = ".tmp-"  # a file being replaced is written as <name>.tmp-<pid> first


class UserError(Exception):
    """A problem with the user's settings, data or files; its message says what and how to fix it."""


class Interrupted(BaseException):
    """A signal ended the command before it could finish. A BaseException, as KeyboardInterrupt
    is, so that no `except Exception` on the way turns it into another error."""

    def __init__(self, signum: int) -> None:
        self.signal = signal.Signals(signum).name
        self.exit_code = 128 + signum
        self.detail = f"{self.signal}: interrupted"  # what it leaves behind, when the command knows
        super().__init__(self.signal)

    def __str__(self) -> str:
        return self.detail


@contextlib.contextmanager
def exits(*, out_of_memory: str | None = None, writing: str = "writing") -> Iterator[None]:
    """How a command ends: an error the user can act on (a UserError, a ValueError, an
    OSError naming its file, or running out of memory when `out_of_memory` says what to
    make smaller) is one line on stderr and exit code 1; a signal is its line and 128 +
    its number, as a shell reports a process it killed; a reader that closed the pipe
    (`| head`) ends it quietly. Anything else is a bug and keeps its traceback."""
    write_whole_lines(sys.stderr)
    try:
        with interrupts_raise():
            yield
    except BrokenPipeError:  # not an error of ours; no second one when stdout is flushed at exit
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    except (UserError, ValueError) as err:
        sys.exit(f"error: {err}")
    except OSError as err:  # a full disk or a vanished directory, named
        where = err.filename or (writing if err.errno else None)  # errno-less: a library's own message
        sys.exit(f"error: {err.strerror or err}" + (f" ({where})" if where else ""))
    except RuntimeError as err:
        message = describe_out_of_memory(err, out_of_memory) if out_of_memory else None
        if message is None:
            raise
        sys.exit(f"error: {message}")
    except Interrupted as stop:
        sys.stderr.write(f"\nerror: {stop}\n")  # one write: see write_whole_lines
        sys.exit(stop.exit_code)


def write_whole_lines(stream: object) -> None:
    """Have each line written to `stream` reach its file in one write, even under python -u
    or PYTHONUNBUFFERED: the ranks of a torchrun job share one stderr, and `sys.exit(message)`
    writes the message and its newline in two calls, between which another rank's line lands."""
    if isinstance(stream, io.TextIOWrapper):
        stream.reconfigure(line_buffering=True, write_through=False)


def describe_out_of_memory(err: RuntimeError, advice: str) -> str | None:
    """One line for an allocation that failed (CUDA's OutOfMemoryError, or the CPU
    allocator's RuntimeError), with `advice` on what to make smaller; None for any other error."""
    text = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
    torch = sys.modules.get("torch")  # not imported here: this module loads before it (see below)
    if (torch is not None and isinstance(err, torch.OutOfMemoryError)) or "can't allocate memory" in text:
        return f"out of memory ({text}): {advice}"
    return None


def quiet_interrupt_while_starting() -> None:
    """A Ctrl-C while a command still imports its modules (torch alone takes seconds, before
    exits() can take over) ends in one line instead of a KeyboardInterrupt traceback; Python
    then ends the process by SIGINT, as a shell expects (status 130). Call it first thing."""
    default = sys.excepthook

    def hook(kind, value, traceback) -> None:
        if issubclass(kind, KeyboardInterrupt):
            print("\nerror: SIGINT: interrupted while starting; nothing was written", file=sys.stderr)
        else:
            default(kind, value, traceback)

    sys.excepthook = hook


@contextlib.contextmanager
def on_signals(handler: Callable[[int, FrameType | None], None]) -> Iterator[None]:
    """SIGINT and SIGTERM call `handler` while active; the previous handlers come back
    after. Only the main thread may handle signals: elsewhere this changes nothing."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {sig: signal.signal(sig, handler) for sig in SIGNALS}
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


def _raise_interrupted(signum: int, frame: FrameType | None) -> None:
    raise Interrupted(signum)


@contextlib.contextmanager
def interrupts_raise() -> Iterator[None]:
    """While active, SIGINT and SIGTERM raise Interrupted (instead of KeyboardInterrupt
    or an instant death), so cleanups run; afterwards both are ignored, so a signal
    during interpreter shutdown cannot turn a finished command's exit code into a failure."""
    try:
        with on_signals(_raise_interrupted):
            yield
    finally:
        if threading.current_thread() is threading.main_thread():
            for sig in SIGNALS:
                signal.signal(sig, signal.SIG_IGN)


def command_finished() -> None:
    """The command has done its work (or is ending with its last line known): from here a
    signal is ignored, so nothing prints after that line (not even from an object's
    finalizer) and the exit status stays. Only the handlers interrupts_raise installed are
    replaced: a caller from Python (a test) keeps its own."""
    if threading.current_thread() is threading.main_thread():
        for sig in SIGNALS:
            if signal.getsignal(sig) is _raise_interrupted:
                signal.signal(sig, signal.SIG_IGN)


class GracefulStop:
    """While active, the first SIGINT or SIGTERM only sets `requested` (the training
    loop checks it after each step, saves and stops); a second one raises Interrupted.
    With a `launcher` (its process id), that process ending requests a stop too: a
    launcher killed with -9 cannot pass a signal on, and its workers must not train on."""

    def __init__(self, launcher: int | None = None) -> None:
        self._requested: str | None = None
        self._launcher = launcher
        self._signals = on_signals(self._handle)

    @property
    def requested(self) -> str | None:
        """What asked for the stop (a signal's name, or the launcher's end); None if nothing did."""
        if self._requested is None and self._launcher is not None and os.getppid() != self._launcher:
            self._requested = f"the launcher (process {self._launcher}) ended"
        return self._requested

    def __enter__(self) -> GracefulStop:
        self._signals.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self._signals.__exit__(*exc)

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self._requested:
            raise Interrupted(signum)
        self._requested = signal.Signals(signum).name


def replace_atomically(path: Path, make: Callable[[Path], None]) -> None:
    """`make` writes the new file (or symlink) at a temporary path next to `path`, which then
    takes its place in one rename: a reader sees the old or the new one, never a part."""
    temp = temp_path(path)
    temp.unlink(missing_ok=True)
    make(temp)
    os.replace(temp, path)


def write_atomic(path: Path, text: str | bytes) -> None:
    """Replace the file at `path` with `text` (UTF-8) or bytes, atomically."""
    data = text.encode("utf-8") if isinstance(text, str) else text
    replace_atomically(path, lambda temp: temp.write_bytes(data))


def temp_path(final: Path) -> Path:
    """Where a file is written before it is renamed to `final`."""
    return final.with_name(f"{final.name}{TEMP_MARK}{os.getpid()}")


def replace_keeping_links_valid(final: Path, new: Path, links: list[Path], stale: Path) -> None:
    """Swap the complete directory `new` in for `final` (moved aside to `stale`, then deleted)
    so that every link in `links` always leads to a complete one: first to `new`, then to the
    new `final` (hard links to new's files, so nothing is copied)."""
    for link in links:
        point_link(link, new)
    final.rename(stale)
    shutil.copytree(new, final, copy_function=_link_or_copy)
    for path in final.iterdir():
        fsync(path)
    fsync(final.parent)
    for link in links:
        point_link(link, final)
    shutil.rmtree(stale)
    shutil.rmtree(new)


def _link_or_copy(source: str, destination: str) -> None:
    try:
        os.link(source, destination)
    except OSError:  # a filesystem without hard links
        shutil.copy2(source, destination)


def point_link(link: Path, target: Path) -> None:
    """Atomically make `link` a relative symlink to `target`."""
    replace_atomically(link, lambda temp: temp.symlink_to(target.name))


def fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
