"""How a sweep ends: an estimate sweep (`train.py -m estimate=true`) writes nothing, so it leaves
no sweep directory and names no report.py command (a sweep of runs does both: tests/test_train.py);
under torchrun only rank 0 says it."""

import subprocess
import sys

from omegaconf import OmegaConf

from conftest import training_overrides
from test_train import REPO
from training.sweep import SweepSummary


def sweep(tmp_path, *overrides):
    settings = [o for o in training_overrides(tmp_path) if not o.startswith("max_iters=")]
    return subprocess.run(
        [
            sys.executable,
            str(REPO / "train.py"),
            "-m",
            *settings,
            "max_iters=4",
            "eval_interval=4",
            f"hydra.sweep.dir={tmp_path / 'sweep'}",
            *overrides,
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_an_estimate_sweep_leaves_no_directory_and_names_no_report(tmp_path):
    done = sweep(tmp_path, "estimate=true", "estimate_steps=1", "seed=1,2")
    assert done.returncode == 0, done.stderr
    assert done.stdout.count("estimate:") == 2 and "report.py" not in done.stdout
    assert not (tmp_path / "sweep").exists()


def test_under_torchrun_only_rank_0_ends_the_sweep_with_its_lines(tmp_path, monkeypatch, capsys):
    config = OmegaConf.create({"estimate": False, "hydra": {"sweep": {"dir": str(tmp_path)}}})
    monkeypatch.setenv("RANK", "1")
    SweepSummary().on_multirun_end(config)
    assert capsys.readouterr().out == ""
    monkeypatch.setenv("RANK", "0")
    SweepSummary().on_multirun_end(config)
    assert f"report on it: python report.py {tmp_path}" in capsys.readouterr().out
