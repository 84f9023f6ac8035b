"""The report's downstream section: per arm, the tasks that downstream.py scored on its
runs' final checkpoints (downstream.json beside each), as the mean over seeds with its
95% interval and the difference to the baseline, paired by seed where the seeds match,
with the loss's statistics (ablation/stats.py, through compare.difference) and Holm's
adjustment across the arms of each task.

A task enters when every baseline run has it; an arm's row holds the runs that have it.
Each task shows one metric, the first it has of PRIMARY: acc_norm for HellaSwag.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ablation.compare import difference
from ablation.runs import Arm
from ablation.stats import Comparison, Estimate, holm, mean_ci, p_value
from evaluation.results import read_results

# The figure a task is summed up by, in order of preference: normalised accuracy (HellaSwag,
# ARC), accuracy, exact match (generative tasks), bits per byte (perplexity tasks).
PRIMARY = ("acc_norm", "acc", "exact_match", "bits_per_byte")
PERCENT = ("acc_norm", "acc", "exact_match")  # fractions, shown in percent


@dataclass
class TaskRow:
    arm: Arm
    seeds: list[int]
    value: Estimate
    comparison: Comparison | None  # against the baseline; None for the baseline itself


def scores(arm: Arm) -> dict[int, dict[str, dict[str, float]]]:
    """seed -> task -> metrics, for the arm's runs that downstream.py evaluated on a task's
    every item (a score taken with limit= is a quick look, not comparable: left out)."""
    return {run.seed: {task: entry["metrics"] for task, entry in read_results(run.checkpoint.path).items()
                       if entry.get("limit") is None}
            for run in arm.runs}


def partial_scores(arms: list[Arm]) -> list[str]:
    """A line for each score left out because it was taken on part of its task (limit=)."""
    return [f"{run.path.name}: {task} was scored on {entry.get('items', '?')} items (limit={entry['limit']}); "
            f"left out: score it again without limit to compare it"
            for arm in arms for run in arm.runs
            for task, entry in read_results(run.checkpoint.path).items() if entry.get("limit") is not None]


def task_rows(arms: list[Arm], baseline: Arm) -> dict[tuple[str, str], list[TaskRow]]:
    """(task, metric) -> a row per arm that has the task, the baseline first."""
    by_arm = {id(arm): scores(arm) for arm in arms}
    base = by_arm[id(baseline)]
    common = set.intersection(*(set(tasks) for tasks in base.values())) if base else set()
    tables = {}
    for task in sorted(common):
        metric = next((m for m in PRIMARY if all(m in tasks[task] for tasks in base.values())), None)
        if metric is None:
            continue
        values = {id(arm): {seed: tasks[task][metric] for seed, tasks in by_arm[id(arm)].items()
                            if metric in tasks.get(task, {})} for arm in arms}
        tables[(task, metric)] = _rows(arms, baseline, values)
    return tables


def _rows(arms: list[Arm], baseline: Arm, values: dict[int, dict[int, float]]) -> list[TaskRow]:
    base = values[id(baseline)]
    others = [arm for arm in arms if arm is not baseline and values[id(arm)]]
    comparisons = holm([difference(list(base.values()), list(base), list(values[id(arm)].values()),
                                   list(values[id(arm)])) for arm in others])
    rows = [TaskRow(baseline, list(base), mean_ci(list(base.values())), None)]
    return rows + [TaskRow(arm, list(values[id(arm)]), mean_ci(list(values[id(arm)].values())), comparison)
                   for arm, comparison in zip(others, comparisons)]


def downstream_section(arms: list[Arm], baseline: Arm) -> str | None:
    """A table per task, or None when the baseline's runs have no downstream results."""
    tables, partial = task_rows(arms, baseline), partial_scores(arms)
    if not tables and not partial:
        return None
    lines = ["### Downstream tasks", "",
             "Scored by `python downstream.py` on each run's final checkpoint: mean and 95% confidence interval "
             "over seeds (Student t), and the difference to the baseline (paired t-test where the seeds match, "
             "Welch otherwise; Holm-adjusted across the arms). Accuracies are in percent.", ""]
    for (task, metric), rows in tables.items():
        lines += [f"| arm | seeds | {task} {metric} | vs baseline (95% CI) | p | Holm p |", "|---|---|---|---|---|---|"]
        for row in rows:
            lines.append(f"| {row.arm.label} | {', '.join(map(str, row.seeds))} | {_value(row.value, metric)} | "
                         f"{_difference(row.comparison, metric)} |")
        lines.append("")
    lines += [f"- {line}" for line in partial]
    return "\n".join(lines).rstrip("\n")


def _scale(metric: str) -> tuple[float, str]:
    return (100.0, "{:.2f}") if metric in PERCENT else (1.0, "{:.4f}")


def _value(e: Estimate, metric: str) -> str:
    scale, fmt = _scale(metric)
    return fmt.format(e.mean * scale) + ("" if math.isnan(e.low) else " ± " + fmt.format(e.half_width * scale))


def _difference(c: Comparison | None, metric: str) -> str:
    if c is None:
        return "baseline | |"
    scale, fmt = _scale(metric)
    signed = fmt.replace("{:", "{:+")
    d = c.difference
    interval = "no CI" if math.isnan(d.low) else f"{signed.format(d.low * scale)}..{signed.format(d.high * scale)}"
    return f"{signed.format(d.mean * scale)} ({interval}) | {p_value(c.p_value)} | {p_value(c.deciding_p)}"
