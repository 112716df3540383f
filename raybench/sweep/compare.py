"""`raybench compare`: WILDS Table 2 for whatever has been run, from the sweeps' own replicate summaries.

Rows are methods (one finished sweep each), columns the dataset's report cells (ID and OOD test for a WILDS-shaped
shift; worst-group and average test accuracy for SpuCo), mean ± std over each sweep's replicates, as its own
`raybench results` shows them. The best entry of the ranking column (OOD test) is marked, and so is every entry
within one std of it, the paper's convention. Analysis-only selections (oracle) get their own block and are never
ranked against the rest. A sweep that has not finished is listed under the table, never dropped silently.

Pure records and text: reading the store is raybench.tracking's, drawing is raybench.sweep.plots'.
"""
from __future__ import annotations

import io
import json
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from raybench.labels import SHIFT_SPLIT_LABELS, column_label, selection_label
from raybench.records import Selection, SweepState, SweepSummary, TrialRecord, TrialStatus
from raybench.report_keys import BEST_PREFIX
from raybench.sweep.results import BudgetSummary, fmt, split_labels

FORMATS = ("table", "csv", "json", "markdown", "latex")
BEST, WITHIN = "best", "within one std"
RANK_SPLIT = "test"  # the held-out test split: OOD test on a shift, the test split of a group benchmark
# A row's budget is the protocol's when its steps, over what the WILDS rule gives its method, and its ERM budget
# are within this share of the table's reference row (ERM's, else the median): rounding moves them by less.
BUDGET_TOLERANCE = 0.10


@dataclass(frozen=True)
class Column:
    key: str  # a replicate summary key without its `best/` prefix: `test/acc`
    label: str  # `OOD test acc`


@dataclass(frozen=True)
class Cell:
    mean: float
    std: float  # sample std (ddof=1) over replicates; NaN with one replicate
    n: int
    mark: str = ""  # BEST, WITHIN or ""

    def text(self) -> str:
        return fmt({"mean": self.mean, "std": self.std})


@dataclass(frozen=True)
class MethodRow:
    """One finished sweep as a row of the table."""

    method: str  # the search space's name (erm_aug), which tells ERM from ERM+aug where the algorithm does not
    sweep: str
    algorithm: str
    selection: str  # the strategy's name: ood_val, id_val, oracle
    selection_label: str
    analysis_only: bool
    trials: int
    trials_ok: int
    replicates: int
    replicates_ok: int
    cells: dict[str, Cell | None]  # by Column.key
    trial_seconds: float | None = None  # compute, search + replicates; None when the sweep did not record it
    cpu_seconds: float | None = None
    gpu_seconds: float | None = None
    blind: str = ""  # the sweep's own finding that its selection could not see (results.blindness), else ""
    blind_everywhere: bool = False  # no finished trial's selection metric moved: the selection was by chance
    budget: BudgetSummary | None = None  # the replicates' mean planned budget; None when they recorded none


@dataclass(frozen=True)
class DatasetTable:
    dataset: str
    columns: list[Column]
    rank_key: str  # the column the best entry is judged on
    rows: list[MethodRow]

    @property
    def ranked(self) -> list[MethodRow]:
        return [r for r in self.rows if not r.analysis_only]

    @property
    def analysis_only(self) -> list[MethodRow]:
        return [r for r in self.rows if r.analysis_only]

    @property
    def unfair(self) -> list[tuple[MethodRow, str]]:
        """Rows whose budget breaks the protocol's ratios, each with why: steps off what the WILDS rule gives the
        method (a flat per-epoch cap, fixed epochs), or another ERM budget than the reference row's."""
        budgets = [r for r in self.rows if r.budget is not None]
        if len(budgets) < 2:
            return []
        reference = next((r for r in budgets if r.algorithm == "erm"), None)
        ratio = reference.budget.protocol_ratio if reference else _median([r.budget.protocol_ratio for r in budgets])
        erm_steps = reference.budget.erm_steps if reference else _median([r.budget.erm_steps for r in budgets])
        found = []
        for row in budgets:
            if _off(row.budget.protocol_ratio, ratio):
                found.append((row, (f"{row.budget.protocol_ratio:.2f}x the steps the WILDS rule gives it "
                                   f"({row.budget.steps:.0f} of {row.budget.protocol_steps:.0f})")))
            elif _off(row.budget.erm_steps, erm_steps):
                found.append((row, (f"an ERM budget of {row.budget.erm_steps:.0f} steps, not the table's "
                                   f"{erm_steps:.0f}")))
        return found

    @property
    def rank_label(self) -> str:
        return next(c.label for c in self.columns if c.key == self.rank_key)


@dataclass(frozen=True)
class UnfinishedSweep:
    name: str
    dataset: str
    algorithm: str
    line: str  # where it stands and how to resume it, as `raybench results` says


@dataclass
class Comparison:
    tables: list[DatasetTable] = field(default_factory=list)
    unfinished: list[UnfinishedSweep] = field(default_factory=list)


# ----- building ----------------------------------------------------------------------------------
def compare(summaries: Sequence[SweepSummary], unfinished: Sequence[UnfinishedSweep] = (),
            selection: str | None = None) -> Comparison:
    """Summaries of sweeps (as `raybench results` reads them) in the order the rows should take.
    Sweeps that did not finish, or finished without a replicate result, join `unfinished`."""
    by_dataset: dict[str, list[SweepSummary]] = {}
    left = list(unfinished)
    for summary in summaries:
        if selection and summary.selection.strategy != selection:
            continue
        reason = _not_comparable(summary)
        if reason:
            left.append(UnfinishedSweep(summary.name, summary.dataset, summary.algorithm, reason))
            continue
        by_dataset.setdefault(summary.dataset, []).append(summary)
    tables = [_table(dataset, dataset_summaries) for dataset, dataset_summaries in by_dataset.items()]
    return Comparison(tables, left)


def from_records(records: Sequence[Any], selection: str | None = None) -> Comparison:
    """The comparison of sweeps read back from the store (raybench.tracking.SweepRecord), in their order;
    those that recorded no results yet are listed as unfinished with where they stand, and those whose
    recorded results are damaged with what is wrong."""
    unfinished = [UnfinishedSweep(r.name, r.dataset, r.algorithm,
                                  r.damage or f"{r.state_line}; no results were recorded yet")
                  for r in records if r.summary is None]
    return compare([r.summary for r in records if r.summary], unfinished, selection)


def _not_comparable(summary: SweepSummary) -> str | None:
    """Why a sweep has no row: the store says it is not finished (or its summary does), or nothing finished."""
    state = summary.stored.state if summary.stored and summary.stored.state is not None else summary.state
    if state != SweepState.FINISHED or not summary.finished:
        return summary.state_line or f"sweep {summary.name}: {state}; its results are partial"
    if summary.selected is None or not summary.replicates.ok:
        return f"sweep {summary.name}: finished without a replicate result (no trial or replicate finished)"
    return None


def columns_of(summary: SweepSummary) -> list[Column]:
    """The report cells the sweep recorded; summaries older than that: ID and OOD test of the selection metric."""
    stored = (summary.report or {}).get("columns")
    if stored:
        return [Column(c["key"], c["label"]) for c in stored]
    metric = summary.selection.metric.partition("/")[2]
    return [Column(f"{split}/{metric}", column_label(split, metric, SHIFT_SPLIT_LABELS)) for split in ("id_test", "test")]


def _table(dataset: str, summaries: list[SweepSummary]) -> DatasetTable:
    columns: list[Column] = []
    for summary in summaries:
        columns += [c for c in columns_of(summary) if c.key not in {k.key for k in columns}]
    rank_key = next((c.key for c in columns if c.key.startswith(f"{RANK_SPLIT}/")), columns[-1].key)
    rows = _disambiguate([_row(summary, columns) for summary in summaries])
    return DatasetTable(dataset, columns, rank_key, _marked(rows, rank_key))


def _row(summary: SweepSummary, columns: list[Column]) -> MethodRow:
    replicates = summary.replicates
    cells = {}
    for column in columns:
        cell = replicates.summary.get(f"{BEST_PREFIX}{column.key}")
        cells[column.key] = Cell(cell["mean"], _nan_if_none(cell["std"]), int(cell["n"])) if cell else None
    compute = summary.compute or {}
    return MethodRow(
        method=Path(summary.space or summary.algorithm).stem, sweep=summary.name,
        algorithm=summary.algorithm, selection=summary.selection.strategy, selection_label=_selection_words(summary),
        analysis_only=_analysis_only(summary.selection),
        trials=len(summary.trials), trials_ok=sum(t.status.selectable for t in summary.trials),
        replicates=len(replicates.seeds), replicates_ok=int(replicates.ok), cells=cells,
        blind=summary.selection_blind or "", blind_everywhere=_blind_everywhere(summary.trials),
        budget=BudgetSummary.from_metrics(replicates.summary),
        **{name: _total(compute, key) for name, key in (("trial_seconds", "wall_s"), ("cpu_seconds", "cpu_s"),
                                                         ("gpu_seconds", "gpu_s"))})


def _blind_everywhere(trials: list[TrialRecord]) -> bool:
    finished = [t for t in trials if t.status == TrialStatus.OK]
    return bool(finished) and all(t.selection_blind for t in finished)


def _selection_words(summary: SweepSummary) -> str:
    """What picked the config, in the dataset's words, also for summaries written before sweeps said so."""
    return selection_label(summary.selection.metric, split_labels(summary), _analysis_only(summary.selection))


def _analysis_only(selection: Selection) -> bool:
    """As the sweep recorded it; summaries older than that: as the strategy is registered (imports torch)."""
    if selection.analysis_only is not None:
        return bool(selection.analysis_only)
    from raybench.sweep.selection import SELECTIONS

    return SELECTIONS.get(selection.strategy).analysis_only


def _median(values: list[float]) -> float:
    return float(pd.Series(values, dtype="float64").median())


def _off(value: float, reference: float) -> bool:
    return not (math.isfinite(value) and reference > 0 and abs(value / reference - 1) <= BUDGET_TOLERANCE)


def _nan_if_none(value: float | None) -> float:
    return float("nan") if value is None else float(value)


def _total(compute: dict[str, dict[str, float]], key: str) -> float | None:
    return float(sum(stage.get(key, 0.0) for stage in compute.values())) if compute else None


def _disambiguate(rows: list[MethodRow]) -> list[MethodRow]:
    """Two sweeps of one space (other seeds, other budgets) keep their sweep name beside the method's."""
    seen = [r.method for r in rows]
    return [r if seen.count(r.method) == 1 else _replace(r, method=f"{r.method} ({r.sweep})") for r in rows]


def _replace(row: MethodRow, **changes: Any) -> MethodRow:
    return MethodRow(**{**{k: getattr(row, k) for k in row.__dataclass_fields__}, **changes})


def _marked(rows: list[MethodRow], rank_key: str) -> list[MethodRow]:
    """Mark the best ranked entry of `rank_key` and every ranked entry within one std (the best's) of it."""
    scored = [r for r in rows if not r.analysis_only and r.cells.get(rank_key) and math.isfinite(r.cells[rank_key].mean)]
    if not scored:
        return rows
    best = max(scored, key=lambda r: r.cells[rank_key].mean)
    top = best.cells[rank_key]
    floor = top.mean - (top.std if math.isfinite(top.std) else 0.0)
    marked = []
    for row in rows:
        cell = row.cells.get(rank_key)
        mark = BEST if row is best else WITHIN if row in scored and cell.mean >= floor else ""
        marked.append(_replace(row, cells={**row.cells, rank_key: Cell(cell.mean, cell.std, cell.n, mark)}) if mark else row)
    return marked


# ----- rendering ---------------------------------------------------------------------------------
def render(comparison: Comparison, fmt_name: str) -> str:
    return {"table": as_table, "csv": as_csv, "json": as_json, "markdown": as_markdown, "latex": as_latex}[fmt_name](comparison)


def _compute_text(seconds: float | None, unit: str) -> str:
    if seconds is None:
        return ""
    return f"{seconds / 3600:.2f} {unit}-h" if seconds >= 3600 else f"{seconds:.0f} {unit}-s"


def _counts(row: MethodRow) -> tuple[str, str]:
    return (f"{row.trials_ok}/{row.trials}" if row.trials_ok != row.trials else str(row.trials),
            f"{row.replicates_ok}/{row.replicates}")


def _display_frame(table: DatasetTable, rows: list[MethodRow], mark: Any) -> pd.DataFrame:
    """The human table's cells; `mark(text, mark)` dresses a marked cell in the format's emphasis."""
    records = []
    for row in rows:
        trials, replicates = _counts(row)
        record = {"method": row.method, "selection": row.selection_label + (" (BLIND)" if row.blind_everywhere else "")}
        for column in table.columns:
            cell = row.cells.get(column.key)
            record[column.label] = mark(cell.text(), cell.mark) if cell else "n/a"
        record.update({"trials": trials, "replicates": replicates, "budget": row.budget.short() if row.budget else "n/a"})
        if row.trial_seconds is not None:
            compute = _compute_text(row.trial_seconds, "trial")
            compute += f", {_compute_text(row.gpu_seconds, 'GPU')}" if row.gpu_seconds else ""
            record["compute"] = compute
        records.append(record)
    return pd.DataFrame(records)


def _heading(table: DatasetTable) -> str:
    return f"{table.dataset}: mean ± std over replicates (%), each at its best-selection epoch"


def _legend(table: DatasetTable, best: str, within: str) -> str:
    return (f"{best} best {table.rank_label}; {within} within one std of it. "
            f"Budget: a replicate's planned steps (batches), labeled passes, and steps over ERM's at the same epoch "
            f"share. Compute: trial-seconds of the search and the replicates together.")


def _blind_lines(table: DatasetTable) -> list[str]:
    """A row whose search could not tell its configs apart is marked, never passed off as a selection; so is a
    row that got another budget than the protocol gives it (an unfair comparison looks like a fair one)."""
    lines = [f"Selection blind: {row.method} ({row.sweep}): {row.blind}." for row in table.rows if row.blind]
    return lines + [f"Budget outside the protocol's ratios: {row.method} ({row.sweep}): {why}."
                    for row, why in table.unfair]


def _unfinished_lines(comparison: Comparison) -> list[str]:
    if not comparison.unfinished:
        return []
    return ["", "Not in the table (unfinished):"] + [f"- {u.line}" for u in comparison.unfinished]


def as_table(comparison: Comparison) -> str:
    out: list[str] = []
    text_mark = {BEST: " **", WITHIN: " *", "": ""}
    for table in comparison.tables:
        out += [_heading(table), ""]
        ranked = _display_frame(table, table.ranked, lambda text, mark: text + text_mark[mark])
        out += [ranked.to_string(index=False)] if not ranked.empty else ["(no OOD-selected sweep)"]
        if table.analysis_only:
            out += ["", "Analysis only (selected on the test split itself, not a valid protocol; not ranked):",
                    _display_frame(table, table.analysis_only, lambda text, mark: text).to_string(index=False)]
        out += ["", _legend(table, "**", "*"), *_blind_lines(table), ""]
    if not comparison.tables:
        out.append("No finished sweep matches.")
    out += _unfinished_lines(comparison)
    return "\n".join(out).rstrip("\n")


def as_markdown(comparison: Comparison) -> str:
    emphasis = {BEST: "**{}**", WITHIN: "_{}_", "": "{}"}
    out: list[str] = []
    for table in comparison.tables:
        frame = _display_frame(table, table.ranked + table.analysis_only, lambda text, mark: emphasis[mark].format(text))
        out += [f"**{_heading(table)}**", "", _markdown_rows(frame), "", _legend(table, "Bold:", "italic:"),
                *_blind_lines(table), ""]
    if not comparison.tables:
        out.append("No finished sweep matches.")
    out += _unfinished_lines(comparison)
    return "\n".join(out).rstrip("\n")


def _markdown_rows(frame: pd.DataFrame) -> str:
    lines = ["| " + " | ".join(frame.columns) + " |", "|" + "---|" * len(frame.columns)]
    lines += ["| " + " | ".join(str(v).replace("|", "\\|") for v in row) + " |" for row in frame.itertuples(index=False)]
    return "\n".join(lines)


LATEX_SPECIALS = {"\\": r"\textbackslash{}", "&": r"\&", "%": r"\%", "$": r"\$", "#": r"\#", "_": r"\_",
                  "{": r"\{", "}": r"\}", "~": r"\textasciitilde{}", "^": r"\textasciicircum{}"}


def latex_escape(text: str) -> str:
    return "".join(LATEX_SPECIALS.get(ch, ch) for ch in text)


def _latex_cell(cell: Cell | None) -> str:
    if cell is None:
        return "--"
    text = f"{100 * cell.mean:.1f}" + ("" if math.isnan(cell.std) else f" $\\pm$ {100 * cell.std:.1f}")
    return {BEST: f"\\textbf{{{text}}}", WITHIN: f"\\underline{{{text}}}", "": text}[cell.mark]


def as_latex(comparison: Comparison) -> str:
    """One booktabs tabular per dataset, ready to paste inside a table environment (needs \\usepackage{booktabs})."""
    out: list[str] = []
    for table in comparison.tables:
        out += [f"% raybench compare: {latex_escape(_heading(table))}",
                f"% bold: best {latex_escape(table.rank_label)}; underlined: within one std of it",
                *(f"% {latex_escape(line)}" for line in _blind_lines(table)),
                f"\\begin{{tabular}}{{l{'c' * len(table.columns)}}}", "\\toprule",
                " & ".join(["Method", *(latex_escape(c.label) for c in table.columns)]) + " \\\\", "\\midrule"]
        out += [_latex_row(table, row) for row in table.ranked]
        if table.analysis_only:
            span = len(table.columns) + 1
            out += ["\\midrule", f"\\multicolumn{{{span}}}{{l}}{{\\emph{{Oracle selection (analysis only)}}}} \\\\"]
            out += [_latex_row(table, row) for row in table.analysis_only]
        out += ["\\bottomrule", "\\end{tabular}", ""]
    return "\n".join(out).rstrip("\n")


def _latex_row(table: DatasetTable, row: MethodRow) -> str:
    return " & ".join([latex_escape(row.method), *(_latex_cell(row.cells.get(c.key)) for c in table.columns)]) + " \\\\"


def records(comparison: Comparison) -> list[dict[str, Any]]:
    """One flat record per row, fractions unrounded: what CSV and JSON carry."""
    flat = []
    for table in comparison.tables:
        for row in table.rows:
            record: dict[str, Any] = {"dataset": table.dataset, "method": row.method, "sweep": row.sweep,
                                      "algorithm": row.algorithm, "selection": row.selection,
                                      "analysis_only": row.analysis_only, "trials": row.trials, "trials_ok": row.trials_ok,
                                      "replicates": row.replicates, "replicates_ok": row.replicates_ok,
                                      "selection_blind": row.blind, "selection_blind_everywhere": row.blind_everywhere}
            budget = row.budget
            record.update({f"budget.{name}": getattr(budget, name) if budget else None
                           for name in (*BudgetSummary.FIELDS, "erm_ratio", "protocol_ratio")})
            record["budget_unfair"] = next((why for unfair, why in table.unfair if unfair is row), "")
            for column in table.columns:
                cell = row.cells.get(column.key)
                record.update({f"{column.key}.mean": cell.mean if cell else None,
                               f"{column.key}.std": cell.std if cell and math.isfinite(cell.std) else None,
                               f"{column.key}.n": cell.n if cell else 0})
            record["mark"] = (row.cells.get(table.rank_key) or Cell(0, 0, 0)).mark
            record.update({"trial_seconds": row.trial_seconds, "cpu_seconds": row.cpu_seconds,
                           "gpu_seconds": row.gpu_seconds})
            flat.append(record)
    return flat


def as_csv(comparison: Comparison) -> str:
    buffer = io.StringIO()
    pd.DataFrame(records(comparison)).to_csv(buffer, index=False)
    return buffer.getvalue().rstrip("\n")


def as_json(comparison: Comparison) -> str:
    tables = [{"dataset": t.dataset, "rank_key": t.rank_key, "columns": [asdict(c) for c in t.columns]}
              for t in comparison.tables]
    return json.dumps({"tables": tables, "rows": records(comparison),
                       "unfinished": [asdict(u) for u in comparison.unfinished]}, indent=2)
