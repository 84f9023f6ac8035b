"""What a Hydra sweep (`python train.py -m ...`) says when it ends: where its runs are,
and the command that reports on them, as a single run ends with its sample.py command."""

from __future__ import annotations

from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig


class SweepSummary(Callback):
    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        directory = config.hydra.sweep.dir
        print(f"sweep: {directory}\nreport on it: python report.py {directory}\n"
              f"sample from its newest run: python sample.py runs_root={directory}", flush=True)
