"""Faults under torchrun: a rank that refuses, a rank or a launcher killed with -9. No rank
waits on one that ended, none trains on without its launcher, and each ends in one line."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from run.checkpoints import Checkpoints

REPO = Path(__file__).resolve().parents[1]
LAUNCH = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", str(REPO / "train.py")]
# Long enough that only a stop ends the run; every step a boundary, a checkpoint every 2.
UNTIL_STOPPED = ["max_iters=100000", "eval_interval=2", "logging.log_interval=1"]


def launch(overrides, cwd):
    """torchrun in a session of its own, as under `setsid`."""
    return subprocess.Popen(
        [*LAUNCH, *overrides],
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


def wait_for_steps(process, run_dir, steps):
    metrics = run_dir / "metrics.jsonl"
    while not metrics.exists() or sum('"kind": "train"' in line for line in metrics.read_text().splitlines()) < steps:
        assert process.poll() is None, process.communicate()
        time.sleep(0.05)


def ranks_of(launcher_pid):
    """{rank: pid} of the launcher's children (Linux's /proc)."""
    found = {}
    for entry in Path("/proc").iterdir():
        try:
            parent = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            environment = (entry / "environ").read_bytes().split(b"\0") if parent == launcher_pid else []
        except (OSError, ValueError, IndexError):
            continue
        for variable in environment:
            if variable.startswith(b"RANK="):
                found[int(variable[5:])] = int(entry.name)
    return found


def end_all(process, pids):
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    process.kill()
    process.communicate()


def killed_while_training(overrides, tmp_path, victim):
    """A 2-process run into tmp_path/run, its launcher or one rank killed with -9 once both
    ranks have trained 3 steps; returns the launcher's pid and what the run printed."""
    run_dir = tmp_path / "run"
    process = launch([*overrides, *UNTIL_STOPPED, f"out_dir={run_dir}"], tmp_path)
    ranks = {}
    try:
        wait_for_steps(process, run_dir, 3)
        ranks = ranks_of(process.pid)
        assert sorted(ranks) == [0, 1]
        os.kill(process.pid if victim == "launcher" else ranks[victim], signal.SIGKILL)
        stdout, stderr = process.communicate(timeout=120)  # the pipes close once every rank has ended
    finally:
        end_all(process, ranks.values())
    return process.pid, stdout, stderr


@pytest.mark.skipif(sys.platform != "linux", reason="reads /proc")
def test_ranks_whose_launcher_was_killed_save_at_the_next_boundary_and_stop(train_overrides, tmp_path):
    launcher, stdout, stderr = killed_while_training(train_overrides, tmp_path, "launcher")  # the ranks hear no signal
    run_dir = tmp_path / "run"
    checkpoint = Checkpoints(run_dir).latest()
    step = int(checkpoint.name.split("_")[1])
    assert 3 <= step < 100000
    assert stdout.splitlines()[-4:] == [
        f"the launcher (process {launcher}) ended: saved {checkpoint} and stopped at step {step}",
        f"checkpoint: {checkpoint}",
        f"sample from it: python sample.py checkpoint={run_dir}",
        f"stopped cleanly at step {step} of 100000: resume={run_dir} continues it",
    ], stderr


@pytest.mark.skipif(sys.platform != "linux", reason="reads /proc")
def test_a_rank_killed_leaves_one_line_on_the_other_naming_it_and_the_intact_checkpoint(train_overrides, tmp_path):
    _, _, stderr = killed_while_training(train_overrides, tmp_path, 1)
    run_dir = tmp_path / "run"
    ours = [line for line in stderr.splitlines() if line.startswith("error:")]
    assert ours == [
        f"error: rank 0: lost rank 1 (killed, or failed with its own line), so this rank stopped too; "
        f"the last good checkpoint {Checkpoints(run_dir).latest()} is intact, and resume={run_dir} "
        "continues from it"
    ], stderr
    assert "Connection closed by peer" not in stderr and 'train.py", line' not in stderr  # no gloo traceback


def test_every_rank_ends_in_one_line_when_rank_0_refuses_the_run(train_overrides, tmp_path):
    run_dir = tmp_path / "run"
    (run_dir / "checkpoints" / "step_000001").mkdir(parents=True)
    for name in ("config.yaml", "checkpoints/step_000001/model.safetensors", "checkpoints/step_000001/config.yaml"):
        (run_dir / name).write_text("")  # a run with a checkpoint: out_dir refuses it
    result = subprocess.run(
        [*LAUNCH, *train_overrides, "max_iters=1", f"out_dir={run_dir}"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=180,
    )
    ours = sorted(line for line in result.stderr.splitlines() if line.startswith("error:"))
    assert ours == [
        f"error: {run_dir} already holds a run; pass resume={run_dir} to continue it",
        "error: rank 1: stopped, rank 0 refused the run (its line says why)",
    ], result.stderr
    assert "broadcast" not in result.stderr and 'train.py", line' not in result.stderr
