"""The sweep figures plot what the records say: points per trial, the selected one marked, log axes, curves."""
from __future__ import annotations

import math

import pytest

from raybench.records import SweepSummary
from raybench.sweep import plots
from raybench.sweep.importance import importances


def trial(trial_id: str, lr: float, ratio: int, value, id_acc: float, ood_acc: float, status: str = "ok") -> dict:
    return {"trial_id": trial_id, "sampled": {"lr": lr, "unlabeled_ratio": ratio}, "status": status,
            "selection_value": value, "metrics": {"best/id_test/acc": id_acc, "best/test/acc": ood_acc}}


@pytest.fixture
def summary() -> SweepSummary:
    trials = [trial("t_00000", 1e-4, 3, 0.60, 0.90, 0.55), trial("t_00001", 1e-3, 7, 0.72, 0.95, 0.66),
              trial("t_00002", 1e-2, 15, 0.41, 0.70, 0.40),
              trial("t_00003", 3e-2, 3, None, math.nan, math.nan, status="failed")]
    replicates = [{"trial_id": "t_00001", "seed": s, "status": "ok", "metrics": {"best/id_test/acc": 0.94 + s / 100,
                                                                  "best/test/acc": 0.65 + s / 100}} for s in range(3)]
    return SweepSummary.from_json({"name": "demo", "algorithm": "dann", "dataset": "digits-shift", "metric_names": ["acc"],
                                   "selection": {"metric": "val/acc"}, "trials": trials, "selected": trials[1],
                                   "replicates": {"runs": replicates}})


def offsets(collection) -> list[tuple[float, float]]:
    return [tuple(map(float, row)) for row in collection.get_offsets()]


def test_search_plot_has_a_point_per_scored_trial_and_marks_the_selected_one(summary):
    figure = plots.search_figure(summary, {"lr": "log", "unlabeled_ratio": "categorical"})
    axes = {ax.get_xlabel().split(" (")[0]: ax for ax in figure.axes}
    assert set(axes) == {"lr", "unlabeled_ratio"}
    lr = axes["lr"]
    trials, selected = lr.collections
    assert sorted(x for x, _ in offsets(trials)) == [1e-4, 1e-3, 1e-2]  # the failed trial has no value to plot
    assert offsets(selected) == [(1e-3, pytest.approx(72.0))]
    assert lr.get_xscale() == "log"
    ratio = axes["unlabeled_ratio"]  # a choice: evenly spaced, labelled ticks in sorted order
    assert sorted(x for x, _ in offsets(ratio.collections[0])) == [0.0, 1.0, 2.0]
    assert [t.get_text() for t in ratio.get_xticklabels()] == ["3", "7", "15"]
    assert lr.get_ylabel() == "best val/acc (%)" and figure._suptitle.get_text().startswith("demo: dann on digits-shift")
    assert [t.get_text() for t in lr.get_legend().get_texts()] == ["trial", "selected"]


def test_curves_plot_draws_one_line_per_run_in_percent(summary):
    curves = [plots.Curve("selected trial t_00001", [0, 1, 2], [0.5, 0.6, 0.72]),
              plots.Curve("replicate, seed 0", [0, 1, 2], [0.4, 0.62, 0.7])]
    (ax,) = plots.curves_figure(summary, curves).axes
    assert [list(line.get_ydata()) for line in ax.lines] == [[50.0, 60.0, 72.0], [40.0, 62.0, 70.0]]
    assert ax.get_xlabel() == "epoch" and [t.get_text() for t in ax.get_legend().get_texts()] == [c.label for c in curves]


def test_id_ood_plot_has_every_trial_and_replicate_with_both_numbers(summary):
    (ax,) = plots.id_ood_figure(summary).axes
    trials, replicates = ax.collections
    assert len(offsets(trials)) == 3 and len(offsets(replicates)) == 3
    assert (pytest.approx(95.0), pytest.approx(66.0)) in offsets(trials)
    assert ax.get_xlabel() == "ID test acc (%)" and ax.get_ylabel() == "OOD test acc (%)"


def test_without_an_id_split_there_is_no_id_ood_plot(summary):
    for run in [*summary.trials, *summary.replicates.runs]:
        run.metrics.pop("best/id_test/acc")
    assert plots.id_ood_figure(summary) is None
    assert set(plots.sweep_figures(summary, {}, [])) == {"search.png", "curves.png", "importance.png"}


def test_save_writes_non_empty_pngs_and_nothing_else(summary, tmp_path):
    written = plots.save(plots.sweep_figures(summary, {"lr": "log"}, []), tmp_path / "plots")
    assert sorted(p.name for p in written) == ["curves.png", "id_vs_ood.png", "importance.png", "search.png"]
    assert sorted(p.name for p in (tmp_path / "plots").iterdir()) == sorted(p.name for p in written)
    for path in written:
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and path.stat().st_size > 5000


def test_importance_chart_draws_one_bar_per_rated_hyperparameter_the_most_important_on_top(summary):
    found = importances(summary, {"lr": "log", "unlabeled_ratio": "categorical"})
    (ax,) = plots.importance_figure(summary, found).axes
    shares = [100 * p.share for p in found.params]
    assert [bar.get_width() for bar in ax.patches] == pytest.approx(shares[::-1])  # barh draws bottom-up
    assert [t.get_text() for t in ax.get_yticklabels()] == [f"{p.name} ({p.scale})" for p in found.params][::-1]
    assert {t.get_text() for t in ax.get_yticklabels()} == {"lr (log)", "unlabeled_ratio (categorical)"}
    assert ax.get_xlabel() == "share of the main effects on best val/acc (%)"
    assert ax.get_title().startswith("demo: dann on digits-shift") and "fANOVA over 3 of 4 trials" in ax.get_title()
    footer = " ".join(text.get_text() for text in ax.figure.texts)
    assert "left out: 1 failed" in footer and "3 trials make rough importances" in footer
