"""Faults around a run's signals and its first checkpoint: a signal at every phase (in
the loop, before the first checkpoint, during the first save, after the run's last line),
the launcher's end, and a run that dies before its first checkpoint or its config. Each
ends in one message that says what is intact and what to do, and loses nothing.

Damaged run files and directories: test_faults_run_files.py; full disks and faults
across ranks: test_faults_writes.py."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

import train
from conf import CONF_DIR
from data import DataError
from run import checkpoints as ckpt
from run import checkpoints as manager
from run.checkpoints import CheckpointError
from run.metrics import read_metrics
from run.run_dir import resolve_resume
from system import GracefulStop, Interrupted, interrupts_raise

REPO = Path(__file__).resolve().parents[1]


def composed(*overrides):
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base=None):
        return compose(config_name="train", overrides=list(overrides))


def train_cli(*args, cwd, processes=1):
    launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={processes}"]
    command = [*(launcher if processes > 1 else [sys.executable]), str(REPO / "train.py"), *args]
    return subprocess.run(command, cwd=cwd, capture_output=True, text=True, timeout=180)


def steps_logged(run_dir):
    return [(r["kind"], r["step"]) for r in read_metrics(run_dir)]


@pytest.fixture(autouse=True)
def restore_signal_handlers():
    saved = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    yield
    for sig, handler in saved.items():
        signal.signal(sig, handler)


def test_a_second_signal_in_the_loop_interrupts_at_once_with_the_shells_exit_code():
    with GracefulStop() as stop:
        os.kill(os.getpid(), signal.SIGINT)
        assert stop.requested == "SIGINT"  # the first only asks the loop to save and stop
        with pytest.raises(Interrupted) as second:
            os.kill(os.getpid(), signal.SIGTERM)
    assert (second.value.signal, second.value.exit_code) == ("SIGTERM", 128 + signal.SIGTERM)


def test_outside_the_loop_a_signal_raises_and_after_the_run_signals_are_ignored():
    with interrupts_raise():
        with pytest.raises(Interrupted, match="SIGINT"):
            os.kill(os.getpid(), signal.SIGINT)
        try:
            {}["missing"]
        except Exception:  # an `except Exception` on the way does not swallow it
            with pytest.raises(Interrupted):
                os.kill(os.getpid(), signal.SIGTERM)
    # interpreter shutdown after a finished run: a late signal cannot change the exit code
    assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN and signal.getsignal(signal.SIGTERM) is signal.SIG_IGN


def test_a_signal_before_the_first_checkpoint_leaves_a_run_that_resume_starts_afresh(train_overrides, tmp_path):
    run_dir = tmp_path / "run"
    # A long step-0 evaluation: the signal lands after config.yaml, before the loop.
    process = subprocess.Popen(
        [sys.executable, str(REPO / "train.py"), *train_overrides, "eval_iters=3000", f"out_dir={run_dir}"],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    while not (run_dir / "config.yaml").exists():
        assert process.poll() is None, process.communicate()
        time.sleep(0.02)
    process.send_signal(signal.SIGTERM)
    stdout, stderr = process.communicate(timeout=60)
    assert process.returncode == 128 + signal.SIGTERM, stdout + stderr
    assert f"error: SIGTERM: stopped before the first checkpoint; resume={run_dir} starts the run afresh" in stderr
    assert "Traceback" not in stderr and not ckpt.has_checkpoint(run_dir)

    resumed = train_cli(f"resume={run_dir}", "eval_iters=2", "max_iters=4", "eval_interval=2", cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr
    assert f"{run_dir} held a run that stopped before its first checkpoint: starting it afresh" in resumed.stdout
    assert steps_logged(run_dir) == [
        ("eval", 0),
        ("train", 1),
        ("train", 2),
        ("eval", 2),
        ("train", 3),
        ("train", 4),
        ("eval", 4),
    ]  # one run's log, not two
    again = train_cli(*train_overrides, f"out_dir={run_dir}", cwd=tmp_path)
    assert again.returncode == 1 and f"error: {run_dir} already holds a run; pass resume={run_dir}" in again.stderr


def test_a_new_run_takes_over_a_directory_whose_run_failed_before_its_first_checkpoint(
    train_overrides, tmp_path, monkeypatch
):
    run_dir = tmp_path / "run"
    with pytest.raises(DataError, match="batch_size"):  # fails before its first step
        train.train(composed(*train_overrides, "batch_size=200000", f"out_dir={run_dir}"))
    monkeypatch.setattr(train, "train_step", lambda *args, **kwargs: 1 / 0)
    with pytest.raises(ZeroDivisionError):  # fails after logging its step-0 evaluation
        train.train(composed(*train_overrides, "batch_size=3", f"out_dir={run_dir}"))
    assert steps_logged(run_dir) == [("eval", 0)] and not ckpt.has_checkpoint(run_dir)
    monkeypatch.undo()
    train.train(composed(*train_overrides, "max_iters=2", "eval_interval=2", f"out_dir={run_dir}"))
    assert steps_logged(run_dir) == [("eval", 0), ("train", 1), ("train", 2), ("eval", 2)]  # one run's log
    assert "batch_size: 4" in (run_dir / "config.yaml").read_text()  # the new run's settings


@pytest.mark.parametrize("max_iters", [4, 2])  # the first save past step 0 mid-run, or the run's last
def test_a_signal_that_cuts_the_first_save_short_says_what_resume_then_does(
    train_overrides, tmp_path, monkeypatch, max_iters
):
    """Ctrl-C twice just after the first evaluation past step 0: its record is logged, its save cut short."""
    run_dir = tmp_path / "run"

    def second_signal(*args, **kwargs):
        raise Interrupted(signal.SIGINT)

    monkeypatch.setattr(manager, "save_file", second_signal)
    with pytest.raises(Interrupted) as stop:
        train.train(composed(*train_overrides, f"max_iters={max_iters}", "eval_interval=2", f"out_dir={run_dir}"))
    monkeypatch.undo()
    assert steps_logged(run_dir)[-1] == ("eval", 2) and not ckpt.has_checkpoint(run_dir)
    if max_iters == 4:  # the log cannot be a finished run's: resume starts it afresh, as it said
        assert str(stop.value) == f"SIGINT: stopped before the first checkpoint; resume={run_dir} starts the run afresh"
        train.train(composed(f"resume={run_dir}"))
        assert steps_logged(run_dir) == [
            ("eval", 0),
            ("train", 1),
            ("train", 2),
            ("eval", 2),
            ("train", 3),
            ("train", 4),
            ("eval", 4),
        ]  # one run's log, not two
    else:  # the log reads as a finished run whose checkpoints were deleted: resume refuses, as it said
        assert str(stop.value) == (
            f"SIGINT: no checkpoint is left, and its metrics.jsonl reads as a run that saved "
            f"one, so resume={run_dir} refuses it: train into another out_dir, or delete "
            f"{run_dir} to run it again there"
        )
        with pytest.raises(ValueError, match="held a run that saved checkpoints .* and they are gone"):
            train.train(composed(f"resume={run_dir}"))


def test_resume_of_a_run_killed_before_its_config_says_so_and_a_new_run_takes_it_over(train_overrides, tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / ".lock").touch()  # what a kill -9 between the lock and config.yaml leaves (a long prepare)
    (run_dir / ".lock.pid").write_text("4242\n")
    with pytest.raises(CheckpointError) as refused:
        resolve_resume(composed(f"resume={run_dir}"))
    assert str(refused.value) == (
        f"{run_dir} holds a run that stopped before it wrote its config.yaml (only its .lock "
        f"is there): nothing was saved to resume; run the original command with "
        f"out_dir={run_dir} to start it there afresh, or delete the directory"
    )
    train.train(composed(*train_overrides, "max_iters=1", f"out_dir={run_dir}"))  # the way on it names
    assert steps_logged(run_dir) == [("eval", 0), ("train", 1), ("eval", 1)]


def test_a_signal_after_the_runs_last_line_prints_nothing_and_changes_nothing(train_overrides, monkeypatch, capsys):
    """The run is complete once it has said where its checkpoint is: a late SIGINT (in
    the cleanup after it, where tqdm's finalizer once printed `Exception ignored ...
    Interrupted`) must neither print nor turn into an interrupted run."""
    real_shutdown = train.shutdown

    def signalled_during_cleanup(ranks):
        os.kill(os.getpid(), signal.SIGINT)
        real_shutdown(ranks)

    monkeypatch.setattr(train, "shutdown", signalled_during_cleanup)
    with interrupts_raise():  # the handlers of a command (train.py's main)
        run_dir = train.train(composed(*train_overrides, "max_iters=2", "eval_interval=2"))
    out, err = capsys.readouterr()
    assert out.endswith(f"sample from it: python sample.py checkpoint={run_dir}\n")
    assert "Interrupted" not in err and "Exception ignored" not in err


def test_the_launchers_end_asks_the_loop_to_stop_and_a_live_launcher_does_not():
    with GracefulStop(launcher=os.getppid()) as alive:
        assert alive.requested is None
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    with GracefulStop(launcher=int(gone.stdout)) as orphaned:  # not our parent: as if it had died
        assert orphaned.requested == f"the launcher (process {gone.stdout.strip()}) ended"
