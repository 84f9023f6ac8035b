"""What a Hydra sweep (`python train.py -m ...`) says when it ends: where its runs are,
and the command that reports on them, as a single run ends with its sample.py command."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig

HYDRA_RECORD = "multirun.yaml"  # what Hydra writes into every sweep directory


class SweepSummary(Callback):
    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        if os.environ.get("RANK", "0") != "0":  # under torchrun every process ends the sweep: rank 0 speaks
            return
        directory = config.hydra.sweep.dir
        if config.get("estimate"):  # each job printed its estimate and wrote nothing: no sweep to report on
            _remove_if_only_hydras(Path(directory))
            return
        print(
            f"sweep: {directory}\nreport on it: python report.py {directory}\n"
            f"sample from its newest run: python sample.py runs_root={directory}",
            flush=True,
        )


def _remove_if_only_hydras(directory: Path) -> None:
    """Delete the sweep directory when it holds only multirun.yaml and the jobs' empty directories."""
    files = [path for path in directory.rglob("*") if not path.is_dir()]
    if directory.is_dir() and all(path == directory / HYDRA_RECORD for path in files):
        shutil.rmtree(directory)
