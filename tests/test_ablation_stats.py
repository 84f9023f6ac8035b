"""ablation.stats against references it does not share code with: printed t tables,
arithmetic done by hand, published power tables, and simulation."""

from __future__ import annotations

import math
import random
import statistics

import pytest

from ablation import stats
from ablation.stats import (
    PAIRED,
    Comparison,
    Estimate,
    detectable_effect,
    holm,
    mean_ci,
    paired_difference,
    power,
    seeds_needed,
    verdict,
    welch_difference,
)

# t_{0.975} from printed tables of Student's t (two-sided 5%).
T_TABLE = {2: 4.302652730, 3: 3.182446305, 4: 2.776445105, 9: 2.262157163}


def test_mean_ci_by_hand():
    # [1, 2, 3]: mean 2, sd 1 (n - 1), se 1/sqrt(3); t_{0.975, 2} = 4.302652730 -> 2 ± 2.484137712
    estimate = mean_ci([1, 2, 3])
    assert (estimate.mean, estimate.n) == (2.0, 3)
    assert estimate.half_width == pytest.approx(4.302652730 / math.sqrt(3), abs=1e-9)
    assert (estimate.low, estimate.high) == pytest.approx((2 - 2.484137712, 2 + 2.484137712), abs=1e-9)
    one = mean_ci([3.5])
    assert one.mean == 3.5 and math.isnan(one.low) and math.isnan(one.high) and math.isnan(one.half_width)
    with pytest.raises(ValueError):
        mean_ci([])


def test_paired_difference_by_hand():
    # differences 0.01, 0.03, 0.02: mean 0.02, deviations -0.01, +0.01, 0 -> sd = sqrt(0.0002 / 2) = 0.01;
    # se = 0.01 / sqrt(3) = 0.005773503, t = 0.02 / se = 2 sqrt(3) = 3.464102 with df = 2;
    # CI 0.02 ± 4.302652730 * se = 0.02 ± 0.024841377 = [-0.004841377, 0.044841377];
    # two-sided p for df = 2 is 1 - t / sqrt(2 + t^2) = 1 - sqrt(12/14) = 0.074179900.
    comparison = paired_difference([3.00, 3.10, 3.20], [3.01, 3.13, 3.22])
    difference = comparison.difference
    assert (comparison.test, comparison.df, difference.n) == ("paired t-test", 2.0, 3)
    assert difference.mean == pytest.approx(0.02, abs=1e-12)
    assert (difference.low, difference.high) == pytest.approx((-0.004841377, 0.044841377), abs=1e-9)
    assert comparison.p_value == pytest.approx(1 - math.sqrt(6 / 7), abs=1e-9)


def test_welch_difference_by_hand():
    # baseline [1, 2, 3], arm [3, 4, 5]: means 2 and 4, variances 1 and 1, so each mean's
    # squared se is 1/3; se = sqrt(2/3) = 0.816497, t = 2 / se = sqrt(6) = 2.449490;
    # df = (1/3 + 1/3)^2 / ((1/3)^2 / 2 + (1/3)^2 / 2) = (4/9) / (1/9) = 4;
    # CI 2 ± 2.776445105 * 0.816497 = 2 ± 2.266957935; for df = 4 the cdf is
    # 1/2 + (3/8) u (1 - t^2 / (12 (1 + t^2/4))) with u = t / sqrt(1 + t^2/4) = sqrt(2.4),
    # = 1/2 + 0.3 sqrt(2.4), so the two-sided p = 1 - 0.6 sqrt(2.4) = 0.070483997.
    comparison = welch_difference([1.0, 2.0, 3.0], [3.0, 4.0, 5.0])
    difference = comparison.difference
    assert comparison.test == "Welch t-test" and comparison.df == pytest.approx(4.0, abs=1e-12)
    assert (difference.mean, difference.n) == (2.0, 6)
    assert (difference.low, difference.high) == pytest.approx((2 - 2.266957935, 2 + 2.266957935), abs=1e-9)
    assert comparison.p_value == pytest.approx(1 - 0.6 * math.sqrt(2.4), abs=1e-9)


def test_welch_degrees_of_freedom_with_unequal_variances():
    # baseline [1, 2, 3]: squared se 1/3; arm [2, 4, 6, 8]: variance 20/3, squared se 5/3;
    # se = sqrt(2), df = 2^2 / ((1/3)^2 / 2 + (5/3)^2 / 3) = 4 / (53/54) = 216/53.
    comparison = welch_difference([1.0, 2.0, 3.0], [2.0, 4.0, 6.0, 8.0])
    assert comparison.df == pytest.approx(216 / 53, rel=1e-12)
    assert comparison.difference.mean == 3.0
    assert comparison.se == pytest.approx(math.sqrt(2), rel=1e-12) and comparison.sd == pytest.approx(
        math.sqrt(1 + 20 / 3)
    )
    quantile = comparison.difference.half_width / math.sqrt(2)  # t_{0.975} at df = 4.08: between df 4 and 5
    assert 2.570581836 < quantile < T_TABLE[4]


def random_arms(rng: random.Random, n_baseline: int, n_arm: int) -> tuple[list[float], list[float]]:
    """Losses around 3 nats whose true difference is sometimes clear and sometimes not."""
    shift = rng.uniform(-0.03, 0.03)
    baseline = [rng.gauss(3.0, 0.02) for _ in range(n_baseline)]
    arm = [rng.gauss(3.0 + shift, rng.choice((0.005, 0.02, 0.05))) for _ in range(n_arm)]
    return baseline, arm


def test_the_interval_excludes_zero_exactly_when_p_is_below_5_percent():
    rng = random.Random(0)
    outcomes = set()
    for _ in range(150):
        n = rng.randint(2, 8)
        baseline, arm = random_arms(rng, n, n)
        paired = paired_difference(baseline, [b + a - 3.0 for b, a in zip(baseline, arm)])
        welch = welch_difference(*random_arms(rng, rng.randint(2, 8), rng.randint(2, 8)))
        for comparison in (paired, welch):
            excludes_zero = comparison.difference.low > 0 or comparison.difference.high < 0
            assert excludes_zero == (comparison.p_value < 0.05)
            outcomes.add(excludes_zero)
    assert outcomes == {True, False}  # both sides of the boundary were exercised


def test_constant_differences_have_an_interval_of_width_zero():
    same = paired_difference([3.0, 3.1, 3.2], [3.0, 3.1, 3.2])
    assert (same.difference.low, same.difference.high, same.p_value) == (0.0, 0.0, 1.0)
    shifted = paired_difference([1.0, 2.0, 3.0], [1.5, 2.5, 3.5])
    assert (shifted.difference.low, shifted.difference.mean, shifted.difference.high) == (0.5, 0.5, 0.5)
    assert (shifted.p_value, shifted.df) == (0.0, 2.0)
    welch_same = welch_difference([2.0, 2.0], [2.0, 2.0, 2.0])
    assert (welch_same.difference.low, welch_same.difference.high, welch_same.p_value) == (0.0, 0.0, 1.0)
    assert math.isnan(welch_same.df)
    welch_shifted = welch_difference([2.0, 2.0], [2.5, 2.5])
    assert (welch_shifted.difference.low, welch_shifted.difference.high, welch_shifted.p_value) == (0.5, 0.5, 0.0)


def test_too_few_seeds_give_no_interval_and_no_p():
    for comparison in (paired_difference([3.0], [3.021]), welch_difference([3.0], [3.0, 3.1])):
        assert math.isnan(comparison.p_value) and math.isnan(comparison.df)
        assert math.isnan(comparison.difference.low) and math.isnan(comparison.difference.high)
    assert paired_difference([3.0], [3.021]).difference.mean == pytest.approx(0.021, abs=1e-12)
    with pytest.raises(ValueError):
        paired_difference([3.0, 3.1], [3.0])
    with pytest.raises(ValueError):
        paired_difference([], [])
    with pytest.raises(ValueError):
        welch_difference([], [3.0, 3.1])


@pytest.mark.parametrize("df, value", T_TABLE.items())
def test_intervals_use_the_printed_t_quantile(df, value):
    n = df + 1
    values = [float(i) for i in range(n)]  # sd of 0..n-1 is sqrt(n (n + 1) / 12)
    expected = value * math.sqrt(n * (n + 1) / 12) / math.sqrt(n)
    assert mean_ci(values).half_width == pytest.approx(expected, rel=1e-9)
    assert paired_difference([0.0] * n, values).difference.half_width == pytest.approx(expected, rel=1e-9)


def test_holm_by_hand():
    # p = 0.01, 0.04, 0.03, untested: m = 3; sorted 0.01 x 3 = 0.03, 0.03 x 2 = 0.06, 0.04 x 1 = 0.04 -> 0.06
    ps = [0.01, 0.04, 0.03, math.nan]
    adjusted = holm([Comparison(Estimate(0, 0, 0, 3), p, PAIRED, 2.0, 3, 3, 1.0, 1.0) for p in ps])
    assert [c.p_adjusted for c in adjusted[:3]] == pytest.approx([0.03, 0.06, 0.06])
    assert math.isnan(adjusted[3].p_adjusted) and {c.family for c in adjusted} == {3}
    assert holm([Comparison(Estimate(0, 0, 0, 3), 0.6, PAIRED, 2.0, 3, 3, 1.0, 1.0)] * 2)[0].p_adjusted == 1.0


def test_the_minimum_detectable_effect_tends_to_the_normal_formula_and_grows_with_fewer_seeds():
    normal = statistics.NormalDist()
    z = normal.inv_cdf(0.975) + normal.inv_cdf(0.8)  # 2.80: the large-sample MDE in standard errors
    assert detectable_effect(1.0, 1e6) == pytest.approx(z, rel=1e-4)
    by_df = [detectable_effect(1.0, df) for df in (2, 4, 9, 30)]
    assert by_df == sorted(by_df, reverse=True) and by_df[-1] > z
    assert power(detectable_effect(0.02, 4), 0.02, 4) == pytest.approx(0.8, abs=1e-9)


@pytest.mark.parametrize("n, effect, expected", [(5, None, 0.8), (4, 2.0, 0.755), (4, 0.0, 0.05)])
def test_power_matches_simulated_t_tests(n, effect, expected):
    """Paired differences of sd 1 drawn around `effect` (None: the MDE of n seeds): a t-test
    done by hand (the printed t table) rejects as often as power() says."""
    rng, trials = random.Random(7), 4000
    effect = detectable_effect(1 / math.sqrt(n), n - 1) if effect is None else effect
    assert power(effect, 1 / math.sqrt(n), n - 1) == pytest.approx(expected, abs=0.001)
    rejected = 0
    for _ in range(trials):
        d = [rng.gauss(effect, 1.0) for _ in range(n)]
        t = statistics.mean(d) / (statistics.stdev(d) / math.sqrt(n))
        rejected += abs(t) > T_TABLE[n - 1]
    assert rejected / trials == pytest.approx(expected, abs=0.028)  # 4 binomial sd at most


@pytest.mark.parametrize("d, n", [(0.2, 199), (0.5, 34), (0.8, 15), (1.0, 10), (2.0, 5)])
def test_seeds_needed_match_the_published_one_sample_power_tables(d, n):
    """The one-sample (paired) t-test, two-sided 5%, 80% power: n for effect size d = effect / sd
    as G*Power gives it (d = 2: 4 seeds have 75.5% power, simulated above)."""
    comparison = paired_difference([0.0, 0.0, 0.0], [-1.0, 0.0, 1.0])  # sd 1
    assert comparison.sd == 1.0 and seeds_needed(comparison, d) == n
    assert seeds_needed(comparison, 1e-6) is None  # beyond any budget
    assert seeds_needed(paired_difference([0.0], [1.0]), d) is None  # one seed: no sd


def comparison(mean, low, high, p, n_baseline=3, n_arm=3, test=PAIRED):
    df = float(n_arm - 1)
    se = (high - low) / 2 / T_TABLE[2] if df == 2 else (high - low) / 2 / T_TABLE[4]
    return Comparison(
        Estimate(mean, low, high, n_arm if test == PAIRED else n_baseline + n_arm),
        p,
        test,
        df,
        n_baseline,
        n_arm,
        se * math.sqrt(n_arm),
        se,
    )


def mde(case):
    return f"{detectable_effect(case.se, case.df):.3f}"


NOT_SIGNIFICANT = comparison(0.004, -0.010, 0.018, 0.42)
IDENTICAL = paired_difference([3.0, 3.1, 3.2, 3.3, 3.4], [3.0, 3.1, 3.2, 3.3, 3.4])


@pytest.mark.parametrize(
    "case, expected",
    [
        (
            comparison(0.021, 0.008, 0.034, 0.0104),
            "MQA vs MHA: +0.021 nats (95% CI +0.008..+0.034, p=0.01, paired t-test, 3 seeds): worse",
        ),
        (
            NOT_SIGNIFICANT,
            "MQA vs MHA: +0.004 nats (95% CI -0.010..+0.018, p=0.42, paired t-test, 3 seeds): "
            f"no difference detected at this budget; it detects {mde(NOT_SIGNIFICANT)} nats or more 80% of the time",
        ),
        (
            comparison(-0.03, -0.05, -0.01, 0.0004, 5, 5),
            "MQA vs MHA: -0.030 nats (95% CI -0.050..-0.010, p<0.001, paired t-test, 5 seeds): better",
        ),
        (
            comparison(-0.03, -0.05, -0.01, 0.0123, 6, 4, "Welch t-test"),
            "MQA vs MHA: -0.030 nats (95% CI -0.050..-0.010, p=0.012, Welch t-test, 4+6 seeds): better",
        ),
        (
            holm([comparison(-0.03, -0.05, -0.01, 0.03), comparison(0.0, -0.1, 0.1, 0.9)])[0],
            "MQA vs MHA: -0.030 nats (95% CI -0.050..-0.010, p=0.03, Holm p=0.06 of 2 tests, paired t-test, 3 seeds): "
            "no difference detected at this budget; it detects 0.026 nats or more 80% of the time",
        ),  # 5.65 se at df 2
        (
            paired_difference([3.0], [3.021]),
            "MQA vs MHA: +0.021 nats (1 seed: no confidence interval; run more seeds, e.g. seed=1,2,3)",
        ),
        (
            welch_difference([3.0], [3.0, 3.1]),
            "MQA vs MHA: +0.050 nats (2+1 seeds: no confidence interval; run more seeds, e.g. seed=1,2,3)",
        ),
        (
            paired_difference([1.0, 2.0, 3.0], [1.5, 2.5, 3.5]),
            "MQA vs MHA: +0.500 nats (95% CI +0.500..+0.500, p<0.001, paired t-test, 3 seeds): worse",
        ),
        (
            IDENTICAL,
            "MQA vs MHA: +0.000 nats (95% CI +0.000..+0.000, p=1, paired t-test, 5 seeds): "
            "no difference detected at this budget; it detects 0.000 nats or more 80% of the time",
        ),
    ],
)
def test_verdict(case, expected):
    assert verdict("MQA", "MHA", case) == expected


def test_verdict_follows_the_level_and_the_unit(monkeypatch):
    baseline, arm = [3.00, 3.10, 3.20], [3.01, 3.13, 3.22]
    monkeypatch.setattr(stats, "LEVEL", 0.9)
    narrower = paired_difference(baseline, arm)
    t_95_2 = 2.919985580  # t_{0.95} at df = 2, printed tables
    assert narrower.difference.half_width == pytest.approx(t_95_2 * 0.01 / math.sqrt(3), rel=1e-9)
    assert verdict("GQA", "MHA", narrower, unit="bits").startswith("GQA vs MHA: +0.020 bits (90% CI ")


@pytest.mark.parametrize("df", [1.0, 1.5, 2.0, 4.08, 30.0, 1e5])
def test_power_is_a_probability_that_grows_with_the_effect_for_any_df(df):
    """Welch's fractional degrees of freedom included, and far out where scipy's left tail of
    the noncentral t is nan."""
    powers = [power(e, 1.0, df) for e in (0.0, 0.5, 1, 2, 3, 5, 8, 20, 50, 1e3)]
    assert all(0.0 <= p <= 1.0 for p in powers) and powers == sorted(powers)
    assert powers[0] == pytest.approx(0.05) and powers[-1] == pytest.approx(1.0)
    assert power(detectable_effect(1.0, df), 1.0, df) == pytest.approx(0.8, abs=1e-9)
