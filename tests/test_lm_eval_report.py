"""The report's downstream tables: hand-written downstream.json files under runs of three
arms, summed up against scipy's t distribution and t-tests and Holm's rule done by hand."""

import html
from dataclasses import asdict

import pytest
from scipy import stats

from ablation.downstream import downstream_section, task_rows
from ablation.runs import Arm, Run
from evaluation.results import write_results
from model import GPTConfig
from run.checkpoints import Checkpoint
from system import UserError

MHA = [0.300, 0.310, 0.305]  # acc_norm of seeds 1, 2, 3
MQA = [0.290, 0.296, 0.297]  # a planted loss of about one point, the same seeds
GQA = [0.303, 0.309, 0.301]  # seeds 1, 3 and 4: as many, but not the same ones: unpaired (Welch)


def arm(tmp_path, name, n_kv_head, seeds, accuracies, extra=None):
    runs = []
    for seed, accuracy in zip(seeds, accuracies):
        path = tmp_path / f"{name}_seed{seed}" / "checkpoints" / "step_000010"
        path.mkdir(parents=True)
        tasks = {"hellaswag": {"metrics": {"acc": accuracy - 0.02, "acc_norm": accuracy}}}
        if seed == seeds[0]:
            tasks.update(extra or {})
        write_results(path, tasks)
        model = asdict(GPTConfig(n_layer=1, n_head=4, n_kv_head=n_kv_head, n_embd=32, block_size=8, vocab_size=16))
        runs.append(Run(path.parent.parent, Checkpoint(path, {"model": model}, {}), {"seed": seed, "arm": name}, []))
    return Arm(name, runs)


@pytest.fixture
def arms(tmp_path):
    only_seed_1 = {"arc_easy": {"metrics": {"acc": 0.4}}}  # one baseline run of three has it: left out
    return [
        arm(tmp_path, "kv4", 4, [1, 2, 3], MHA, extra=only_seed_1),
        arm(tmp_path, "kv1", 1, [1, 2, 3], MQA),
        arm(tmp_path, "kv2", 2, [1, 3, 4], GQA),
    ]


def test_each_arm_gets_its_mean_interval_and_holm_adjusted_difference(arms):
    tables = task_rows(arms, arms[0])
    assert list(tables) == [("hellaswag", "acc_norm")]
    base, mqa, gqa = tables[("hellaswag", "acc_norm")]
    low, high = stats.t.interval(0.95, 2, loc=sum(MHA) / 3, scale=stats.sem(MHA))
    assert (base.value.mean, base.value.low, base.value.high) == pytest.approx((sum(MHA) / 3, low, high))
    paired = stats.ttest_rel(MQA, MHA)
    welch = stats.ttest_ind(GQA, MHA, equal_var=False)
    assert mqa.comparison.difference.mean == pytest.approx(sum(MQA) / 3 - sum(MHA) / 3)
    assert (mqa.comparison.p_value, gqa.comparison.p_value) == pytest.approx((paired.pvalue, welch.pvalue))
    smaller, larger = sorted([paired.pvalue, welch.pvalue])  # Holm: 2 x the smaller, the larger at least that
    adjusted = {smaller: min(1, 2 * smaller), larger: min(1, max(2 * smaller, larger))}
    assert mqa.comparison.p_adjusted == pytest.approx(adjusted[paired.pvalue])
    assert gqa.comparison.p_adjusted == pytest.approx(adjusted[welch.pvalue])
    assert gqa.seeds == [1, 3, 4] and gqa.comparison.test == "Welch t-test"


def test_the_section_shows_accuracies_in_percent(arms):
    section = downstream_section(arms, arms[0])
    mean, half = sum(MHA) / 3 * 100, (stats.t.ppf(0.975, 2) * stats.sem(MHA)) * 100
    assert f"| MHA (4 kv heads) | 1, 2, 3 | {mean:.2f} ± {half:.2f} | baseline | | |" in section
    assert f"| MQA (1 kv heads) | 1, 2, 3 | {sum(MQA) / 3 * 100:.2f} ± " in section
    assert "arc_easy" not in section and "| arm | seeds | hellaswag acc_norm |" in section


def table_cells(section: str) -> dict[str, dict[str, str]]:
    """arm label -> column name -> the cell's text, read from the printed table."""
    lines = [line for line in section.splitlines() if line.startswith("| ") and not line.startswith("|---")]
    split = [[cell.strip() for cell in line.strip().strip("|").split("|")] for line in lines]
    header, rows = split[0], split[1:]
    return {row[0]: dict(zip(header, row, strict=True)) for row in rows}


def test_the_printed_table_holds_each_p_value_and_its_holm_adjustment(arms):
    cells = table_cells(downstream_section(arms, arms[0]))
    paired = stats.ttest_rel(MQA, MHA).pvalue  # 0.026: the smaller of 2, so Holm doubles it
    welch = stats.ttest_ind(GQA, MHA, equal_var=False).pvalue  # 0.87: already above twice that
    mqa, gqa = cells["MQA (1 kv heads)"], cells["GQA (2 kv heads)"]
    assert float(mqa["p"]) == pytest.approx(paired, rel=0.05)  # printed to 2 significant digits
    assert float(mqa["Holm p"]) == pytest.approx(2 * paired, rel=0.05)
    assert float(gqa["p"]) == pytest.approx(welch, rel=0.05)
    assert float(gqa["Holm p"]) == pytest.approx(max(2 * paired, welch), rel=0.05)
    assert cells["MHA (4 kv heads)"]["p"] == cells["MHA (4 kv heads)"]["Holm p"] == ""


def test_no_section_without_results(tmp_path, arms):
    for run in arms[0].runs:
        (run.checkpoint.path / "downstream.json").unlink()
    assert downstream_section(arms, arms[0]) is None


@pytest.mark.parametrize(
    "value, problem",
    [
        ('"high"', 'is the string "high", not a number'),
        ('{"deep": {"er": [1]}}', "is an object, not a number"),
        ("NaN", "is NaN, not a finite number"),
        ("-Infinity", "is -Infinity, not a finite number"),
    ],
)
def test_a_metric_the_tables_cannot_use_is_named_with_its_file(arms, value, problem):
    path = arms[1].runs[1].checkpoint.path / "downstream.json"
    path.write_text(f'{{"hellaswag": {{"metrics": {{"acc_norm": {value}, "acc": 0.2}}}}}}')
    with pytest.raises(UserError) as refused:
        downstream_section(arms, arms[0])
    assert str(refused.value) == (
        f'{path}: ["hellaswag"]["metrics"]["acc_norm"] {problem}; mend the file, or '
        "delete it and evaluate the tasks again"
    )


def test_every_bad_results_file_is_named_at_once(arms):
    deep, counts = (run.checkpoint.path / "downstream.json" for run in (arms[0].runs[2], arms[2].runs[0]))
    deep.write_text('{"hellaswag": {"metrics": {"acc": ' + "[" * 100_000 + "]" * 100_000 + "}}}")
    counts.write_text('{"hellaswag": {"metrics": {"acc_norm": 0.3, "acc": true}, "limit": "all", "items": 2.5}}')
    with pytest.raises(UserError) as refused:
        downstream_section(arms, arms[0])
    assert str(refused.value) == (
        f"2 problems: {deep} is nested too deeply to be a results file of downstream.py; delete it and evaluate the "
        f'tasks again; {counts}: ["hellaswag"]["metrics"]["acc"] is true, not a number, ["hellaswag"]["limit"] is '
        'the string "all", not null or a whole number >= 1, ["hellaswag"]["items"] is 2.5, not null or a whole '
        "number >= 0; mend the file, or delete it and evaluate the tasks again"
    )
    assert "\n" not in str(refused.value)


def test_task_names_are_shown_as_written_without_breaking_the_table(arms):
    """A task file may name its task anything: a pipe would split a cell, a line break end the
    table, HTML render (or run) in the report's viewer."""
    task = 'ev|il\n<script>alert("x")</script> a\\|b `c`'
    for arm in arms:
        for run in arm.runs:
            write_results(
                run.checkpoint.path,
                {
                    task: {"metrics": {"acc": 0.5 + 0.01 * run.seed}},
                    f"{task} quick": {"metrics": {"acc": 1.0}, "limit": 2, "items": 2},
                },
            )
    section = downstream_section(arms, arms[0])
    table = [line for line in section.splitlines() if line.startswith("|")]
    assert len(table) == 2 * (2 + 3) and all(line.count("|") == 7 for line in table)  # this task's and hellaswag's
    assert "<" not in section and "`c`" not in section
    shown = task.replace("\n", "\\n")  # as its Python escape
    assert html.unescape(table[0].split("|")[3].strip()) == f"{shown} acc"
    partial = [line for line in section.splitlines() if "was scored on" in line]  # a line per run
    assert len(partial) == 9 and html.unescape(partial[0]).startswith(f"- kv4_seed1: {shown} quick was scored")
