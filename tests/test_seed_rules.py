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
    assert rule.next_count([0.1, 0.12, 0.11], [0.9, 0.91, 0.89]) is None


def test_no_difference_runs_to_the_cap():
    rng = np.random.default_rng(1)
    rule = SequentialRule(first=3, cap=10)
    x, y, n = list(rng.normal(0.5, 0.05, 3)), list(rng.normal(0.5, 0.05, 3)), 3
    while (wanted := rule.next_count(x, y)) is not None:
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
