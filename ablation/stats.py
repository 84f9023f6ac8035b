"""Statistics for comparing the final validation losses of ablation arms over seeds, on scipy.stats.

Arms differ by about as much as two seeds of one arm do, so each comparison is Student's t:
an interval and a p-value (paired by seed, or Welch's test when the seeds differ), Holm's
adjustment when several arms face one baseline, and the test's power: the smallest effect it
detects 80% of the time, and the seeds an effect the user names would need.
"""

from __future__ import annotations

import bisect
import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, replace
from functools import partial

from scipy import optimize
from scipy import stats as distributions

LEVEL = 0.95  # the confidence level of every comparison, and the "95%" its verdict prints
POWER = 0.80  # the chance of detecting an effect that the minimum detectable effect stands for
MAX_SEEDS = 10_000  # seeds_needed gives up beyond this many: the effect is lost in the noise
PAIRED = "paired t-test"
WELCH = "Welch t-test"


@dataclass(frozen=True)
class Estimate:
    """A mean with its confidence interval [low, high] (nan when n < 2). n counts the values
    behind it: seeds, pairs of seeds, or the seeds of both arms for an unpaired difference."""

    mean: float
    low: float
    high: float
    n: int

    @property
    def half_width(self) -> float:
        return (self.high - self.low) / 2


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
    half = float(distributions.t.ppf((1 + level) / 2, n - 1)) * (statistics.stdev(values, mean) / math.sqrt(n))
    return Estimate(mean, mean - half, mean + half, n)


@dataclass(frozen=True)
class Comparison:
    """Arm minus baseline: p_value two-sided, from `test` with df degrees of freedom; p_adjusted
    Holm's among `family` comparisons, which the verdict decides by; sd the spread of one seed's
    difference (Welch: sqrt(var_baseline + var_arm)), se the mean difference's standard error.
    With fewer than 2 values on a side, p-values, df, sd, se and bounds are nan."""

    difference: Estimate
    p_value: float
    test: str
    df: float
    n_baseline: int
    n_arm: int
    sd: float
    se: float
    p_adjusted: float | None = None  # None until holm() has seen the family
    family: int = 1

    @property
    def deciding_p(self) -> float:
        return self.p_value if self.p_adjusted is None else self.p_adjusted


def _comparison(test: str, mean: float, n_baseline: int, n_arm: int, sd=math.nan, se=math.nan, df=math.nan, run=None):
    """The Comparison of scipy's t-test run() (None: untestable). se == 0 (every seed gave the same difference)
    leaves t undefined; its limit stands in: an interval of width 0, p = 1 for a zero difference, else 0."""
    n = n_arm if test == PAIRED else n_baseline + n_arm
    if run is None:
        return Comparison(Estimate(mean, math.nan, math.nan, n), math.nan, test, df, n_baseline, n_arm, sd, se)
    if se == 0:
        return Comparison(Estimate(mean, mean, mean, n), float(mean == 0), test, df, n_baseline, n_arm, 0.0, 0.0)
    result = run()
    interval = result.confidence_interval(confidence_level=LEVEL)
    estimate = Estimate(mean, float(interval.low), float(interval.high), n)
    return Comparison(estimate, float(result.pvalue), test, float(result.df), n_baseline, n_arm, sd, se)


def paired_difference(baseline: Sequence[float], arm: Sequence[float]) -> Comparison:
    """arm - baseline, paired by position (the caller lines both up by seed, so what a seed
    does to every arm alike cancels): the paired t-test with n - 1 degrees of freedom."""
    if len(baseline) != len(arm):
        raise ValueError(f"paired samples need equal lengths, got {len(baseline)} and {len(arm)}")
    if not len(arm):
        raise ValueError("there is nothing to compare without a seed")
    differences = [a - b for b, a in zip(baseline, arm)]
    n, mean = len(differences), float(statistics.mean(differences))
    if n < 2:
        return _comparison(PAIRED, mean, n, n)
    sd = statistics.stdev(differences, mean)
    return _comparison(
        PAIRED, mean, n, n, sd, sd / math.sqrt(n), n - 1.0, partial(distributions.ttest_rel, arm, baseline)
    )


def welch_difference(baseline: Sequence[float], arm: Sequence[float]) -> Comparison:
    """mean(arm) - mean(baseline) by Welch's t-test, for arms whose seeds differ (df from
    Welch-Satterthwaite, usually fractional; nan when both sides are constant)."""
    n_baseline, n_arm = len(baseline), len(arm)
    if min(n_baseline, n_arm) == 0:
        raise ValueError(f"each side needs a seed, got {n_baseline} and {n_arm}")
    mean = float(statistics.mean(arm) - statistics.mean(baseline))
    if min(n_baseline, n_arm) < 2:
        return _comparison(WELCH, mean, n_baseline, n_arm)
    var_baseline, var_arm = statistics.variance(baseline), statistics.variance(arm)
    se = math.sqrt(var_baseline / n_baseline + var_arm / n_arm)
    test = partial(distributions.ttest_ind, arm, baseline, equal_var=False)
    return _comparison(WELCH, mean, n_baseline, n_arm, math.sqrt(var_baseline + var_arm), se, math.nan, test)


def holm(comparisons: Sequence[Comparison]) -> list[Comparison]:
    """Holm's adjustment among the comparisons that have a p-value: the i-th smallest of m times
    m - i + 1, capped at 1, and never below an adjusted p-value ranked before it."""
    tested = sorted((c.p_value, i) for i, c in enumerate(comparisons) if not math.isnan(c.p_value))
    m, running, adjusted = len(tested), 0.0, {}
    for rank, (p, i) in enumerate(tested):
        running = adjusted[i] = max(running, min(1.0, (m - rank) * p))
    return [replace(c, p_adjusted=adjusted.get(i, math.nan), family=max(m, 1)) for i, c in enumerate(comparisons)]


def power(effect: float, se: float, df: float, level: float = LEVEL) -> float:
    """The chance that a two-sided t-test at level rejects "no difference" when the true difference
    is `effect` and its estimate's standard error se: the noncentral t's mass beyond the critical values."""
    critical, noncentrality = distributions.t.ppf((1 + level) / 2, df), effect / se
    # the lower tail P(T' < -c) as P(T' > c) at -noncentrality: scipy's nct.cdf far out on the left gives nan
    return float(distributions.nct.sf(critical, df, noncentrality) + distributions.nct.sf(critical, df, -noncentrality))


def detectable_effect(se: float, df: float, target: float = POWER, level: float = LEVEL) -> float:
    """The smallest |difference| the test detects with probability `target` (the minimum
    detectable effect), for an estimate with standard error se and df degrees of freedom."""
    if math.isnan(se) or math.isnan(df):
        return math.nan
    if se == 0:
        return 0.0
    high = se
    while power(high, se, df, level) < target:
        high *= 2
    return float(optimize.brentq(lambda e: power(e, se, df, level) - target, 0.0, high, xtol=se * 1e-9))


def seeds_needed(comparison: Comparison, effect: float, target: float = POWER, level: float = LEVEL) -> int | None:
    """seeds_for the comparison's sd of one seed's difference (for Welch with n seeds a side, its
    n - 1 degrees of freedom are a lower bound: never too few); None where no sd is known."""
    return None if math.isnan(comparison.sd) else seeds_for(effect, comparison.sd, target, level)


def seeds_for(effect: float, sd: float, target: float = POWER, level: float = LEVEL) -> int | None:
    """The fewest seeds n at which a paired t-test (se = sd / sqrt(n), df n - 1) detects a true
    difference `effect` with probability `target`, sd being one seed's difference's spread (before any
    run, sqrt(2) times one run's noise when the arms' noise is unrelated); None beyond MAX_SEEDS."""
    if sd == 0:
        return 2
    seeds = range(2, MAX_SEEDS + 1)  # power grows with n: bisect to the first n that is enough
    first = bisect.bisect_left(seeds, True, key=lambda n: power(effect, sd / math.sqrt(n), n - 1, level) >= target)
    return seeds[first] if first < len(seeds) else None


def _format_p(p: float) -> str:
    return "p<0.001" if p < 0.001 else f"p={p:.2g}"


def _conclusion(comparison: Comparison, unit: str) -> str:
    """Lower loss is better; only a (Holm-adjusted) p-value below 1 - LEVEL supports either word.
    Otherwise the verdict says what the test could have seen: its minimum detectable effect."""
    if comparison.deciding_p < 1 - LEVEL:
        return "worse" if comparison.difference.mean > 0 else "better"
    mde = detectable_effect(comparison.se, comparison.df)
    return f"no difference detected at this budget; it detects {mde:.3f} {unit} or more {POWER * 100:g}% of the time"


def verdict(name: str, baseline_name: str, comparison: Comparison, unit: str = "nats") -> str:
    """One sentence for report.md, every word from the numbers (a positive difference: the arm's loss is higher):
    "MQA vs MHA: +0.021 nats (95% CI +0.008..+0.034, p=0.01, Holm p=0.03 of 3 tests, paired t-test, 5 seeds): worse".
    """
    c, difference = comparison, comparison.difference
    head = f"{name} vs {baseline_name}: {difference.mean:+.3f} {unit}"
    # the seeds behind it: "3 seeds" when paired; for Welch "2+3 seeds", arm first as in "MQA vs MHA"
    seeds = f"{c.n_arm}+{c.n_baseline} seeds" if c.test != PAIRED else "1 seed" if c.n_arm == 1 else f"{c.n_arm} seeds"
    if math.isnan(difference.low):
        return f"{head} ({seeds}: no confidence interval; run more seeds, e.g. seed=1,2,3)"
    holm_note = f", Holm {_format_p(c.deciding_p)} of {c.family} tests" if c.family > 1 else ""
    return (
        f"{head} ({LEVEL * 100:g}% CI {difference.low:+.3f}..{difference.high:+.3f}, "
        f"{_format_p(c.p_value)}{holm_note}, {c.test}, {seeds}): {_conclusion(c, unit)}"
    )


def p_value(p: float) -> str:
    """A p-value as the report prints it (n/a where no test could be made)."""
    return "n/a" if math.isnan(p) else f"{p:.2g}"
