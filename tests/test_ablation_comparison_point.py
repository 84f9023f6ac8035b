"""Which tokens each ablation arm is compared with the baseline at (ablation/compare.py,
docs/ablation.md): a plain or tokens_per_param arm at the baseline's final tokens, a
match_mha_flops arm at its own final evaluation, where it has spent the baseline's
training FLOPs.

Runs are written by hand: each arm's losses at the right comparison point and at the
wrong one differ from the baseline's by known, opposite amounts, so the paired
difference and the verdict say which point was used. Reference: the per-seed
differences worked out here, and scipy's paired t-test on them.
"""

from dataclasses import asdict
from pathlib import Path

import pytest
from scipy import stats

from ablation.compare import EQUAL_FLOPS, EQUAL_TOKENS, baseline_of, results
from ablation.runs import Arm, Run
from conftest import tiny_config
from run.checkpoints import Checkpoint

SEEDS = [1, 2, 3, 4]
BASELINE = [3.00, 3.10, 2.95, 3.05]  # the MHA baseline's val loss at its end, 1000 tokens, per seed
BASELINE_TOKENS = 1000


def arm(name, n_kv_head, losses_at, **settings):
    """An arm of one run per seed; losses_at maps tokens to each seed's offset from BASELINE."""
    config = {"model": asdict(tiny_config(n_kv_head=n_kv_head))}
    runs = []
    for i, seed in enumerate(SEEDS):
        evals = [
            {
                "kind": "eval",
                "step": tokens // 100,
                "tokens": tokens,
                "val_loss": BASELINE[i] + offsets[i],
                "val_windows": 16,
            }
            for tokens, offsets in sorted(losses_at.items())
        ]
        path = Path(f"sweep/{name}_seed{seed}")
        runs.append(
            Run(
                path,
                Checkpoint(path / "checkpoints" / "latest", config, {}),
                {"seed": seed, "arm": name, **settings},
                evals,
            )
        )
    return Arm(name, runs)


# Per-seed offsets from the baseline: worse where compared, better elsewhere (and the other way round).
WORSE = [0.10, 0.12, 0.11, 0.09]  # mean +0.105
BETTER = [-0.30, -0.28, -0.31, -0.29]  # mean -0.295
SLIGHTLY_BETTER = [-0.05, -0.06, -0.04, -0.05]  # mean -0.05


@pytest.fixture(scope="module")
def rows():
    arms = [
        arm("kv4", 4, {0: [8.0] * 4, BASELINE_TOKENS: [0.0] * 4}),
        # Trains twice as long: compared at 1000 tokens (worse), not at its end (better).
        arm("kv1_long", 1, {BASELINE_TOKENS: WORSE, 2 * BASELINE_TOKENS: BETTER}),
        # tokens_per_param gives every layout of the shape the MHA shape's tokens: the same end.
        arm("kv2_tpp", 2, {BASELINE_TOKENS // 2: BETTER, BASELINE_TOKENS: WORSE}, tokens_per_param=4.0),
        # Spends MHA's training FLOPs by 1300 tokens: compared there (slightly better), not at 1000 (worse).
        arm("kv1_flops", 1, {BASELINE_TOKENS: WORSE, 1300: SLIGHTLY_BETTER}, match_mha_flops=True),
    ]
    baseline = baseline_of(arms, None)
    assert baseline.name == "kv4"
    return {row.arm.name: row for row in results(arms, baseline)}


@pytest.mark.parametrize(
    "name, tokens, axis, offsets, conclusion",
    [
        ("kv1_long", BASELINE_TOKENS, EQUAL_TOKENS, WORSE, "worse"),
        ("kv2_tpp", BASELINE_TOKENS, EQUAL_TOKENS, WORSE, "worse"),
        ("kv1_flops", 1300, EQUAL_FLOPS, SLIGHTLY_BETTER, "better"),
    ],
)
def test_each_arm_is_compared_at_its_comparison_point(rows, name, tokens, axis, offsets, conclusion):
    row = rows[name]
    assert (row.tokens, row.axis) == (tokens, axis)
    arm_losses = [b + d for b, d in zip(BASELINE, offsets)]
    assert row.val_loss.mean == pytest.approx(sum(arm_losses) / len(SEEDS), abs=1e-12)
    difference = row.comparison.difference
    assert difference.mean == pytest.approx(sum(offsets) / len(SEEDS), abs=1e-12)
    assert row.comparison.p_value == pytest.approx(stats.ttest_rel(arm_losses, BASELINE).pvalue, rel=1e-9)
    assert row.comparison.family == 3 and row.comparison.p_adjusted < 0.05
    assert row.verdict.startswith(f"{row.arm.label} vs MHA (4 kv heads): {difference.mean:+.3f} nats (95% CI ")
    assert row.verdict.endswith(f", paired t-test, 4 seeds): {conclusion}")


def test_the_baseline_row_is_its_own_end_with_nothing_to_compare(rows):
    row = rows["kv4"]
    assert (row.tokens, row.axis, row.comparison, row.verdict) == (BASELINE_TOKENS, EQUAL_TOKENS, None, None)
    assert row.val_loss.mean == pytest.approx(sum(BASELINE) / len(SEEDS))
