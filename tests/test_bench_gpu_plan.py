"""bench/gpu_plan.py: the GPU ablation's seeds come from a power computation that
simulated t-tests confirm, and its cost from GPT-2 small's FLOPs counted by hand."""

import json
import math

import numpy as np
import pytest
from scipy import stats

from ablation.stats import power, seeds_for
from bench import gpu_plan as plan


def simulated_power(effect: float, sd: float, n: int, trials: int = 20_000) -> float:
    """How often scipy's one-sample t-test on n paired differences, drawn around `effect`, rejects 0 at 5%."""
    differences = np.random.default_rng(46).normal(effect, sd, size=(trials, n))
    return float(np.mean(stats.ttest_1samp(differences, 0.0, axis=1).pvalue < 0.05))


def test_the_seeds_are_the_fewest_that_detect_one_halving_of_the_kv_heads_80_percent_of_the_time():
    halving = plan.seeds_table(plan.NOISE_NATS, 0.0, 4.5, 12, 2)[0]
    sd = math.sqrt(2) * plan.NOISE_NATS
    assert halving["nats"] == 0.003 * math.log(2) * 4.5  # bits per byte to nats per token
    n = seeds_for(halving["nats"], sd)
    assert n == halving["seeds"] == 3
    for seeds in (n - 1, n):  # 43% with 2 seeds, 98% with 3
        expected = power(halving["nats"], sd / math.sqrt(seeds), seeds - 1)
        assert simulated_power(halving["nats"], sd, seeds) == pytest.approx(expected, abs=0.015)
    assert (
        power(halving["nats"], sd / math.sqrt(n - 1), n - 2) < 0.8 <= power(halving["nats"], sd / math.sqrt(n), n - 1)
    )


def test_the_experiment_runs_the_seeds_its_plan_computes():
    arms, seeds = plan.arms_and_seeds()
    table = plan.seeds_table(plan.NOISE_NATS, 0.0, 4.5, arms[0].n_head, len(arms) - 1)
    assert [arm.n_kv_head for arm in arms] == [12, 4, 1]
    assert len(seeds) == max(row["seeds_holm"] for row in table)


def test_the_cost_is_gpt2_smalls_flops_counted_by_hand():
    arms, _ = plan.arms_and_seeds()
    d, layers, context, vocab = 768, 12, 1024, 50304  # GPT-2 small, its vocabulary padded to 64
    per_layer = 12 * d * d + 13 * d  # qkv, proj and the MLP's two matrices with biases; two LayerNorms
    matmul_params = layers * per_layer + 2 * d + vocab * d  # + the final LayerNorm and the tied table
    mha = arms[0]
    assert mha.flops_per_token == 6 * matmul_params + 12 * layers * d * context
    assert mha.tokens == 4000 * 524288
    smaller = 2 * (d - d // 12) * (d + 1) * layers  # MQA: K and V project to one head of 64, not 12
    assert arms[2].flops_per_token == mha.flops_per_token - 6 * smaller
    (h100,) = [row for row in plan.cost(arms, 3, 0.4, 10) if row["gpu"] == "H100 SXM"]
    steps_hours = 3 * sum(a.flops_per_token * a.tokens for a in arms) / (989e12 * 0.4) / 3600
    assert h100["hours_1"] == steps_hours + 9 * 10 / 60 and h100["hours_8"] == steps_hours / 8 + 9 * 10 / 60


def test_the_command_prints_the_tables_and_records_them(tmp_path, capsys):
    plan.main(["--json", str(tmp_path / "plan.json")])
    printed = capsys.readouterr().out
    assert "| MQA vs MHA (0.02 nats) | 0.0200 | 3 | 3 |" in printed and "| H100 SXM |" in printed
    record = json.loads((tmp_path / "plan.json").read_text())
    assert record["seeds"] == [1, 2, 3] and {"machine", "gptlab"} <= set(record["provenance"])
    plan.main(["--experiment", "gpt2_fineweb", "--json", str(tmp_path / "one.json")])
    (arm,) = json.loads((tmp_path / "one.json").read_text())["arms"]
    assert arm["n_kv_head"] == 12 and arm["tokens"] == 19073 * 524288
