"""Statistics for comparing the final validation losses of ablation arms over seeds, on scipy.stats.

Two arms of an ablation (say MQA against MHA) differ by a few thousandths of a nat,
about as much as two seeds of one arm do, so "which is better" is a question about
a mean difference measured through noise. The report answers it with Student's t:
an interval and a p-value per comparison (paired by seed, or Welch's test when the
seeds differ), Holm's adjustment when several arms face one baseline, and the power
of each test: the smallest effect it would detect 80% of the time, and the seeds an
effect the user names would need.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, replace

from scipy import optimize
from scipy import stats as distributions

LEVEL = 0.95  # the confidence level of every comparison, and the "95%" its verdict prints
POWER = 0.80  # the chance of detecting an effect that the minimum detectable effect stands for
MAX_SEEDS = 10_000  # seeds_needed gives up beyond this many: the effect is lost in the noise
PAIRED = "paired t-test"
WELCH = "Welch t-test"


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


def _t_half_width(se: float, df: float, level: float = LEVEL) -> float:
    return float(distributions.t.ppf((1 + level) / 2, df)) * se


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
    half = _t_half_width(statistics.stdev(values, mean) / math.sqrt(n), n - 1, level)
    return Estimate(mean, mean - half, mean + half, n)


@dataclass(frozen=True)
class Comparison:
    """How an arm's losses differ from the baseline's: difference is arm minus baseline.

    p_value is two-sided, from `test` with df degrees of freedom; p_adjusted is the
    Holm-adjusted p-value among `family` comparisons, which the verdict decides by. sd is
    the spread of the difference for one seed (the
    sd of the paired differences; for Welch, sqrt(var_baseline + var_arm)) and se the
    standard error of the mean difference. Where no test is possible (fewer than 2
    values on a side) p-values, df, sd, se and the bounds are nan.
    """

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


def _untestable(mean: float, test: str, n_baseline: int, n_arm: int) -> Comparison:
    n = n_arm if test == PAIRED else n_baseline + n_arm
    return Comparison(
        Estimate(mean, math.nan, math.nan, n), math.nan, test, math.nan, n_baseline, n_arm, math.nan, math.nan
    )


def _tested(
    test_on_scipy, mean: float, se: float, sd: float, test: str, n_baseline: int, n_arm: int, df: float
) -> Comparison:
    """A Comparison from scipy's t-test (test_on_scipy(), called only when se > 0). se == 0
    (every seed gave the same difference) leaves t undefined; the limit stands in for it:
    an interval of width 0, and p = 1 for a zero difference, p = 0 for any other."""
    n = n_arm if test == PAIRED else n_baseline + n_arm
    if se == 0:
        return Comparison(
            Estimate(mean, mean, mean, n), 1.0 if mean == 0 else 0.0, test, df, n_baseline, n_arm, 0.0, 0.0
        )
    result = test_on_scipy()
    df = float(result.df)
    interval = result.confidence_interval(confidence_level=LEVEL)
    return Comparison(
        Estimate(mean, float(interval.low), float(interval.high), n),
        float(result.pvalue),
        test,
        df,
        n_baseline,
        n_arm,
        sd,
        se,
    )


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
    n, mean = len(differences), float(statistics.mean(differences))
    if n < 2:
        return _untestable(mean, PAIRED, n, n)
    sd = statistics.stdev(differences, mean)
    return _tested(
        lambda: distributions.ttest_rel(arm, baseline), mean, sd / math.sqrt(n), sd, PAIRED, n, n, float(n - 1)
    )


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
    if min(n_baseline, n_arm) < 2:
        return _untestable(mean, WELCH, n_baseline, n_arm)
    var_baseline, var_arm = statistics.variance(baseline), statistics.variance(arm)
    se = math.sqrt(var_baseline / n_baseline + var_arm / n_arm)
    return _tested(
        lambda: distributions.ttest_ind(arm, baseline, equal_var=False),
        mean,
        se,
        math.sqrt(var_baseline + var_arm),
        WELCH,
        n_baseline,
        n_arm,
        math.nan,
    )


def holm(comparisons: Sequence[Comparison]) -> list[Comparison]:
    """The comparisons with Holm-adjusted p-values, the family being those that have a
    p-value: the i-th smallest of m is multiplied by m - i + 1, capped at 1, and
    never below an adjusted p-value ranked before it."""
    tested = sorted((c.p_value, i) for i, c in enumerate(comparisons) if not math.isnan(c.p_value))
    m, running, adjusted = len(tested), 0.0, {}
    for rank, (p, i) in enumerate(tested):
        running = max(running, min(1.0, (m - rank) * p))
        adjusted[i] = running
    return [replace(c, p_adjusted=adjusted.get(i, math.nan), family=max(m, 1)) for i, c in enumerate(comparisons)]


def power(effect: float, se: float, df: float, level: float = LEVEL) -> float:
    """The chance that a two-sided t-test at level rejects "no difference" when the true
    difference is `effect` and the estimate's standard error is se: the noncentral t's
    mass beyond the critical values."""
    critical = distributions.t.ppf((1 + level) / 2, df)
    noncentrality = effect / se
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
    """Seeds (per arm) at which the comparison would detect `effect` with probability
    `target`, if the spread of one seed's difference stays comparison.sd (seeds_for; for
    Welch with n seeds on each side, its n - 1 degrees of freedom are a lower bound, so never
    too few seeds). None when no sd is known (fewer than 2 seeds) or more than MAX_SEEDS would be needed."""
    if math.isnan(comparison.sd):
        return None
    return seeds_for(effect, comparison.sd, target, level)


def seeds_for(effect: float, sd: float, target: float = POWER, level: float = LEVEL) -> int | None:
    """The fewest seeds n at which a paired t-test (se = sd / sqrt(n), n - 1 degrees of
    freedom) detects a true difference `effect` with probability `target`, where sd is the
    spread of one seed's difference; None beyond MAX_SEEDS. Before any run, sd comes from
    the run-to-run noise of one run's loss: sqrt(2) times it when the arms' noise is unrelated."""
    if sd == 0:
        return 2

    def enough(n: int) -> bool:
        return power(effect, sd / math.sqrt(n), n - 1, level) >= target

    low, high = 1, 2  # enough(low) is false (one seed has no interval); find a high that is enough
    while not enough(high):
        if high >= MAX_SEEDS:
            return None
        low, high = high, min(2 * high, MAX_SEEDS)
    while high - low > 1:  # power grows with n: bisect to the first n that is enough
        middle = (low + high) // 2
        low, high = (low, middle) if enough(middle) else (middle, high)
    return high


def _format_p(p: float) -> str:
    return "p<0.001" if p < 0.001 else f"p={p:.2g}"


def _seeds(comparison: Comparison) -> str:
    """The seeds behind a comparison: "3 seeds" when paired; for Welch "2+3 seeds", arm first as in "MQA vs MHA"."""
    if comparison.test == PAIRED:
        return "1 seed" if comparison.n_arm == 1 else f"{comparison.n_arm} seeds"
    return f"{comparison.n_arm}+{comparison.n_baseline} seeds"


def _conclusion(comparison: Comparison, unit: str) -> str:
    """Lower loss is better; only a (Holm-adjusted) p-value below 1 - LEVEL supports either word.
    Otherwise the verdict says what the test could have seen: its minimum detectable effect."""
    if comparison.deciding_p < 1 - LEVEL:
        return "worse" if comparison.difference.mean > 0 else "better"
    mde = detectable_effect(comparison.se, comparison.df)
    return f"no difference detected at this budget; it detects {mde:.3f} {unit} or more {POWER * 100:g}% of the time"


def verdict(name: str, baseline_name: str, comparison: Comparison, unit: str = "nats") -> str:
    """One sentence for report.md stating what the loss difference shows, every word from the numbers.

    e.g. "MQA vs MHA: +0.021 nats (95% CI +0.008..+0.034, p=0.01, Holm p=0.03 of 3 tests,
    paired t-test, 5 seeds): worse". A positive difference means the arm's loss is higher.
    """
    difference = comparison.difference
    head = f"{name} vs {baseline_name}: {difference.mean:+.3f} {unit}"
    seeds = _seeds(comparison)
    if math.isnan(difference.low):
        return f"{head} ({seeds}: no confidence interval; run more seeds, e.g. seed=1,2,3)"
    holm_note = (
        f", Holm {_format_p(comparison.deciding_p)} of {comparison.family} tests" if comparison.family > 1 else ""
    )
    return (
        f"{head} ({LEVEL * 100:g}% CI {difference.low:+.3f}..{difference.high:+.3f}, "
        f"{_format_p(comparison.p_value)}{holm_note}, {comparison.test}, {seeds}): {_conclusion(comparison, unit)}"
    )


def p_value(p: float) -> str:
    """A p-value as the report prints it (n/a where no test could be made)."""
    return "n/a" if math.isnan(p) else f"{p:.2g}"
