"""The report's downstream section: per arm, the tasks that downstream.py scored on its
runs' final checkpoints (downstream.json beside each), as the mean over seeds with its
95% interval and the difference to the baseline, paired by seed where the seeds match,
with the loss's statistics (ablation/stats.py, through compare.difference) and Holm's
adjustment across the arms of each task.

A task enters when every baseline run has it; an arm's row holds the runs that have it.
Each task shows one metric, the first it has of PRIMARY: acc_norm for HellaSwag. The
files are checked as they are read (every problem of every file in one error), and task
names are escaped for Markdown, since a task file may name its task anything.
"""

from __future__ import annotations

import html
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ablation.compare import difference
from ablation.runs import Arm, Run
from ablation.stats import Comparison, Estimate, holm, mean_ci, p_value
from evaluation.results import RESULTS, read_results
from system import UserError

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


def checked_results(arms: list[Arm]) -> dict[Path, dict[str, dict[str, Any]]]:
    """Each run's downstream.json (by run directory), checked for what the tables read:
    one UserError names every problem, in every file."""
    found, problems = {}, []
    for run in (run for arm in arms for run in arm.runs):
        try:
            tasks = read_results(run.checkpoint.path)
        except UserError as err:
            problems.append(str(err))
            continue
        except RecursionError:  # json's own limit, met before read_results can judge the file
            problems.append(
                f"{run.checkpoint.path / RESULTS} is nested too deeply to be a results file of "
                "downstream.py; delete it and evaluate the tasks again"
            )
            continue
        fields = [
            f"[{json.dumps(task)}]{field} {why}"
            for task, entry in tasks.items()
            for field, why in _entry_problems(entry)
        ]
        if fields:
            problems.append(
                f"{run.checkpoint.path / RESULTS}: {', '.join(fields)}; mend the file, or delete it and "
                "evaluate the tasks again"
            )
        found[run.path] = tasks
    if problems:
        raise UserError(problems[0] if len(problems) == 1 else f"{len(problems)} problems: {'; '.join(problems)}")
    return found


def _entry_problems(entry: dict) -> list[tuple[str, str]]:
    """(field, what is wrong) for one task's entry: metrics are numbers, finite where the
    tables read them; limit and items are counts or null."""
    problems = []
    for metric, value in entry["metrics"].items():
        field = f'["metrics"][{json.dumps(metric)}]'
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            problems.append((field, f"is {_kind(value)}, not a number"))
        elif metric in PRIMARY and not math.isfinite(value):
            problems.append((field, f"is {json.dumps(value)}, not a finite number"))
    for key, least in (("limit", 1), ("items", 0)):
        value = entry.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < least):
            problems.append((f'["{key}"]', f"is {_kind(value)}, not null or a whole number >= {least}"))
    return problems


def _kind(value: Any) -> str:
    if isinstance(value, str):
        return f"the string {json.dumps(value[:40] + ('...' if len(value) > 40 else ''))}"
    return {dict: "an object", list: "an array"}.get(type(value)) or json.dumps(value)


def _count(items: int | None) -> str:
    return "?" if items is None else f"{items:,}"


def _scores(run: Run, results: dict[Path, dict]) -> dict[str, dict[str, float]]:
    """task -> metrics, for the tasks downstream.py evaluated on every item (a score taken
    with limit= is a quick look, not comparable: left out)."""
    return {task: entry["metrics"] for task, entry in results[run.path].items() if entry.get("limit") is None}


def partial_scores(arms: list[Arm], results: dict[Path, dict]) -> list[str]:
    """A line for each score left out because it was taken on part of its task (limit=)."""
    return [
        f"{markdown_text(run.path.name)}: {markdown_text(task)} was scored on {_count(entry.get('items'))} items "
        f"(limit={entry['limit']}); left out: score it again without limit to compare it"
        for arm in arms
        for run in arm.runs
        for task, entry in results[run.path].items()
        if entry.get("limit") is not None
    ]


def task_rows(
    arms: list[Arm], baseline: Arm, results: dict[Path, dict] | None = None
) -> dict[tuple[str, str], list[TaskRow]]:
    """(task, metric) -> a row per arm that has the task, the baseline first; `results`
    as checked_results(arms) returns them (read here when not given)."""
    results = checked_results(arms) if results is None else results
    by_arm = {id(arm): {run.seed: _scores(run, results) for run in arm.runs} for arm in arms}
    base = by_arm[id(baseline)]
    common = set.intersection(*(set(tasks) for tasks in base.values())) if base else set()
    tables = {}
    for task in sorted(common):
        metric = next((m for m in PRIMARY if all(m in tasks[task] for tasks in base.values())), None)
        if metric is None:
            continue
        values = {
            id(arm): {
                seed: tasks[task][metric] for seed, tasks in by_arm[id(arm)].items() if metric in tasks.get(task, {})
            }
            for arm in arms
        }
        tables[(task, metric)] = _rows(arms, baseline, values)
    return tables


def _rows(arms: list[Arm], baseline: Arm, values: dict[int, dict[int, float]]) -> list[TaskRow]:
    base = values[id(baseline)]
    others = [arm for arm in arms if arm is not baseline and values[id(arm)]]
    comparisons = holm(
        [
            difference(list(base.values()), list(base), list(values[id(arm)].values()), list(values[id(arm)]))
            for arm in others
        ]
    )
    rows = [TaskRow(baseline, list(base), mean_ci(list(base.values())), None)]
    return rows + [
        TaskRow(arm, list(values[id(arm)]), mean_ci(list(values[id(arm)].values())), comparison)
        for arm, comparison in zip(others, comparisons)
    ]


def downstream_section(arms: list[Arm], baseline: Arm) -> str | None:
    """A table per task, or None when the baseline's runs have no downstream results."""
    results = checked_results(arms)
    tables, partial = task_rows(arms, baseline, results), partial_scores(arms, results)
    if not tables and not partial:
        return None
    lines = [
        "### Downstream tasks",
        "",
        "Scored by `python downstream.py` on each run's final checkpoint: mean and 95% confidence interval "
        "over seeds (Student t), and the difference to the baseline (paired t-test where the seeds match, "
        "Welch otherwise; Holm-adjusted across the arms). Accuracies are in percent.",
        "",
    ]
    for (task, metric), rows in tables.items():
        lines += [
            f"| arm | seeds | {markdown_text(task)} {metric} | vs baseline (95% CI) | p | Holm p |",
            "|---|---|---|---|---|---|",
        ]
        for row in rows:
            lines.append(
                f"| {row.arm.label} | {', '.join(map(str, row.seeds))} | {_value(row.value, metric)} | "
                f"{_difference(row.comparison, metric)} |"
            )
        lines.append("")
    lines += [f"- {line}" for line in partial]
    return "\n".join(lines).rstrip("\n")


def markdown_text(text: str) -> str:
    """`text` shown as itself in a Markdown table cell or list item: HTML escaped, `|` (which
    would end the cell), backslash and backtick as character references, control characters
    (a line break would end the table) as their Python escapes."""
    escaped = html.escape(text, quote=False).replace("|", "&#124;").replace("\\", "&#92;").replace("`", "&#96;")
    return "".join(repr(c)[1:-1] if not c.isprintable() else c for c in escaped)


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
