"""A sweep's figures, drawn by matplotlib from its summary records (and, for learning curves, per-epoch values).

Three per sweep, each a PNG beside the results and an MLflow artifact of the parent run:

- `search.png`: the selection metric against each searched hyperparameter, one point per trial (log axes where
  the space samples log-uniformly), the selected trial marked: was the range wide enough, is the optimum inside?
- `curves.png`: the selection metric per epoch of the selected trial and of its replicates: did training converge,
  is the selected epoch a fluke?
- `id_vs_ood.png`: ID against OOD test of every trial and replicate (Miller et al.'s "accuracy on the line" view):
  does a better ID model also move OOD?
- `importance.png`: each searched hyperparameter's fANOVA importance for the selection metric
  (raybench.sweep.importance), where at least one could be rated: which ranges deserve the next search's trials?

And one per comparison (`raybench compare --plot`): every method's mean ± std in each report column (ID and OOD
test), the best OOD entry ringed.

Drawing functions return the matplotlib Figure so tests can read the plotted data back; `save` writes and closes.
"""
from __future__ import annotations

import functools
import math
import textwrap
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import matplotlib

matplotlib.use("Agg")  # files only: no display on a cluster node

import matplotlib.pyplot as plt
from matplotlib.figure import Figure
from matplotlib.ticker import LogFormatterSciNotation, LogLocator, MaxNLocator, NullFormatter

from raybench.labels import METRIC_LABELS
from raybench.paths import write_atomically
from raybench.records import SweepSummary
from raybench.report_keys import BEST_PREFIX
from raybench.sweep.importance import Importances, importances
from raybench.sweep.results import split_labels

if TYPE_CHECKING:
    from raybench.sweep.compare import Comparison, DatasetTable

LOG, LINEAR, CATEGORICAL = "log", "linear", "categorical"  # Param.scale's names (raybench.sweep.space)
BEST_STYLE = {"marker": "o", "s": 260, "facecolors": "none", "edgecolors": "tab:red", "linewidths": 2, "zorder": 3}
AXIS_WORDS = {"acc": "accuracy"}
SELECTED_STYLE = {"marker": "*", "s": 220, "color": "tab:red", "edgecolors": "black", "zorder": 3}


@dataclass(frozen=True)
class Curve:
    """One run's selection metric per epoch."""

    label: str
    epochs: Sequence[int]
    values: Sequence[float]


def _finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _title(summary: SweepSummary, what: str) -> str:
    return f"{summary.name}: {summary.algorithm} on {summary.dataset} — {what}"


def _percent_label(split: str, metric: str) -> str:
    return f"{split} {metric} (%)"


def search_figure(summary: SweepSummary, scales: Mapping[str, str]) -> Figure:
    """Selection value against each searched hyperparameter; trials without a value are left out."""
    names = sorted({name for trial in summary.trials for name in trial.sampled})
    columns = max(len(names), 1)
    figure, axes = plt.subplots(1, columns, figsize=(max(4.2 * columns, 7.0), 4.2), squeeze=False)
    metric = summary.selection.metric
    selected = summary.selected.trial_id if summary.selected else None
    scored = [t for t in summary.trials if _finite(t.selection_value)]
    for ax, name in zip(axes[0], names):
        points = [(t.sampled[name], 100 * t.selection_value, t.trial_id == selected)
                  for t in scored if name in t.sampled]
        xs = _positions(ax, [x for x, _, _ in points], scales.get(name))
        ax.scatter(xs, [y for _, y, _ in points], color="tab:blue", alpha=0.8, label="trial")
        best = [(x, y) for x, (_, y, is_selected) in zip(xs, points) if is_selected]
        if best:
            ax.scatter([best[0][0]], [best[0][1]], label="selected", **SELECTED_STYLE)
        if scales.get(name) == LOG and xs:
            _log_axis(ax, min(xs), max(xs))
        ax.set_xlabel(f"{name} ({scales.get(name, LINEAR)} scale)")
        ax.set_ylabel(_percent_label("best", metric))
        ax.grid(alpha=0.3)
        ax.legend(loc="best", fontsize="small")
    figure.suptitle(textwrap.fill(_title(summary, f"{metric} per trial against each searched hyperparameter"),
                                  width=int(11 * figure.get_figwidth())), fontsize="medium")
    figure.tight_layout()
    return figure


def _log_axis(ax: Any, low: float, high: float) -> None:
    """A log x axis with room around the points and labels at 1, 2 and 5 x 10^k only, so a narrow range (a
    factor of 2) still shows readable ticks instead of overlapping minor labels."""
    ax.set_xscale("log")
    ax.set_xlim(low / 1.6, high * 1.6)
    ax.xaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    ax.xaxis.set_major_formatter(LogFormatterSciNotation(labelOnlyBase=False))
    ax.xaxis.set_minor_formatter(NullFormatter())


def _positions(ax: Any, values: list[Any], scale: str | None) -> list[float]:
    """x positions of sampled values: the values themselves, or for a choice, evenly spaced ticks labelled with
    the choices in sorted order (so 3, 7, 15 sit side by side, and strings work too)."""
    if scale != CATEGORICAL and all(_finite(v) for v in values):
        return [float(v) for v in values]
    choices = sorted(set(values), key=lambda v: (not _finite(v), v if _finite(v) else str(v)))
    ax.set_xticks(range(len(choices)), [str(c) for c in choices])
    ax.set_xlim(-0.5, len(choices) - 0.5)
    return [float(choices.index(v)) for v in values]


def curves_figure(summary: SweepSummary, curves: Sequence[Curve]) -> Figure:
    """The selection metric per epoch, one line per run (the selected trial, then its replicates)."""
    figure, ax = plt.subplots(figsize=(6.4, 4.2))
    metric = summary.selection.metric
    for curve in curves:
        ax.plot(list(curve.epochs), [100 * v for v in curve.values], marker="o", label=curve.label)
    ax.set_xlabel("epoch")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_ylabel(_percent_label("", metric).strip())
    ax.set_title(_title(summary, "learning curves of the selected config"), fontsize="medium")
    ax.grid(alpha=0.3)
    if curves:
        ax.legend(loc="best", fontsize="small")
    figure.tight_layout()
    return figure


def id_ood_keys(summary: SweepSummary) -> tuple[str, str, str] | None:
    """(ID key, OOD key, metric) of the headline metric: ID test if the dataset has it, else ID val."""
    runs = [*summary.trials, *summary.replicates.runs]
    keys = set().union(*(r.metrics for r in runs)) if runs else set()
    for metric in summary.metric_names:
        for id_split in ("id_test", "id_val"):
            if f"{BEST_PREFIX}{id_split}/{metric}" in keys and f"{BEST_PREFIX}test/{metric}" in keys:
                return f"{BEST_PREFIX}{id_split}/{metric}", f"{BEST_PREFIX}test/{metric}", metric
    return None


def id_ood_figure(summary: SweepSummary) -> Figure | None:
    """ID against OOD test of every trial (circles) and replicate (triangles); None without both splits."""
    keys = id_ood_keys(summary)
    if keys is None:
        return None
    id_key, ood_key, metric = keys
    figure, ax = plt.subplots(figsize=(5.6, 4.8))
    for runs, style in ((summary.trials, {"marker": "o", "label": "search trial"}),
                        (summary.replicates.runs, {"marker": "^", "label": "replicate of the selected config"})):
        points = [(100 * r.metrics[id_key], 100 * r.metrics[ood_key]) for r in runs
                  if _finite(r.metrics.get(id_key)) and _finite(r.metrics.get(ood_key))]
        if points:
            ax.scatter(*zip(*points), alpha=0.8, **style)
    low, high = ax.get_xlim()
    ax.plot([low, high], [low, high], color="gray", linestyle="--", linewidth=1, label="OOD = ID")
    ax.set_xlim(low, high)
    labels = split_labels(summary)
    ax.set_xlabel(_percent_label(labels[id_key.split("/")[1]], metric))
    ax.set_ylabel(_percent_label(labels["test"], metric))
    ax.set_title(_title(summary, "ID against OOD"), fontsize="medium")
    ax.grid(alpha=0.3)
    ax.legend(loc="best", fontsize="small")
    figure.tight_layout()
    return figure


def importance_figure(summary: SweepSummary, found: Importances) -> Figure | None:
    """Each rated hyperparameter's share of the main effects as a horizontal bar, the most important on top; the
    evaluator, the trial count and how much the main effects explain in the title, the caveats (left-out or
    stopped trials, too few trials, what was not rated and why) under the axis. None when no hyperparameter
    could be rated (`raybench results` says why)."""
    rated = [p for p in found.params if p.share is not None]
    if not rated:
        return None
    footer = _importance_caveats(found)
    lines = footer.count("\n") + 1 if footer else 0
    figure, ax = plt.subplots(figsize=(8.0, 2.8 + 0.45 * len(rated) + 0.14 * lines))
    rows = list(reversed(rated))  # barh draws bottom-up: the most important ends on top
    percents = [100 * (p.share or 0.0) for p in rows]
    bars = ax.barh(range(len(rows)), percents, color="tab:blue", alpha=0.85, height=0.6)
    ax.bar_label(bars, labels=[f"{v:.1f}%" for v in percents], padding=3)
    ax.set_yticks(range(len(rows)), [f"{p.name} ({p.scale})" for p in rows])
    ax.set_ylim(-0.75, len(rows) - 0.25)  # a lone bar stays a bar, not a filled axis
    ax.set_xlim(0, 112)  # room for the label past a bar at 100 %
    ax.set_xlabel(f"share of the main effects on best {found.metric} (%)")
    ax.set_ylabel("searched hyperparameter")
    title = textwrap.fill(_title(summary, "which hyperparameters matter"), 72, break_on_hyphens=False)
    method = found.evaluator.partition(" (")[0]
    ax.set_title(f"{title}\n{method} over {found.n_trials} of {found.n_search_trials} trials; main effects explain "
                 f"{100 * (found.explained or 0.0):.0f}% of the variance", fontsize="medium")
    ax.grid(alpha=0.3, axis="x")
    if footer:
        figure.text(0.01, 0.01, footer, fontsize="x-small", va="bottom", ha="left", color="dimgray")
    footer_inches = 0.08 + 0.13 * lines if footer else 0.0  # x-small lines, about 0.13 inch each
    figure.tight_layout(rect=(0, footer_inches / figure.get_figheight(), 1, 1))
    return figure


def _importance_caveats(found: Importances) -> str:
    """The notes and each unrated hyperparameter's reason, wrapped to the figure's width: a chart read without
    `raybench results` beside it still says when its numbers are rough or what it leaves out."""
    lines = [*found.notes, *(f"not rated: {p.name}, {p.reason}" for p in found.params if p.share is None)]
    return "\n".join(textwrap.fill(line, width=150, subsequent_indent="  ") for line in lines)


def sweep_figures(summary: SweepSummary, scales: Mapping[str, str], curves: Sequence[Curve],
                  found: Importances | None = None) -> dict[str, Figure]:
    """Every figure of one sweep, by file name; `found`: the importances already rated on these scales."""
    figures = {"search.png": search_figure(summary, scales), "curves.png": curves_figure(summary, curves)}
    id_ood = id_ood_figure(summary)
    if id_ood is not None:
        figures["id_vs_ood.png"] = id_ood
    importance = importance_figure(summary, found or importances(summary, scales))
    if importance is not None:
        figures["importance.png"] = importance
    return figures


def comparison_figure(table: DatasetTable) -> Figure:
    """Each method's mean ± std over replicates (error bars) in every report column, side by side; the best
    entry of the ranking column ringed, analysis-only (oracle) rows labelled as such."""
    from raybench.sweep.compare import BEST

    rows = table.ranked + table.analysis_only
    figure, ax = plt.subplots(figsize=(max(6.4, 1.0 * len(rows) + 2.5), 4.8))
    width = 0.7 / max(len(table.columns), 1)
    for i, column in enumerate(table.columns):
        offset = (i - (len(table.columns) - 1) / 2) * width
        points = [(j + offset, cell) for j, row in enumerate(rows) if (cell := row.cells.get(column.key)) is not None]
        ax.errorbar([x for x, _ in points], [100 * c.mean for _, c in points],
                    yerr=[100 * c.std if math.isfinite(c.std) else 0.0 for _, c in points],
                    fmt="o", capsize=4, label=column.label)
        best = [(x, c) for x, c in points if c.mark == BEST]
        if best:  # a ring, so the error bar inside stays visible
            ax.scatter([best[0][0]], [100 * best[0][1].mean], label=f"best {column.label}", **BEST_STYLE)
    ax.set_xticks(range(len(rows)), [r.method + (" (oracle)" if r.analysis_only else "") for r in rows],
                  rotation=30, ha="right")
    ax.set_xlim(-0.6, len(rows) - 0.4)
    if table.analysis_only:  # the oracle rows stand apart: they are not a result of the protocol
        ax.axvline(len(table.ranked) - 0.5, color="gray", linestyle=":", linewidth=1)
    metrics = dict.fromkeys(AXIS_WORDS.get(m, METRIC_LABELS.get(m, m)) for m in (c.key.partition("/")[2] for c in table.columns))
    ax.set_ylabel(f"{', '.join(metrics)} (%)\nmean ± std over replicates")  # two lines: fits a 4.8-inch axis
    ax.set_xlabel("method (search space), selected on its validation metric")
    ax.set_title(f"{table.dataset}: methods compared", fontsize="medium")
    ax.grid(alpha=0.3, axis="y")
    ax.legend(loc="best", fontsize="small")
    figure.tight_layout()
    return figure


def comparison_names(comparison: Comparison, filename: str) -> list[str]:
    """The file names of the comparison's figures, one per dataset: `filename` itself for one, its stem +
    `-<dataset>` for several (what `compare --plot` checks before it draws any)."""
    stem, several = Path(filename).stem, len(comparison.tables) > 1
    return [(f"{stem}-{t.dataset}.png" if several else filename) for t in comparison.tables]


def comparison_figures(comparison: Comparison, filename: str) -> dict[str, Figure]:
    """One figure per dataset, under its name (comparison_names)."""
    return {name: comparison_figure(t) for name, t in zip(comparison_names(comparison, filename), comparison.tables)}


def save(figures: Mapping[str, Figure], directory: Path) -> list[Path]:
    """Write each figure as a PNG under `directory`, all or nothing (raybench.paths.write_atomically: a reader
    never sees half a file, and a write that fails, on a full disk or onto a folder of that name, leaves no
    temporary file), and close every figure, written or not."""
    directory.mkdir(parents=True, exist_ok=True)
    written = []
    try:
        for name, figure in figures.items():
            path = directory / name
            write_atomically(path, functools.partial(figure.savefig, dpi=120, format="png"))
            written.append(path)
    finally:
        for figure in figures.values():
            plt.close(figure)
    return written
