"""How many seeds: the power plan behind `compare --stats --plan-seeds` and the sequential rule behind
`--replicates auto` (raybench.sweep.seed_rules)."""
from __future__ import annotations

import numpy as np
import pytest

from raybench.sweep.seed_rules import SequentialRule, plan_seeds, welch_power


def exact(mean: float, sd: float, n: int) -> list[float]:
    """n values with exactly this mean and sample std."""
    z = np.linspace(-1.0, 1.0, n)
    z = (z - z.mean()) / z.std(ddof=1)
    return list(mean + sd * z)


def test_the_plan_for_one_std_of_difference_is_the_textbook_seventeen():
    """A two-sample t-test at alpha 0.05 needs 17 per group for power 0.8 at Cohen's d = 1 (16.7, rounded up)."""
    plan = plan_seeds(exact(0.6, 0.1, 3), exact(0.5, 0.1, 3))
    assert plan.needed == 17
    assert welch_power(0.1, 0.1, 0.1, 17) >= 0.8 > welch_power(0.1, 0.1, 0.1, 16)
    assert "17 replicates per side (28 more runs)" in plan.text()


def test_power_from_the_formula_matches_a_simulation():
    rng = np.random.default_rng(0)
    from scipy import stats

    x, y = rng.normal(0.1, 0.1, (4000, 8)), rng.normal(0.0, 0.2, (4000, 8))
    simulated = float(np.mean(stats.ttest_ind(x, y, axis=1, equal_var=False).pvalue < 0.05))
    assert welch_power(0.1, 0.1, 0.2, 8) == pytest.approx(simulated, abs=0.03)


def test_a_plan_out_of_reach_says_why():
    assert plan_seeds([0.5, 0.6, 0.7], [0.5, 0.6, 0.7]).needed is None
    assert "no measured difference" in plan_seeds([0.5, 0.6, 0.7], [0.5, 0.6, 0.7]).text()
    assert "more than 1000" in plan_seeds(exact(0.5001, 0.2, 3), exact(0.5, 0.2, 3)).text()
    assert "two replicates" in plan_seeds([0.5], [0.4, 0.6]).text()


def test_a_large_difference_stops_at_the_first_look():
    rule = SequentialRule(first=3, cap=10)
    assert rule.next_count(3, [0.1, 0.12, 0.11], [0.9, 0.91, 0.89]) is None
    assert rule.next_count(0, [], [0.9, 0.91, 0.89]) == 3  # no look before the first count


def test_no_difference_runs_to_the_cap():
    rng = np.random.default_rng(1)
    rule = SequentialRule(first=3, cap=10)
    x, y, n = list(rng.normal(0.5, 0.05, 3)), list(rng.normal(0.5, 0.05, 3)), 3
    while (wanted := rule.next_count(n, x, y)) is not None:
        x += list(rng.normal(0.5, 0.05, wanted - n))
        y += list(rng.normal(0.5, 0.05, wanted - n))
        n = wanted
    assert n == 10


def false_positive_rate(level_of: SequentialRule, runs: int = 800) -> float:
    """Seeded null sequences (both sides the same normal), looked at from `first` to `cap` one pair at a time."""
    rng = np.random.default_rng(2)
    rejected = 0
    for _ in range(runs):
        x, y = rng.normal(0.0, 1.0, level_of.cap), rng.normal(0.0, 1.0, level_of.cap)
        rejected += any(level_of.decided(x[:n], y[:n]) for n in range(level_of.first, level_of.cap + 1))
    return rejected / runs


def test_the_rule_keeps_its_false_positive_rate_under_alpha_over_all_looks():
    assert false_positive_rate(SequentialRule(first=3, cap=10)) <= 0.05


def test_testing_at_alpha_at_every_look_would_not(monkeypatch):
    """The check above can fail: the naive rule (alpha at each of 8 looks) rejects a true null more often."""
    monkeypatch.setattr(SequentialRule, "level", property(lambda self: self.alpha))
    assert false_positive_rate(SequentialRule(first=3, cap=10)) > 0.07


def test_the_rule_refuses_a_cap_below_its_start():
    with pytest.raises(ValueError, match="first"):
        SequentialRule(first=5, cap=4)


def test_a_failed_replicate_still_counts_towards_the_cap():
    """Three run, one failed (no value): the next look asks for a fourth, not for the third again."""
    rule = SequentialRule(first=3, cap=4)
    assert rule.next_count(3, [0.5, 0.52], [0.5, 0.51, 0.49]) == 4
    assert rule.next_count(4, [0.5, 0.52], [0.5, 0.51, 0.49]) is None


# ----- the runner's looks (raybench.sweep.runner.replicates_until_settled), with the stages faked ---------------
def replicate(seed: int, value: float):
    from raybench.records import TrialRecord, TrialStatus

    return TrialRecord(order=0, trial_id="t1", seed=seed, sampled={}, status=TrialStatus.OK,
                       metrics={"best/test/acc": value})


def settle(values_of_seed, baseline: list[float], first: int = 3, cap: int = 6, grow=None):
    """replicates_until_settled on a fake stage: each look's seeds score values_of_seed(seed); `grow` (count ->
    the baseline's values) stands for the baseline sweep resumed with more replicates."""
    from types import SimpleNamespace

    from raybench.sweep import runner
    from raybench.sweep.outcome import replicate_seeds

    prepared = SimpleNamespace(replicate_rule=SequentialRule(first, cap), report={"columns": [{"key": "test/acc"}]},
                               baseline_values=tuple(baseline), options=SimpleNamespace(baseline="erm-sweep"))
    seeds = replicate_seeds("t1", first)
    looks, checks = [], []

    def look(new_seeds, total):
        looks.append((list(new_seeds), total))
        return [replicate(s, values_of_seed(s)) for s in new_seeds], False

    replicates, seeds = runner.replicates_until_settled(
        prepared, SimpleNamespace(trial_id="t1"), [replicate(s, values_of_seed(s)) for s in seeds], seeds, look,
        lambda runs, ran, cut: checks.append(len(ran)), grow)
    return replicates, seeds, looks, checks


def test_auto_replicates_stop_at_the_first_look_on_a_large_difference():
    _, seeds, looks, _ = settle(lambda seed: 0.5 + (seed % 7) / 1000, [0.90, 0.91, 0.89])
    assert len(seeds) == 3 and looks == []


def test_auto_replicates_run_to_the_cap_when_nothing_differs_each_look_one_seed_of_the_same_stream():
    from raybench.sweep.outcome import replicate_seeds

    rng = np.random.default_rng(3)
    scores = {}
    replicates, seeds, looks, checks = settle(lambda seed: scores.setdefault(seed, float(rng.normal(0.5, 0.05))),
                                              list(rng.normal(0.5, 0.05, 3)))
    assert seeds == replicate_seeds("t1", 6) and len(replicates) == 6
    assert [(len(new), total) for new, total in looks] == [(1, 4), (1, 5), (1, 6)]
    assert checks == [4, 5, 6]  # every look checked for an interruption, with all seeds so far


def test_the_baseline_is_grown_to_each_looks_count_before_the_look_so_both_sides_have_as_many_seeds():
    rng = np.random.default_rng(4)
    baseline = list(rng.normal(0.5, 0.05, 12))
    grown, sides = [], []

    def grow(count):
        grown.append(count)
        return tuple(baseline[:count])

    def score(seed):
        sides.append(len(grown))
        return float(rng.normal(0.5, 0.05))

    _, seeds, looks, _ = settle(score, baseline[:3], grow=grow)
    assert grown == [total for _, total in looks] == [4, 5, 6] and len(seeds) == 6
    assert sides[3:] == [1, 2, 3]  # each look's seed scored after the baseline was grown to that look's count


def test_a_baseline_with_fewer_replicates_than_the_first_look_is_grown_before_the_first_decision():
    grown = []

    def grow(count):
        grown.append(count)
        return (0.90, 0.91, 0.89)[:count]

    _, seeds, looks, _ = settle(lambda seed: 0.5 + (seed % 7) / 1000, [0.90, 0.91], grow=grow)
    assert grown == [3] and looks == [] and len(seeds) == 3  # decided at the first look, 3 against 3


def test_a_baseline_with_more_replicates_than_the_look_needs_is_not_grown():
    grown = []
    settle(lambda seed: 0.5 + (seed % 5) / 100, [0.5, 0.52, 0.48, 0.51, 0.49, 0.5], grow=grown.append)
    assert grown == []


def test_auto_replicates_are_refused_without_a_baseline_and_its_flags_without_auto(tmp_path):
    from raybench.sweep.errors import OptionError
    from raybench.sweep.runner import SweepOptions, check_options

    def refused(**changes) -> str:
        with pytest.raises(OptionError) as err:
            check_options(SweepOptions(space="erm", storage=str(tmp_path), **changes))
        return str(err.value)

    assert refused(replicates="auto").startswith("--replicates auto: expected --baseline SWEEP")
    assert refused(baseline="erm-sweep").startswith("--baseline: only with --replicates auto")
    assert refused(replicates=3, replicates_cap=5).startswith("--replicates-cap: only with --replicates auto")
    check_options(SweepOptions(space="erm", storage=str(tmp_path), replicates="auto", baseline="erm-sweep"))
