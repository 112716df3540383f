"""The sweep figures plot what the records say: points per trial, the selected one marked, log axes, curves; they
name splits and metrics in words, have one legend outside their axes, and save each search panel on its own."""
from __future__ import annotations

import copy
import math

import matplotlib.pyplot as plt
import pytest
from matplotlib.container import ErrorbarContainer

from raybench.labels import GROUP_SPLIT_LABELS, SHIFT_SPLIT_LABELS
from raybench.records import SweepSummary
from raybench.report import plots
from raybench.report.compare import DatasetTable, compare
from raybench.report.importance import importances

SCALES = {"lr": "log", "unlabeled_ratio": "categorical"}


def trial(trial_id: str, lr: float, ratio: int, value, id_acc: float, ood_acc: float, status: str = "ok") -> dict:
    return {"trial_id": trial_id, "sampled": {"lr": lr, "unlabeled_ratio": ratio}, "status": status,
            "selection_value": value, "metrics": {"best/id_test/acc": id_acc, "best/test/acc": ood_acc}}


def summary_json() -> dict:
    trials = [trial("t_00000", 1e-4, 3, 0.60, 0.90, 0.55), trial("t_00001", 1e-3, 7, 0.72, 0.95, 0.66),
              trial("t_00002", 1e-2, 15, 0.41, 0.70, 0.40),
              trial("t_00003", 3e-2, 3, None, math.nan, math.nan, status="failed")]
    replicates = [{"trial_id": "t_00001", "seed": s, "status": "ok", "metrics": {"best/id_test/acc": 0.94 + s / 100,
                                                                  "best/test/acc": 0.65 + s / 100}} for s in range(3)]
    return {"name": "demo", "algorithm": "dann", "dataset": "digits-shift", "metric_names": ["acc"],
            "selection": {"metric": "val/acc"}, "trials": trials, "selected": trials[1],
            "replicates": {"runs": replicates}}


@pytest.fixture(autouse=True)
def closed_figures():
    yield
    plt.close("all")  # the drawing functions leave their figures open for the test to read


@pytest.fixture
def summary() -> SweepSummary:
    return SweepSummary.from_json(summary_json())


CURVES = [plots.Curve("selected trial t_00001", [0, 1, 2], [0.5, 0.6, 0.72]),
          plots.Curve("replicate, seed 0", [0, 1, 2], [0.4, 0.62, 0.7])]


def offsets(collection) -> list[tuple[float, float]]:
    return [tuple(map(float, row)) for row in collection.get_offsets()]


def test_search_plot_has_a_point_per_scored_trial_and_marks_the_selected_one(summary):
    figure = plots.search_figure(summary, SCALES)
    axes = {ax.get_xlabel().split(" (")[0]: ax for ax in figure.axes}
    assert set(axes) == {"lr", "unlabeled_ratio"}
    lr = axes["lr"]
    trials, selected = lr.collections
    assert sorted(x for x, _ in offsets(trials)) == [1e-4, 1e-3, 1e-2]  # the failed trial has no value to plot
    assert offsets(selected) == [(1e-3, pytest.approx(72.0))] and selected.get_paths()  # a star
    assert lr.get_xscale() == "log"
    ratio = axes["unlabeled_ratio"]  # a choice: evenly spaced, labelled ticks in sorted order
    assert sorted(x for x, _ in offsets(ratio.collections[0])) == [0.0, 1.0, 2.0]
    assert [t.get_text() for t in ratio.get_xticklabels()] == ["3", "7", "15"]
    assert lr.get_ylabel() == "OOD validation accuracy (%)"
    assert figure.get_suptitle().startswith("demo: dann on digits-shift — OOD validation accuracy of each trial")
    (legend,) = figure.legends
    assert [t.get_text() for t in legend.get_texts()] == ["search trial", "selected trial"]


def test_tied_trials_are_spread_sideways_the_same_way_every_time_and_no_other_point_moves():
    data = summary_json()
    data["trials"] += [trial("t_00004", 2e-3, 7, 0.72, 0.9, 0.6), trial("t_00005", 5e-3, 7, 0.72, 0.9, 0.6),
                       trial("t_00006", 3e-4, 15, 0.55, 0.9, 0.6)]  # 3 trials at ratio 7 and 72 %
    tied = SweepSummary.from_json(data)

    def drawn():
        figure = plots.search_figure(tied, SCALES)
        return {ax.get_xlabel().split(" (")[0]: ax for ax in figure.axes}, figure

    (axes, figure), (again, _) = drawn(), drawn()
    points = offsets(axes["unlabeled_ratio"].collections[0])
    at_seven = sorted(x for x, y in points if y == pytest.approx(72.0))
    assert at_seven[1] == pytest.approx(1.0) and at_seven[0] < 0.99 and at_seven[2] > 1.01  # spread around 7
    assert at_seven[0] > 0.6 and at_seven[2] < 1.4  # a little: still in its choice's column
    assert at_seven[1] - at_seven[0] == pytest.approx(at_seven[2] - at_seven[1])
    assert points == offsets(again["unlabeled_ratio"].collections[0])  # deterministic
    untied = sorted(x for x, y in points if y != pytest.approx(72.0))
    assert untied == [0.0, 2.0, 2.0]  # 60 % at 3, 41 % and 55 % at 15: distinct values stay put
    assert sorted(x for x, _ in offsets(axes["lr"].collections[0])) == [1e-4, 3e-4, 1e-3, 2e-3, 5e-3, 1e-2]
    (selected,) = offsets(axes["unlabeled_ratio"].collections[1])  # the star sits on its trial's spread point
    assert selected in points
    assert figure.legends[0].get_texts()[0].get_text() == "search trial (ties spread sideways)"


def test_each_search_panel_is_also_saved_as_its_own_png(summary, tmp_path):
    figures = plots.sweep_figures(summary, SCALES, CURVES)
    assert list(figures)[:3] == ["search.png", "search-lr.png", "search-unlabeled_ratio.png"]
    whole = {ax.get_xlabel(): offsets(ax.collections[0]) for ax in figures["search.png"].axes}
    for name in ("lr", "unlabeled_ratio"):
        (ax,) = figures[f"search-{name}.png"].axes
        assert offsets(ax.collections[0]) == whole[ax.get_xlabel()]  # the same panel as in search.png
        assert ax.get_ylabel() == "OOD validation accuracy (%)" and name in figures[f"search-{name}.png"].get_suptitle()
    written = plots.save(figures, tmp_path / "plots")
    assert {"search-lr.png", "search-unlabeled_ratio.png"} <= {p.name for p in written}
    assert sorted(p.name for p in (tmp_path / "plots").iterdir()) == sorted(p.name for p in written)
    one = copy.deepcopy(summary)
    for run in one.trials:
        run.sampled.pop("unlabeled_ratio")
    assert not [name for name in plots.sweep_figures(one, {"lr": "log"}, []) if name.startswith("search-")]
    assert plots.search_panel_name("model/width x") == "search-model_width_x.png"


def test_curves_plot_draws_one_line_per_run_in_percent(summary):
    figure = plots.curves_figure(summary, CURVES)
    (ax,) = figure.axes
    assert [list(line.get_ydata()) for line in ax.lines] == [[50.0, 60.0, 72.0], [40.0, 62.0, 70.0]]
    assert ax.get_xlabel() == "epoch" and ax.get_ylabel() == "OOD validation accuracy (%)"
    assert [t.get_text() for t in figure.legends[0].get_texts()] == [c.label for c in CURVES]


def test_id_ood_plot_has_every_trial_and_replicate_the_selected_trial_and_the_replicates_spread(summary):
    figure = plots.id_ood_figure(summary)
    (ax,) = figure.axes
    trials, selected, replicates = ax.collections[:3]
    assert len(offsets(trials)) == 3 and len(offsets(replicates)) == 3
    assert (pytest.approx(95.0), pytest.approx(66.0)) in offsets(trials)
    assert offsets(selected) == [(pytest.approx(95.0), pytest.approx(66.0))] and selected.get_label() == "selected trial"
    (bars,) = [c for c in ax.containers if isinstance(c, ErrorbarContainer)]  # mean ± std of the 3 replicates
    assert [list(v) for v in bars.lines[0].get_data()] == [[pytest.approx(95.0)], [pytest.approx(66.0)]]
    spans = sorted(float(abs(seg[1] - seg[0]).max()) for lines in bars.lines[2] for seg in lines.get_segments())
    assert spans == pytest.approx([2.0, 2.0])  # ± 1 point on both axes (sample std)
    assert ax.get_xlabel() == "ID test accuracy (%)" and ax.get_ylabel() == "OOD test accuracy (%)"
    stored = copy.deepcopy(summary)  # the replicate summary's cells, where the sweep recorded them
    stored.replicates.summary = {"best/id_test/acc": {"mean": 0.9, "std": 0.02, "n": 3},
                                 "best/test/acc": {"mean": 0.6, "std": 0.05, "n": 3}}
    (bars,) = [c for c in plots.id_ood_figure(stored).axes[0].containers if isinstance(c, ErrorbarContainer)]
    assert [list(v) for v in bars.lines[0].get_data()] == [[pytest.approx(90.0)], [pytest.approx(60.0)]]
    assert "replicates' mean ± std (n = 3)" in [t.get_text() for t in figure.legends[0].get_texts()]


def test_without_an_id_split_there_is_no_id_ood_plot(summary):
    for run in [*summary.trials, *summary.replicates.runs]:
        run.metrics.pop("best/id_test/acc")
    assert plots.id_ood_figure(summary) is None
    assert set(plots.sweep_figures(summary, {}, [])) == {"search.png", "search-lr.png", "search-unlabeled_ratio.png",
                                                         "curves.png", "importance.png"}


def test_save_writes_non_empty_pngs_and_nothing_else(summary, tmp_path):
    written = plots.save(plots.sweep_figures(summary, {"lr": "log"}, []), tmp_path / "plots")
    assert sorted(p.name for p in written) == ["curves.png", "id_vs_ood.png", "importance.png", "search-lr.png",
                                               "search-unlabeled_ratio.png", "search.png"]
    assert sorted(p.name for p in (tmp_path / "plots").iterdir()) == sorted(p.name for p in written)
    for path in written:
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and path.stat().st_size > 5000


def test_importance_chart_draws_one_bar_per_rated_hyperparameter_the_most_important_on_top(summary):
    found = importances(summary, SCALES)
    figure = plots.importance_figure(summary, found)
    (ax,) = figure.axes
    shares = [100 * p.share for p in found.params]
    assert [bar.get_width() for bar in ax.patches] == pytest.approx(shares[::-1])  # barh draws bottom-up
    assert [t.get_text() for t in ax.get_yticklabels()] == [f"{p.name} ({p.scale})" for p in found.params][::-1]
    assert {t.get_text() for t in ax.get_yticklabels()} == {"lr (log)", "unlabeled_ratio (categorical)"}
    assert ax.get_xlabel() == "share of the main effects (%) on OOD validation accuracy"
    title = figure.get_suptitle()
    assert title.startswith("demo: dann on digits-shift") and "fANOVA over 3 of 4 trials" in title
    footer = " ".join(text.get_text() for text in figure.texts)
    assert "left out: 1 failed" in footer and "3 trials make rough importances" in footer


# ----- every figure: words, not keys; one legend, outside the axes ----------------------------------------------
def spuco_summary() -> SweepSummary:
    """A group-robustness sweep: SpuCo's split labels, worst-group selection, no ID split."""
    data = summary_json()
    data.update(dataset="spuco-digits", metric_names=["worst_group_acc", "avg_acc"],
                selection={"metric": "val/worst_group_acc"},
                report={"split_labels": dict(GROUP_SPLIT_LABELS), "columns": []})
    return SweepSummary.from_json(data)


def compared(dataset: str, report: dict, keys: tuple[str, ...]) -> DatasetTable:
    def sweep(name: str, space: str, mean: float, strategy: str = "ood_val") -> dict:
        return {"name": name, "dataset": dataset, "algorithm": space, "space": f"search_spaces/{space}.yaml",
                "selection": {"strategy": strategy, "metric": "test/acc" if strategy == "oracle" else "val/acc"},
                "trials": [{"trial_id": f"{name}-t0", "status": "ok"}], "selected": {"trial_id": f"{name}-t0", "status": "ok"},
                "replicates": {"ok": 3, "summary": {f"best/{k}": {"mean": mean, "std": 0.01, "n": 3} for k in keys}},
                "report": report}
    return compare([SweepSummary.from_json(s) for s in (sweep("a", "erm", 0.6), sweep("b", "dann", 0.65),
                                                         sweep("c", "erm_aug", 0.7, strategy="oracle"))]).tables[0]


def every_figure(summary: SweepSummary) -> dict:
    wilds = {"split_labels": dict(SHIFT_SPLIT_LABELS), "columns": [{"key": "id_test/acc", "label": "ID test acc"},
                                                                    {"key": "test/acc", "label": "OOD test acc"}]}
    spuco = {"split_labels": dict(GROUP_SPLIT_LABELS),
             "columns": [{"key": "test/worst_group_acc", "label": "test worst-group acc"},
                         {"key": "test/avg_acc", "label": "test average acc"}]}
    figures = plots.sweep_figures(summary, SCALES, CURVES)
    figures["compare-wilds.png"] = plots.comparison_figure(compared("digits-shift", wilds, ("id_test/acc", "test/acc")))
    figures["compare-spuco.png"] = plots.comparison_figure(
        compared("spuco-digits", spuco, ("test/worst_group_acc", "test/avg_acc")))
    return figures


def words_of(figure) -> list[str]:
    texts = [figure.get_suptitle(), *(t.get_text() for t in figure.texts)]
    for ax in figure.axes:
        texts += [ax.get_xlabel(), ax.get_ylabel(), ax.get_title()]
    for legend in [*figure.legends, *(ax.get_legend() for ax in figure.axes if ax.get_legend())]:
        texts += [t.get_text() for t in legend.get_texts()]
    return [t for t in texts if t]


@pytest.mark.parametrize("which", ["wilds", "spuco"])
def test_every_figure_names_splits_and_metrics_in_words_never_as_keys(summary, which):
    summary = summary if which == "wilds" else spuco_summary()
    figures = every_figure(summary)
    assert {"search.png", "search-lr.png", "curves.png", "importance.png"} <= set(figures)
    for name, figure in figures.items():
        for text in words_of(figure):
            assert "/" not in text and "_acc" not in text and " acc " not in f"{text} ", (name, text)
    selection = "OOD validation accuracy (%)" if which == "wilds" else "validation worst-group accuracy (%)"
    assert {ax.get_ylabel() for ax in figures["search.png"].axes} == {selection}
    assert figures["curves.png"].axes[0].get_ylabel() == selection
    if which == "wilds":
        (ax,) = figures["id_vs_ood.png"].axes
        assert (ax.get_xlabel(), ax.get_ylabel()) == ("ID test accuracy (%)", "OOD test accuracy (%)")
    else:
        assert "id_vs_ood.png" not in figures  # SpuCo has one distribution: no ID split
    wilds_legend = [t.get_text() for t in figures["compare-wilds.png"].axes[0].get_legend().get_texts()]
    assert wilds_legend == ["ID test accuracy", "OOD test accuracy", "best OOD test accuracy"]
    spuco_legend = [t.get_text() for t in figures["compare-spuco.png"].axes[0].get_legend().get_texts()]
    assert spuco_legend[:2] == ["test worst-group accuracy", "test average accuracy"]
    assert figures["compare-spuco.png"].axes[0].get_ylabel().startswith("worst-group accuracy, average accuracy (%)")


def test_metric_words_know_the_datasets_metrics_and_spell_out_the_rest():
    wilds, spuco = SHIFT_SPLIT_LABELS, GROUP_SPLIT_LABELS
    assert plots.metric_words("val", "acc", wilds) == "OOD validation accuracy"
    assert plots.metric_words("id_val", "acc", wilds) == "ID validation accuracy"
    assert plots.metric_words("id_test", "acc", wilds) == "ID test accuracy"
    assert plots.metric_words("test", "worst_group_acc", wilds) == "OOD test worst-group accuracy"
    assert plots.metric_words("test", "acc_wg", wilds) == "OOD test worst-group accuracy"  # WILDS's own key
    assert plots.metric_words("val", "worst_group_acc", spuco) == "validation worst-group accuracy"
    assert plots.metric_words("test", "avg_acc", spuco) == "test average accuracy"
    assert plots.metric_words("test", "macro_f1", wilds) == "OOD test macro F1"
    assert plots.metric_words("test", "F1-macro_all", wilds) == "OOD test macro F1"
    assert plots.metric_words("test", "acc_y:0_male:1", wilds) == "OOD test acc y:0 male:1"  # unknown: no underscores
    assert plots.key_words("best/val/acc", wilds) == plots.key_words("val/acc", wilds) == "OOD validation accuracy"
    assert plots.axis_label("test/r_wg", wilds) == "OOD test worst-group Pearson r (× 100)"  # no fraction: not %


def drawn_legends(figure) -> list:
    figure.canvas.draw()
    return [*figure.legends, *(ax.get_legend() for ax in figure.axes if ax.get_legend() is not None)]


def test_every_figure_has_one_legend_and_it_covers_no_axis(summary):
    for name, figure in every_figure(summary).items():
        legends = drawn_legends(figure)
        if name == "importance.png":  # bars labelled on the axis: nothing for a legend to name
            assert legends == [], name
            continue
        assert len(legends) == 1, (name, len(legends))
        box = legends[0].get_window_extent()
        for ax in figure.axes:
            assert not box.overlaps(ax.get_window_extent()), name  # outside: never over a point
