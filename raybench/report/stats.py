"""The statistics behind `raybench compare --stats`: which differences between methods are real, and what model
selection costs.

With three replicates per method, "within one std of the best" is a rough guide, not an answer. Here each answer
says how it was reached:
- a cell's 95 % interval of the mean over replicates: a t-interval by default (with 3 replicates a bootstrap sees
  at most 10 distinct resamples and never reaches past the observed range, so it understates the uncertainty),
  or scipy's BCa bootstrap, percentile where BCa is degenerate; `Interval.method` says which was used;
- a method against the baseline row: the difference of means, its interval and a test, Welch's t by default
  (scipy's ttest_ind, equal_var=False, and its interval) or a permutation test (with a bootstrap interval); the
  verdict is "better" or "worse" only when the test rejects at alpha AND the interval excludes zero, and "too few
  replicates to tell" below two replicates on either side, or when the permutation test cannot reach alpha at all;
- over several datasets: each method's mean rank, and the interquartile mean of min-max normalised replicate
  scores with a stratified bootstrap interval (Agarwal et al. 2021, "Deep RL at the edge of the statistical
  precipice");
- selection cost: from a sweep's search trials alone, the trial each rule (OOD val, ID val, the oracle) would have
  chosen and its test value; Kendall's tau between the method rankings the rules give.

Pure functions of numbers and trial records (numpy and scipy): raybench.report.compare wires them into the table.
"""
from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import cache
from itertools import combinations
from typing import Any

import numpy as np

from raybench.records import TrialRecord, Words, is_finite_number
from raybench.report_keys import BEST_PREFIX
from raybench.sweep.seed_rules import POWER, SeedPlan, plan_seeds
from raybench.words import SELECTION_RULES

CONFIDENCE = 0.95
ALPHA = 0.05
MIN_REPLICATES = 2  # a sample std (a t-interval, Welch's t) and a bootstrap both need two values on each side
N_RESAMPLES = 9999
SEED = 0  # the bootstraps' and the permutation test's generator: the same runs print the same intervals
IQM_TRIM = 0.25  # trim_mean's proportion cut from each end: the interquartile mean
NORMALISATION = ("min-max per dataset over every ranked method's replicate values of the ranking column "
                 "(0: the lowest replicate in that dataset, 1: the highest; 0.5 when all are equal)")


@cache
def sps() -> Any:
    """scipy.stats, imported on first use: it was a third of what `compare` spent importing (the figures:
    benchmarks/README.md, "Commands that only read declarations"), and `compare` without --stats computes nothing
    with it."""
    from scipy import stats

    return stats


DEFAULT_BASELINE = "erm"  # the row the others are tested against unless --baseline names another


class IntervalChoice(Words):
    """What the caller asks for a cell's interval of the mean (`compare --interval`)."""

    T = "t"
    BOOTSTRAP = "bootstrap"


class Significance(Words):
    """What the caller asks for the difference against the baseline (`compare --test`)."""

    WELCH = "welch"
    PERMUTATION = "permutation"


class IntervalMethod(Words):
    """How an interval was actually computed: recorded with it, since a bootstrap may fall back."""

    T = "t"
    WELCH = "Welch t"
    BCA = "BCa bootstrap"
    PERCENTILE = "percentile bootstrap"
    STRATIFIED_BCA = "stratified BCa bootstrap"
    STRATIFIED_PERCENTILE = "stratified percentile bootstrap"


class SignificanceTest(Words):
    WELCH = "Welch's t"
    PERMUTATION = "permutation"


class Verdict(Words):
    BETTER = "better"
    WORSE = "worse"
    SAME = "not distinguishable"
    TOO_FEW = "too few replicates to tell"


@dataclass(frozen=True)
class StatsSettings:
    """How `compare --stats` computes: the interval, the test, the baseline row and their levels."""

    interval: IntervalChoice = IntervalChoice.T
    test: Significance = Significance.WELCH
    baseline: str | None = None  # a row's method or sweep name; None: the row named DEFAULT_BASELINE, if any
    confidence: float = CONFIDENCE
    alpha: float = ALPHA
    n_resamples: int = N_RESAMPLES
    seed: int = SEED
    plan_seeds: bool = False  # also plan the replicates each comparison needs (raybench.sweep.seed_rules)
    power: float = POWER

    @property
    def baseline_name(self) -> str:
        return self.baseline or DEFAULT_BASELINE


@dataclass(frozen=True)
class Interval:
    low: float
    high: float
    method: IntervalMethod
    confidence: float = CONFIDENCE

    def excludes_zero(self) -> bool:
        return self.low > 0 or self.high < 0


def finite(values: Sequence[float]) -> np.ndarray:
    """The finite values as floats: a NaN replicate is left out, as raybench.sweep.outcome.summarize leaves it out."""
    array = np.asarray(list(values), dtype="float64")
    return array[np.isfinite(array)]


# ----- a cell: the interval of a mean over replicates ------------------------------------------------------
def mean_interval(values: Sequence[float], settings: StatsSettings = StatsSettings()) -> Interval | None:
    """The interval of the mean the settings ask for; None below MIN_REPLICATES values (no spread to go on)."""
    x = finite(values)
    if len(x) < MIN_REPLICATES:
        return None
    if settings.interval == IntervalChoice.T:
        return t_interval(x, settings.confidence)
    return bootstrap_interval((x,), _mean, settings)


def t_interval(x: np.ndarray, confidence: float = CONFIDENCE) -> Interval:
    """Mean ± t quantile × standard error (n - 1 degrees of freedom): exact for normal replicates."""
    mean, sem = float(np.mean(x)), float(sps().sem(x))
    if sem == 0:  # every replicate equal: scipy's interval is undefined, the data's is the point
        return Interval(mean, mean, IntervalMethod.T, confidence)
    low, high = sps().t.interval(confidence, df=len(x) - 1, loc=mean, scale=sem)
    return Interval(float(low), float(high), IntervalMethod.T, confidence)


def bootstrap_interval(samples: tuple[np.ndarray, ...], statistic: Callable[..., np.ndarray],
                       settings: StatsSettings = StatsSettings(), stratified: bool = False) -> Interval:
    """scipy's bootstrap interval of `statistic` (vectorised, `axis` keyword), each sample resampled on its own:
    BCa, or percentile where BCa is degenerate (all values equal, a jackknife without spread)."""
    methods = ((IntervalMethod.STRATIFIED_BCA, IntervalMethod.STRATIFIED_PERCENTILE) if stratified
               else (IntervalMethod.BCA, IntervalMethod.PERCENTILE))
    # All values equal: BCa's jackknife has no spread (scipy's answer is NaN, or rounding noise); percentile is exact.
    flat = all(np.ptp(sample) == 0 for sample in samples)
    for recorded, method in list(zip(methods, ("BCa", "percentile")))[flat:]:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", sps().DegenerateDataWarning)
            warnings.simplefilter("ignore", RuntimeWarning)
            result = sps().bootstrap(samples, statistic, vectorized=True, method=method,
                                     confidence_level=settings.confidence, n_resamples=settings.n_resamples,
                                     rng=np.random.default_rng(settings.seed))
        low, high = (float(v) for v in result.confidence_interval)
        if math.isfinite(low) and math.isfinite(high):
            return Interval(low, high, recorded, settings.confidence)
    point = float(statistic(*samples, axis=-1))
    return Interval(point, point, methods[1], settings.confidence)


def _mean(x: np.ndarray, axis: int = -1) -> np.ndarray:
    return np.mean(x, axis=axis)


def _mean_difference(x: np.ndarray, y: np.ndarray, axis: int = -1) -> np.ndarray:
    return np.mean(x, axis=axis) - np.mean(y, axis=axis)


# ----- a row against the baseline --------------------------------------------------------------------------
@dataclass(frozen=True)
class Difference:
    """A row's mean minus the baseline row's (fractions), with its interval, the test's p-value and the verdict."""

    baseline: str
    difference: float
    interval: Interval | None
    p_value: float | None
    test: SignificanceTest
    verdict: Verdict
    n: int
    n_baseline: int
    note: str = ""  # why the replicates are too few to tell, where they are
    plan: SeedPlan | None = None  # with plan_seeds: the replicates per side Welch's test needs at the settings' power


def versus(values: Sequence[float], baseline_values: Sequence[float], baseline: str,
           settings: StatsSettings = StatsSettings()) -> Difference:
    """The row's replicates against the baseline's, by the settings' test."""
    x, y = finite(values), finite(baseline_values)
    difference = float(np.mean(x) - np.mean(y)) if len(x) and len(y) else math.nan
    test = SignificanceTest.WELCH if settings.test == Significance.WELCH else SignificanceTest.PERMUTATION
    too_few = too_few_reason(len(x), len(y), settings)
    plan = plan_seeds(x, y, settings.alpha, settings.power) if settings.plan_seeds else None
    if min(len(x), len(y)) < MIN_REPLICATES:
        return Difference(baseline, difference, None, None, test, Verdict.TOO_FEW, len(x), len(y), too_few, plan)
    p_value, interval = welch(x, y, settings) if test == SignificanceTest.WELCH else permutation(x, y, settings)
    verdict = Verdict.TOO_FEW if too_few else decide(p_value, interval, settings.alpha)
    return Difference(baseline, difference, interval, p_value, test, verdict, len(x), len(y), too_few, plan)


def too_few_reason(n: int, n_baseline: int, settings: StatsSettings = StatsSettings()) -> str:
    """Why the replicates cannot tell, or "": fewer than two on a side (no variance to test with), or, for the
    permutation test, so few that even the most extreme arrangement gives p >= alpha."""
    if min(n, n_baseline) < MIN_REPLICATES:
        return f"{n} vs {n_baseline} replicates: a test needs at least {MIN_REPLICATES} on each side"
    floor = permutation_floor(n, n_baseline)
    if settings.test == Significance.PERMUTATION and floor >= settings.alpha:
        return (f"{n} vs {n_baseline} replicates: the smallest p a permutation test can reach is {floor:.3g}, "
                f"not below alpha {settings.alpha:g}")
    return ""


def permutation_floor(n: int, n_baseline: int) -> float:
    """The smallest two-sided p-value an exact permutation test of n against n_baseline values can give: the
    observed split is one of C(n + n_baseline, n), doubled for two sides."""
    return min(1.0, 2 / math.comb(n + n_baseline, n))


def welch(x: np.ndarray, y: np.ndarray, settings: StatsSettings = StatsSettings()) -> tuple[float, Interval]:
    """Welch's t-test (unequal variances) and its interval of the difference, both scipy's ttest_ind."""
    result = sps().ttest_ind(x, y, equal_var=False)
    low, high = result.confidence_interval(settings.confidence)
    return float(result.pvalue), Interval(float(low), float(high), IntervalMethod.WELCH, settings.confidence)


def permutation(x: np.ndarray, y: np.ndarray, settings: StatsSettings = StatsSettings()) -> tuple[float, Interval]:
    """scipy's permutation test of the difference of means (exact when the splits are fewer than n_resamples),
    with a two-sample bootstrap interval of the difference."""
    result = sps().permutation_test((x, y), _mean_difference, vectorized=True, n_resamples=settings.n_resamples,
                                    rng=np.random.default_rng(settings.seed))
    return float(result.pvalue), bootstrap_interval((x, y), _mean_difference, settings)


def decide(p_value: float, interval: Interval, alpha: float = ALPHA) -> Verdict:
    """Better or worse only when the test rejects AND the interval of the difference excludes zero on that side:
    a large difference with a wide interval is not distinguishable. A NaN p (no spread, equal means) tells nothing."""
    if not (math.isfinite(p_value) and p_value < alpha and interval.excludes_zero()):
        return Verdict.SAME
    return Verdict.BETTER if interval.low > 0 else Verdict.WORSE


# ----- several datasets: mean rank and the IQM of normalised scores ----------------------------------------
@dataclass(frozen=True)
class MethodAggregate:
    """One method over the comparison's datasets."""

    method: str
    datasets: int  # how many of the datasets it has a ranked row in
    mean_rank: float  # 1 is the best; ties share the mean of their ranks
    iqm: float | None  # interquartile mean of its normalised replicate scores pooled over datasets
    interval: Interval | None  # stratified bootstrap: seeds resampled within each dataset
    scores: int  # how many normalised scores went into the IQM


def aggregate(scores: Mapping[str, Mapping[str, Sequence[float]]],
              settings: StatsSettings = StatsSettings()) -> list[MethodAggregate]:
    """`scores[dataset][method]`: each method's replicate values of the dataset's ranking column. Methods in the
    order they first appear, each on the datasets it has values for."""
    ranks = {dataset: mean_ranks(by_method) for dataset, by_method in scores.items()}
    normalised = {dataset: normalise(by_method) for dataset, by_method in scores.items()}
    methods = list(dict.fromkeys(m for by_method in scores.values() for m in by_method))
    found = []
    for method in methods:
        mine = [ranks[d][method] for d in scores if method in ranks[d]]
        strata = [normalised[d][method] for d in scores if method in normalised[d] and len(normalised[d][method])]
        iqm, interval = iqm_interval(strata, settings)
        found.append(MethodAggregate(method, len(mine), float(np.mean(mine)) if mine else math.nan, iqm, interval,
                                     sum(len(s) for s in strata)))
    return found


def mean_ranks(by_method: Mapping[str, Sequence[float]]) -> dict[str, float]:
    """Each method's rank by its mean in one dataset (1: the highest mean; ties averaged); methods without a
    finite value are not ranked."""
    means = {m: float(np.mean(finite(v))) for m, v in by_method.items() if len(finite(v))}
    ranked = sps().rankdata([-v for v in means.values()], method="average")
    return {m: float(r) for m, r in zip(means, ranked)}


def normalise(by_method: Mapping[str, Sequence[float]]) -> dict[str, np.ndarray]:
    """Min-max over every method's replicate values in the dataset (NORMALISATION)."""
    finite_by_method = {m: finite(v) for m, v in by_method.items()}
    pooled = np.concatenate(list(finite_by_method.values()) or [np.empty(0)])
    if not len(pooled):
        return finite_by_method
    low, high = float(pooled.min()), float(pooled.max())
    if high == low:
        return {m: np.full_like(v, 0.5) for m, v in finite_by_method.items()}
    return {m: (v - low) / (high - low) for m, v in finite_by_method.items()}


def iqm(values: np.ndarray, axis: int = -1) -> np.ndarray:
    """The interquartile mean: the mean of the middle half, robust to a stray seed and less noisy than a median."""
    return sps().trim_mean(values, IQM_TRIM, axis=axis)


def iqm_interval(strata: Sequence[np.ndarray], settings: StatsSettings = StatsSettings()
                 ) -> tuple[float | None, Interval | None]:
    """The IQM of the pooled strata (one per dataset) and its stratified bootstrap interval: each dataset's seeds
    resampled on their own, a dataset with one seed held fixed. No interval when no dataset has two seeds."""
    if not strata:
        return None, None
    pooled = np.concatenate(strata)
    point = float(iqm(pooled))
    varied = tuple(s for s in strata if len(s) >= MIN_REPLICATES)
    if not varied:
        return point, None
    fixed = np.concatenate([s for s in strata if len(s) < MIN_REPLICATES] or [np.empty(0)])

    def pooled_iqm(*samples: np.ndarray, axis: int = -1) -> np.ndarray:
        held = np.broadcast_to(fixed, samples[0].shape[:-1] + fixed.shape)
        return iqm(np.concatenate([*samples, held], axis=-1), axis=-1)

    return point, bootstrap_interval(varied, pooled_iqm, settings, stratified=True)


# ----- selection cost: what each rule would have chosen from the search trials ------------------------------
class _RuleWords(Words):
    @property
    def split(self) -> str:
        """The split whose best value the rule takes: the protocol's is OOD validation ("val")."""
        return SELECTION_RULES[self.value].split or "val"


# A selection rule, named as `--selection` names the strategy (raybench.words declares them): OOD_VAL, the
# protocol's; ID_VAL; ORACLE, the test split itself, analysis only.
Rule = _RuleWords("Rule", {name.upper(): name for name in SELECTION_RULES})
RULES = tuple(Rule)
REPORT_SPLIT = "test"  # what every rule's choice is judged on: OOD test on a shift, the test split of SpuCo


@dataclass(frozen=True)
class Choice:
    """The trial one rule picks: the highest value of the rule's metric at its best epoch (ties: the earlier)."""

    rule: Rule
    key: str  # the metric the rule maximises: `best/val/acc`
    trial_id: str | None = None
    order: int | None = None
    chosen_on: float | None = None  # the chosen trial's value of `key`
    test: float | None = None  # its value on the report split: what the choice is worth
    note: str = ""  # why there is no choice

    @property
    def made(self) -> bool:
        return self.trial_id is not None


@dataclass(frozen=True)
class SelectionCost:
    """What each rule picks among one sweep's search trials; single-seed, since each trial ran once."""

    metric: str  # the selection metric's name without its split: `acc`, `worst_group_acc`
    choices: tuple[Choice, ...]  # in RULES order
    trials: int  # the finished (selectable) trials the rules chose among

    def choice(self, rule: Rule) -> Choice:
        return next(c for c in self.choices if c.rule == rule)

    @property
    def cost(self) -> float | None:
        """The oracle's test value minus the protocol's (OOD val) choice's: what selecting by validation costs."""
        protocol, oracle = self.choice(Rule.OOD_VAL).test, self.choice(Rule.ORACLE).test
        return None if protocol is None or oracle is None else oracle - protocol


def selection_cost(trials: Sequence[TrialRecord], metric: str, has_id_val: bool) -> SelectionCost:
    """Each rule's pick among the finished trials; `metric` is the selection metric's name (`acc`), `has_id_val`
    whether the dataset has an ID validation split."""
    finished = [t for t in trials if t.status.selectable]
    choices = tuple(choose(finished, rule, metric) if rule != Rule.ID_VAL or has_id_val
                    else Choice(rule, _key(rule, metric), note="the dataset has no ID val split")
                    for rule in RULES)
    return SelectionCost(metric, choices, len(finished))


def _key(rule: Rule, metric: str) -> str:
    return f"{BEST_PREFIX}{rule.split}/{metric}"


def choose(trials: Sequence[TrialRecord], rule: Rule, metric: str) -> Choice:
    """The trial with the highest finite value of the rule's metric; ties go to the earlier-sampled trial."""
    key, test_key = _key(rule, metric), f"{BEST_PREFIX}{REPORT_SPLIT}/{metric}"
    scored = [t for t in trials if is_finite_number(t.metrics.get(key))]
    if not scored:
        return Choice(rule, key, note=f"no finished trial recorded {key}")
    best = max(scored, key=lambda t: (t.metrics[key], -t.order))
    test = best.metrics.get(test_key)
    return Choice(rule, key, best.trial_id, best.order, float(best.metrics[key]),
                  float(test) if is_finite_number(test) else None)



@dataclass(frozen=True)
class RuleRanking:
    """The methods ordered by the test value of the trial a rule picks for each (best first)."""

    rule: Rule
    methods: tuple[str, ...]


@dataclass(frozen=True)
class RankAgreement:
    """Kendall's tau-b between two rules' scorings of the methods both can score; None below two methods."""

    first: Rule
    second: Rule
    tau: float | None
    methods: int


def rankings(costs: Mapping[str, SelectionCost]) -> tuple[list[RuleRanking], list[RankAgreement]]:
    """Each rule's ranking of the methods, and Kendall's tau between every pair of rules."""
    tests = {rule: {m: c.choice(rule).test for m, c in costs.items() if c.choice(rule).test is not None}
             for rule in RULES}
    ranked = [RuleRanking(rule, tuple(sorted(tests[rule], key=lambda m, r=rule: -tests[r][m]))) for rule in RULES]
    agreements = []
    for first, second in combinations(RULES, 2):
        common = [m for m in costs if m in tests[first] and m in tests[second]]
        tau = rank_agreement([tests[first][m] for m in common], [tests[second][m] for m in common])
        agreements.append(RankAgreement(first, second, tau, len(common)))
    return ranked, agreements


def rank_agreement(first: Sequence[float], second: Sequence[float]) -> float | None:
    """Kendall's tau-b of two scorings of the same items: 1 the same order, -1 reversed; None when it is undefined
    (fewer than two items, or one scoring constant)."""
    if len(first) < 2:
        return None
    tau = float(sps().kendalltau(first, second).statistic)
    return tau if math.isfinite(tau) else None
