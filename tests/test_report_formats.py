"""One document model, one renderer per format (raybench/report/document.py, raybench/report/renderers.py): no module
outside the report floor writes a format itself, a new format is one registered class that `raybench compare`,
`raybench results` and a benchmark's files then offer with no other change, and every format writes the same
cells of the same document."""
from __future__ import annotations

import ast
import json
from pathlib import Path
from types import SimpleNamespace

import pytest
from test_compare import UnfinishedSweep, compare_json, summary
from test_stats import DEFAULTS, stats_comparison

from raybench.cli import main
from raybench.commands.benchmark import BenchmarkOptions, comparison_formats, write_formats
from raybench.records import SweepSummary
from raybench.report import compare
from raybench.report.document import (
    Column,
    Document,
    Heading,
    Lines,
    Measure,
    Missing,
    RowGroup,
    Table,
    TableKind,
    Text,
)
from raybench.report.renderers import FORMATS, BlockRenderer, Part, render
from raybench.report.results_text import results_document, results_text
from raybench.sweep.errors import OptionError

PACKAGE = Path(__file__).resolve().parents[1] / "raybench"
REPORT = PACKAGE / "report"
TABLE_MARKUP = ("---|", "|---", "\\begin{tabular}", "\\toprule")  # a Markdown table's rule, a LaTeX tabular
FRAME_WRITERS = ("to_markdown", "to_latex", "to_csv")  # pandas writing a table in a format


# ----- (a) only the report floor writes a format -------------------------------------------------------------
def _registers_a_format(node: ast.AST) -> bool:
    """`FORMATS.register(...)` (or `renderers.FORMATS.register(...)`), as a decorator or a call."""
    if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "register"):
        return False
    owner = node.func.value
    return (isinstance(owner, ast.Name) and owner.id == "FORMATS") or (
        isinstance(owner, ast.Attribute) and owner.attr == "FORMATS")


def _is_a_renderer(node: ast.ClassDef) -> bool:
    return any((isinstance(b, ast.Name) and b.id.endswith("Renderer")) or
               (isinstance(b, ast.Attribute) and b.attr.endswith("Renderer")) for b in node.bases)


def format_writing(path: Path) -> list[str]:
    """Where the module writes a format itself: a renderer class or a format registered, a literal of table markup
    (Markdown's `|---|`, LaTeX's tabular), or pandas writing a frame as Markdown, LaTeX or CSV."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.ClassDef) and _is_a_renderer(node):
            found.append(f"{node.lineno}: defines the renderer {node.name}")
        elif _registers_a_format(node):
            found.append(f"{node.lineno}: registers a format")
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and any(m in node.value for m in TABLE_MARKUP):
            found.append(f"{node.lineno}: writes table markup {node.value[:40]!r}")
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in FRAME_WRITERS:
            found.append(f"{node.lineno}: calls .{node.func.attr}()")
    return found


def outside_the_report(package: Path) -> list[str]:
    report = package / "report"
    return [f"{path.relative_to(package.parent)}:{line}" for path in sorted(package.rglob("*.py"))
            if report not in path.parents for line in format_writing(path)]


def test_no_module_outside_the_report_floor_writes_a_format():
    assert outside_the_report(PACKAGE) == [], "build a raybench.report.document.Document and render it instead"


def test_the_report_floor_is_where_the_formats_are_written():
    """The scan sees what it looks for: the renderers themselves would be found outside the floor."""
    found = " ".join(format_writing(REPORT / "renderers.py"))
    for kind in ("defines the renderer TextRenderer", "registers a format", "writes table markup", "calls .to_csv()"):
        assert kind in found


@pytest.mark.parametrize("source, finding", [
    (("from raybench.report.renderers import FORMATS, Renderer\n\n@FORMATS.register('html')\nclass Html(Renderer):\n"
      "    suffix = 'html'\n"), "defines the renderer Html"),
    ("from raybench.report import renderers\nrenderers.FORMATS.register('html')(object)\n", "registers a format"),
    ("def table(rows):\n    return ['| a | b |', '|---|---|', *rows]\n", "writes table markup"),
    ("TABULAR = '\\\\begin{tabular}{lc}'\n", "writes table markup"),
    ("def save(frame, path):\n    frame.to_csv(path, index=False)\n", "calls .to_csv()"),
])
def test_the_scan_finds_a_format_written_outside_the_report_floor(tmp_path, source, finding):
    package = tmp_path / "raybench"
    (package / "commands").mkdir(parents=True)
    (package / "report").mkdir()
    (package / "commands" / "writes.py").write_text(source)
    (package / "report" / "fine.py").write_text(source)  # the floor itself may
    found = outside_the_report(package)
    assert found and all(line.startswith("raybench/commands/writes.py:") for line in found), found
    assert any(finding in line for line in found), found


def test_rendering_a_document_from_outside_is_not_writing_a_format(tmp_path):
    package = tmp_path / "raybench"
    (package / "commands").mkdir(parents=True)
    (package / "commands" / "reads.py").write_text(
        "from raybench.report import renderers\n\ndef page(document):\n    return renderers.render(document, 'markdown')\n")
    assert outside_the_report(package) == []


# ----- (b) a format is one class -------------------------------------------------------------------------------
class Tabs(BlockRenderer):
    """Tab-separated cells of every table, and nothing else: a format made in a test."""

    suffix = "tsv"

    def results(self, table: Table) -> list[str]:
        return ["\t".join(c.title for c in table.columns), *("\t".join(c.plain() for c in row) for row in table.rows)]

    detail = results

    def lines(self, lines: Lines) -> list[str]:
        return []


@pytest.fixture
def tabs(monkeypatch):
    """`tabs` registered as a format for the test, and gone after it."""
    monkeypatch.setattr(FORMATS, "_entries", dict(FORMATS._entries))
    FORMATS.register("tabs")(Tabs)
    return "tabs"


def _store_of(summaries: list[SweepSummary], monkeypatch) -> None:
    """`compare` and `results` read these sweeps instead of a tracking store's."""
    from raybench import tracking

    found = [SimpleNamespace(name=s.name, dataset=s.dataset, algorithm=s.algorithm, summary=s, damage=None,
                             state_line="finished") for s in summaries]
    monkeypatch.setattr(tracking, "find_sweeps", lambda *args: found)
    monkeypatch.setattr(tracking, "load_sweep_results", lambda uri, name: next(s for s in summaries if s.name == name))
    monkeypatch.setattr(tracking, "default_tracking_uri", lambda: "sqlite:///nowhere.db")


def test_a_registered_class_is_a_format_of_compare_results_and_a_benchmark(tabs, monkeypatch, capsys, tmp_path):
    sweeps = [SweepSummary.from_json(summary("s-erm", "erm", {"id_test/acc": (0.97, 0.01), "test/acc": (0.55, 0.03)})),
              SweepSummary.from_json(summary("s-dann", "dann", {"id_test/acc": (0.95, 0.02), "test/acc": (0.6, 0.02)}))]
    _store_of(sweeps, monkeypatch)
    assert main(["compare", "--format", tabs]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split("\t")[:4] == ["method", "selection", "ID test acc", "OOD test acc"]
    assert lines[1].split("\t")[:4] == ["erm", "OOD val acc", "97.0 ± 1.0", "55.0 ± 3.0"]
    assert lines[2].split("\t")[3] == "60.0 ± 2.0"  # the marks are the other formats' business
    assert main(["results", "s-dann", "--format", tabs]) == 0
    assert capsys.readouterr().out.splitlines()[0].split("\t")[:2] == ["trial_id", "status"]

    written = write_formats(compare.document(compare.compare(sweeps)), tmp_path, "compare", comparison_formats())
    assert sorted(p.name for p in written) == sorted(f"compare.{FORMATS.get(n).suffix}" for n in FORMATS.names())
    assert (tmp_path / "compare.tsv").read_text().startswith("method\tselection\t")


def test_a_benchmark_writes_exactly_the_formats_asked_and_refuses_an_unknown_one(tmp_path):
    asked = comparison_formats(("markdown", "csv"))
    written = write_formats(compare.document(compare_json([summary("s-erm", "erm", {"test/acc": (0.5, 0.01)})])),
                            tmp_path, "compare", asked)
    assert [p.name for p in written] == ["compare.md", "compare.csv"]
    with pytest.raises(OptionError) as refused:
        BenchmarkOptions(tmp_path, "sqlite:///x.db", compare_formats=("markdown", "html"))
    message = str(refused.value)
    assert "\n" not in message and "'html'" in message and all(name in message for name in FORMATS.names())


def test_two_formats_with_one_suffix_are_refused_since_one_would_overwrite_the_other(tabs):
    class Again(Tabs):
        """Tab-separated again, under the same suffix."""

    FORMATS.register("again")(Again)
    with pytest.raises(OptionError, match="compare.tsv"):
        comparison_formats()


# ----- (c) every format writes the same cells -------------------------------------------------------------------
def _unescaped(text: str) -> str:
    return text.replace("\\", "")  # LaTeX's erm\_aug is erm_aug


def _shows(text: str, fraction: float) -> bool:
    """The number in % to one decimal (the formats for people) or unrounded (the formats for machines)."""
    return f"{100 * fraction:.1f}" in text or repr(fraction) in text


PAGE = Document((Heading("Plain page"), Lines(("what the page is about",)),
                 Table("scores", (Column("name"), Column("score"), Column("remark", essential=False)),
                       (RowGroup(((Text("first"), Measure(0.625, 0.02), Text("kept")),
                                  (Text("second"), Missing(), Text("none")))),
                        RowGroup(((Text("third"), Measure(0.25, float("nan")), Text("apart")),), heading="Apart",
                                 label="apart")), TableKind.RESULTS)))


@pytest.mark.parametrize("fmt_name", FORMATS.names())
def test_every_format_writes_every_essential_cell_of_a_page_without_data_of_its_own(fmt_name):
    text = render(PAGE, fmt_name)
    assert all(name in text for name in ("first", "second", "third")), text
    assert _shows(text, 0.625) and _shows(text, 0.25), text


@pytest.mark.parametrize("fmt_name", FORMATS.names())
@pytest.mark.parametrize("with_stats", [False, True])
def test_every_format_writes_each_row_and_report_cell_of_the_comparison(fmt_name, with_stats):
    comparison = stats_comparison(DEFAULTS) if with_stats else compare_json([
        summary("s-erm", "erm", {"id_test/acc": (0.97, 0.01), "test/acc": (0.55, 0.03)}),
        summary("s-coral", "coral", {"id_test/acc": (0.96, 0.01), "test/acc": (0.585, 0.01)}),
        summary("s-oracle", "erm_aug", {"id_test/acc": (0.90, 0.01), "test/acc": (0.70, 0.01)}, strategy="oracle",
                algorithm="erm")], [UnfinishedSweep("s-none", "digits-shift", "swav", "sweep s-none: running")])
    text = _unescaped(compare.render_comparison(comparison, fmt_name))
    for table in comparison.tables:
        for row in table.rows:
            assert row.method in text, (fmt_name, row.method)
            for column in table.columns:
                cell = row.cells.get(column.key)
                assert cell is None or _shows(text, cell.mean), (fmt_name, row.method, column.key)


@pytest.mark.parametrize("fmt_name", FORMATS.names())
def test_every_format_writes_each_trial_of_a_sweeps_results(fmt_name):
    from test_importance import sweep

    searched = sweep()
    text = _unescaped(results_text(searched, fmt_name))
    assert all(trial.trial_id in text for trial in searched.trials)
    assert all(_shows(text, trial.selection_value) or f"{trial.selection_value:.4f}" in text
               for trial in searched.trials)


def test_the_formats_for_people_share_one_page_and_those_for_machines_its_data():
    searched = SweepSummary.from_json(summary("s-erm", "erm", {"test/acc": (0.5, 0.01)}))
    page = results_document(searched)
    assert {FORMATS.get(name).reads for name in FORMATS.names()} == set(Part)
    assert json.loads(render(page, "json")) == json.loads(json.dumps(dict(page.dataset().tree), default=str))
    assert render(page, "csv").splitlines()[0].split(",")[:2] == ["trial_id", "status"]
    assert render(page, "table") == results_text(searched, "table").split("\n\nhyperparameter importance")[0]
