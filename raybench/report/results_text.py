"""`raybench results`: one sweep's summary as a document (raybench.report.document) that every format of
raybench.report.renderers writes: for people (the console's table, Markdown, LaTeX) its trials, the selected config
and the replicates' mean ± std per split; for spreadsheets (CSV) one row per trial; for scripts (JSON) the whole
summary, its keys sorted."""
from __future__ import annotations

import math
from typing import Any

import pandas as pd
from pandas.api.types import is_numeric_dtype

from raybench.budget import ratio_text
from raybench.records import Importances, SweepSummary, TrialRecord
from raybench.report import renderers
from raybench.report.document import (
    Block,
    Cell,
    Column,
    Dataset,
    Document,
    Lines,
    Measure,
    Missing,
    RowGroup,
    Table,
    TableKind,
    Text,
)
from raybench.report.importance import sweep_importances, table_lines
from raybench.report.results import (
    compute_line,
    epoch_of,
    nothing_selected,
    notices,
    summary_splits,
    summary_tracking_line,
    trial_flags,
)
from raybench.report_keys import BEST_PREFIX
from raybench.sweep.outcome import BudgetSummary
from raybench.sweep.progress import duration


def _json_safe(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _json_safe(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_json_safe(v) for v in value]
    return value


def _sorted_keys(value: Any) -> Any:
    """Every mapping's keys in sorted order, however deep: the stable keys scripts read."""
    if isinstance(value, dict):
        return {k: _sorted_keys(v) for k, v in sorted(value.items())}
    if isinstance(value, (list, tuple)):
        return [_sorted_keys(v) for v in value]
    return value


def trial_records(summary: SweepSummary) -> list[dict[str, Any]]:
    """One record per trial, as `results --format csv` writes it: numbers as numbers (best_epoch is 0-based among
    epochs_run)."""
    return [{"trial_id": t.trial_id, "status": t.status.value + (" (blind)" if t.selection_blind else ""),
             "selection_value": t.selection_value, "best_epoch": t.best_epoch, "epochs_run": t.epochs_run,
             **_budget_cells(t), "failure_reason": t.failure_reason,
             **{f"config.{k}": v for k, v in sorted(t.sampled.items())}} for t in summary.trials]


def console_trial_rows(summary: SweepSummary) -> pd.DataFrame:
    """The trials as the console shows them: each status with its flags in words, the best epoch as `4 of 10`
    (1-based, among the epochs it ran), the selection value to 4 places."""
    rows = [{"trial_id": t.trial_id, "status": t.status.value + trial_flags(t),
             "selection_value": "" if t.selection_value is None or not math.isfinite(t.selection_value)
             else f"{t.selection_value:.4f}",
             "best epoch": epoch_of(t), **_budget_cells(t), "failure_reason": t.failure_reason or "",
             **{f"config.{k}": v for k, v in sorted(t.sampled.items())}} for t in summary.trials]
    return pd.DataFrame(rows)


def _budget_cells(trial: TrialRecord) -> dict[str, Any]:
    """A trial's planned steps and their ratio to the WILDS rule's (blank when it recorded none)."""
    budget = BudgetSummary.from_metrics(trial.metrics)
    if budget is None:
        return {"steps": "", "x protocol": ""}
    return {"steps": f"{budget.steps:.0f}", "x protocol": ratio_text(budget.protocol_ratio)}


# ----- the document ---------------------------------------------------------------------------------------
def results_document(summary: SweepSummary, found: Importances | None = None) -> Document:
    """The sweep's page: its heading and notices, every trial, its compute and tracking, the selected config and
    the replicates' table, then which hyperparameters mattered (`found`, when given); its data, one record per
    trial (CSV) and the whole summary with `importances` (JSON)."""
    blocks = _page(summary)
    tree = _json_safe(summary.to_json())
    if found is not None:
        lines = table_lines(found)
        blocks.append(Lines(tuple(lines if isinstance(blocks[-1], Table) else ["", *lines])))  # a table ends blank
        tree = {**tree, "importances": found.to_json()}
    return Document(tuple(blocks), Dataset(tuple(trial_records(summary)), _sorted_keys(tree)))


def _page(summary: SweepSummary) -> list[Block]:
    sel, rep = summary.selected, summary.replicates
    metric = summary.selection.metric
    head = [(f"sweep {summary.name}: {summary.algorithm} on {summary.dataset}, "
             f"selected on {summary.selection.label} ({metric})"), *([summary.state_line] if summary.state_line else []),
            ""]
    said = notices(summary)
    head += [f"! {line}" for line in said] + ([""] if said else [])
    blocks: list[Block] = [Lines(tuple(head))]
    frame = console_trial_rows(summary)
    if not frame.empty:
        blocks.append(printed_table(frame))
    after = [f"wall time {duration(summary.wall_seconds)}. {compute_line(summary.compute)}", ""] if summary.compute else []
    after += [summary_tracking_line(summary), ""] if summary.tracking else []
    if sel is None:
        return [*blocks, Lines((*after, nothing_selected(summary)))]
    config = ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in sorted(sel.sampled.items()))
    after.append(f"selected {sel.trial_id}: {config}")
    budget = BudgetSummary.from_metrics(rep.summary)
    after += [f"budget per replicate: {budget.text()}"] if budget is not None else []
    after.append(f"replicates: {rep.ok}/{len(rep.seeds)} seeds finished, metrics at each replicate's best-{metric} "
                 f"epoch (mean ± std over seeds, %)")
    blocks.append(Lines(tuple(after)))
    replicates = _replicate_table(summary)
    return blocks + ([replicates] if replicates is not None else [])


def _replicate_table(summary: SweepSummary) -> Table | None:
    """Mean ± std per split and metric; a split with no value is left out, and so is a metric with none (e.g.
    per-group families a dataset does not have)."""
    names = summary.metric_names
    rows: list[tuple[Cell, ...]] = []
    for split, label in summary_splits(summary):
        cells = [_measure(summary.replicates.summary.get(f"{BEST_PREFIX}{split}/{m}")) for m in names]
        if any(not isinstance(c, Missing) for c in cells):
            rows.append((Text(label), *cells))
    if not rows:
        return None
    shown = [0] + [i + 1 for i in range(len(names)) if any(not isinstance(row[i + 1], Missing) for row in rows)]
    titles = ["split", *names]
    return Table("", tuple(Column(titles[i]) for i in shown), (RowGroup(tuple(tuple(row[i] for i in shown)
                                                                          for row in rows)),), TableKind.RESULTS)


def _measure(cell: dict[str, float] | None) -> Cell:
    if not cell:
        return Missing()
    return Measure(cell["mean"], float("nan") if cell["std"] is None else cell["std"])


def printed_table(frame: pd.DataFrame) -> Table:
    """A frame of mixed values as a results table of the text pandas prints for each (a float column to one shared
    precision, a missing value as NaN, a column of numbers titled one space in), so the console's trial table reads
    as it always has."""
    columns = [_printed(frame[name]) for name in frame.columns]
    rows = tuple(tuple(Text(column[i]) for column in columns) for i in range(len(frame)))
    titles = [f" {name}" if is_numeric_dtype(frame[name]) else str(name) for name in frame.columns]
    return Table("", tuple(Column(title) for title in titles), (RowGroup(rows),), TableKind.RESULTS)


def _printed(column: pd.Series) -> list[str]:
    return [line.lstrip() for line in column.to_string(index=False).split("\n")]


# ----- the formats --------------------------------------------------------------------------------------
def render_results(summary: SweepSummary, fmt_name: str) -> str:
    """The sweep in the format registered as `fmt_name`, without the hyperparameter importances: `table`, the
    console's text; `csv`, one row per trial; `json`, the whole summary; and every other registered format."""
    return renderers.render(results_document(summary), fmt_name)


def results_text(summary: SweepSummary, fmt_name: str) -> str:
    """The sweep as `render_results` writes it, with which hyperparameters mattered (raybench.report.importance):
    a table under the text, an `importances` field in JSON. CSV stays one row per trial, where no importance fits,
    so a format that writes only the rows rates none. Both a finished sweep's last output and `raybench results`
    print this, so they show the same."""
    shown = renderers.renderer(fmt_name)
    found = None if shown.reads == renderers.Part.ROWS else sweep_importances(summary)
    return shown.render(results_document(summary, found))


def table(summary: SweepSummary) -> str:
    """The console's text of the sweep (`render_results` in the `table` format)."""
    return render_results(summary, "table")
