"""Rendering a sweep summary for people (table), spreadsheets (csv) and scripts (json, stable keys)."""
from __future__ import annotations

import io
import json
import math
from typing import Any

import pandas as pd

from raybench.budget import ratio_text
from raybench.records import SweepSummary, TrialRecord
from raybench.report.importance import sweep_importances, table_lines
from raybench.report.results import (
    compute_line,
    epoch_of,
    fmt,
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


def trial_rows(summary: SweepSummary) -> pd.DataFrame:
    """One row per trial, as `results --format csv` writes it: numbers as numbers (best_epoch is 0-based among
    epochs_run)."""
    rows = [{"trial_id": t.trial_id, "status": t.status.value + (" (blind)" if t.selection_blind else ""),
             "selection_value": t.selection_value, "best_epoch": t.best_epoch, "epochs_run": t.epochs_run,
             **_budget_cells(t), "failure_reason": t.failure_reason,
             **{f"config.{k}": v for k, v in sorted(t.sampled.items())}} for t in summary.trials]
    return pd.DataFrame(rows)


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


def render_results(summary: SweepSummary, fmt_name: str) -> str:
    """The sweep in one of raybench.words' RESULT_FORMATS: `json`, the whole summary; `csv`, one row per trial;
    `table`, the console's text (`raybench results`)."""
    if fmt_name == "json":
        return json.dumps(_json_safe(summary.to_json()), indent=2, sort_keys=True, default=str)
    if fmt_name == "csv":
        buffer = io.StringIO()
        trial_rows(summary).to_csv(buffer, index=False)
        return buffer.getvalue().rstrip("\n")
    return table(summary)


def results_text(summary: SweepSummary, fmt_name: str) -> str:
    """The sweep as `render` shows it, with which hyperparameters mattered (raybench.report.importance): a table
    under the text, an `importances` field in JSON. CSV stays one row per trial, where no importance fits. Both
    a finished sweep's last output and `raybench results` print this, so they show the same."""
    text = render_results(summary, fmt_name)
    if fmt_name == "csv":
        return text
    found = sweep_importances(summary)
    if fmt_name == "json":
        return json.dumps({**json.loads(text), "importances": found.to_json()}, indent=2, sort_keys=True, default=str)
    return "\n".join([text, "", *table_lines(found)])


def table(summary: SweepSummary) -> str:
    sel, rep = summary.selected, summary.replicates
    metric = summary.selection.metric
    out = [(f"sweep {summary.name}: {summary.algorithm} on {summary.dataset}, "
           f"selected on {summary.selection.label} ({metric})"), ""]
    if summary.state_line:
        out[1:1] = [summary.state_line]
    out += [f"! {line}" for line in notices(summary)] + ([""] if notices(summary) else [])
    frame = console_trial_rows(summary)
    if not frame.empty:
        out += [frame.to_string(index=False), ""]
    if summary.compute:
        out += [f"wall time {duration(summary.wall_seconds)}. {compute_line(summary.compute)}", ""]
    if summary.tracking:
        out += [summary_tracking_line(summary), ""]
    if sel is None:
        out.append(nothing_selected(summary))
        return "\n".join(out)
    config = ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in sorted(sel.sampled.items()))
    out += [f"selected {sel.trial_id}: {config}",
            (f"replicates: {rep.ok}/{len(rep.seeds)} seeds finished, metrics at each replicate's best-{metric} epoch "
            f"(mean ± std over seeds, %)")]
    budget = BudgetSummary.from_metrics(rep.summary)
    if budget is not None:
        out.insert(-1, f"budget per replicate: {budget.text()}")
    rows = []
    for split, label in summary_splits(summary):
        cells = {m: fmt(rep.summary.get(f"{BEST_PREFIX}{split}/{m}")) for m in summary.metric_names}
        if any(c != "n/a" for c in cells.values()):
            rows.append({"split": label, **cells})
    if rows:
        frame = pd.DataFrame(rows)
        shown = [c for c in frame.columns if c == "split" or (frame[c] != "n/a").any()]  # e.g. per-group families
        out.append(frame[shown].to_string(index=False))
    return "\n".join(out)
