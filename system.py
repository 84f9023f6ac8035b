"""What every command shares with the operating system, each in one place: how it ends on an error
(`with exits(out_of_memory="lower batch_size"):` around main()'s body), how it takes a signal and how
it replaces a file. (Locks are the `filelock` package's.)"""

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
    """A signal ended the command; a BaseException, so no `except Exception` on the way turns it into another error."""

    def __init__(self, signum: int) -> None:
        self.signal, self.exit_code = signal.Signals(signum).name, 128 + signum
        self.detail = f"{self.signal}: interrupted"  # what it leaves behind, when the command knows
        super().__init__(self.signal)

    def __str__(self) -> str:
        return self.detail


@contextlib.contextmanager
def exits(*, out_of_memory: str | None = None, writing: str = "writing") -> Iterator[None]:
    """How a command ends: an error the user can act on (a UserError, ValueError, OSError naming its file, or running
    out of memory when `out_of_memory` says what to make smaller) is one line on stderr and exit code 1; a signal, its
    line and 128 + its number, as a shell has it; a closed pipe (`| head`) ends quietly. A bug keeps its traceback."""
    # Each stderr line in one write, even under python -u: the ranks of a torchrun job share one stderr,
    # and `sys.exit(message)` writes the message and its newline in two calls, between which another's lands.
    if isinstance(sys.stderr, io.TextIOWrapper):
        sys.stderr.reconfigure(line_buffering=True, write_through=False)
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
        if not out_of_memory or (message := describe_out_of_memory(err, out_of_memory)) is None:
            raise
        sys.exit(f"error: {message}")
    except Interrupted as stop:
        sys.stderr.write(f"\nerror: {stop}\n")  # one write, as above
        sys.exit(stop.exit_code)


def describe_out_of_memory(err: RuntimeError, advice: str) -> str | None:
    """One line for a failed allocation (CUDA's or the CPU allocator's), with `advice`; None for another error."""
    text = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
    torch = sys.modules.get("torch")  # not imported here: this module loads before it (see below)
    if (torch is not None and isinstance(err, torch.OutOfMemoryError)) or "can't allocate memory" in text:
        return f"out of memory ({text}): {advice}"
    return None


def quiet_interrupt_while_starting() -> None:
    """Call it first thing: a Ctrl-C while a command still imports (torch alone takes seconds, before exits()
    takes over) ends in one line, not a traceback; Python then ends by SIGINT, as a shell expects (130)."""
    default = sys.excepthook

    def hook(kind, value, traceback) -> None:
        if issubclass(kind, KeyboardInterrupt):
            print("\nerror: SIGINT: interrupted while starting; nothing was written", file=sys.stderr)
        else:
            default(kind, value, traceback)

    sys.excepthook = hook


@contextlib.contextmanager
def on_signals(handler: Callable[[int, FrameType | None], None]) -> Iterator[None]:
    """SIGINT and SIGTERM call `handler` while active, the previous ones after (in the main thread only)."""
    main = threading.current_thread() is threading.main_thread()
    previous = {sig: signal.signal(sig, handler) for sig in SIGNALS} if main else {}
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


def _raise_interrupted(signum: int, frame: FrameType | None) -> None:
    raise Interrupted(signum)


@contextlib.contextmanager
def interrupts_raise() -> Iterator[None]:
    """While active, SIGINT and SIGTERM raise Interrupted, so cleanups run; afterwards both are ignored, so
    a signal during interpreter shutdown cannot turn a finished command's exit code into a failure."""
    try:
        with on_signals(_raise_interrupted):
            yield
    finally:
        command_finished(every=True)


def command_finished(*, every: bool = False) -> None:
    """The command has done its work (or knows its last line): from here a signal is ignored, so nothing prints after
    it and the exit status stays (unless `every`, only interrupts_raise's handlers: a test keeps its own)."""
    if threading.current_thread() is threading.main_thread():
        for sig in SIGNALS:
            if every or signal.getsignal(sig) is _raise_interrupted:
                signal.signal(sig, signal.SIG_IGN)


class GracefulStop:
    """While active, the first SIGINT or SIGTERM only sets `requested` (the loop saves and stops); a second raises
    Interrupted. The `launcher` process (its id) ending requests a stop too: killed with -9, it passes no signal on."""

    def __init__(self, launcher: int | None = None) -> None:
        self._requested, self._launcher, self._signals = None, launcher, on_signals(self._handle)

    @property
    def requested(self) -> str | None:
        """What asked for the stop (a signal's name, or the launcher's end); None if nothing did."""
        if self._requested is None and self._launcher is not None and os.getppid() != self._launcher:
            self._requested = f"the launcher (process {self._launcher}) ended"
        return self._requested

    def __enter__(self) -> "GracefulStop":
        self._signals.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self._signals.__exit__(*exc)

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self._requested:
            raise Interrupted(signum)
        self._requested = signal.Signals(signum).name


def replace_atomically(path: Path, make: Callable[[Path], None]) -> None:
    """`make` writes the new file (or symlink) at a temporary path that then replaces `path` in one rename."""
    temp = temp_path(path)
    temp.unlink(missing_ok=True)
    make(temp)
    os.replace(temp, path)


def write_atomic(path: Path, text: str | bytes) -> None:
    data = text.encode("utf-8") if isinstance(text, str) else text
    replace_atomically(path, lambda temp: temp.write_bytes(data))


def temp_path(final: Path) -> Path:
    return final.with_name(f"{final.name}{TEMP_MARK}{os.getpid()}")


def replace_keeping_links_valid(final: Path, new: Path, links: list[Path], stale: Path) -> None:
    """Swap the complete directory `new` in for `final` (moved aside to `stale`, then deleted), every link
    in `links` leading to a complete one throughout: first `new`, then the new `final` (hard links to new's files)."""
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
