"""Downstream tasks at the end of every run of a sweep, so report.py shows them beside the
loss: a Hydra callback an experiment names (conf/experiment/attention_ablation_gpt2.yaml:
hydra.callbacks.downstream._target_: evaluation.after_training.DownstreamAfterTraining).
It evaluates the latest checkpoint of the run the job wrote, on the run's device, in rank 0
alone. A failure costs no training: a warning with the command that evaluates it later.
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

        if (run := job_return.return_value) is None:  # the directory train.py wrote (None for max_iters=0)
            return
        try:
            evaluate(
                DownstreamConfig(checkpoint=run, runs_root=config.runs_root, device=config.device, **self.settings)
            )
        except (UserError, ValueError, OSError) as err:
            include = f" include_path={self.settings['include_path']}" if self.settings["include_path"] else ""
            later = f"python downstream.py checkpoint={run}{include} 'tasks=[{','.join(self.settings['tasks'])}]'"
            message = f"warning: the downstream tasks were not evaluated: {err}\nevaluate them later: {later}"
            print(message, file=sys.stderr, flush=True)
