"""The report's downstream section: per arm, the tasks downstream.py scored on its runs'
final checkpoints (downstream.json), as the mean over seeds with its 95% interval and the
difference to the baseline with the loss's statistics (compare.difference), Holm-adjusted
across the arms of each task. A task enters when every baseline run has it; an arm's row
holds the runs that have it; each task shows the first metric of PRIMARY it has. Every
problem of every file is one error; task names are escaped for Markdown.
"""

from __future__ import annotations

import html
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ablation.compare import difference
from ablation.runs import Arm
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
        path = run.checkpoint.path / RESULTS
        try:
            tasks = read_results(run.checkpoint.path)
        except UserError as err:
            problems.append(str(err))
            continue
        except RecursionError:  # json's own limit, met before read_results can judge the file
            problems.append(
                f"{path} is nested too deeply to be a results file of downstream.py; delete it and evaluate the "
                "tasks again"
            )
            continue
        if fields := [f"[{json.dumps(task)}]{f} {why}" for task, e in tasks.items() for f, why in _entry_problems(e)]:
            problems.append(f"{path}: {', '.join(fields)}; mend the file, or delete it and evaluate the tasks again")
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


def partial_scores(arms: list[Arm], results: dict[Path, dict]) -> list[str]:
    """A line for each score left out because it was taken on part of its task (limit=)."""
    return [
        f"{markdown_text(run.path.name)}: {markdown_text(task)} was scored on "
        f"{'?' if entry.get('items') is None else format(entry['items'], ',')} items "
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
    # task -> metrics, of the tasks evaluated on every item (one taken with limit= is a quick look, not comparable)
    full = {
        run: {t: e["metrics"] for t, e in tasks.items() if e.get("limit") is None} for run, tasks in results.items()
    }
    by_arm = {id(arm): {run.seed: full[run.path] for run in arm.runs} for arm in arms}
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
        rows = [baseline] + [arm for arm in arms if arm is not baseline and values[id(arm)]]
        seeds = [list(values[id(arm)]) for arm in rows]
        scores = [list(values[id(arm)].values()) for arm in rows]
        comparisons = [None] + holm([difference(scores[0], seeds[0], v, s) for s, v in zip(seeds[1:], scores[1:])])
        tables[(task, metric)] = [TaskRow(a, s, mean_ci(v), c) for a, s, v, c in zip(rows, seeds, scores, comparisons)]
    return tables


def downstream_section(arms: list[Arm], baseline: Arm) -> str | None:
    """A table per task, or None when the baseline's runs have no downstream results."""
    results = checked_results(arms)
    tables, partial = task_rows(arms, baseline, results), partial_scores(arms, results)
    if not tables and not partial:
        return None
    lines = [
        "### Downstream tasks\n",
        "Scored by `python downstream.py` on each run's final checkpoint: mean and 95% confidence interval "
        "over seeds (Student t), and the difference to the baseline (paired t-test where the seeds match, "
        "Welch otherwise; Holm-adjusted across the arms). Accuracies are in percent.\n",
    ]
    for (task, metric), rows in tables.items():
        lines += [
            f"| arm | seeds | {markdown_text(task)} {metric} | vs baseline (95% CI) | p | Holm p |",
            "|---|---|---|---|---|---|",
        ]
        lines += [f"| {row.arm.label} | {', '.join(map(str, row.seeds))} | {_cells(row, metric)} |" for row in rows]
        lines.append("")
    lines += [f"- {line}" for line in partial]
    return "\n".join(lines).rstrip("\n")


def markdown_text(text: str) -> str:
    """`text` shown as itself in a Markdown table cell or list item: HTML escaped, `|` (which
    would end the cell), backslash and backtick as character references, control characters
    (a line break would end the table) as their Python escapes."""
    escaped = html.escape(text, quote=False).replace("|", "&#124;").replace("\\", "&#92;").replace("`", "&#96;")
    return "".join(repr(c)[1:-1] if not c.isprintable() else c for c in escaped)


def _cells(row: TaskRow, metric: str) -> str:
    """A row's value and comparison cells; accuracies in percent."""
    (scale, digits), e, c = (100.0, 2) if metric in PERCENT else (1.0, 4), row.value, row.comparison
    value = f"{e.mean * scale:.{digits}f}" + ("" if math.isnan(e.low) else f" ± {e.half_width * scale:.{digits}f}")
    if c is None:
        return f"{value} | baseline | |"
    d = c.difference
    interval = "no CI" if math.isnan(d.low) else f"{d.low * scale:+.{digits}f}..{d.high * scale:+.{digits}f}"
    return f"{value} | {d.mean * scale:+.{digits}f} ({interval}) | {p_value(c.p_value)} | {p_value(c.deciding_p)}"
