"""system.py: how every command ends, takes a signal and replaces a file."""

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from system import Interrupted, on_signals, replace_atomically, temp_path, write_atomic

REPO = Path(__file__).resolve().parents[1]

COMMAND = """
import sys
from system import UserError, exits
problem = sys.argv[1]
with exits(out_of_memory="lower batch_size", writing="the run"):
    print("started", flush=True)
    if problem == "user":
        raise UserError("a setting is wrong")
    if problem == "value":
        raise ValueError("a value is wrong")
    if problem == "disk":
        raise OSError(28, "No space left on device", "/runs/x/metrics.jsonl")
    if problem == "oom":
        raise RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried to allocate 9 bytes")
    if problem == "bug":
        raise RuntimeError("a bug")
    if problem == "pipe":
        raise BrokenPipeError(32, "Broken pipe")
    if problem == "signal":
        import os, signal, time
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(10)
print("finished")
"""


def run_command(problem: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", COMMAND, problem],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )


@pytest.mark.parametrize(
    "problem, code, line",
    [
        ("user", 1, "error: a setting is wrong"),
        ("value", 1, "error: a value is wrong"),
        ("disk", 1, "error: No space left on device (/runs/x/metrics.jsonl)"),
        (
            "oom",
            1,
            "error: out of memory (DefaultCPUAllocator: can't allocate memory: you tried to allocate 9 bytes): "
            "lower batch_size",
        ),
        ("signal", 128 + signal.SIGTERM, "error: SIGTERM: interrupted"),
        ("pipe", 0, ""),
    ],
)
def test_a_command_ends_with_one_line_and_the_exit_code_of_its_kind_of_ending(problem, code, line):
    result = run_command(problem)
    assert result.stdout == "started\n"
    assert (result.returncode, result.stderr.strip()) == (code, line)


def test_a_bug_keeps_its_traceback():
    result = run_command("bug")
    assert result.returncode == 1 and "Traceback" in result.stderr and "RuntimeError: a bug" in result.stderr


def test_on_signals_calls_the_handler_then_restores_the_previous_one():
    before = signal.getsignal(signal.SIGTERM)
    received = []
    with on_signals(lambda signum, frame: received.append(signum)):
        os.kill(os.getpid(), signal.SIGTERM)
    assert received == [signal.SIGTERM] and signal.getsignal(signal.SIGTERM) is before


def test_interrupted_names_the_signal_and_the_shells_exit_code():
    stop = Interrupted(signal.SIGINT)
    assert (str(stop), stop.exit_code) == ("SIGINT: interrupted", 130)


def test_an_atomic_write_replaces_the_file_whole_and_leaves_no_temporary_file(tmp_path):
    path = tmp_path / "meta.json"
    path.write_text("old")
    write_atomic(path, "néw\n")
    assert path.read_bytes() == "néw\n".encode() and os.listdir(tmp_path) == ["meta.json"]
    write_atomic(path, b"\x00\x01")
    assert path.read_bytes() == b"\x00\x01"


def test_a_write_that_fails_leaves_the_old_file_as_it_was(tmp_path):
    path = tmp_path / "progress.json"
    path.write_text("old")

    def half_then_fail(temp):
        temp.write_text("half")
        raise OSError(28, "No space left on device")

    with pytest.raises(OSError):
        replace_atomically(path, half_then_fail)
    assert path.read_text() == "old"
    assert temp_path(path).read_text() == "half"  # what the prepare step's cleanup removes (TEMP_MARK)


def test_a_symlink_is_swapped_in_one_rename(tmp_path):
    for name in ("step_1", "step_2"):
        (tmp_path / name).mkdir()
    link = tmp_path / "latest"
    replace_atomically(link, lambda temp: temp.symlink_to("step_1"))
    replace_atomically(link, lambda temp: temp.symlink_to("step_2"))
    assert os.readlink(link) == "step_2" and sorted(os.listdir(tmp_path)) == ["latest", "step_1", "step_2"]


def test_the_run_lock_holds_against_another_process(tmp_path):
    """filelock's lock, taken by another process, refuses this one with that process's id."""
    from run.run_dir import run_lock

    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            textwrap.dedent(f"""
        import sys, time
        from pathlib import Path
        from run.run_dir import run_lock
        with run_lock(Path({str(tmp_path)!r}), new_run=False):
            print("locked", flush=True)
            sys.stdin.readline()
    """),
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    try:
        assert holder.stdout.readline() == "locked\n"
        with pytest.raises(ValueError, match=f"process {holder.pid} is writing it"):
            with run_lock(tmp_path, new_run=False):
                pass
    finally:
        holder.communicate("\n", timeout=60)
    with run_lock(tmp_path, new_run=False):
        pass  # free once the holder has gone


INTERRUPTED_WHILE_IMPORTING = """
import runpy, sys

class CtrlCWhileTorchLoads:
    def find_spec(self, name, path=None, target=None):
        if name == "torch":
            raise KeyboardInterrupt

sys.meta_path.insert(0, CtrlCWhileTorchLoads())
sys.argv = [{train_py!r}]
runpy.run_path({train_py!r}, run_name="__main__")
"""


@pytest.mark.parametrize("command", ["train.py", "sample.py", "report.py", "export.py", "downstream.py"])
def test_ctrl_c_while_a_command_imports_torch_is_one_line_and_death_by_sigint(command):
    script = INTERRUPTED_WHILE_IMPORTING.format(train_py=str(REPO / command))
    result = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert result.stderr == "\nerror: SIGINT: interrupted while starting; nothing was written\n"
    assert result.returncode == -signal.SIGINT  # as Python ends on Ctrl-C: a shell reports 130


RECORDED_EXIT = """
import io, os, sys
from system import UserError, exits

class Recorder(io.RawIOBase):  # each write that would reach the file descriptor, on its own line
    def writable(self):
        return True

    def write(self, data):
        os.write(2, repr(bytes(data)).encode() + b"\\n")
        return len(data)

sys.stderr = io.TextIOWrapper(Recorder(), write_through=True, line_buffering=True)  # as under python -u
with exits():
    raise UserError("rank 1: stopped")
"""


def test_the_error_line_reaches_stderr_in_one_write_even_unbuffered():
    """Ranks share one stderr: a line written in two pieces can be split by another rank's."""
    result = subprocess.run(
        [sys.executable, "-c", RECORDED_EXIT],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO), "PYTHONUNBUFFERED": "1"},
    )
    assert (result.returncode, result.stderr.splitlines()) == (1, [repr(b"error: rank 1: stopped\n")])
