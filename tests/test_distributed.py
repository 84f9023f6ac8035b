"""DDP on the CPU: two gloo processes launched by torchrun, against one process."""

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from training.checkpoint import find_checkpoint, load_checkpoint
from training.logger import read_metrics

from conftest import training_overrides

REPO = Path(__file__).resolve().parents[1]
STEPS = ["max_iters=6", "eval_interval=3", "model.dropout=0.0"]


def train_command(*overrides, processes=1):
    launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={processes}"]
    return [*(launcher if processes > 1 else [sys.executable]), str(REPO / "train.py"), *overrides]


def run(command, cwd):
    result = subprocess.run(command, cwd=cwd, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    return result


def final_weights(run_dir):
    return load_checkpoint(find_checkpoint(run_dir, runs_root=run_dir.parent)).model_state


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """One process accumulating 2 micro-batches of 4, and 2 processes with 4 each:
    the same 8 sequences per step."""
    directory = tmp_path_factory.mktemp("ddp")
    overrides = training_overrides(directory)
    single = directory / "single"
    run(train_command(*overrides, *STEPS, "batch_size=4", "grad_accum_steps=2", f"out_dir={single}"), directory)
    ddp_root = directory / "ddp_runs"
    run(train_command(*overrides, *STEPS, "batch_size=4", f"runs_root={ddp_root}", processes=2), directory)
    return directory, overrides, single, ddp_root


def test_two_processes_leave_exactly_one_run_directory(runs):
    _, _, _, ddp_root = runs
    assert len(list(ddp_root.iterdir())) == 1  # not one per rank (hydra issue 2070)


def test_two_processes_train_the_same_weights_as_one_process_accumulating(runs):
    _, _, single, ddp_root = runs
    ddp = next(ddp_root.iterdir())
    single_state, ddp_state = final_weights(single), final_weights(ddp)
    assert single_state.keys() == ddp_state.keys()
    for name in single_state:
        torch.testing.assert_close(ddp_state[name], single_state[name], rtol=1e-5, atol=1e-6, msg=name)
    single_losses = [r["loss"] for r in read_metrics(single) if r["kind"] == "train"]
    ddp_losses = [r["loss"] for r in read_metrics(ddp) if r["kind"] == "train"]
    assert ddp_losses == pytest.approx(single_losses, rel=1e-5)
    assert len(ddp_losses) == 6


def test_checkpoints_move_between_ddp_and_one_process(runs):
    directory, overrides, single, ddp_root = runs
    ddp = next(ddp_root.iterdir())
    run(train_command(f"resume={ddp}", "max_iters=8"), directory)  # DDP checkpoint, one process
    run(train_command(f"resume={single}", "max_iters=8", processes=2), directory)  # and the other way
    for run_dir in (ddp, single):
        assert load_checkpoint(find_checkpoint(run_dir, runs_root=run_dir.parent)).training_state()["step"] == 8
