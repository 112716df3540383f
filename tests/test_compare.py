"""`raybench compare` on summaries shaped like the runner's: the numbers, the marks, the blocks, every format, the
figure. The same command on real sweeps read back from MLflow is in test_sweep_e2e.py."""
from __future__ import annotations

import io
import json
import math

import pandas as pd
import pytest
from pylatexenc.latexwalker import LatexEnvironmentNode, LatexMacroNode, LatexWalker

from raybench.records import SweepSummary
from raybench.report.compare import (
    BEST,
    WITHIN,
    Comparison,
    UnfinishedSweep,
    compare,
    records,
    render_comparison,
)
from raybench.report.plots import comparison_figure, save
from raybench.report.renderers import FORMATS, latex_escape

WILDS_REPORT = {"split_labels": {"id_val": "ID val", "val": "OOD val", "test": "OOD test", "id_test": "ID test"},
                "columns": [{"key": "id_test/acc", "label": "ID test acc"}, {"key": "test/acc", "label": "OOD test acc"}]}
SPUCO_REPORT = {"split_labels": {"val": "val", "test": "test"},
                "columns": [{"key": "test/worst_group_acc", "label": "test worst-group acc"},
                            {"key": "test/avg_acc", "label": "test average acc"}]}


def summary(name: str, space: str, cells: dict[str, tuple[float, float]], strategy: str = "ood_val",
            dataset: str = "digits-shift", report: dict | None = WILDS_REPORT, state: str = "finished",
            algorithm: str | None = None) -> dict:
    algorithm = algorithm or space.split("_")[0]
    split = "id_val" if strategy == "id_val" else "val"
    replicate_summary = {f"best/{k}": {"mean": m, "std": s, "n": 3} for k, (m, s) in cells.items()}
    record = {
        "name": name, "state": state, "tracking_state": state, "dataset": dataset, "algorithm": algorithm,
        "space": f"search_spaces/{space}.yaml",
        "selection": {"strategy": strategy, "metric": "test/acc" if strategy == "oracle" else f"{split}/acc",
                      "label": "as the sweep wrote it"},
        "trials": [{"trial_id": f"{name}-t{i}", "status": "ok" if i < 9 else "failed"} for i in range(10)],
        "selected": {"trial_id": f"{name}-t0", "status": "ok"},
        "replicates": {"seeds": [1, 2, 3], "ok": 3, "summary": replicate_summary},
        "compute": {"search": {"runs": 10, "wall_s": 600.0, "cpu_s": 500.0, "gpu_s": 0.0},
                    "replicates": {"runs": 3, "wall_s": 200.0, "cpu_s": 150.0, "gpu_s": 0.0}},
    }
    if report is not None:
        record["report"] = report
    return record


def compare_json(summaries: list[dict], unfinished: list[UnfinishedSweep] = (), selection: str | None = None) -> Comparison:
    """`compare` on summaries as summary.json holds them: the helpers here build and edit them as dicts."""
    return compare([SweepSummary.from_json(s) for s in summaries], unfinished, selection)


@pytest.fixture
def wilds_comparison():
    return compare_json([
        summary("s-erm", "erm", {"id_test/acc": (0.97, 0.01), "test/acc": (0.55, 0.03)}),
        summary("s-dann", "dann", {"id_test/acc": (0.95, 0.02), "test/acc": (0.60, 0.02)}),
        summary("s-coral", "coral", {"id_test/acc": (0.96, 0.01), "test/acc": (0.585, 0.01)}),
        summary("s-oracle", "erm_aug", {"id_test/acc": (0.90, 0.01), "test/acc": (0.70, 0.01)}, strategy="oracle",
                algorithm="erm"),
        summary("s-half", "fixmatch", {}, state="interrupted"),
    ], [UnfinishedSweep("s-none", "digits-shift", "swav", "sweep s-none: running; no results were recorded yet")])


def test_rows_carry_each_sweeps_replicate_numbers_and_the_best_ood_entry_is_marked(wilds_comparison):
    (table,) = wilds_comparison.tables
    assert table.rank_key == "test/acc" and [c.label for c in table.columns] == ["ID test acc", "OOD test acc"]
    assert [r.method for r in table.ranked] == ["erm", "dann", "coral"]  # the order they came in
    marks = {r.method: r.cells["test/acc"].mark for r in table.rows}
    # DANN is best; CORAL (58.5) lies within DANN's one std (60 - 2); ERM (55) does not; the oracle is never ranked.
    assert marks == {"erm": "", "dann": BEST, "coral": WITHIN, "erm_aug": ""}
    dann = table.rows[1]
    assert (dann.cells["id_test/acc"].mean, dann.cells["test/acc"].std) == (0.95, 0.02)
    assert (dann.trials, dann.trials_ok, dann.replicates, dann.replicates_ok) == (10, 9, 3, 3)
    assert dann.trial_seconds == 800.0 and dann.cpu_seconds == 650.0


def test_the_oracle_is_kept_apart_and_labelled_and_unfinished_sweeps_are_listed(wilds_comparison):
    (table,) = wilds_comparison.tables
    assert [r.method for r in table.analysis_only] == ["erm_aug"]
    assert [u.name for u in wilds_comparison.unfinished] == ["s-none", "s-half"]
    text = render_comparison(wilds_comparison, "table")
    ranked, oracle = text.split("Analysis only")
    assert "erm_aug" not in ranked and "erm_aug" in oracle and "70.0 ± 1.0" in oracle
    assert "60.0 ± 2.0 **" in ranked and "58.5 ± 1.0 *" in ranked and "55.0 ± 3.0 *" not in ranked
    assert "Not in the table (unfinished):" in text and "s-half" in text and "s-none: running" in text
    markdown = render_comparison(wilds_comparison, "markdown")
    assert "**60.0 ± 2.0**" in markdown and "_58.5 ± 1.0_" in markdown and "- sweep s-none: running" in markdown
    assert "| erm_aug | OOD test acc (ORACLE: selected on the test split, analysis only, not a valid protocol) |" \
        in markdown  # each row says how it was selected
    assert "| dann | OOD val acc |" in markdown


def test_csv_and_json_carry_the_unrounded_numbers(wilds_comparison):
    frame = pd.read_csv(io.StringIO(render_comparison(wilds_comparison, "csv")))
    assert list(frame["method"]) == ["erm", "dann", "coral", "erm_aug"]
    assert list(frame["test/acc.mean"]) == [0.55, 0.60, 0.585, 0.70]
    assert list(frame["analysis_only"]) == [False, False, False, True]
    assert list(frame["mark"].fillna("")) == ["", BEST, WITHIN, ""]
    data = json.loads(render_comparison(wilds_comparison, "json"))
    assert data["rows"] == json.loads(json.dumps(records(wilds_comparison)))
    assert data["tables"][0]["rank_key"] == "test/acc" and [u["name"] for u in data["unfinished"]] == ["s-none", "s-half"]


def _latex_nodes(text: str) -> list:
    nodes, _, _ = LatexWalker(text, tolerant_parsing=False).get_latex_nodes()
    return [n for n in nodes if isinstance(n, LatexEnvironmentNode)]


def test_latex_is_a_booktabs_tabular_that_parses(wilds_comparison):
    text = render_comparison(wilds_comparison, "latex")
    (tabular,) = _latex_nodes(text)
    assert tabular.environmentname == "tabular"
    macros = [n.macroname for n in tabular.nodelist if isinstance(n, LatexMacroNode)]
    assert macros.count("toprule") == 1 and macros.count("bottomrule") == 1 and "midrule" in macros
    body = text[text.index("\\toprule"):text.index("\\bottomrule")]
    rows = [line for line in body.splitlines() if line.endswith("\\\\") and "multicolumn" not in line]
    assert len(rows) == 1 + 4 and all(line.count("&") == 2 for line in rows)  # header + 4 methods, 3 columns each
    assert "\\textbf{60.0 $\\pm$ 2.0}" in text and "\\underline{58.5 $\\pm$ 1.0}" in text
    assert "erm\\_aug" in text and "Oracle selection" in text


def test_latex_escapes_what_would_break_it():
    nasty = "a_b & c % d $ e # f {g} ~ h ^ i \\ j"
    escaped = latex_escape(nasty)
    _latex_nodes(f"\\begin{{tabular}}{{l}} {escaped} \\\\ \\end{{tabular}}")  # parses
    assert "&" not in escaped.replace("\\&", "") and "%" not in escaped.replace("\\%", "")


def test_spuco_columns_are_worst_group_and_average_on_its_test_split_never_called_ood():
    comparison = compare_json([summary("gb", "gb", {"test/worst_group_acc": (0.6, 0.05), "test/avg_acc": (0.9, 0.01)},
                                  dataset="spuco-digits", report=SPUCO_REPORT)])
    (table,) = comparison.tables
    assert table.rank_key == "test/worst_group_acc"
    for fmt_name in FORMATS:
        text = render_comparison(comparison, fmt_name)
        assert "OOD" not in text, fmt_name
    assert "test worst-group acc" in render_comparison(comparison, "table") and "60.0 ± 5.0" in render_comparison(comparison, "table")


def test_a_summary_without_report_columns_gets_id_and_ood_test_of_its_selection_metric():
    (table,) = compare_json([summary("old", "erm", {"id_test/acc": (0.9, 0.0), "test/acc": (0.5, 0.01)}, report=None)]).tables
    assert [(c.key, c.label) for c in table.columns] == [("id_test/acc", "ID test acc"), ("test/acc", "OOD test acc")]


def test_selection_filter_and_two_sweeps_of_one_space_and_several_datasets():
    comparison = compare_json([summary("a", "erm", {"test/acc": (0.5, 0.01)}), summary("b", "erm", {"test/acc": (0.6, 0.01)}),
                          summary("c", "erm", {"test/acc": (0.7, 0.01)}, strategy="id_val"),
                          summary("d", "gb", {"test/worst_group_acc": (0.6, 0.05)}, dataset="spuco-digits",
                                  report=SPUCO_REPORT)], selection="ood_val")
    assert [t.dataset for t in comparison.tables] == ["digits-shift", "spuco-digits"]
    assert [r.method for r in comparison.tables[0].rows] == ["erm (a)", "erm (b)"]
    assert "erm (b)" in render_comparison(comparison, "table") and "spuco-digits" in render_comparison(comparison, "csv")


def test_a_single_replicate_has_no_std_and_only_the_best_is_marked():
    (table,) = compare_json([summary("a", "erm", {"test/acc": (0.5, math.nan)}),
                        summary("b", "dann", {"test/acc": (0.5 - 1e-9, math.nan)})]).tables
    assert [r.cells["test/acc"].mark for r in table.rows] == [BEST, ""]
    assert json.loads(render_comparison(compare_json([summary("a", "erm", {"test/acc": (0.5, math.nan)})]), "json"))["rows"][0][
        "test/acc.std"] is None


def test_comparison_figure_has_one_error_bar_per_method_and_column_and_stars_the_best(wilds_comparison, tmp_path):
    (table,) = wilds_comparison.tables
    figure = comparison_figure(table)
    ax = figure.axes[0]
    bars = ax.containers
    assert [c.get_label() for c in bars] == ["ID test acc", "OOD test acc"]
    for container, key in zip(bars, ("id_test/acc", "test/acc")):
        _xs, ys = container.lines[0].get_data()
        rows = table.ranked + table.analysis_only
        assert list(ys) == pytest.approx([100 * r.cells[key].mean for r in rows])
        (err,) = container.lines[2]
        spans = [seg[1, 1] - seg[0, 1] for seg in err.get_segments()]
        assert spans == pytest.approx([2 * 100 * r.cells[key].std for r in rows])
    (star,) = [c for c in ax.collections if c.get_label().startswith("best")]
    assert star.get_offsets()[0][1] == pytest.approx(60.0)  # DANN's OOD mean
    assert [t.get_text() for t in ax.get_xticklabels()] == ["erm", "dann", "coral", "erm_aug (oracle)"]
    assert ax.get_title() and "(%)" in ax.get_ylabel() and ax.get_xlabel() and ax.get_legend() is not None
    (path,) = save({"comparison.png": figure}, tmp_path)
    assert path.stat().st_size > 10_000


def test_a_blind_selection_is_marked_in_every_format_never_passed_off_as_a_choice():
    blind = summary("s-blind", "erm", {"id_test/acc": (0.9, 0.01), "test/acc": (0.5, 0.02)})
    blind["trials"] = [{"trial_id": f"t{i}", "status": "ok", "selection_blind": True} for i in range(4)]
    blind["selection_blind"] = "every trial's selection metric constant: selection is blind"
    partly = summary("s-partly", "coral", {"id_test/acc": (0.9, 0.01), "test/acc": (0.6, 0.02)})
    partly["trials"] = [{"trial_id": f"t{i}", "status": "ok", "selection_blind": i < 3} for i in range(4)]
    partly["selection_blind"] = "3 of 4 trials: selection metric constant: selection is blind"
    comparison = compare_json([blind, partly])
    table = render_comparison(comparison, "table")
    assert "OOD val acc (BLIND)" in table and table.count("(BLIND)") == 1  # only where no trial could be told apart
    for fmt_name in ("table", "markdown"):
        text = render_comparison(comparison, fmt_name)
        assert "Selection blind: erm (s-blind): every trial's selection metric constant" in text
        assert "Selection blind: coral (s-partly): 3 of 4 trials" in text
    assert "% Selection blind: erm (s-blind)" in render_comparison(comparison, "latex")
    rows = {r["sweep"]: r for r in json.loads(render_comparison(comparison, "json"))["rows"]}
    assert rows["s-blind"]["selection_blind_everywhere"] and not rows["s-partly"]["selection_blind_everywhere"]
    assert rows["s-partly"]["selection_blind"].startswith("3 of 4")
