"""How many seeds: the replicates a comparison against the baseline needs, planned from the variance already
measured, and a stopping rule for adding replicates one look at a time until the comparison is decided.

Both answer the question the verdict "not distinguishable with 3 replicates" leaves open. Both use Welch's t
(unequal variances), the test `compare --stats` applies by default (raybench.report.stats.welch).

The stopping rule looks again after every added pair of replicates. Testing at alpha at every look would reject
a true null far more often than alpha (Armitage, McPherson and Rowe 1969, "Repeated significance tests on
accumulating data"); here the looks are planned (from the first replicate count to the cap, one seed per side
each) and each look tests at alpha / looks. By the union bound the chance of any false rejection over all looks
is at most alpha, whatever the dependence between looks: a Bonferroni group-sequential design (Jennison and
Turnbull 2000, "Group Sequential Methods with Applications to Clinical Trials", sec. 2.2), more conservative than
Pocock's or O'Brien-Fleming's boundaries but exact without their normal approximation, which three to ten
replicates do not support. tests/test_seed_rules.py checks the false-positive rate by simulation.

Pure numpy and scipy (imported on first use): the sweep's runner and raybench.report both read it.
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache
from typing import Any

import numpy as np

ALPHA = 0.05
POWER = 0.8
MAX_PLANNED = 1000  # a plan past this many replicates per side is "not within reach", not a number to act on


@cache
def _stats() -> Any:
    from scipy import stats

    return stats


def welch_power(difference: float, sd: float, sd_baseline: float, n: int, alpha: float = ALPHA) -> float:
    """The power of a two-sided Welch test at `alpha` with n replicates on each side, when the true means differ
    by `difference` and the replicate stds are the ones given: P(|T| > t_crit) for T noncentral t with the
    Welch-Satterthwaite degrees of freedom."""
    if n < 2:
        return 0.0
    var, var_b = sd * sd, sd_baseline * sd_baseline
    if var + var_b == 0:
        return 1.0 if difference else 0.0
    se = math.sqrt((var + var_b) / n)
    df = (var + var_b) ** 2 / ((var * var + var_b * var_b) / (n - 1))
    critical = _stats().t.ppf(1 - alpha / 2, df)
    ncp = abs(difference) / se
    nct = _stats().nct
    power = float(nct.sf(critical, df, ncp) + nct.cdf(-critical, df, ncp))
    if math.isnan(power):  # scipy's noncentral t fails far in its tail, where the normal approximation is exact
        norm = _stats().norm
        power = float(norm.sf(critical - ncp) + norm.cdf(-critical - ncp))
    return power


@dataclass(frozen=True)
class SeedPlan:
    """The replicates per side a comparison needs: `needed` is None when it is out of reach (no measured
    difference, or more than MAX_PLANNED), with `reason` saying which."""

    difference: float
    sd: float
    sd_baseline: float
    have: int
    have_baseline: int
    needed: int | None
    reason: str = ""

    def text(self) -> str:
        if self.needed is None:
            return self.reason
        more = max(0, self.needed - self.have) + max(0, self.needed - self.have_baseline)
        return (f"{self.needed} replicates per side ({more} more runs), for a difference of {100 * self.difference:+.1f} "
                f"points at the measured stds {100 * self.sd:.1f} and {100 * self.sd_baseline:.1f}")


def plan_seeds(values: Sequence[float], baseline_values: Sequence[float], alpha: float = ALPHA,
               power: float = POWER) -> SeedPlan:
    """The smallest n (replicates on each side) at which Welch's test at `alpha` tells this method from the
    baseline with `power`, taking the measured difference of means and the measured stds as the truth. With three
    replicates those estimates are themselves uncertain, so the plan is a forecast, not a guarantee."""
    x, y = np.asarray(values, dtype=float), np.asarray(baseline_values, dtype=float)
    if len(x) < 2 or len(y) < 2:
        return SeedPlan(math.nan, math.nan, math.nan, len(x), len(y), None,
                        "needs two replicates on each side to measure a variance")
    difference, sd, sd_b = float(x.mean() - y.mean()), float(x.std(ddof=1)), float(y.std(ddof=1))
    plan = SeedPlan(difference, sd, sd_b, len(x), len(y), None)
    if difference == 0:
        return _with(plan, reason="no measured difference: no number of replicates tells them apart")
    if welch_power(difference, sd, sd_b, MAX_PLANNED, alpha) < power:
        return _with(plan, reason=f"more than {MAX_PLANNED} replicates per side")
    low, high = 2, MAX_PLANNED  # power grows with n: bisect for the first n that reaches it
    while low < high:
        middle = (low + high) // 2
        if welch_power(difference, sd, sd_b, middle, alpha) >= power:
            high = middle
        else:
            low = middle + 1
    return _with(plan, needed=low)


def _with(plan: SeedPlan, **changes: Any) -> SeedPlan:
    from dataclasses import replace

    return replace(plan, **changes)


@dataclass(frozen=True)
class SequentialRule:
    """Add one replicate per look, from `first` replicates up to `cap`, and stop as soon as Welch's test rejects
    at alpha / looks (the module docstring says why that level). A sweep adds them to its own side; the
    baseline's replicates are the ones it recorded."""

    first: int
    cap: int
    alpha: float = ALPHA

    def __post_init__(self) -> None:
        if not 2 <= self.first <= self.cap:
            raise ValueError(f"replicates auto: needs 2 <= first ({self.first}) <= cap ({self.cap})")

    @property
    def looks(self) -> int:
        return self.cap - self.first + 1

    @property
    def level(self) -> float:
        """The level each look tests at."""
        return self.alpha / self.looks

    def decided(self, values: Sequence[float], baseline_values: Sequence[float]) -> bool:
        """Whether the comparison is decided at this look: Welch's test rejects at `level`."""
        x, y = np.asarray(values, dtype=float), np.asarray(baseline_values, dtype=float)
        if len(x) < 2 or len(y) < 2:
            return False
        if x.std(ddof=1) == 0 and y.std(ddof=1) == 0:
            return bool(x.mean() != y.mean())
        return bool(_stats().ttest_ind(x, y, equal_var=False).pvalue < self.level)

    def next_count(self, ran: int, values: Sequence[float], baseline_values: Sequence[float]) -> int | None:
        """The replicate count to have run after this look, or None to stop: decided, or `ran` (the replicates
        run so far, failed ones too, whose values are missing from `values`) at the cap."""
        if ran >= self.cap or (ran >= self.first and self.decided(values, baseline_values)):
            return None
        return max(ran + 1, self.first)

    def words(self) -> str:
        return (f"replicates until Welch's test decides at alpha {self.alpha} over {self.looks} looks "
                f"({self.first} to {self.cap} per side, each look at {self.level:.4g}: Bonferroni group-sequential)")
