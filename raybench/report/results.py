"""Result tables of a sweep: trials, the selected config and the replicate summary (WILDS Table 2 cells).

Pure pandas, no Ray: the runner hands over typed records (raybench.records), this module shapes, summarises
and writes them atomically (raybench.paths.write_atomically: temp file, fsync, rename), so a crash or a full
disk never leaves a half-written table.
"""
from __future__ import annotations

import json
import math
from pathlib import Path

import pandas as pd

from raybench.labels import SHIFT_SPLIT_LABELS
from raybench.paths import write_atomically, write_text_atomically
from raybench.records import SweepSummary, TrialRecord, TrialStatus, is_finite_number
from raybench.report.importance import Importances, markdown_lines, sweep_importances
from raybench.report_keys import BEST_PREFIX
from raybench.sweep.extension import extension_words
from raybench.sweep.outcome import BudgetSummary, RowHealth
from raybench.sweep.spending import budget_words


def split_labels(summary: SweepSummary) -> dict[str, str]:
    """What this sweep's dataset calls its splits (summaries written before they said so: WILDS's words)."""
    return dict((summary.report or {}).get("split_labels") or SHIFT_SPLIT_LABELS)


def summary_splits(summary: SweepSummary) -> list[tuple[str, str]]:
    """(split, label) of a replicate table's rows: test splits first, then validation."""
    labels = split_labels(summary)
    return [(split, labels[split]) for split in ("id_test", "test", "id_val", "val") if split in labels]


def compute_line(compute: dict[str, dict[str, float]]) -> str:
    """`Compute: search 10 runs, 412 trial-s wall, 380 CPU-s, 0 GPU-s; replicates ...` (hours past an hour)."""
    def amount(seconds: float, unit: str) -> str:
        return f"{seconds / 3600:.2f} {unit}-h" if seconds >= 3600 else f"{seconds:.0f} {unit}-s"

    stages = sorted(compute, key=lambda stage: (stage != "search", stage))  # the search first, also from JSON
    parts = [f"{stage} {int(t['runs'])} runs, {amount(t['wall_s'], 'trial')} wall, {amount(t['cpu_s'], 'CPU')}, "
             f"{amount(t['gpu_s'], 'GPU')}" for stage, t in ((s, compute[s]) for s in stages) if t["runs"]]
    return "Compute: " + ("; ".join(parts) if parts else "nothing ran")


def tracking_line(stats: dict[str, float], wall_s: float, runs: int) -> str:
    """`Tracking: 1234 calls (6.2 a run), 4.0 s waited (1.0% of the wall time), 45.0 s in the background, 0 failed,
    0 retried`: what the sweep's process asked of the MLflow store (raybench.tracking.TrackingStats); the seconds
    the sweep waited on it, and those its trial-run writer spent while the sweep went on."""
    share = 100.0 * stats["seconds"] / wall_s if wall_s > 0 else 0.0
    per_run = f" ({stats['calls'] / runs:.1f} a run)" if runs else ""
    background = stats.get("background_seconds", 0.0)  # absent from a summary written before the writer
    return (f"Tracking: {int(stats['calls'])} calls{per_run}, {stats['seconds']:.1f} s waited ({share:.1f}% of the "
            f"wall time), {background:.1f} s in the background, {int(stats['failed'])} failed, "
            f"{int(stats['retried']) + int(stats['http_retries'])} retried")


def summary_tracking_line(summary: SweepSummary) -> str:
    runs = sum(int(stage["runs"]) for stage in (summary.compute or {}).values())
    return tracking_line(summary.tracking or {}, summary.wall_seconds, runs)


def trial_flags(trial: TrialRecord) -> str:
    """A trial's status suffix: ` (selection blind; not converged; pseudo-labels collapsed)`, or nothing."""
    flags = [name for name, flagged in (("selection blind", trial.selection_blind), ("not converged", trial.not_converged),
                                        ("pseudo-labels collapsed", trial.pseudo_labels_collapsed)) if flagged]
    return f" ({'; '.join(flags)})" if flags else ""


def trials_frame(trials: list[TrialRecord]) -> pd.DataFrame:
    """One row per trial (trials.csv): built from the records' JSON, so a status is its stored word."""
    rows = []
    for t in (trial.to_json() for trial in trials):
        row = {k: t[k] for k in ("order", "trial_id", "status", "failure_reason", "selection_value", "best_epoch", "node")}
        row.update({f"config.{k}": v for k, v in t["sampled"].items()})
        row.update(t["metrics"])
        rows.append(row)
    return pd.DataFrame(rows).sort_values("order").reset_index(drop=True) if rows else pd.DataFrame()


def replicates_frame(replicates: list[TrialRecord]) -> pd.DataFrame:
    rows = [{"seed": r["seed"], "status": r["status"], "failure_reason": r["failure_reason"], **r["metrics"]}
            for r in (run.to_json() for run in replicates)]
    return pd.DataFrame(rows)


def write_results(directory: Path, summary: SweepSummary, trials: pd.DataFrame, replicates: pd.DataFrame,
                  found: Importances | None = None) -> None:
    """The tables, then the markdown, then `summary.json` last: each file all or nothing (a full disk leaves the
    previous version or none, never half a file), and the record `results` and `benchmark --resume` trust is
    only replaced once everything beside it was written."""
    directory.mkdir(parents=True, exist_ok=True)
    for name, frame in (("trials", trials), ("replicates", replicates)):
        write_atomically(directory / f"{name}.csv", lambda p, f=frame: f.to_csv(p, index=False))
        write_atomically(directory / f"{name}.parquet", lambda p, f=frame: f.to_parquet(p, index=False))
    write_text_atomically(directory / "summary.md", markdown(summary, found))
    write_text_atomically(directory / "summary.json", json.dumps(summary.to_json(), indent=2, sort_keys=True, default=str))


def fmt(cell: dict[str, float] | None) -> str:
    if not cell:
        return "n/a"
    std = "" if math.isnan(cell["std"]) else f" ± {100 * cell['std']:.1f}"
    return f"{100 * cell['mean']:.1f}{std}"


def markdown(summary: SweepSummary, found: Importances | None = None) -> str:
    """The short human summary: selected config, the Table-2 row, which hyperparameters mattered (`found`, or
    rated here), every trial."""
    lines = [f"# {summary.name}: {summary.algorithm} on {summary.dataset}", "",
             f"Selection: {summary.selection.label} (`{summary.selection.metric}`)", ""]
    lines += [f"**{line}**" for line in notices(summary)] + ([""] if notices(summary) else [])
    if summary.compute:
        lines += [f"Wall time: {summary.wall_seconds:.0f} s. {compute_line(summary.compute)}", ""]
    if summary.tracking:
        lines += [summary_tracking_line(summary), ""]
    if summary.selected is None:
        lines.append(nothing_selected(summary))
    else:
        lines += _selected_lines(summary, summary.selected)
    lines += ["", *markdown_lines(found or sweep_importances(summary))]  # before the trials: a long description is cut at its end
    lines += ["", "| trial | status | selection value | best epoch of epochs run |", "|---|---|---|---|"]
    for t in summary.trials:
        value = "" if not is_finite_number(t.selection_value) else f"{t.selection_value:.4f}"
        status = f"failed: {t.failure_reason}" if t.status == TrialStatus.FAILED else t.status.value
        status += trial_flags(t)
        lines.append(f"| `{t.trial_id}` | {status} | {value} | {epoch_of(t)} |")
    return "\n".join(lines) + "\n"


def epoch_of(trial: TrialRecord) -> str:
    """`4 of 10`: its best epoch (1-based) among those it ran; the bare index for records that lack the count."""
    if trial.best_epoch is None:
        return ""
    if trial.epochs_run is None:
        return f"{trial.best_epoch:g}"
    return f"{trial.best_epoch + 1:g} of {trial.epochs_run:g}"


def _selected_lines(summary: SweepSummary, sel: TrialRecord) -> list[str]:
    rep, names = summary.replicates, summary.metric_names
    lines = [f"Selected trial `{sel.trial_id}` ({summary.selection.metric} = {sel.selection_value:.4f}):", ""]
    lines += [f"- `{k}` = {v}" for k, v in sorted(sel.sampled.items())]
    budget = BudgetSummary.from_metrics(rep.summary)
    lines += ["", f"Budget per replicate: {budget.text()}"] if budget else []
    lines += ["", f"Replicates: {rep.ok} of {len(rep.seeds)} seeds finished (mean ± std, %):", "",
              "| split | " + " | ".join(names) + " |", "|---" * (len(names) + 1) + "|"]
    for split, label in summary_splits(summary):
        cells = [fmt(rep.summary.get(f"{BEST_PREFIX}{split}/{m}")) for m in names]
        if any(c != "n/a" for c in cells):
            lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return lines


def notices(summary: SweepSummary) -> list[str]:
    """What a reader must know before trusting the numbers: an unfinished sweep, a blind selection, and a
    selection metric measured on other rows than the split's name says."""
    lines = []
    if not summary.finished:
        lines.append(f"INTERRUPTED: this sweep was {summary.state.value}; the results below are partial")
    if summary.selection_blind:
        lines.append(f"Selection is blind: {summary.selection_blind}")
    if summary.selected is not None and summary.selected.selection_note:
        lines.append(f"Held out: {summary.selected.selection_note}")
    return (lines + RowHealth.of(summary).notices() + replicate_rule_lines(summary)
            + extension_words(summary.report or {}) + budget_words(summary.report or {}))


def replicate_rule_lines(summary: SweepSummary) -> list[str]:
    """`--replicates auto`'s outcome, as summary.json recorded it (raybench.sweep.runner.replicate_rule_record)."""
    found = (summary.report or {}).get("replicate_rule")
    if not found:
        return []
    verdict = "decided" if found["decided"] else f"not decided at the cap of {found['cap']}"
    line = (f"Replicates: {found['replicates']}, {verdict} against {found['baseline']} on {found['column']} "
            f"({found['rule']})")
    if found.get("baseline_grown"):
        line += f"; the baseline {found['baseline_replicates']} (seeds added to it as to this sweep)"
    elif found.get("baseline_not_grown"):
        line += f"; the baseline's {found['baseline_replicates']} replicates as recorded ({found['baseline_not_grown']})"
    return [line]


def nothing_selected(summary: SweepSummary) -> str:
    if not summary.finished:
        return "Nothing selected yet: the search did not finish."
    return "No trial finished; nothing was selected."
