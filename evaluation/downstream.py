"""Score a checkpoint on downstream tasks (downstream.py's and the after-training callback's
work): the checkpoint as the harness's `gptlab` model (lm.py), lm_eval.simple_evaluate, the
harness's table printed, each task's figures into downstream.json (results.py)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from conf.downstream_config import DownstreamConfig
from evaluation import NO_HARNESS
from evaluation.results import write_results
from system import UserError


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
    c = config
    model = GptlabLM(
        c.checkpoint, c.runs_root, c.device, precision=c.precision, weights=c.weights, batch_size=c.batch_size
    )
    print(f"evaluating {model.checkpoint.path} on {', '.join(config.tasks)}", file=sys.stderr)
    tasks = TaskManager(include_path=config.include_path)
    if missing := [name for name in config.tasks if name not in tasks.all_tasks]:
        where = f"the harness or {config.include_path}" if config.include_path else "the harness"
        raise UserError(
            f"tasks {missing} are not tasks of {where}: `lm_eval ls tasks` lists them; "
            "a task file of your own needs include_path=DIR"
        )
    result = lm_eval.simple_evaluate(
        model=model, tasks=list(config.tasks), num_fewshot=config.num_fewshot, limit=config.limit, task_manager=tasks
    )
    print(make_table(result))
    return write_results(model.checkpoint.path, task_results(result, config))


def task_results(result: dict[str, Any], config: DownstreamConfig) -> dict[str, dict[str, Any]]:
    """Per task: its metrics (the harness's `acc,none` is `acc`), its item count and how it was run."""
    return {
        task: {
            "metrics": {
                k.removesuffix(",none"): v for k, v in figures.items() if "," in k and isinstance(v, (int, float))
            },
            "items": result["n-samples"].get(task, {}).get("effective"),
            "num_fewshot": result["n-shot"].get(task),
            "limit": config.limit,
        }
        for task, figures in result["results"].items()
    }
