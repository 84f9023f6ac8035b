"""Score a checkpoint on downstream tasks with EleutherAI's lm-evaluation-harness.

    python downstream.py checkpoint=runs/<run> 'tasks=[hellaswag]'             # 10,042 items: a GPU's job
    python downstream.py checkpoint=runs/<run> 'tasks=[hellaswag,arc_easy]' limit=200
    python downstream.py checkpoint=runs/<run> include_path=my_tasks 'tasks=[my_task]'

The work is evaluation/downstream.py's: each task's figures go to downstream.json in the
checkpoint's directory, where report.py reads them. The harness is the optional `eval` extra.
"""

from __future__ import annotations

import sys

from system import quiet_interrupt_while_starting

if __name__ == "__main__":  # before the imports below: torch alone takes seconds
    quiet_interrupt_while_starting()

import hydra
from omegaconf import DictConfig

from conf.cli import check_overrides, options_first
from conf.downstream_config import DownstreamConfig, load_downstream_config
from evaluation.downstream import evaluate
from system import exits


@hydra.main(config_path="conf", config_name="downstream", version_base=None)
def main(cfg: DictConfig) -> None:
    with exits(out_of_memory="lower batch_size, or the activations' memory with precision=bf16"):
        config = load_downstream_config(cfg)
        print(f"results: {evaluate(config)}")


if __name__ == "__main__":
    sys.argv[1:] = options_first(sys.argv[1:])
    check_overrides(sys.argv[1:], DownstreamConfig, "downstream")
    main()
