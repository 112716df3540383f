"""`raybench compare`: WILDS Table 2 for whatever has been run, from the sweeps' own replicate summaries.

Rows are methods (one finished sweep each), columns the dataset's report cells (ID and OOD test for a WILDS-shaped
shift; worst-group and average test accuracy for SpuCo), mean ± std over each sweep's replicates, as its own
`raybench results` shows them. The best entry of the ranking column (OOD test) is marked, and so is every entry
within one std of it, the paper's convention. Analysis-only selections (oracle) get their own block and are never
ranked against the rest. A sweep that has not finished is listed under the table, never dropped silently.

With statistics (`compare --stats`, raybench.report.stats) the marks give way to answers: each cell's 95 % interval
of the mean, each row's difference from the baseline row (ERM's) with its interval, p-value and verdict, the
trial each selection rule would have picked from the search trials (what the protocol's selection costs) with
Kendall's tau between the rules' rankings, and over several datasets each method's mean rank and IQM.

Pure records and one document of them (raybench.report.document), which every format of raybench.report.renderers
writes: reading the store is raybench.tracking's, drawing is raybench.report.plots'.
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import pandas as pd

from raybench.labels import SHIFT_SPLIT_LABELS, column_label, selection_label
from raybench.records import Selection, SweepState, SweepSummary, TrialRecord, TrialStatus
from raybench.report import document as doc
from raybench.report import renderers, stats
from raybench.report.document import percent
from raybench.report.importance import sweep_importances
from raybench.report.results import fmt, split_labels
from raybench.report.stats import (
    NORMALISATION,
    Difference,
    Interval,
    MethodAggregate,
    RankAgreement,
    Rule,
    RuleRanking,
    SelectionCost,
    StatsSettings,
)
from raybench.report_keys import BEST_PREFIX, KEPT_AT_BEST
from raybench.sweep.outcome import BudgetSummary, RowHealth, ranking_key, replicate_values

BEST, WITHIN = "best", "within one std"
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
    mark: str = ""  # BEST, WITHIN or ""; never set with statistics, whose verdicts replace the marks
    values: tuple[float, ...] = ()  # the finite replicate values (OK replicates), in run order
    interval: Interval | None = None  # with statistics: the interval of the mean; None below two values

    def text(self) -> str:
        """`60.0 ± 2.0`, and with an interval `60.0 ± 2.0 [55.0, 65.0]` (%)."""
        return fmt({"mean": self.mean, "std": self.std}) + (f" {interval_text(self.interval)}" if self.interval else "")


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
    blind: str = ""  # the sweep's own finding that its selection could not see (raybench.sweep.outcome.blindness), else ""
    blind_everywhere: bool = False  # no finished trial's selection metric moved: the selection was by chance
    budget: BudgetSummary | None = None  # the replicates' mean planned budget; None when they recorded none
    versus: Difference | None = None  # with statistics: against the baseline row on the ranking column
    selection_cost: SelectionCost | None = None  # with statistics: each rule's pick among the search trials
    importance: dict[str, float] | None = None  # with statistics: each rated hyperparameter's share (importance.py)
    health: RowHealth = field(default_factory=RowHealth)  # convergence and pseudo-labels of its replicates
    pseudo_kept: float | None = None  # the replicates' mean share of unlabeled rows pseudo-labelled at the best epoch
    epochs_scale: float = 1.0  # an attempt of the convergence rule: every config's epochs were raised by this

    @property
    def budget_text(self) -> str:
        """The budget cell: `780 st, 2.5 lp, 2.00x ERM`, and `, epochs x2` for a convergence attempt."""
        if self.budget is None:
            return "n/a"
        return self.budget.short() + (f", epochs x{self.epochs_scale:g}" if self.epochs_scale != 1 else "")


@dataclass(frozen=True)
class TableStats:
    """What statistics add to a dataset's table besides its rows' fields."""

    baseline: str | None  # the baseline row's method; None: no ranked row has the baseline's name
    rankings: list[RuleRanking]  # the ranked methods under each selection rule
    agreements: list[RankAgreement]  # Kendall's tau between every two rules' rankings
    selection_label: str  # the split and metric each rule's pick is judged on: `OOD test acc`
    split_labels: dict[str, str]  # what the dataset calls its splits


@dataclass(frozen=True)
class DatasetTable:
    dataset: str
    columns: list[Column]
    rank_key: str  # the column the best entry is judged on
    rows: list[MethodRow]
    stats: TableStats | None = None

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
        reference_scale = reference.epochs_scale if reference else 1.0
        erm_steps = reference.budget.erm_steps if reference else _median([r.budget.erm_steps for r in budgets])
        found = []
        for row in budgets:
            # A convergence attempt's raise is on purpose (its budget cell says it): its epochs come from the raised
            # E through the method's own rule, so its ratio to ERM holds; only its ERM budget is judged
            if row.epochs_scale == 1 and _off(row.budget.protocol_ratio, ratio / reference_scale):
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
    stats: StatsSettings | None = None  # set: the tables carry intervals, differences and selection costs
    aggregate: list[MethodAggregate] = field(default_factory=list)  # with statistics and several datasets
    superseded: list[str] = field(default_factory=list)  # `NAME, by NAME-epochs-x2 (...)`: shorter attempts left out


SINGLE_SEED = ("Single-seed: each search trial ran once, and replicates exist only for the selected config, so no "
               "selection-cost figure is averaged over seeds.")


class BaselineError(ValueError):
    """`--baseline NAME` names no ranked row of any table."""


# ----- building ----------------------------------------------------------------------------------
def compare(summaries: Sequence[SweepSummary], unfinished: Sequence[UnfinishedSweep] = (),
            selection: str | None = None, settings: StatsSettings | None = None) -> Comparison:
    """Summaries of sweeps (as `raybench results` reads them) in the order the rows should take.
    Sweeps that did not finish, or finished without a replicate result, join `unfinished`. With `settings`, the
    tables carry statistics instead of marks; a BaselineError when `settings.baseline` names no ranked row."""
    by_dataset: dict[str, list[SweepSummary]] = {}
    left = list(unfinished)
    replaced = superseded_attempts(summaries)
    for summary in summaries:
        if selection and summary.selection.strategy != selection:
            continue
        if summary.name in replaced:
            continue
        reason = _not_comparable(summary)
        if reason:
            left.append(UnfinishedSweep(summary.name, summary.dataset, summary.algorithm, reason))
            continue
        by_dataset.setdefault(summary.dataset, []).append(summary)
    tables = [_table(dataset, dataset_summaries, settings) for dataset, dataset_summaries in by_dataset.items()]
    superseded = list(replaced.values())
    if settings is None:
        return Comparison(tables, left, superseded=superseded)
    if settings.baseline and tables and not any(t.stats and t.stats.baseline for t in tables):
        rows = sorted({r.method for t in tables for r in t.ranked} | {r.sweep for t in tables for r in t.ranked})
        known = f"methods and sweeps: {', '.join(rows)}" if rows else "there is no ranked row (only oracle ones)"
        raise BaselineError(f"no ranked (non-oracle) row is named {settings.baseline!r}; {known}")
    aggregate = stats.aggregate(_rank_scores(tables), settings) if len(tables) > 1 else []
    return Comparison(tables, left, settings, aggregate, superseded)


def superseded_attempts(summaries: Sequence[SweepSummary]) -> dict[str, str]:
    """The sweeps a longer attempt of the same pair replaced under the convergence rule (`--converge`), each
    with a line saying by which: only the last attempt's row is the method's."""
    replaced = {}
    for summary in summaries:
        if _not_comparable(summary):  # an interrupted attempt supersedes nothing yet: the earlier one keeps its row
            continue
        for attempt in summary.attempts or []:
            budget = f", {attempt.budget}" if attempt.budget else ""
            replaced[attempt.name] = (f"{attempt.name} (epochs x{attempt.epochs_scale:g}{budget}: {attempt.reason}), by "
                                      f"{summary.name} (epochs x{summary.epochs_scale or 1:g})")
    return replaced


def from_records(records: Sequence[Any], selection: str | None = None,
                 settings: StatsSettings | None = None) -> Comparison:
    """The comparison of sweeps read back from the store (raybench.tracking.SweepRecord), in their order;
    those that recorded no results yet are listed as unfinished with where they stand, and those whose
    recorded results are damaged with what is wrong."""
    unfinished = [UnfinishedSweep(r.name, r.dataset, r.algorithm,
                                  r.damage or f"{r.state_line}; no results were recorded yet")
                  for r in records if r.summary is None]
    return compare([r.summary for r in records if r.summary], unfinished, selection, settings)


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


def _table(dataset: str, summaries: list[SweepSummary], settings: StatsSettings | None = None) -> DatasetTable:
    columns: list[Column] = []
    for summary in summaries:
        columns += [c for c in columns_of(summary) if c.key not in {k.key for k in columns}]
    rank_key = ranking_key([{"key": c.key} for c in columns])
    rows = _disambiguate([_row(summary, columns, settings) for summary in summaries])
    if settings is None:
        return DatasetTable(dataset, columns, rank_key, _marked(rows, rank_key))
    rows, baseline = _tested(rows, rank_key, settings)
    rankings, agreements = stats.rankings({r.method: r.selection_cost for r in rows
                                           if not r.analysis_only and r.selection_cost})
    table_stats = TableStats(baseline, rankings, agreements, _selection_cost_label(summaries[0]),
                             split_labels(summaries[0]))
    return DatasetTable(dataset, columns, rank_key, rows, table_stats)


def _row(summary: SweepSummary, columns: list[Column], settings: StatsSettings | None = None) -> MethodRow:
    replicates = summary.replicates
    cells = {}
    for column in columns:
        cell = replicates.summary.get(f"{BEST_PREFIX}{column.key}")
        cells[column.key] = Cell(cell["mean"], _nan_if_none(cell["std"]), int(cell["n"])) if cell else None
    if settings is not None:
        cells = {key: _with_interval(cell, replicate_values(replicates.runs, key), settings) if cell else None
                 for key, cell in cells.items()}
    compute = summary.compute or {}
    return MethodRow(
        method=Path(summary.space or summary.algorithm).stem, sweep=summary.name,
        algorithm=summary.algorithm, selection=summary.selection.strategy, selection_label=_selection_words(summary),
        analysis_only=_analysis_only(summary.selection),
        trials=len(summary.trials), trials_ok=sum(t.status.selectable for t in summary.trials),
        replicates=len(replicates.seeds), replicates_ok=int(replicates.ok), cells=cells,
        blind=summary.selection_blind or "", blind_everywhere=_blind_everywhere(summary.trials),
        budget=BudgetSummary.from_metrics(replicates.summary),
        selection_cost=None if settings is None else _selection_cost(summary),
        importance=None if settings is None else sweep_importances(summary).shares,
        health=RowHealth.of(summary), pseudo_kept=_mean(replicates.summary.get(f"{BEST_PREFIX}{KEPT_AT_BEST}")),
        epochs_scale=summary.epochs_scale or 1.0,
        **{name: _total(compute, key) for name, key in (("trial_seconds", "wall_s"), ("cpu_seconds", "cpu_s"),
                                                         ("gpu_seconds", "gpu_s"))})


# ----- statistics (raybench.report.stats) -----------------------------------------------------------
def _with_interval(cell: Cell, values: tuple[float, ...], settings: StatsSettings) -> Cell:
    return replace(cell, values=values, interval=stats.mean_interval(values, settings))


def _selection_cost(summary: SweepSummary) -> SelectionCost:
    """Each rule's pick among the sweep's search trials, on the sweep's selection metric."""
    metric = summary.selection.metric.partition("/")[2]
    return stats.selection_cost(summary.trials, metric, has_id_val=Rule.ID_VAL.split in split_labels(summary))


def _selection_cost_label(summary: SweepSummary) -> str:
    """What a rule's pick is judged on, in the dataset's words: `OOD test acc`."""
    return column_label(stats.REPORT_SPLIT, summary.selection.metric.partition("/")[2], split_labels(summary))


def rule_label(rule: Rule, labels: dict[str, str]) -> str:
    """A rule in the dataset's words: `OOD val`, `ID val`, `oracle (OOD test)`; SpuCo's `val`, `oracle (test)`."""
    words = labels.get(rule.split, rule.split)
    return f"oracle ({words})" if rule == Rule.ORACLE else words


def _tested(rows: list[MethodRow], rank_key: str, settings: StatsSettings) -> tuple[list[MethodRow], str | None]:
    """Every ranked row but the baseline against the baseline row on `rank_key`; the baseline's method, or None
    (and no differences) when no ranked row is named so."""
    name = settings.baseline_name
    baseline = next((r for r in rows if not r.analysis_only and name in (r.method, r.sweep)), None)
    if baseline is None:
        return rows, None
    reference = baseline.cells.get(rank_key)
    tested = []
    for row in rows:
        cell = row.cells.get(rank_key)
        skip = row is baseline or row.analysis_only or cell is None or reference is None
        tested.append(row if skip else replace(
            row, versus=stats.versus(cell.values, reference.values, baseline.method, settings)))
    return tested, baseline.method


def _rank_scores(tables: list[DatasetTable]) -> dict[str, dict[str, tuple[float, ...]]]:
    """Per dataset, each ranked method's replicate values of the ranking column: what the aggregate ranks."""
    return {t.dataset: {r.method: r.cells[t.rank_key].values for r in t.ranked if r.cells.get(t.rank_key)}
            for t in tables}


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


def _mean(cell: dict[str, float] | None) -> float | None:
    return None if not cell else float(cell["mean"])


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


# ----- the document: what every format writes (raybench.report.renderers) ------------------------------------
def render_comparison(comparison: Comparison, fmt_name: str) -> str:
    """The comparison in the format registered as `fmt_name` (raybench.report.renderers.FORMATS)."""
    return renderers.render(document(comparison), fmt_name)


def document(comparison: Comparison) -> doc.Document:
    """The comparison as one document: per dataset its results table (with statistics, then the differences, the
    selection costs and the rankings), the aggregate over datasets, and what is not in the tables; its dataset is
    one flat record per row (`records`) and the JSON tree around them."""
    settings = comparison.stats
    blocks: list[doc.Block] = []
    for table in comparison.tables:
        blocks.append(_results_table(table, settings))
        blocks += _table_blocks(table, settings) if settings else []
    if comparison.aggregate:
        blocks.append(_aggregate_block(comparison))
    if not comparison.tables:
        blocks.append(doc.Lines(("No finished sweep matches.",)))
    unfinished = _unfinished_lines(comparison)
    if unfinished:
        blocks.append(doc.Lines(tuple(unfinished)))
    return doc.Document(tuple(blocks), doc.Dataset(tuple(records(comparison)), json_tree(comparison)))


def _compute_text(seconds: float | None, unit: str) -> str:
    if seconds is None:
        return ""
    return f"{seconds / 3600:.2f} {unit}-h" if seconds >= 3600 else f"{seconds:.0f} {unit}-s"


def _counts(row: MethodRow) -> tuple[str, str]:
    return (f"{row.trials_ok}/{row.trials}" if row.trials_ok != row.trials else str(row.trials),
            f"{row.replicates_ok}/{row.replicates}")


ANALYSIS_HEADING = "Analysis only (selected on the test split itself, not a valid protocol; not ranked)"
ANALYSIS_LABEL = "Oracle selection (analysis only)"


def _results_table(table: DatasetTable, settings: StatsSettings | None) -> doc.Table:
    """The dataset's Table 2: a row per method, its report cells (the essentials), trials, replicates, budget,
    checks, pseudo-labels kept and compute; the analysis-only rows as a group of their own."""
    pseudo = any(r.pseudo_kept is not None for r in table.rows)
    compute = any(r.trial_seconds is not None for r in table.rows)
    columns = (doc.Column("method"), doc.Column("selection", essential=False),
               *(doc.Column(c.label) for c in table.columns),
               *(doc.Column(title, essential=False) for title in ("trials", "replicates", "budget", "checks")),
               *((doc.Column("pseudo-labels kept", essential=False),) if pseudo else ()),
               *((doc.Column("compute", essential=False),) if compute else ()))
    groups = [doc.RowGroup(_display_rows(table, table.ranked, pseudo, compute), empty="(no OOD-selected sweep)")]
    if table.analysis_only:
        groups.append(doc.RowGroup(_display_rows(table, table.analysis_only, pseudo, compute),
                                   heading=ANALYSIS_HEADING, label=ANALYSIS_LABEL))
    return doc.Table(_heading(table, settings), columns, tuple(groups), doc.TableKind.RESULTS,
                     _legend(table, settings), tuple(_blind_lines(table) + _percentile_lines(table)),
                     context="raybench compare")


def _display_rows(table: DatasetTable, rows: list[MethodRow], pseudo: bool,
                  compute: bool) -> tuple[tuple[doc.Cell, ...], ...]:
    return tuple(_display_row(table, row, pseudo, compute) for row in rows)


def _display_row(table: DatasetTable, row: MethodRow, pseudo: bool, compute: bool) -> tuple[doc.Cell, ...]:
    """The row's cells: a report cell as its measure (marked, with its interval), n/a where the sweep has none."""
    trials, replicates = _counts(row)
    cells: list[doc.Cell] = [doc.Text(row.method),
                             doc.Text(row.selection_label + (" (BLIND)" if row.blind_everywhere else ""))]
    cells += [_measure(row.cells.get(column.key)) for column in table.columns]
    cells += [doc.Text(trials), doc.Text(replicates), doc.Text(row.budget_text),
              doc.Text("; ".join(row.health.flags()) or "ok")]
    if pseudo:
        cells.append(doc.Text("n/a" if row.pseudo_kept is None else f"{100 * row.pseudo_kept:.1f} %"))
    if compute:
        cells.append(doc.Missing() if row.trial_seconds is None else doc.Text(_compute_line(row)))
    return tuple(cells)


def _compute_line(row: MethodRow) -> str:
    text = _compute_text(row.trial_seconds, "trial")
    return text + (f", {_compute_text(row.gpu_seconds, 'GPU')}" if row.gpu_seconds else "")


def _measure(cell: Cell | None) -> doc.Cell:
    if cell is None:
        return doc.Missing()
    interval = (cell.interval.low, cell.interval.high) if cell.interval else None
    return doc.Measure(cell.mean, cell.std, interval, doc.Mark(cell.mark))


def _heading(table: DatasetTable, settings: StatsSettings | None = None) -> str:
    if settings is None:
        return f"{table.dataset}: mean ± std over replicates (%), each at its best-selection epoch"
    return (f"{table.dataset}: mean ± std [{_interval_words(settings)} of the mean] over replicates (%), each at its "
            f"best-selection epoch")


def _interval_words(settings: StatsSettings) -> str:
    kind = "t interval" if settings.interval == stats.IntervalChoice.T else "BCa bootstrap interval"
    return f"{settings.confidence:.0%} {kind}"


COLUMN_WORDS = ("Budget: a replicate's planned steps (batches), labeled passes, and steps over ERM's at the same "
                "epoch share. Compute: trial-seconds of the search and the replicates together.")


def _legend(table: DatasetTable, settings: StatsSettings | None = None) -> doc.Legend:
    if settings is None:
        marks = ((doc.Mark.BEST, f"best {table.rank_label}"), (doc.Mark.WITHIN, "within one std of it"))
        return doc.Legend(marks, details=COLUMN_WORDS)
    return doc.Legend(reading=(f"In brackets: the {_interval_words(settings)} of the mean, none below "
                               f"{stats.MIN_REPLICATES} replicates."), details=COLUMN_WORDS)


def _blind_lines(table: DatasetTable) -> list[str]:
    """A row whose search could not tell its configs apart is marked, never passed off as a selection; so is a
    row that got another budget than the protocol gives it (an unfair comparison looks like a fair one)."""
    lines = [f"Selection blind: {row.method} ({row.sweep}): {row.blind}." for row in table.rows if row.blind]
    lines += [f"{kind}: {row.method} ({row.sweep}): {detail}." for row in table.rows
              for kind, detail in row.health.findings()]
    return lines + [f"Budget outside the protocol's ratios: {row.method} ({row.sweep}): {why}."
                    for row, why in table.unfair]


def _unfinished_lines(comparison: Comparison) -> list[str]:
    lines = []
    if comparison.superseded:
        lines += ["", "Not in the table (superseded by a longer attempt of the same pair, under the convergence rule):"]
        lines += [f"- {line}" for line in comparison.superseded]
    if comparison.unfinished:
        lines += ["", "Not in the table (unfinished):"] + [f"- {u.line}" for u in comparison.unfinished]
    return lines


# ----- the statistics' detail tables: plain text, the same in every format -----------------------------------
def points(value: float | None) -> str:
    """A difference of fractions in percentage points, signed: `+5.0`."""
    return "n/a" if value is None or not math.isfinite(value) else f"{100 * value:+.1f}"


def interval_text(interval: Interval | None, signed: bool = False) -> str:
    """`[55.0, 65.0]` (%), or signed points `[-1.2, +11.2]`."""
    if interval is None:
        return "n/a"
    show = points if signed else percent
    return f"[{show(interval.low)}, {show(interval.high)}]"


def p_text(p_value: float | None) -> str:
    if p_value is None or not math.isfinite(p_value):
        return "n/a"
    return f"{p_value:.3f}" if p_value >= 0.001 else f"{p_value:.1e}"


def tau_text(tau: float | None) -> str:
    return "n/a" if tau is None else f"{tau:+.2f}"


def _difference_block(table: DatasetTable, settings: StatsSettings) -> doc.Table:
    baseline = table.stats.baseline if table.stats else None
    if baseline is None:
        return doc.detail_table(f"No differences: no ranked row is named {settings.baseline_name!r} (--baseline NAME "
                                f"names the row to test against)", [], context=table.dataset)
    test = "Welch's t-test" if settings.test == stats.Significance.WELCH else "permutation test"
    kind = ("Welch t interval" if settings.test == stats.Significance.WELCH
            else "bootstrap interval (BCa; percentile where BCa is degenerate)")
    title = (f"Against the baseline {baseline} on {table.rank_label}: difference of means in points, its "
             f"{settings.confidence:.0%} {kind}, {test} at alpha {settings.alpha:g}")
    records, notes = [], []
    for row in table.ranked:
        versus = row.versus
        if row.method == baseline or versus is None:
            verdict = "(baseline)" if row.method == baseline else "n/a"
            records.append({"method": row.method, "difference (points)": "", "interval (points)": "", "p": "",
                            "replicates": "", "verdict": verdict, **_plan_cells(settings, None)})
            continue
        records.append({"method": row.method, "difference (points)": points(versus.difference),
                        "interval (points)": interval_text(versus.interval, signed=True), "p": p_text(versus.p_value),
                        "replicates": f"{versus.n} vs {versus.n_baseline}", "verdict": str(versus.verdict),
                        **_plan_cells(settings, versus)})
        notes += [f"{row.method}: {versus.note}."] if versus.note else []
        notes += _plan_notes(row.method, versus)
    if settings.plan_seeds:
        notes.append(f"Replicates needed: per side, for Welch's test at alpha {settings.alpha:g} to tell the row from "
                     f"the baseline with power {settings.power:g}, taking the measured difference and stds as the "
                     f"truth (a forecast from the replicates run so far; "
                     f"`sweep --replicates auto --baseline SWEEP` adds them until the verdict settles)")
    return doc.detail_table(title, records, notes, table.dataset)


def _plan_cells(settings: StatsSettings, versus: Difference | None) -> dict[str, str]:
    """The `replicates needed` column of --plan-seeds: a count, `out of reach`, or nothing for the baseline."""
    if not settings.plan_seeds:
        return {}
    plan = versus.plan if versus else None
    return {"replicates needed": "" if plan is None else str(plan.needed) if plan.needed else "out of reach"}


def _plan_notes(method: str, versus: Difference) -> list[str]:
    plan = versus.plan
    return [f"{method}: {plan.text()}."] if plan is not None else []


def _pick_text(choice: stats.Choice) -> str:
    return f"{percent(choice.test)} (#{choice.order})" if choice.made else "n/a"


def _selection_block(table: DatasetTable) -> doc.Table:
    assert table.stats is not None
    labels = table.stats.split_labels
    records = []
    for row in table.ranked + table.analysis_only:
        cost = row.selection_cost
        if cost is None:
            continue
        record = {"method": row.method, "epochs chosen by": row.selection_label.split(" (")[0],
                  "trials": str(cost.trials)}
        record.update({f"{rule_label(c.rule, labels)} pick": _pick_text(c) for c in cost.choices})
        record["cost (points)"] = points(cost.cost)
        records.append(record)
    title = (f"What selection costs: the {table.stats.selection_label} (%) of the search trial each rule picks "
             f"(#: the trial's order)")
    return doc.detail_table(title, records, _selection_notes(table), table.dataset)


def _selection_notes(table: DatasetTable) -> list[str]:
    assert table.stats is not None
    labels = table.stats.split_labels
    protocol, oracle = rule_label(Rule.OOD_VAL, labels), rule_label(Rule.ORACLE, labels)
    missing = sorted({c.note for r in table.rows if r.selection_cost for c in r.selection_cost.choices if c.note})
    return [SINGLE_SEED,
            ("Each trial's metrics are those at the epoch its sweep's own selection chose (the 'epochs chosen by' "
             "column); no rule re-chooses the epoch."),
            (f"cost: the {oracle} pick minus the {protocol} pick, what the protocol's selection gives up; the oracle "
             f"peeks at the test split and is for analysis only."),
            *(f"Not available: {note}." for note in missing)]


def _ranking_block(table: DatasetTable) -> doc.Table:
    assert table.stats is not None
    labels = table.stats.split_labels
    costs = {r.method: r.selection_cost for r in table.ranked if r.selection_cost}
    depth = max((len(r.methods) for r in table.stats.rankings), default=0)
    records = []
    for position in range(depth):
        record = {"rank": str(position + 1)}
        for ranking in table.stats.rankings:
            method = ranking.methods[position] if position < len(ranking.methods) else ""
            record[rule_label(ranking.rule, labels)] = (
                f"{method} ({percent(costs[method].choice(ranking.rule).test)})" if method else "")
        records.append(record)
    taus = [f"Kendall's tau, {rule_label(a.first, labels)} vs {rule_label(a.second, labels)}: {tau_text(a.tau)} "
            f"({a.methods} methods{'; undefined below two, or with one ranking all tied' if a.tau is None else ''})"
            for a in table.stats.agreements]
    return doc.detail_table(f"Methods ranked under each selection rule by the {table.stats.selection_label} (%) of "
                            f"its pick, best first", records, [*taus, "(tau 1: the same order, -1: reversed)"],
                            table.dataset)


def _aggregate_block(comparison: Comparison) -> doc.Table:
    columns = ", ".join(f"{t.dataset}: {t.rank_label}" for t in comparison.tables)
    records = [{"method": a.method, "datasets": f"{a.datasets}/{len(comparison.tables)}",
                "mean rank": "n/a" if _number(a.mean_rank) is None else f"{a.mean_rank:.2f}", "IQM (0-1)": "n/a" if a.iqm is None else f"{a.iqm:.2f}",
                "interval": "n/a" if a.interval is None else f"[{a.interval.low:.2f}, {a.interval.high:.2f}]",
                "scores": str(a.scores)} for a in comparison.aggregate]
    confidence = comparison.stats.confidence if comparison.stats else stats.CONFIDENCE
    notes = [("mean rank: each dataset ranks its methods by their mean (1: the best; ties averaged), over the datasets "
              "a method has a row in."),
             (f"IQM: interquartile mean (25 % trimmed from each end) of the method's normalised scores, every seed of "
              f"every dataset pooled; normalisation: {NORMALISATION}."),
             (f"interval: {confidence:.0%} stratified bootstrap (seeds resampled within each dataset; Agarwal et al. "
              f"2021), BCa, percentile where BCa is degenerate.")]
    return doc.detail_table(f"Over {len(comparison.tables)} datasets ({columns})", records, notes, "all datasets")


def _table_blocks(table: DatasetTable, settings: StatsSettings) -> list[doc.Table]:
    return [_difference_block(table, settings), _selection_block(table), _ranking_block(table)]


def _percentile_lines(table: DatasetTable) -> list[str]:
    """Cells whose bootstrap fell back to percentile, named, since the heading says BCa."""
    fell = [f"{row.method} {column.label}" for row in table.rows for column in table.columns
            if (cell := row.cells.get(column.key)) and cell.interval
            and cell.interval.method == stats.IntervalMethod.PERCENTILE]
    return [f"Percentile bootstrap where BCa is degenerate: {', '.join(fell)}."] if fell else []


# ----- for machines: CSV's rows and JSON's tree --------------------------------------------------------------
def records(comparison: Comparison) -> list[dict[str, Any]]:
    """One flat record per row, fractions unrounded: what CSV and JSON carry."""
    flat = []
    aggregate = {a.method: a for a in comparison.aggregate}
    for table in comparison.tables:
        for row in table.rows:
            record: dict[str, Any] = {"dataset": table.dataset, "method": row.method, "sweep": row.sweep,
                                      "algorithm": row.algorithm, "selection": row.selection,
                                      "analysis_only": row.analysis_only, "trials": row.trials, "trials_ok": row.trials_ok,
                                      "replicates": row.replicates, "replicates_ok": row.replicates_ok,
                                      "selection_blind": row.blind, "selection_blind_everywhere": row.blind_everywhere,
                                      "epochs_scale": row.epochs_scale, "not_converged": row.health.not_converged, "late_runs": row.health.late,
                                      "pseudo_labels_collapsed": row.health.collapsed, "health_runs": row.health.runs,
                                      "pseudo_labels_kept": row.pseudo_kept}
            budget = row.budget
            record.update({f"budget.{name}": getattr(budget, name) if budget else None
                           for name in (*BudgetSummary.FIELDS, "erm_ratio", "protocol_ratio")})
            record["budget_unfair"] = next((why for unfair, why in table.unfair if unfair is row), "")
            for column in table.columns:
                cell = row.cells.get(column.key)
                record.update({f"{column.key}.mean": cell.mean if cell else None,
                               f"{column.key}.std": cell.std if cell and math.isfinite(cell.std) else None,
                               f"{column.key}.n": cell.n if cell else 0})
                if comparison.stats:
                    record.update(_interval_fields(column.key, cell.interval if cell else None))
            if comparison.stats is None:
                record["mark"] = (row.cells.get(table.rank_key) or Cell(0, 0, 0)).mark
            record.update({"trial_seconds": row.trial_seconds, "cpu_seconds": row.cpu_seconds,
                           "gpu_seconds": row.gpu_seconds})
            if comparison.stats:
                record.update(_stats_fields(table, row, aggregate.get(row.method) if not row.analysis_only else None))
                record.update({f"importance.{name}": share for name, share in (row.importance or {}).items()})
            flat.append(record)
    return flat


def _number(value: float | None) -> float | None:
    """A finite number, else None: JSON has no NaN."""
    return value if value is not None and math.isfinite(value) else None


def _interval_fields(prefix: str, interval: Interval | None) -> dict[str, Any]:
    return {f"{prefix}.ci_low": interval.low if interval else None, f"{prefix}.ci_high": interval.high if interval else None,
            f"{prefix}.ci_method": str(interval.method) if interval else None}


def _stats_fields(table: DatasetTable, row: MethodRow, aggregate: MethodAggregate | None) -> dict[str, Any]:
    """A row's statistics, flat: its difference from the baseline, each rule's pick, its aggregate."""
    versus = row.versus
    fields: dict[str, Any] = {
        "vs_baseline.baseline": table.stats.baseline if table.stats else None, "vs_baseline.column": table.rank_key,
        "vs_baseline.difference": _number(versus.difference) if versus else None,
        **_interval_fields("vs_baseline", versus.interval if versus else None),
        "vs_baseline.p_value": _number(versus.p_value) if versus else None, "vs_baseline.test": str(versus.test) if versus else None,
        "vs_baseline.verdict": str(versus.verdict) if versus else None, "vs_baseline.note": versus.note if versus else None,
        "vs_baseline.replicates_needed": versus.plan.needed if versus and versus.plan else None}
    cost = row.selection_cost
    for rule in stats.RULES:
        choice = cost.choice(rule) if cost else None
        fields.update({f"selection_cost.{rule}.trial_id": choice.trial_id if choice else None,
                       f"selection_cost.{rule}.order": choice.order if choice else None,
                       f"selection_cost.{rule}.chosen_on": choice.chosen_on if choice else None,
                       f"selection_cost.{rule}.test": choice.test if choice else None,
                       f"selection_cost.{rule}.note": choice.note if choice else None,
                       f"selection_rank.{rule}": _position(table, row, rule)})
    fields.update({"selection_cost.cost": cost.cost if cost else None, "selection_cost.single_seed": True,
                   "aggregate.datasets": aggregate.datasets if aggregate else None,
                   "aggregate.mean_rank": _number(aggregate.mean_rank) if aggregate else None,
                   "aggregate.iqm": aggregate.iqm if aggregate else None,
                   **_interval_fields("aggregate.iqm", aggregate.interval if aggregate else None)})
    return fields


def _position(table: DatasetTable, row: MethodRow, rule: Rule) -> int | None:
    """The row's place (1: the best) in the rule's ranking of the table's methods; None when it is not ranked."""
    ranking = next((r for r in table.stats.rankings if r.rule == rule), None) if table.stats else None
    return ranking.methods.index(row.method) + 1 if ranking and row.method in ranking.methods else None


def json_tree(comparison: Comparison) -> dict[str, Any]:
    """What `--format json` writes: the tables (dataset, ranking column, columns; with statistics the baseline,
    rankings and rank agreement), every row as `records` gives it, the unfinished sweeps, and with statistics the
    settings and the aggregate over datasets."""
    tables = [{"dataset": t.dataset, "rank_key": t.rank_key, "columns": [asdict(c) for c in t.columns],
               **(_table_stats_json(t) if comparison.stats else {})} for t in comparison.tables]
    data: dict[str, Any] = {"tables": tables, "rows": records(comparison),
                            "unfinished": [asdict(u) for u in comparison.unfinished]}
    if comparison.stats:
        data["stats"] = _settings_json(comparison.stats)
        data["aggregate"] = [_aggregate_json(a) for a in comparison.aggregate]
    return data


def _settings_json(settings: StatsSettings) -> dict[str, Any]:
    return {**{k: str(v) if isinstance(v, stats.Words) else v for k, v in asdict(settings).items()},
            "baseline": settings.baseline_name, "min_replicates": stats.MIN_REPLICATES,
            "normalisation": NORMALISATION,
            "selection_cost": (f"{SINGLE_SEED} Each trial's metrics are those at the epoch its sweep's own "
                               f"selection chose.")}


def _table_stats_json(table: DatasetTable) -> dict[str, Any]:
    assert table.stats is not None
    return {"baseline": table.stats.baseline, "selection_cost_column": table.stats.selection_label,
            "selection_rankings": {str(r.rule): list(r.methods) for r in table.stats.rankings},
            "rank_agreement": [{"first": str(a.first), "second": str(a.second), "kendall_tau": a.tau,
                                "methods": a.methods} for a in table.stats.agreements]}


def _aggregate_json(entry: MethodAggregate) -> dict[str, Any]:
    return {"method": entry.method, "datasets": entry.datasets, "mean_rank": _number(entry.mean_rank), "iqm": entry.iqm,
            "scores": entry.scores, **_interval_fields("iqm", entry.interval)}
