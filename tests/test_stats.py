"""`raybench compare --stats` (raybench/report/stats.py): the intervals and tests against scipy's own on fixed data,
the verdicts (an interval that reaches over zero is never "better"), "too few to tell", what each selection rule
picks from hand-built trial records, Kendall's tau on known rankings, the aggregate over datasets, and every format
carrying the new fields on a comparison built from hand-built summaries (as tests/test_compare.py builds them)."""
from __future__ import annotations

import io
import json
import math
from dataclasses import replace
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest
from pylatexenc.latexwalker import LatexEnvironmentNode, LatexWalker
from scipy import stats as sps
from test_compare import SPUCO_REPORT, summary

from raybench.cli import main
from raybench.records import SweepSummary, TrialRecord
from raybench.report.compare import BaselineError, Comparison, compare, records, render_comparison
from raybench.report.renderers import FORMATS
from raybench.report.stats import (
    IntervalChoice,
    IntervalMethod,
    Rule,
    Significance,
    SignificanceTest,
    StatsSettings,
    Verdict,
    aggregate,
    bootstrap_interval,
    decide,
    mean_interval,
    normalise,
    permutation_floor,
    rank_agreement,
    rankings,
    selection_cost,
    t_interval,
    versus,
)
from raybench.sweep.outcome import summarize

X = [0.61, 0.64, 0.58, 0.66, 0.60]
Y = [0.55, 0.57, 0.52, 0.58, 0.54]
BOOTSTRAP = StatsSettings(interval=IntervalChoice.BOOTSTRAP, n_resamples=2000, seed=7)
PERMUTATION = StatsSettings(test=Significance.PERMUTATION, n_resamples=2000, seed=7)


# ----- intervals and tests against scipy ------------------------------------------------------------------------
def test_the_t_interval_is_scipys():
    interval = mean_interval(X)
    low, high = sps.t.interval(0.95, df=len(X) - 1, loc=np.mean(X), scale=sps.sem(X))
    assert (interval.low, interval.high) == pytest.approx((low, high)) and interval.method == IntervalMethod.T
    assert t_interval(np.array([0.5, 0.5, 0.5])) == t_interval(np.array([0.5, 0.5, 0.5]))  # no spread: the point
    assert (t_interval(np.array([0.5, 0.5])).low, t_interval(np.array([0.5, 0.5])).high) == (0.5, 0.5)


def test_the_bootstrap_interval_is_scipys_bca_with_the_same_generator():
    interval = mean_interval(X, BOOTSTRAP)
    expected = sps.bootstrap((np.array(X),), np.mean, method="BCa", n_resamples=2000,
                             rng=np.random.default_rng(7)).confidence_interval
    assert (interval.low, interval.high) == pytest.approx((expected.low, expected.high))
    assert interval.method == IntervalMethod.BCA


def test_the_bootstrap_falls_back_to_percentile_where_bca_is_degenerate_and_says_so():
    interval = mean_interval([0.7, 0.7, 0.7], BOOTSTRAP)  # BCa's jackknife has no spread: scipy gives NaN
    assert interval.method == IntervalMethod.PERCENTILE and (interval.low, interval.high) == pytest.approx((0.7, 0.7))


def test_one_replicate_has_no_interval():
    assert mean_interval([0.5]) is None and mean_interval([0.5, math.nan]) is None
    assert mean_interval([0.5], BOOTSTRAP) is None


def test_welchs_t_is_scipys_ttest_ind_with_unequal_variances():
    difference = versus(X, Y, "erm")
    expected = sps.ttest_ind(X, Y, equal_var=False)
    ci = expected.confidence_interval(0.95)
    assert difference.test == SignificanceTest.WELCH and difference.p_value == pytest.approx(expected.pvalue)
    assert (difference.interval.low, difference.interval.high) == pytest.approx((ci.low, ci.high))
    assert difference.interval.method == IntervalMethod.WELCH
    assert difference.difference == pytest.approx(np.mean(X) - np.mean(Y)) and (difference.n, difference.n_baseline) == (5, 5)
    assert difference.verdict == Verdict.BETTER and versus(Y, X, "dann").verdict == Verdict.WORSE


def test_the_permutation_test_is_scipys_with_a_bootstrap_interval_of_the_difference():
    difference = versus(X, Y, "erm", PERMUTATION)
    expected = sps.permutation_test((np.array(X), np.array(Y)), lambda x, y, axis: x.mean(axis) - y.mean(axis),
                                    vectorized=True, n_resamples=2000, rng=np.random.default_rng(7))
    assert difference.test == SignificanceTest.PERMUTATION and difference.p_value == pytest.approx(expected.pvalue)
    assert difference.interval.method in (IntervalMethod.BCA, IntervalMethod.PERCENTILE)
    assert difference.interval.low > 0 and difference.verdict == Verdict.BETTER


def test_too_few_replicates_to_tell_with_one_on_either_side():
    for difference in (versus([0.9], Y, "erm"), versus(X, [0.1], "erm")):
        assert difference.verdict == Verdict.TOO_FEW and difference.p_value is None and difference.interval is None
        assert "at least 2 on each side" in difference.note
    assert versus([0.9], Y, "erm").difference == pytest.approx(0.9 - np.mean(Y))  # the difference is still shown


def test_a_permutation_test_of_three_against_three_cannot_reach_alpha_and_says_so():
    assert permutation_floor(3, 3) == pytest.approx(0.1) and permutation_floor(5, 5) == pytest.approx(2 / 252)
    difference = versus([0.9, 0.91, 0.92], [0.1, 0.11, 0.12], "erm", PERMUTATION)  # as far apart as can be
    assert difference.verdict == Verdict.TOO_FEW and "smallest p a permutation test can reach is 0.1" in difference.note
    assert difference.p_value == pytest.approx(0.1) and difference.interval.low > 0  # shown, yet no verdict
    assert versus([0.9, 0.91, 0.92], [0.1, 0.11, 0.12], "erm").verdict == Verdict.BETTER  # Welch's t can tell


def test_a_big_difference_with_a_huge_variance_is_not_distinguishable():
    difference = versus([0.95, 0.20, 0.90], [0.40, 0.45, 0.42], "erm")  # +26 points on average
    assert difference.difference == pytest.approx(0.26)
    assert difference.interval.low < 0 < difference.interval.high and difference.verdict == Verdict.SAME


def test_the_verdict_needs_the_interval_to_exclude_zero_not_only_a_small_p():
    from raybench.report.stats import Interval

    assert decide(0.01, Interval(-0.01, 0.05, IntervalMethod.BCA)) == Verdict.SAME
    assert decide(0.01, Interval(0.01, 0.05, IntervalMethod.BCA)) == Verdict.BETTER
    assert decide(0.01, Interval(-0.05, -0.01, IntervalMethod.BCA)) == Verdict.WORSE
    assert decide(0.20, Interval(0.01, 0.05, IntervalMethod.BCA)) == Verdict.SAME
    assert decide(math.nan, Interval(0.0, 0.0, IntervalMethod.WELCH)) == Verdict.SAME


# ----- the aggregate over datasets ------------------------------------------------------------------------------
SCORES = {"a": {"erm": [0.50, 0.52, 0.54], "dann": [0.60, 0.62, 0.64], "coral": [0.55]},
          "b": {"erm": [0.80, 0.82], "dann": [0.70, 0.72, 0.74]}}


def test_mean_rank_and_the_iqm_of_min_max_normalised_scores_with_a_stratified_bootstrap():
    settings = StatsSettings(n_resamples=2000, seed=3)
    found = {a.method: a for a in aggregate(SCORES, settings)}
    assert [found[m].mean_rank for m in ("erm", "dann", "coral")] == [2.0, 1.5, 2.0]
    assert [found[m].datasets for m in ("erm", "dann", "coral")] == [2, 2, 1]
    normalised = normalise(SCORES["a"])  # over every method's values in the dataset: 0.50 -> 0, 0.64 -> 1
    assert normalised["erm"][0] == 0 and normalised["dann"][-1] == 1 and normalised["coral"][0] == pytest.approx(5 / 14)
    erm = [normalised["erm"], normalise(SCORES["b"])["erm"]]
    assert found["erm"].iqm == pytest.approx(sps.trim_mean(np.concatenate(erm), 0.25)) and found["erm"].scores == 5
    expected = sps.bootstrap(tuple(erm), lambda *s, axis: sps.trim_mean(np.concatenate(s, axis=-1), 0.25, axis=-1),
                             vectorized=True, n_resamples=2000, rng=np.random.default_rng(3)).confidence_interval
    assert (found["erm"].interval.low, found["erm"].interval.high) == pytest.approx((expected.low, expected.high))
    assert found["erm"].interval.method == IntervalMethod.STRATIFIED_BCA
    assert found["coral"].interval is None  # one seed on one dataset: nothing to resample


def test_a_dataset_where_every_value_is_equal_normalises_to_one_half():
    assert list(normalise({"erm": [0.5, 0.5], "dann": [0.5]})["dann"]) == [0.5]


# ----- selection cost ----------------------------------------------------------------------------------------------
def trial(order: int, val: float, id_val: float, test: float, status: str = "ok") -> TrialRecord:
    return TrialRecord.from_json({"trial_id": f"t{order}", "order": order, "status": status,
                                  "metrics": {"best/val/acc": val, "best/id_val/acc": id_val, "best/test/acc": test}})


# Each rule picks a different trial: t0 has the best OOD val, t1 the best ID val, t2 the best OOD test. t3 failed
# with the best of everything and must not be picked; t4 ties t0 on OOD val and loses to the earlier trial.
TRIALS = [trial(0, 0.70, 0.90, 0.50), trial(1, 0.60, 0.95, 0.55), trial(2, 0.65, 0.80, 0.62),
          trial(3, 0.99, 0.99, 0.99, status="failed"), trial(4, 0.70, 0.85, 0.58)]


def test_each_rule_picks_its_own_trial_and_the_cost_is_the_oracles_gain_over_ood_val():
    cost = selection_cost(TRIALS, "acc", has_id_val=True)
    picks = {c.rule: (c.trial_id, c.chosen_on, c.test) for c in cost.choices}
    assert picks == {Rule.OOD_VAL: ("t0", 0.70, 0.50), Rule.ID_VAL: ("t1", 0.95, 0.55), Rule.ORACLE: ("t2", 0.62, 0.62)}
    assert cost.cost == pytest.approx(0.12) and cost.trials == 4
    assert [c.key for c in cost.choices] == ["best/val/acc", "best/id_val/acc", "best/test/acc"]


def test_a_dataset_without_id_val_says_so_and_still_picks_by_the_other_rules():
    cost = selection_cost(TRIALS, "acc", has_id_val=False)
    assert not cost.choice(Rule.ID_VAL).made and cost.choice(Rule.ID_VAL).note == "the dataset has no ID val split"
    assert cost.choice(Rule.OOD_VAL).trial_id == "t0" and cost.cost == pytest.approx(0.12)
    blank = selection_cost([TrialRecord.from_json({"trial_id": "x", "status": "ok"})], "acc", has_id_val=True)
    assert blank.cost is None and blank.choice(Rule.ORACLE).note == "no finished trial recorded best/test/acc"


def test_kendalls_tau_on_known_rankings():
    assert rank_agreement([1, 2, 3, 4], [10, 20, 30, 40]) == 1.0
    assert rank_agreement([1, 2, 3, 4], [4, 3, 2, 1]) == -1.0
    assert rank_agreement([1, 2, 3], [1, 3, 2]) == pytest.approx(sps.kendalltau([1, 2, 3], [1, 3, 2]).statistic)
    assert rank_agreement([1], [1]) is None and rank_agreement([1, 1], [1, 2]) is None  # undefined, not 0


def test_rankings_under_each_rule_and_the_tau_between_them():
    def cost(val_pick_test: float, oracle_test: float):
        return selection_cost([trial(0, 0.9, 0.9, val_pick_test), trial(1, 0.1, 0.1, oracle_test)], "acc", True)

    costs = {"erm": cost(0.50, 0.90), "dann": cost(0.60, 0.80), "coral": cost(0.70, 0.70)}
    ranked, agreements = rankings(costs)
    assert {r.rule: r.methods for r in ranked} == {Rule.OOD_VAL: ("coral", "dann", "erm"),
                                                   Rule.ID_VAL: ("coral", "dann", "erm"),
                                                   Rule.ORACLE: ("erm", "dann", "coral")}
    taus = {(a.first, a.second): a.tau for a in agreements}
    assert taus == {(Rule.OOD_VAL, Rule.ID_VAL): 1.0, (Rule.OOD_VAL, Rule.ORACLE): -1.0, (Rule.ID_VAL, Rule.ORACLE): -1.0}


# ----- the comparison, in every format ------------------------------------------------------------------------------
def sweep(name: str, space: str, tests: list[float], trials: list[tuple[float, float, float]], **kw) -> dict:
    """test_compare's summary with replicate runs (OOD and ID test) and search trials (OOD val, ID val, OOD test)."""
    record = summary(name, space, {}, **kw)
    runs = [{"trial_id": f"{name}-r{i}", "status": "ok", "seed": i,
             "metrics": {"best/test/acc": t, "best/id_test/acc": 0.9 + t / 10}} for i, t in enumerate(tests)]
    record["replicates"] = {"seeds": list(range(len(runs))), "ok": len(runs), "runs": runs,
                            "summary": summarize([TrialRecord.from_json(r) for r in runs])}
    record["trials"] = [trial(i, *values).to_json(public=True) for i, values in enumerate(trials)]
    return record


DEFAULTS = StatsSettings()


def stats_comparison(settings: StatsSettings = DEFAULTS) -> Comparison:
    sweeps = [
        sweep("s-erm", "erm", [0.55, 0.58, 0.52], [(0.6, 0.90, 0.55), (0.5, 0.95, 0.50), (0.55, 0.8, 0.60)]),
        sweep("s-dann", "dann", [0.65, 0.66, 0.64], [(0.7, 0.90, 0.64), (0.6, 0.92, 0.60), (0.65, 0.85, 0.68)]),
        sweep("s-coral", "coral", [0.40, 0.80, 0.60], [(0.6, 0.90, 0.58), (0.5, 0.95, 0.61), (0.55, 0.8, 0.59)]),
        sweep("s-one", "fish", [0.70], [(0.6, 0.9, 0.7)]),
        sweep("s-oracle", "erm_aug", [0.70, 0.71], [(0.6, 0.9, 0.7)], strategy="oracle", algorithm="erm"),
        sweep("t-erm", "erm", [0.30, 0.32, 0.31], [(0.6, 0.9, 0.31)], dataset="text-shift"),
        sweep("t-dann", "dann", [0.36, 0.35, 0.37], [(0.6, 0.9, 0.36)], dataset="text-shift"),
    ]
    return compare([SweepSummary.from_json(s) for s in sweeps], settings=settings)


@pytest.fixture(scope="module")
def with_stats() -> Comparison:
    return stats_comparison(DEFAULTS)


def test_the_rows_carry_intervals_differences_and_selection_costs_and_no_marks(with_stats):
    digits, text = with_stats.tables
    rows = {r.method: r for r in digits.rows}
    assert all(c.mark == "" for r in digits.rows for c in r.cells.values() if c)  # the verdicts replace the marks
    erm = rows["erm"].cells["test/acc"]
    assert erm.values == (0.55, 0.58, 0.52) and erm.interval.method == IntervalMethod.T
    assert digits.stats.baseline == "erm" and rows["erm"].versus is None
    assert rows["dann"].versus.verdict == Verdict.BETTER and rows["coral"].versus.verdict == Verdict.SAME
    assert rows["fish"].versus.verdict == Verdict.TOO_FEW and rows["fish"].cells["test/acc"].interval is None
    assert rows["erm_aug"].versus is None  # the oracle row is never tested against the protocol's rows
    assert rows["erm"].selection_cost.cost == pytest.approx(0.05)
    assert [r.methods for r in digits.stats.rankings][2] == ("fish", "dann", "coral", "erm")  # by the oracle's pick
    assert [a.methods for a in text.stats.agreements] == [2, 2, 2]
    assert {a.method: a.datasets for a in with_stats.aggregate} == {"erm": 2, "dann": 2, "coral": 1, "fish": 1}


def test_the_table_and_markdown_show_every_answer(with_stats):
    for fmt_name in ("table", "markdown"):
        text = render_comparison(with_stats, fmt_name)
        assert "[95% t interval of the mean]" in text and "55.0 ± 3.0 [47.5, 62.5]" in text, fmt_name
        assert "Against the baseline erm on OOD test acc" in text and "Welch's t-test at alpha 0.05" in text
        for words in ("better", "not distinguishable", "too few replicates to tell", "(baseline)",
                      "fish: 1 vs 3 replicates: a test needs at least 2 on each side"):
            assert words in text, (fmt_name, words)
        assert "What selection costs" in text and "Single-seed" in text and "oracle (OOD test) pick" in text
        assert "epoch its sweep's own selection chose" in text and "Kendall's tau, OOD val vs ID val" in text
        assert "Over 2 datasets" in text and "normalisation: min-max per dataset" in text and "IQM" in text
        assert "within one std" not in text and " **" not in text.replace("**digits", "").replace("**text", "")
    table = render_comparison(with_stats, "table")
    assert "dann                  +10.0" in table  # names read from the left, numbers line up on the right


def test_the_latex_blocks_are_booktabs_tabulars_that_parse_with_one_cell_per_column(with_stats):
    text = render_comparison(with_stats, "latex")
    nodes, _, _ = LatexWalker(text, tolerant_parsing=False).get_latex_nodes()
    tabulars = [n for n in nodes if isinstance(n, LatexEnvironmentNode)]
    assert [n.environmentname for n in tabulars] == ["tabular"] * 9  # per dataset 1 + 3 blocks, then the aggregate
    assert text.count("{") == text.count("}") + text.count("\\{") - text.count("\\}")
    for block in text.split("\\begin{tabular}")[1:]:
        spec = block[1:block.index("}")]
        body = block[block.index("\\toprule"):block.index("\\bottomrule")]
        rows = [line for line in body.splitlines() if line.endswith("\\\\") and "multicolumn" not in line]
        assert rows and all(line.replace("\\&", "").count("&") == len(spec) - 1 for line in rows), spec
    assert "[+3.4, +16.6] & 0.020 & 3 vs 3 & better" in text and "55.0 $\\pm$ 3.0 [47.5, 62.5]" in text
    assert "55.0 (\\#0) & 50.0 (\\#1) & 60.0 (\\#2) & +5.0" in text and "% digits-shift: Kendall's tau" not in text


def test_csv_and_json_carry_the_new_fields_unrounded(with_stats):
    frame = pd.read_csv(io.StringIO(render_comparison(with_stats, "csv")))
    dann = frame[(frame["dataset"] == "digits-shift") & (frame["method"] == "dann")].iloc[0]
    expected = sps.ttest_ind([0.65, 0.66, 0.64], [0.55, 0.58, 0.52], equal_var=False)
    assert dann["vs_baseline.p_value"] == pytest.approx(expected.pvalue) and dann["vs_baseline.verdict"] == "better"
    assert dann["vs_baseline.ci_low"] == pytest.approx(expected.confidence_interval().low)
    assert dann["vs_baseline.test"] == "Welch's t" and dann["vs_baseline.baseline"] == "erm"
    assert dann["test/acc.ci_method"] == "t" and dann["test/acc.ci_low"] < 0.65 < dann["test/acc.ci_high"]
    assert dann["selection_cost.oracle.test"] == 0.68 and dann["selection_cost.ood_val.trial_id"] == "t0"
    assert dann["selection_cost.cost"] == pytest.approx(0.04) and dann["selection_rank.oracle"] == 2
    assert dann["aggregate.mean_rank"] == 1.5 and dann["aggregate.iqm.ci_method"].startswith("stratified")
    assert "mark" not in frame.columns
    data = json.loads(render_comparison(with_stats, "json"))
    assert data["rows"] == json.loads(json.dumps(records(with_stats)))
    assert data["stats"]["interval"] == "t" and data["stats"]["test"] == "welch" and data["stats"]["baseline"] == "erm"
    assert "min-max per dataset" in data["stats"]["normalisation"] and "Single-seed" in data["stats"]["selection_cost"]
    (digits, _) = data["tables"]
    assert digits["baseline"] == "erm" and digits["selection_rankings"]["oracle"][0] == "fish"
    assert {(a["first"], a["second"]) for a in digits["rank_agreement"]} == {
        ("ood_val", "id_val"), ("ood_val", "oracle"), ("id_val", "oracle")}
    assert [a["method"] for a in data["aggregate"]] == ["erm", "dann", "coral", "fish"]


def test_every_format_carries_the_new_fields(with_stats):
    fields = {"table": ["[47.5, 62.5]", "0.020", "better", "Kendall's tau", "IQM"],
              "markdown": ["[47.5, 62.5]", "0.020", "better", "Kendall's tau", "IQM"],
              "latex": ["[47.5, 62.5]", "0.020", "better", "Kendall's tau", "IQM"],
              "csv": ["test/acc.ci_low", "vs_baseline.p_value", "vs_baseline.verdict", "selection_cost.cost",
                      "aggregate.iqm"],
              "json": ["test/acc.ci_low", "vs_baseline.p_value", "kendall_tau", "selection_cost.oracle.test", "iqm"]}
    assert set(fields) == set(FORMATS)
    for fmt_name, words in fields.items():
        text = render_comparison(with_stats, fmt_name)
        assert all(w in text for w in words), (fmt_name, [w for w in words if w not in text])


def test_without_stats_the_marks_stay_and_no_new_field_appears():
    plain = compare([SweepSummary.from_json(sweep("s-erm", "erm", [0.55, 0.58], [(0.6, 0.9, 0.55)]))])
    assert plain.stats is None and plain.tables[0].stats is None and plain.tables[0].rows[0].cells["test/acc"].mark
    assert "vs_baseline.verdict" not in records(plain)[0] and "mark" in records(plain)[0]
    assert "stats" not in json.loads(render_comparison(plain, "json"))


def test_a_baseline_by_sweep_name_and_one_naming_no_row():
    comparison = stats_comparison(StatsSettings(baseline="s-dann"))
    rows = {r.method: r for r in comparison.tables[0].rows}
    assert comparison.tables[0].stats.baseline == "dann" and rows["erm"].versus.verdict == Verdict.WORSE
    assert comparison.tables[1].stats.baseline is None  # text-shift has no s-dann: no differences there, said so
    assert "No differences: no ranked row is named 's-dann'" in render_comparison(comparison, "table")
    with pytest.raises(BaselineError, match="no ranked .* row is named 'erm_aug'; methods and sweeps: coral, dann"):
        stats_comparison(StatsSettings(baseline="erm_aug"))  # the oracle row is never a baseline


def test_spuco_has_no_id_val_rule_and_is_never_called_ood():
    spuco = summary("gb", "gb", {}, dataset="spuco-digits", report=SPUCO_REPORT)
    spuco["selection"]["metric"] = "val/worst_group_acc"
    spuco["trials"] = [{"trial_id": "t0", "status": "ok", "metrics": {"best/val/worst_group_acc": 0.5,
                                                                     "best/test/worst_group_acc": 0.4}}]
    runs = [{"trial_id": f"r{i}", "status": "ok", "metrics": {"best/test/worst_group_acc": v}}
            for i, v in enumerate((0.4, 0.45))]
    spuco["replicates"] = {"seeds": [0, 1], "ok": 2, "runs": runs,
                           "summary": summarize([TrialRecord.from_json(r) for r in runs])}
    comparison = compare([SweepSummary.from_json(spuco)], settings=StatsSettings(baseline="gb"))
    for fmt_name in ("table", "markdown", "latex", "csv"):
        assert "OOD" not in render_comparison(comparison, fmt_name), fmt_name
    text = render_comparison(comparison, "table")
    assert "the test worst-group acc (%) of the search trial" in text and "oracle (test) pick" in text
    assert "Not available: the dataset has no ID val split." in text


# ----- the command line -------------------------------------------------------------------------------------------
@pytest.mark.parametrize("flags", [["--baseline", "erm"], ["--interval", "bootstrap"], ["--test", "permutation"]])
def test_a_stats_flag_without_stats_is_a_one_line_usage_error(flags, capsys):
    assert main(["compare", *flags]) == 2
    err = capsys.readouterr().err
    assert err == f"raybench: error: {flags[0]}: only with --stats\n"


def test_a_baseline_naming_no_row_is_a_one_line_usage_error(monkeypatch, capsys):
    from raybench import tracking

    found = [SimpleNamespace(name=s.name, dataset=s.dataset, algorithm=s.algorithm, summary=s, damage=None,
                             state_line="finished")
             for s in (SweepSummary.from_json(sweep("s-erm", "erm", [0.5, 0.6], [(0.6, 0.9, 0.5)])),)]
    monkeypatch.setattr(tracking, "find_sweeps", lambda *args: found)
    monkeypatch.setattr(tracking, "default_tracking_uri", lambda: "sqlite:///nowhere.db")
    assert main(["compare", "--stats", "--baseline", "dann"]) == 2
    assert capsys.readouterr().err == ("raybench: error: --baseline: no ranked (non-oracle) row is named 'dann'; "
                                       "methods and sweeps: erm, s-erm\n")
    assert main(["compare", "--stats", "--test", "permutation", "--format", "json"]) == 0
    assert json.loads(capsys.readouterr().out)["stats"]["test"] == "permutation"


def test_bootstrap_interval_takes_any_vectorised_statistic():
    interval = bootstrap_interval((np.array(X),), lambda x, axis: np.median(x, axis=axis), BOOTSTRAP)
    assert interval.low <= np.median(X) <= interval.high


def test_json_and_csv_carry_each_rated_hyperparameters_importance_with_stats():
    """The importance column (issue part 3): each row's fANOVA shares over its own search trials."""
    from test_importance import sweep as importance_sweep

    searched = replace(SweepSummary.from_json(sweep("s-imp", "erm", [0.55, 0.58, 0.52], [])),
                       trials=importance_sweep().trials)
    rows = json.loads(render_comparison(compare([searched], settings=DEFAULTS), "json"))["rows"]
    assert rows[0]["importance.lr"] > 0.7 and rows[0]["importance.weight_decay"] < 0.3
    assert "importance.lr" in render_comparison(compare([searched], settings=DEFAULTS), "csv").splitlines()[0]
    assert not [k for k in json.loads(render_comparison(compare([searched]), "json"))["rows"][0] if k.startswith("importance.")]


# ----- --plan-seeds: the replicates each comparison needs --------------------------------------------------------
def test_plan_seeds_adds_the_replicates_each_row_needs_in_every_format():
    from raybench.sweep.seed_rules import plan_seeds

    planned = stats_comparison(StatsSettings(plan_seeds=True))
    rows = {r.method: r for r in planned.tables[0].rows}
    expected = plan_seeds([0.40, 0.80, 0.60], [0.55, 0.58, 0.52]).needed
    assert rows["coral"].versus.plan.needed == expected and expected > 3  # not distinguishable with 3: how many
    assert rows["dann"].versus.plan.needed == plan_seeds([0.65, 0.66, 0.64], [0.55, 0.58, 0.52]).needed
    assert rows["fish"].versus.plan.needed is None  # one replicate: no variance to plan from
    text = render_comparison(planned, "table")
    assert "replicates needed" in text and f"coral: {expected} replicates per side" in text
    assert "fish: needs two replicates on each side to measure a variance." in text
    assert "power 0.8" in text
    by_method = {r["method"]: r for r in records(planned) if r["dataset"] == "digits-shift"}
    assert by_method["coral"]["vs_baseline.replicates_needed"] == expected
    assert "replicates needed" not in render_comparison(stats_comparison(DEFAULTS), "table")  # asked for, not by default


def test_plan_seeds_is_a_stats_flag(tmp_path, capsys):
    assert main(["compare", "--plan-seeds", "--tracking-uri", f"sqlite:///{tmp_path}/m.db"]) == 2
    assert "--plan-seeds: only with --stats" in capsys.readouterr().err
