"""Score a checkpoint on downstream tasks with EleutherAI's lm-evaluation-harness.

    python downstream.py checkpoint=runs/<run> 'tasks=[hellaswag]'             # 10,042 items: a GPU's job
    python downstream.py checkpoint=runs/<run> 'tasks=[hellaswag,arc_easy]' limit=200
    python downstream.py checkpoint=runs/<run> include_path=my_tasks 'tasks=[my_task]'

The story: check the settings, load the checkpoint as the harness's `gptlab` model
(evaluation/lm.py, which loads it as sample.py does), run lm_eval.simple_evaluate on the
tasks, print the harness's table, and write each task's figures to downstream.json in the
checkpoint's directory, beside the tasks evaluated there before (a task evaluated again
replaces its entry); the ablation report reads them from there. The harness is the
optional `eval` extra: pip install -e ".[eval]".
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from system import quiet_interrupt_while_starting

if __name__ == "__main__":  # before the imports below: torch alone takes seconds
    quiet_interrupt_while_starting()

import hydra
from omegaconf import DictConfig

from conf.cli import check_overrides, options_first
from conf.downstream_config import DownstreamConfig, load_downstream_config
from evaluation import NO_HARNESS
from evaluation.results import write_results
from system import UserError, exits


@hydra.main(config_path="conf", config_name="downstream", version_base=None)
def main(cfg: DictConfig) -> None:
    with exits(out_of_memory="lower batch_size, or the activations' memory with dtype=bf16"):
        config = load_downstream_config(cfg)
        print(f"results: {evaluate(config)}")


def evaluate(config: DownstreamConfig) -> Path:
    """Run config.tasks on the checkpoint; returns the results file it wrote."""
    try:
        import lm_eval
        from lm_eval.tasks import TaskManager
        from lm_eval.utils import make_table
    except ImportError as err:
        raise UserError(NO_HARNESS) from err
    from evaluation.lm import GptlabLM
    from evaluation.tasks import check_include_path

    if config.include_path:  # before the model loads: the harness would only say its tasks are not found
        check_include_path(config.include_path, "include_path=")
    model = GptlabLM(checkpoint=config.checkpoint, runs_root=config.runs_root, device=config.device,
                     dtype=config.dtype, weights=config.weights, batch_size=config.batch_size)
    print(f"evaluating {model.checkpoint.path} on {', '.join(config.tasks)}", file=sys.stderr)
    tasks = TaskManager(include_path=config.include_path)
    missing = [name for name in config.tasks if name not in tasks.all_tasks]
    if missing:
        where = f"the harness or {config.include_path}" if config.include_path else "the harness"
        raise UserError(f"tasks {missing} are not tasks of {where}: `lm_eval ls tasks` lists them; "
                        "a task file of your own needs include_path=DIR")
    result = lm_eval.simple_evaluate(model=model, tasks=list(config.tasks), num_fewshot=config.num_fewshot,
                                     limit=config.limit, task_manager=tasks)
    print(make_table(result))
    return write_results(model.checkpoint.path, task_results(result, config))


def task_results(result: dict[str, Any], config: DownstreamConfig) -> dict[str, dict[str, Any]]:
    """Per task: its metrics (the harness's `acc,none` is `acc`), its item count and how it was run."""
    tasks = {}
    for task, figures in result["results"].items():
        metrics = {key.removesuffix(",none"): value for key, value in figures.items()
                   if "," in key and isinstance(value, (int, float))}
        tasks[task] = {"metrics": metrics, "items": result["n-samples"].get(task, {}).get("effective"),
                       "num_fewshot": result["n-shot"].get(task), "limit": config.limit}
    return tasks


if __name__ == "__main__":
    sys.argv[1:] = options_first(sys.argv[1:])
    check_overrides(sys.argv[1:], DownstreamConfig, "downstream")
    main()
