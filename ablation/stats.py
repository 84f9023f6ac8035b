"""Statistics for comparing the final validation losses of ablation arms over seeds.

Two arms of an ablation (say MQA against MHA) differ by a few thousandths of a nat,
about as much as two seeds of one arm do, so "which is better" is a question about
a mean difference measured through noise. report.py answers it with an interval
and a p-value from Student's t distribution, implemented here on the standard
library alone so that the report needs no scipy.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

LEVEL = 0.95  # the confidence level of every comparison, and the "95%" its verdict prints
FEW_SEEDS = 5  # below this many seeds per arm only a large difference can be detected
# The continued fraction's rounding grows with df (a tail's relative error is up to
# about 1e-16 * df); beyond this a t's cdf is the normal's to 2e-8 anyway.
MAX_DF = 1e7
PAIRED = "paired t-test"
WELCH = "Welch t-test"

_EPS = 1e-15  # relative size of the last continued-fraction factor: double precision
_TINY = 1e-300  # what Lentz's algorithm puts in place of a zero it would divide by
_MAX_ITERATIONS = 10_000  # far more than any valid input needs; a bound against hanging
_NEWTON_TOLERANCE = 1e-13  # relative size of a Newton step too small to take
_NORMAL = statistics.NormalDist()
# Stirling's series for log Γ, lgamma(z) - ((z - 1/2) log z - z + log(2π)/2) = Σ c_k / z^(2k+1);
# from z = 20 on, the terms kept leave an error below 1e-17.
_STIRLING = (1 / 12, -1 / 360, 1 / 1260, -1 / 1680, 1 / 1188, -691 / 360360)
_STIRLING_FROM = 20.0


def _check_df(df: float) -> None:
    if not 0 < df <= MAX_DF:
        raise ValueError(f"degrees of freedom must lie in (0, {MAX_DF:g}], got {df}")


def _stirling_correction(z: float) -> float:
    return sum(c / z ** (2 * k + 1) for k, c in enumerate(_STIRLING))


def _log_gamma_ratio(z: float, s: float) -> float:
    """log(Γ(z + s) / Γ(z)).

    For large z the two lgammas are large and nearly equal, and their difference
    keeps only the digits they do not share (1e-9 of absolute error at z = 1e6,
    which a t with a million degrees of freedom would inherit); Stirling's formula
    gives the difference without subtracting them.
    """
    if z < _STIRLING_FROM:
        return math.lgamma(z + s) - math.lgamma(z)
    return (
        s * math.log(z) + (z + s - 0.5) * math.log1p(s / z) - s
        + _stirling_correction(z + s) - _stirling_correction(z)
    )


def _log_beta(a: float, b: float) -> float:
    small, large = sorted((a, b))
    return math.lgamma(small) - _log_gamma_ratio(large, small)


def _log(x: float, y: float) -> float:
    """log x where y = 1 - x: near x = 1 the digits are in y, and log1p(-y) keeps them."""
    return math.log1p(-y) if y < 0.5 else math.log(x)


def _continued_fraction(a: float, b: float, x: float) -> float:
    """The denominator 1 + d1/(1 + d2/(1 + ...)) of I_x(a, b), by the modified Lentz algorithm.

    Lentz's algorithm evaluates the fraction front to back, so it stops as soon as
    another level no longer changes the value; the coefficients are DLMF 8.17.22.
    The fraction converges quickly only for x < (a + 1) / (a + b + 2).
    """
    value = c = 1.0
    d = 0.0
    for j in range(1, _MAX_ITERATIONS):
        m = j // 2
        if j % 2:
            coefficient = -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1))
        else:
            coefficient = m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m))
        d = 1.0 + coefficient * d
        c = 1.0 + coefficient / c
        d = 1.0 / (d if abs(d) > _TINY else _TINY)
        c = c if abs(c) > _TINY else _TINY
        factor = c * d
        value *= factor
        if abs(factor - 1.0) < _EPS:
            return value
    raise ArithmeticError(f"the continued fraction of I_x({a}, {b}) did not converge at x={x}")


def _regularized_beta(a: float, b: float, x: float, y: float) -> float:
    """The regularized incomplete beta function I_x(a, b).

    y is 1 - x, passed in because the caller can compute it without the
    cancellation 1 - x suffers when x is close to 1: I_x(a, b) = 1 - I_y(b, a)
    moves each evaluation to the side where the continued fraction converges.
    """
    if x == 0.0:
        return 0.0
    if y == 0.0:
        return 1.0
    if x > (a + 1) / (a + b + 2):
        return 1.0 - _regularized_beta(b, a, y, x)
    log_front = a * _log(x, y) + b * _log(y, x) - _log_beta(a, b)
    return math.exp(log_front) / (a * _continued_fraction(a, b, x))


def t_sf_two_sided(t: float, df: float) -> float:
    """P(|T| >= |t|) for T with Student's t distribution: the two-sided p-value of t.

    This tail is I_x(df/2, 1/2) at x = df / (df + t^2) directly, without the
    1 - cdf that would round small p-values away. df need not be an integer.
    """
    _check_df(df)
    if math.isnan(t):
        return math.nan
    t2 = t * t
    if math.isinf(t2):  # t = ±inf, or so large that no double is left in the tail
        return 0.0
    return _regularized_beta(df / 2, 0.5, df / (df + t2), t2 / (df + t2))


def t_cdf(t: float, df: float) -> float:
    """P(T <= t) for T with Student's t distribution with df (possibly fractional) degrees of freedom."""
    tail = t_sf_two_sided(t, df) / 2
    return 1.0 - tail if t > 0 else tail


def _t_pdf(t: float, df: float) -> float:
    log_norm = _log_gamma_ratio(df / 2, 0.5) - 0.5 * math.log(df * math.pi)
    return math.exp(log_norm - (df + 1) / 2 * math.log1p(t * t / df))


def t_quantile(p: float, df: float) -> float:
    """The t with t_cdf(t, df) == p, by Newton's method on the upper tail G(t) = P(T > t).

    Newton needs no bracket here: for t >= 0, G is decreasing and convex, so steps
    from below the root rise to it without overshooting, and the normal quantile
    starts below the root because Student's t has the heavier tails. Every exact
    step is therefore forward, and one that is not (or is negligible) means only
    rounding is left to correct. Solving for the smaller tail min(p, 1 - p),
    exact in floating point, keeps tiny p accurate.
    """
    _check_df(df)
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"a probability must lie in [0, 1], got {p}")
    if p in (0.0, 1.0):
        return math.copysign(math.inf, p - 0.5)
    tail = min(p, 1.0 - p)
    t = max(0.0, -_NORMAL.inv_cdf(tail))
    for _ in range(_MAX_ITERATIONS):
        density = _t_pdf(t, df)
        if density == 0.0:  # t * t overflowed: the tail lies beyond what doubles can evaluate
            raise ArithmeticError(f"t_quantile({p}, {df}) is out of floating-point range")
        step = (t_sf_two_sided(t, df) / 2 - tail) / density
        if step <= _NEWTON_TOLERANCE * max(1.0, t):
            return t if p >= 0.5 else -t
        t += step
    raise ArithmeticError(f"t_quantile({p}, {df}) did not converge")


@dataclass(frozen=True)
class Estimate:
    """A mean with its confidence interval [low, high].

    low and high are nan when n < 2: one value says nothing about its own spread.
    n counts the values behind the mean: seeds, or pairs of seeds for a paired
    difference, or the seeds of both arms for an unpaired one.
    """

    mean: float
    low: float
    high: float
    n: int

    @property
    def half_width(self) -> float:
        """The ± of the interval: how far the mean could plausibly be off."""
        return (self.high - self.low) / 2


def _half_width(se: float, df: float, level: float) -> float:
    return t_quantile((1 + level) / 2, df) * se


def mean_ci(values: Sequence[float], level: float = LEVEL) -> Estimate:
    """The mean of values with Student's t interval at level, from the sample sd (n - 1)."""
    if not 0 < level < 1:
        raise ValueError(f"the confidence level must lie in (0, 1), got {level}")
    n = len(values)
    if n == 0:
        raise ValueError("the mean of no values is undefined")
    mean = float(statistics.mean(values))
    if n < 2:
        return Estimate(mean, math.nan, math.nan, n)
    half = _half_width(statistics.stdev(values, mean) / math.sqrt(n), n - 1, level)
    return Estimate(mean, mean - half, mean + half, n)


@dataclass(frozen=True)
class Comparison:
    """How an arm's losses differ from the baseline's: difference is arm minus baseline.

    p_value is two-sided, from `test` with df degrees of freedom. Where no test is
    possible (fewer than 2 values on a side) p_value, df and the bounds are nan.
    n_baseline and n_arm count the seeds of each side, which a verdict reports.
    """

    difference: Estimate
    p_value: float
    test: str
    df: float
    n_baseline: int
    n_arm: int


def _interval_and_p(mean: float, se: float, df: float, n: int) -> tuple[Estimate, float]:
    """The interval at LEVEL and the two-sided p-value of a difference with standard error se.

    se == 0 (every seed gave the same difference) leaves t = mean / se undefined;
    the limit stands in for it: an interval of width 0, and p = 1 for a zero
    difference, p = 0 for any other.
    """
    if se == 0:
        return Estimate(mean, mean, mean, n), 1.0 if mean == 0 else 0.0
    half = _half_width(se, df, LEVEL)
    return Estimate(mean, mean - half, mean + half, n), t_sf_two_sided(mean / se, df)


def paired_difference(baseline: Sequence[float], arm: Sequence[float]) -> Comparison:
    """arm - baseline, paired by position: the paired t-test with n - 1 degrees of freedom.

    The caller lines both lists up by seed, so what a seed does to every arm alike
    (initialisation, data order) cancels in each difference: the test is sharper
    than an unpaired one on the same runs.
    """
    if len(baseline) != len(arm):
        raise ValueError(f"paired samples need equal lengths, got {len(baseline)} and {len(arm)}")
    if not len(arm):
        raise ValueError("there is nothing to compare without a seed")
    differences = [a - b for b, a in zip(baseline, arm)]
    n = len(differences)
    mean = float(statistics.mean(differences))
    if n < 2:
        return Comparison(Estimate(mean, math.nan, math.nan, n), math.nan, PAIRED, math.nan, n, n)
    se = statistics.stdev(differences, mean) / math.sqrt(n)
    difference, p_value = _interval_and_p(mean, se, n - 1, n)
    return Comparison(difference, p_value, PAIRED, float(n - 1), n, n)


def welch_difference(baseline: Sequence[float], arm: Sequence[float]) -> Comparison:
    """mean(arm) - mean(baseline) by Welch's t-test, for arms whose seeds do not match.

    Welch's test lets the arms' variances differ; its degrees of freedom come from
    the Welch-Satterthwaite formula and are usually fractional. df is nan when both
    sides are constant, where that formula is 0/0.
    """
    n_baseline, n_arm = len(baseline), len(arm)
    if min(n_baseline, n_arm) == 0:
        raise ValueError(f"each side needs a seed, got {n_baseline} and {n_arm}")
    mean = float(statistics.mean(arm) - statistics.mean(baseline))
    n = n_baseline + n_arm
    if min(n_baseline, n_arm) < 2:
        return Comparison(Estimate(mean, math.nan, math.nan, n), math.nan, WELCH, math.nan, n_baseline, n_arm)
    var_baseline = statistics.variance(baseline) / n_baseline  # the squared standard error of each mean
    var_arm = statistics.variance(arm) / n_arm
    se = math.sqrt(var_baseline + var_arm)
    df = (
        (var_baseline + var_arm) ** 2 / (var_baseline**2 / (n_baseline - 1) + var_arm**2 / (n_arm - 1))
        if se > 0
        else math.nan
    )
    difference, p_value = _interval_and_p(mean, se, df, n)
    return Comparison(difference, p_value, WELCH, df, n_baseline, n_arm)


def _format_p(p: float) -> str:
    return "p<0.001" if p < 0.001 else f"p={p:.2g}"


def _seeds(comparison: Comparison) -> str:
    """The seeds behind a comparison: "3 seeds" when paired; for Welch "2+3 seeds", arm first as in "MQA vs MHA"."""
    if comparison.test == PAIRED:
        return "1 seed" if comparison.n_arm == 1 else f"{comparison.n_arm} seeds"
    return f"{comparison.n_arm}+{comparison.n_baseline} seeds"


def _conclusion(difference: Estimate) -> str:
    """Lower loss is better; only an interval that excludes 0 supports either word."""
    if difference.low > 0:
        return "worse"
    if difference.high < 0:
        return "better"
    return "CI includes 0, no difference detected at this budget"


def verdict(name: str, baseline_name: str, comparison: Comparison, unit: str = "nats") -> str:
    """One sentence for report.md stating what the loss difference shows, every word from the numbers.

    e.g. "MQA vs MHA: +0.021 nats (95% CI +0.008..+0.034, p=0.01, paired t-test,
    5 seeds): worse". A positive difference means the arm's loss is higher.
    """
    difference = comparison.difference
    head = f"{name} vs {baseline_name}: {difference.mean:+.3f} {unit}"
    seeds = _seeds(comparison)
    if math.isnan(difference.low):
        return f"{head} ({seeds}: no confidence interval; run more seeds, e.g. seed=1,2,3)"
    sentence = (
        f"{head} ({LEVEL * 100:g}% CI {difference.low:+.3f}..{difference.high:+.3f}, "
        f"{_format_p(comparison.p_value)}, {comparison.test}, {seeds}): {_conclusion(difference)}"
    )
    if min(comparison.n_baseline, comparison.n_arm) < FEW_SEEDS:
        sentence += f"; with fewer than {FEW_SEEDS} seeds the test is weak"
    return sentence
