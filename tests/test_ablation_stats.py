"""ablation.stats against references it does not share code with: printed t tables,
closed forms, arithmetic done by hand, and scipy.stats where it is installed."""

from __future__ import annotations

import math
import random
import statistics

import pytest

from ablation import stats
from ablation.stats import (
    Comparison,
    Estimate,
    mean_ci,
    paired_difference,
    t_cdf,
    t_quantile,
    t_sf_two_sided,
    verdict,
    welch_difference,
)

# t_{0.975} from printed tables of Student's t (two-sided 5%).
T_TABLE = {1: 12.706204736, 2: 4.302652730, 4: 2.776445105, 10: 2.228138852, 30: 2.042272456}


@pytest.mark.parametrize("df, value", T_TABLE.items())
def test_quantile_matches_the_printed_table(df, value):
    assert t_quantile(0.975, df) == pytest.approx(value, abs=1e-9)
    assert t_quantile(0.025, df) == pytest.approx(-value, abs=1e-9)


@pytest.mark.parametrize("df", [0.3, 1, 2, 4.0754716981, 30, 1e6])
def test_cdf_is_one_half_at_zero_and_symmetric(df):
    assert t_cdf(0.0, df) == 0.5
    assert t_quantile(0.5, df) == 0.0
    for t in (0.1, 1.0, 2.5, 40.0):
        assert t_cdf(-t, df) == pytest.approx(1 - t_cdf(t, df), abs=1e-15)
        assert t_sf_two_sided(-t, df) == t_sf_two_sided(t, df)
    for p in (2.0**-30, 0.01, 0.3):  # 1 - p is exact for these, or nearly
        assert t_quantile(p, df) == pytest.approx(-t_quantile(1 - p, df), rel=1e-10)
        assert t_cdf(t_quantile(p, df), df) == pytest.approx(p, rel=1e-10)


@pytest.mark.parametrize("t", [-30.0, -2.0, -0.3, 0.7, 4.0, 1e4])
def test_cdf_matches_the_closed_forms_for_one_and_two_degrees_of_freedom(t):
    assert t_cdf(t, 1) == pytest.approx(0.5 + math.atan(t) / math.pi, abs=1e-14)  # Cauchy
    assert t_cdf(t, 2) == pytest.approx(0.5 + t / (2 * math.sqrt(2 + t * t)), abs=1e-14)


def test_infinite_t_and_a_large_df():
    assert t_cdf(math.inf, 3) == 1.0 and t_cdf(-math.inf, 3) == 0.0
    assert t_sf_two_sided(math.inf, 3) == 0.0
    assert t_quantile(1.0, 3) == math.inf and t_quantile(0.0, 3) == -math.inf
    # For large df, t_q = z + (z^3 + z) / (4 df) + O(1/df^2) with z the normal quantile
    # (Cornish-Fisher), here 1.959963985 + 2.372e-6.
    z = statistics.NormalDist().inv_cdf(0.975)
    assert t_quantile(0.975, 1e6) == pytest.approx(z + (z**3 + z) / 4e6, abs=1e-10)
    assert t_quantile(0.975, 1e6) == pytest.approx(1.959964, abs=3e-6)


@pytest.mark.parametrize("call", [lambda: t_cdf(1.0, 0), lambda: t_cdf(1.0, math.inf), lambda: t_quantile(1.5, 3)])
def test_out_of_domain_arguments_are_refused(call):
    with pytest.raises(ValueError):
        call()


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
    assert comparison.p_value == pytest.approx(t_sf_two_sided(3 / math.sqrt(2), 216 / 53), rel=1e-12)
    assert comparison.difference.half_width == pytest.approx(t_quantile(0.975, 216 / 53) * math.sqrt(2), rel=1e-12)


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


def comparison(mean, low, high, p, n_baseline=3, n_arm=3, test="paired t-test"):
    return Comparison(Estimate(mean, low, high, n_arm if test == "paired t-test" else n_baseline + n_arm),
                      p, test, float(n_arm - 1), n_baseline, n_arm)


@pytest.mark.parametrize("case, expected", [
    (comparison(0.021, 0.008, 0.034, 0.0104),
     "MQA vs MHA: +0.021 nats (95% CI +0.008..+0.034, p=0.01, paired t-test, 3 seeds): worse"
     "; with fewer than 5 seeds the test is weak"),
    (comparison(0.004, -0.010, 0.018, 0.42),
     "MQA vs MHA: +0.004 nats (95% CI -0.010..+0.018, p=0.42, paired t-test, 3 seeds): "
     "CI includes 0, no difference detected at this budget; with fewer than 5 seeds the test is weak"),
    (comparison(-0.03, -0.05, -0.01, 0.0004, 5, 5),
     "MQA vs MHA: -0.030 nats (95% CI -0.050..-0.010, p<0.001, paired t-test, 5 seeds): better"),
    (comparison(-0.03, -0.05, -0.01, 0.0123, 6, 4, "Welch t-test"),
     "MQA vs MHA: -0.030 nats (95% CI -0.050..-0.010, p=0.012, Welch t-test, 4+6 seeds): better"
     "; with fewer than 5 seeds the test is weak"),
    (paired_difference([3.0], [3.021]),
     "MQA vs MHA: +0.021 nats (1 seed: no confidence interval; run more seeds, e.g. seed=1,2,3)"),
    (welch_difference([3.0], [3.0, 3.1]),
     "MQA vs MHA: +0.050 nats (2+1 seeds: no confidence interval; run more seeds, e.g. seed=1,2,3)"),
    (paired_difference([1.0, 2.0, 3.0], [1.5, 2.5, 3.5]),
     "MQA vs MHA: +0.500 nats (95% CI +0.500..+0.500, p<0.001, paired t-test, 3 seeds): worse"
     "; with fewer than 5 seeds the test is weak"),
    (paired_difference([3.0, 3.1, 3.2, 3.3, 3.4], [3.0, 3.1, 3.2, 3.3, 3.4]),
     "MQA vs MHA: +0.000 nats (95% CI +0.000..+0.000, p=1, paired t-test, 5 seeds): "
     "CI includes 0, no difference detected at this budget"),
])
def test_verdict(case, expected):
    assert verdict("MQA", "MHA", case) == expected


def test_verdict_follows_the_level_and_the_unit(monkeypatch):
    baseline, arm = [3.00, 3.10, 3.20], [3.01, 3.13, 3.22]
    monkeypatch.setattr(stats, "LEVEL", 0.9)
    narrower = paired_difference(baseline, arm)
    assert narrower.difference.half_width == pytest.approx(t_quantile(0.95, 2) * 0.01 / math.sqrt(3), rel=1e-9)
    assert verdict("GQA", "MHA", narrower, unit="bits").startswith("GQA vs MHA: +0.020 bits (90% CI ")


def test_against_scipy():
    scipy_stats = pytest.importorskip("scipy.stats")
    rng = random.Random(1)
    for _ in range(100):
        df, t, p = rng.uniform(0.3, 60), rng.gauss(0, 4), rng.random()
        assert t_cdf(t, df) == pytest.approx(scipy_stats.t.cdf(t, df), rel=1e-8, abs=1e-15)
        assert t_quantile(p, df) == pytest.approx(scipy_stats.t.ppf(p, df), rel=1e-8)
    for _ in range(50):
        n = rng.randint(2, 10)
        baseline, arm = random_arms(rng, n, n)
        ours, theirs = paired_difference(baseline, arm), scipy_stats.ttest_rel(arm, baseline)
        assert_matches(ours, theirs)
        baseline, arm = random_arms(rng, rng.randint(2, 10), rng.randint(2, 10))
        ours, theirs = welch_difference(baseline, arm), scipy_stats.ttest_ind(arm, baseline, equal_var=False)
        assert_matches(ours, theirs)


def assert_matches(ours: Comparison, theirs) -> None:
    interval = theirs.confidence_interval(confidence_level=0.95)
    assert ours.p_value == pytest.approx(theirs.pvalue, rel=1e-8, abs=1e-15)
    assert ours.df == pytest.approx(theirs.df, rel=1e-10)
    assert ours.difference.low == pytest.approx(interval.low, rel=1e-8, abs=1e-12)
    assert ours.difference.high == pytest.approx(interval.high, rel=1e-8, abs=1e-12)
