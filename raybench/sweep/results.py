"""Result tables of a sweep: trials, the selected config and the replicate summary (WILDS Table 2 cells).

Pure pandas, no Ray: the runner hands over typed records (raybench.records), this module shapes, summarises
and writes them atomically (raybench.paths.write_atomically: temp file, fsync, rename), so a crash or a full
disk never leaves a half-written table.
"""
from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from raybench.budget import StepRatios
from raybench.labels import SHIFT_SPLIT_LABELS
from raybench.paths import write_atomically, write_text_atomically  # cli and benchmark import the latter from here
from raybench.records import SweepSummary, TrialRecord, TrialStatus
from raybench.report_keys import BEST_PREFIX, CLOCK_STAMPS, CPU_S, GPU_S, SELECTION_BLIND, WALL_S
from raybench.sweep.importance import Importances, markdown_lines, sweep_importances

# What a run used, as its driver and workers report it (raybench/sweep/ray_backend.py), by total name.
COMPUTE_KEYS = {"wall_s": WALL_S, "cpu_s": CPU_S, "gpu_s": GPU_S}


@dataclass(frozen=True)
class BudgetSummary(StepRatios):
    """What a run planned to train (raybench/budget.py), read back from its `budget/` metrics, or their
    means over a sweep's replicates. `steps` are batches; `spent_steps` what the run ran (early stopping ends
    some runs before their plan)."""

    steps: float
    optimizer_steps: float
    labeled_examples: float
    unlabeled_examples: float
    labeled_passes: float
    protocol_steps: float
    erm_steps: float
    spent_steps: float

    FIELDS = ("steps", "optimizer_steps", "labeled_examples", "unlabeled_examples", "labeled_passes",
              "protocol_steps", "erm_steps")

    @classmethod
    def from_metrics(cls, values: Mapping[str, Any]) -> BudgetSummary | None:
        """From a run's metrics (numbers) or a replicate summary (cells with a mean); None when not recorded."""
        def number(key: str) -> float | None:
            value = values.get(key)
            value = value.get("mean") if isinstance(value, dict) else value
            return float(value) if _finite(value) else None

        planned = {name: number(f"budget/planned_{name}") for name in cls.FIELDS}
        if any(v is None for v in planned.values()):
            return None
        return cls(**planned, spent_steps=number("budget/steps") or 0.0)  # type: ignore[arg-type]

    def text(self) -> str:
        return (f"{self.steps:.0f} steps ({self.optimizer_steps:.0f} optimizer steps), {self.labeled_examples:.0f} "
                f"labeled + {self.unlabeled_examples:.0f} unlabeled examples, {self.labeled_passes:.2f} labeled passes; "
                f"{self.erm_ratio:.2f}x ERM's steps, {self.protocol_ratio:.2f}x the protocol's")

    def short(self) -> str:
        return f"{self.steps:.0f} st, {self.labeled_passes:.1f} lp, {self.erm_ratio:.2f}x ERM"


def ratio_text(ratio: float) -> str:
    """A budget ratio that never reads 0.00: two places from 0.1 up, two significant digits below."""
    return f"{ratio:.2f}" if ratio >= 0.1 or ratio == 0 else f"{ratio:.2g}"


def split_labels(summary: SweepSummary) -> dict[str, str]:
    """What this sweep's dataset calls its splits (summaries written before they said so: WILDS's words)."""
    return dict((summary.report or {}).get("split_labels") or SHIFT_SPLIT_LABELS)


def summary_splits(summary: SweepSummary) -> list[tuple[str, str]]:
    """(split, label) of a replicate table's rows: test splits first, then validation."""
    labels = split_labels(summary)
    return [(split, labels[split]) for split in ("id_test", "test", "id_val", "val") if split in labels]


def replicate_seeds(trial_id: str, count: int) -> list[int]:
    """K seeds derived from the selected trial's identity, so re-running a sweep repeats them exactly."""
    return [int(hashlib.sha256(f"{trial_id}/replicate/{i}".encode()).hexdigest()[:8], 16) for i in range(count)]


def select_best(trials: list[TrialRecord]) -> TrialRecord | None:
    """The finished trial (run to its end or stopped early) with the highest selection value at its best
    epoch; ties go to the earlier-sampled trial."""
    candidates = [t for t in trials if t.status.selectable and _finite(t.selection_value)]
    if not candidates:
        return None
    return max(candidates, key=lambda t: (t.selection_value, -t.order))


def _finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and math.isfinite(value)


def summarize(replicates: list[TrialRecord]) -> dict[str, dict[str, float]]:
    """Mean and sample std (ddof=1) of every metric at each replicate's best-validation epoch; `n` counts
    the finite values that went into them (a NaN metric is left out of all three)."""
    ok = [r.metrics for r in replicates if r.status == TrialStatus.OK]
    keys = sorted({k for m in ok for k in m} - CLOCK_STAMPS)  # moments, whose mean means nothing
    summary = {}
    for key in keys:
        values = pd.Series([m[key] for m in ok if key in m and _finite(m[key])], dtype="float64")
        if values.empty:
            continue
        summary[key] = {"mean": float(values.mean()), "std": float(values.std(ddof=1)) if len(values) > 1 else float("nan"),
                        "n": len(values)}
    return summary


def compute_totals(runs: list[TrialRecord]) -> dict[str, float]:
    """What a stage's runs used, summed over all of them: failed and interrupted runs used compute too.
    wall_s is trial-seconds (each run's own wall time), cpu_s its workers' process time, gpu_s the GPUs it
    held times its wall time."""
    totals: dict[str, float] = {"runs": float(len(runs))}
    for name, key in COMPUTE_KEYS.items():
        totals[name] = float(sum(r.metrics.get(key, 0.0) for r in runs if _finite(r.metrics.get(key))))
    return totals


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


def blindness(trials: list[TrialRecord]) -> str | None:
    """One line when trials' selection metric never moved: that selection picked by chance, not by merit."""
    # Trials that ran to their end: one stopped early (ASHA) ended right after a report, before the check.
    finished = [t for t in trials if t.status == TrialStatus.OK]
    blind = [t for t in finished if t.selection_blind]
    if len(blind) == len(finished) and blind:
        return f"every trial's {SELECTION_BLIND}"
    if blind:
        return f"{len(blind)} of {len(finished)} trials: {SELECTION_BLIND}"
    return tied_trials(finished)


@dataclass(frozen=True)
class RowHealth:
    """What the sweep's reported row (its selected config's replicates; the selected trial where none finished)
    can be trusted for: how many peaked in their late epochs, and how many trained on collapsed pseudo-labels
    (raybench.trainer.health has both rules). Not converged when most of them peaked late: on a plateau one run in
    ten peaks late by chance. Collapsed when any did: a collapse is an event, not noise."""

    runs: int = 0
    late: int = 0
    collapsed: int = 0
    late_reason: str = ""
    collapse_reason: str = ""

    @classmethod
    def of(cls, summary: SweepSummary) -> RowHealth:
        runs = [r for r in summary.replicates.runs if r.status == TrialStatus.OK]
        if not runs and summary.selected is not None:
            runs = [summary.selected]
        late = [r for r in runs if r.not_converged]
        collapsed = [r for r in runs if r.pseudo_labels_collapsed]
        return cls(len(runs), len(late), len(collapsed), late[0].not_converged or "" if late else "",
                   collapsed[0].pseudo_labels_collapsed or "" if collapsed else "")

    @property
    def not_converged(self) -> bool:
        return self.runs > 0 and 2 * self.late > self.runs

    def flags(self) -> list[str]:
        """`not converged (3/3 peaked late)`, `pseudo-labels collapsed (1/3)`: what a row's reader must see."""
        flags = [f"not converged ({self.late}/{self.runs} peaked late)"] if self.not_converged else []
        return flags + ([f"pseudo-labels collapsed ({self.collapsed}/{self.runs})"] if self.collapsed else [])

    def findings(self) -> list[tuple[str, str]]:
        """(kind, detail) for each flag, with the first flagged run's own reason: a results page writes
        `kind: detail`, a comparison puts the row's name between them."""
        found = []
        if self.not_converged:
            detail = (f"{self.late} of {self.runs} runs of the selected config peaked late ({self.late_reason}); "
                      f"raise the epochs (sweep --converge)")
            found.append(("Not converged", detail))
        if self.collapsed:
            detail = f"in {self.collapsed} of {self.runs} runs of the selected config ({self.collapse_reason})"
            found.append(("Pseudo-labels collapsed", detail))
        return found

    def notices(self) -> list[str]:
        """The findings as lines of a sweep's own results."""
        return [f"{kind}: {detail}" for kind, detail in self.findings()]


def trial_flags(trial: TrialRecord) -> str:
    """A trial's status suffix: ` (selection blind; not converged; pseudo-labels collapsed)`, or nothing."""
    flags = [name for name, flagged in (("selection blind", trial.selection_blind), ("not converged", trial.not_converged),
                                        ("pseudo-labels collapsed", trial.pseudo_labels_collapsed)) if flagged]
    return f" ({'; '.join(flags)})" if flags else ""


def tied_trials(finished: list[TrialRecord]) -> str | None:
    """One line when two or more finished trials all scored the same selection value: the search then kept
    the first by order, not by merit, however well each trial's own epochs were chosen."""
    values = [t.selection_value for t in finished]
    if len(values) < 2 or any(v is None for v in values) or len(set(values)) > 1:
        return None
    return f"all {len(values)} trials scored the same selection value ({values[0]:.4f}): choosing among them is blind"


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
        value = "" if not _finite(t.selection_value) else f"{t.selection_value:.4f}"
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
    return lines + RowHealth.of(summary).notices()


def nothing_selected(summary: SweepSummary) -> str:
    if not summary.finished:
        return "Nothing selected yet: the search did not finish."
    return "No trial finished; nothing was selected."
