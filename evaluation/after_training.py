"""Downstream tasks at the end of every run of a sweep: a Hydra callback that an experiment
names, so that each final checkpoint has its downstream.json when the sweep ends and
report.py shows the tasks beside the loss (conf/experiment/attention_ablation_gpt2.yaml):

    hydra:
      callbacks:
        downstream:
          _target_: evaluation.after_training.DownstreamAfterTraining
          tasks: [hellaswag]

It runs downstream.py's evaluation (evaluation/downstream.py) on the latest checkpoint of
the run the job wrote, on the run's device, in rank 0 alone (under torchrun the other
ranks end). A failure (the harness not installed, a task's data out of reach) costs no
training: it is a warning with the command that evaluates the run later.
"""

from __future__ import annotations

import os
import sys
from typing import Any

from hydra.core.utils import JobReturn, JobStatus
from hydra.experimental.callback import Callback
from omegaconf import DictConfig

from system import UserError


class DownstreamAfterTraining(Callback):
    def __init__(self, tasks: list[str], batch_size: int = 8, include_path: str | None = None) -> None:
        self.settings = {"tasks": list(tasks), "batch_size": batch_size, "include_path": include_path}

    def on_job_end(self, config: DictConfig, job_return: JobReturn, **kwargs: Any) -> None:
        if job_return.status != JobStatus.COMPLETED or os.environ.get("RANK", "0") != "0":
            return
        from conf.downstream_config import DownstreamConfig  # imported here: train.py starts without them
        from evaluation.downstream import evaluate

        run = job_return.return_value  # the directory train.py wrote (None for max_iters=0)
        if run is None:
            return
        try:
            evaluate(
                DownstreamConfig(checkpoint=run, runs_root=config.runs_root, device=config.device, **self.settings)
            )
        except (UserError, ValueError, OSError) as err:
            include = f" include_path={self.settings['include_path']}" if self.settings["include_path"] else ""
            print(
                f"warning: the downstream tasks were not evaluated: {err}\n"
                f"evaluate them later: python downstream.py checkpoint={run}{include} "
                f"'tasks=[{','.join(self.settings['tasks'])}]'",
                file=sys.stderr,
                flush=True,
            )
