"""A sweep's figures, drawn by matplotlib from its summary records (and, for learning curves, per-epoch values).

Per sweep, each a PNG beside the results and an MLflow artifact of the parent run:

- `search.png`: the selection metric against each searched hyperparameter, one panel per hyperparameter and one
  point per trial (log axes where the space samples log-uniformly), the selected trial starred, trials that tie
  (the same value at the same setting) spread a little sideways so each one shows: was the range wide enough,
  is the optimum inside? With two or more searched hyperparameters each panel is also its own PNG,
  `search-<hyperparameter>.png`, readable where MLflow's artifact viewer shrinks a wide figure.
- `curves.png`: the selection metric per epoch of the selected trial and of its replicates: did training converge,
  is the selected epoch a fluke?
- `id_vs_ood.png`: ID against OOD test of every trial and replicate (Miller et al.'s "accuracy on the line" view),
  the selected trial starred and the replicates' mean ± std as error bars: does a better ID model also move OOD?
- `importance.png`: each searched hyperparameter's fANOVA importance for the selection metric
  (raybench.report.importance), where at least one could be rated: which ranges deserve the next search's trials?

And one per comparison (`raybench compare --plot`): every method's mean ± std in each report column (ID and OOD
test), the best OOD entry ringed.

Axes and titles name splits and metrics in words, in the dataset's own split labels (`OOD validation accuracy`,
`test worst-group accuracy`: metric_words), never as a `split/metric` key; each figure has one legend, outside
its axes, so it never covers a point.

Drawing functions return the matplotlib Figure so tests can read the plotted data back; `save` writes and closes.
"""
from __future__ import annotations

import functools
import math
import re
import statistics
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

from raybench.labels import METRIC_LABELS, SHIFT_SPLIT_LABELS
from raybench.paths import write_atomically
from raybench.records import SweepSummary, TrialRecord, is_finite_number
from raybench.report.importance import Importances, importances
from raybench.report.results import split_labels
from raybench.report_keys import BEST_PREFIX

if TYPE_CHECKING:
    from matplotlib.axes import Axes

    from raybench.report.compare import Comparison, DatasetTable

LOG, LINEAR, CATEGORICAL = "log", "linear", "categorical"  # Param.scale's names (raybench.sweep.space)
BEST_STYLE = {"marker": "o", "s": 260, "facecolors": "none", "edgecolors": "tab:red", "linewidths": 2, "zorder": 3}
SELECTED_STYLE = {"marker": "*", "s": 260, "color": "tab:red", "edgecolors": "black", "zorder": 4}
TRIAL_STYLE = {"marker": "o", "color": "tab:blue", "alpha": 0.75, "zorder": 2}
REPLICATE_STYLE = {"marker": "^", "color": "tab:orange", "alpha": 0.85, "zorder": 2}
MEAN_STYLE = {"fmt": "D", "color": "black", "markerfacecolor": "none", "markersize": 8, "markeredgewidth": 1.5,
              "capsize": 5, "elinewidth": 1.5, "zorder": 5}  # hollow: a replicate under it still shows
LEGEND_STYLE = {"fontsize": "small", "frameon": False}

# What the datasets and algorithms call their metrics (raybench.data: `acc`, `macro_f1`, SpuCo's `worst_group_acc`
# and `avg_acc`; the WILDS datasets' own `eval` keys, raybench/data/wilds/datasets.yaml), in words.
METRIC_WORDS: Mapping[str, str] = {
    "acc": "accuracy",
    "acc_avg": "average accuracy",
    "avg_acc": "average accuracy",
    "worst_group_acc": "worst-group accuracy",
    "acc_wg": "worst-group accuracy",
    "acc_worst_region": "worst-region accuracy",
    "10th_percentile_acc": "10th-percentile accuracy",
    "macro_f1": "macro F1",
    "F1-macro_all": "macro F1",
    "detection_acc_avg_dom": "detection accuracy (mean over domains)",
    "ap": "average precision",
    "r_all": "Pearson r",
    "r_wg": "worst-group Pearson r",
}
# Metrics that are no fraction of examples: drawn times 100 like the rest (as the tables print them), not in %.
NOT_PERCENT = frozenset({"r_all", "r_wg"})
SPLIT_WORDS: Mapping[str, str] = {"val": "validation", "train": "training"}  # words inside a split's label
TIE_POINTS = 0.05  # selection values this close (in points of %) at one setting tie: they would hide each other
FOOTER_WIDTH = 100  # characters of importance.png's small footer across its 6.4 inches
TIED_LABEL = "search trial (ties spread sideways)"
TIE_STEP = 0.03  # how far apart tied points are spread, as a share of the x axis


@dataclass(frozen=True)
class Curve:
    """One run's selection metric per epoch."""

    label: str
    epochs: Sequence[int]
    values: Sequence[float]



def metric_words(split: str, metric: str, labels: Mapping[str, str]) -> str:
    """A split and a metric in words: ("val", "acc") is `OOD validation accuracy` with WILDS's split labels,
    ("test", "worst_group_acc") `test worst-group accuracy` with SpuCo's. A split the labels lack reads as
    WILDS calls it; a metric the table lacks as its name with spaces for underscores and slashes."""
    label = labels.get(split) or SHIFT_SPLIT_LABELS.get(split) or split
    split_text = " ".join(SPLIT_WORDS.get(word, word) for word in label.replace("_", " ").split())
    metric_text = METRIC_WORDS.get(metric) or metric.replace("_", " ").replace("/", " ")
    return f"{split_text} {metric_text}".strip()


def key_words(key: str, labels: Mapping[str, str]) -> str:
    """metric_words of a `split/metric` key, `best/` prefix or not: `best/val/acc` is `OOD validation accuracy`."""
    split, _, metric = key.removeprefix(BEST_PREFIX).partition("/")
    return metric_words(split, metric, labels) if metric else metric_words("", split, labels)


def _unit(key: str) -> str:
    return " (× 100)" if key.rpartition("/")[2] in NOT_PERCENT else " (%)"


def axis_label(key: str, labels: Mapping[str, str]) -> str:
    """An axis of a `split/metric` key's values times 100: `OOD validation accuracy (%)`."""
    return key_words(key, labels) + _unit(key)


def _title(summary: SweepSummary, what: str) -> str:
    return f"{summary.name}: {summary.algorithm} on {summary.dataset} — {what}"


def _wrap(text: str, figure: Figure) -> str:
    """A title fitted to the figure's width (a medium font sets about 12 characters an inch)."""
    return textwrap.fill(text, width=max(int(12 * figure.get_figwidth()), 40), break_on_hyphens=False)


def _legend_below(figure: Figure, axes: Sequence[Axes], columns: int = 3) -> None:
    """The figure's one legend, under its axes (a constrained layout makes room), never over a point: the
    entries of every axis, each label once."""
    entries: dict[str, Any] = {}
    for ax in axes:
        for handle, label in zip(*ax.get_legend_handles_labels()):
            entries.setdefault(label, handle)
    if entries:
        figure.legend(list(entries.values()), list(entries), loc="outside lower center",
                      ncols=min(columns, len(entries)), **LEGEND_STYLE)


def searched_names(summary: SweepSummary) -> list[str]:
    """The hyperparameters the trials sampled, sorted: one search panel each."""
    return sorted({name for trial in summary.trials for name in trial.sampled})


def search_figure(summary: SweepSummary, scales: Mapping[str, str]) -> Figure:
    """Selection value against each searched hyperparameter, one panel each (two to a row); trials without a
    value are left out."""
    names = searched_names(summary)
    columns = min(max(len(names), 1), 2)
    rows = max(math.ceil(len(names) / columns), 1)
    size = (6.4, 4.8) if len(names) <= 1 else (4.4 * columns, 3.4 * rows + 1.0)
    figure, grid = plt.subplots(rows, columns, figsize=size, squeeze=False, layout="constrained")
    axes = list(grid.flat)
    for ax in axes[len(names):] if names else []:
        ax.remove()
    tied = [_search_panel(ax, summary, name, scales.get(name)) for ax, name in zip(axes, names)]
    if any(tied):  # one wording in every panel: the legend has one entry for the trials
        for ax in axes[:len(names)]:
            ax.collections[0].set_label(TIED_LABEL)
    words = key_words(summary.selection.metric, split_labels(summary))
    figure.suptitle(_wrap(_title(summary, f"{words} of each trial against each searched hyperparameter"), figure),
                    fontsize="medium")
    _legend_below(figure, axes[:len(names)])
    return figure


def search_panel_figure(summary: SweepSummary, scales: Mapping[str, str], name: str) -> Figure:
    """One panel of search_figure on its own: the selection value against `name`."""
    figure, ax = plt.subplots(figsize=(6.4, 4.8), layout="constrained")
    if _search_panel(ax, summary, name, scales.get(name)):
        ax.collections[0].set_label(TIED_LABEL)
    words = key_words(summary.selection.metric, split_labels(summary))
    figure.suptitle(_wrap(_title(summary, f"{words} of each trial against {name}"), figure), fontsize="medium")
    _legend_below(figure, [ax])
    return figure


def search_panel_name(name: str) -> str:
    """The file of one hyperparameter's search panel: `search-lr.png`."""
    return f"search-{re.sub(r'[^A-Za-z0-9_.-]+', '_', name)}.png"


def _search_panel(ax: Axes, summary: SweepSummary, name: str, scale: str | None) -> bool:
    """One hyperparameter's panel: the trials (its first collection), the selected one starred; whether tied
    trials were spread."""
    selected = summary.selected.trial_id if summary.selected else None
    scored = [t for t in summary.trials if is_finite_number(t.selection_value) and name in t.sampled]
    xs, categorical = _positions(ax, [t.sampled[name] for t in scored], scale)
    ys = [100 * (t.selection_value or 0.0) for t in scored]
    log = scale == LOG and not categorical and all(x > 0 for x in xs)
    width = len(ax.get_xticks()) if categorical else None
    spread = _spread_ties(xs, ys, log, width)
    tied = any(a != b for a, b in zip(xs, spread))
    ax.scatter(spread, ys, label="search trial", **TRIAL_STYLE)
    best = [(x, y) for x, y, t in zip(spread, ys, scored) if t.trial_id == selected]
    if best:
        ax.scatter([best[0][0]], [best[0][1]], label="selected trial", **SELECTED_STYLE)
    if log and xs:
        _log_axis(ax, min(xs), max(xs))
    ax.set_xlabel(f"{name} ({scale or LINEAR} scale)")
    ax.set_ylabel(axis_label(summary.selection.metric, split_labels(summary)))
    ax.grid(alpha=0.3)
    return tied


def _spread_ties(xs: list[float], ys: list[float], log: bool, categories: int | None) -> list[float]:
    """x positions with tied points spread sideways, evenly and in trial order (so the same records always draw
    the same figure): points whose values lie within TIE_POINTS of each other and whose x positions lie within
    one step (TIE_STEP of the axis) would hide each other. Every other point keeps its x."""
    if len(xs) < 2:
        return list(xs)
    positions = [math.log10(x) if log else x for x in xs]
    if categories is not None:
        span = float(categories)
    else:
        span = (max(positions) - min(positions)) * 1.1 + (2 * math.log10(1.6) if log else 0.0)
        span = span or max(abs(positions[0]) * 0.2, 1.0)
    step = TIE_STEP * span
    by_value = sorted(range(len(xs)), key=lambda i: ys[i])
    groups: list[list[int]] = []
    for i in by_value:  # chains of values within TIE_POINTS of the previous one
        if groups and ys[i] - ys[groups[-1][-1]] <= TIE_POINTS:
            groups[-1].append(i)
        else:
            groups.append([i])
    spread: dict[int, float] = {}
    for group in groups:
        run: list[int] = []
        for i in sorted(group, key=lambda i: (positions[i], i)) + [-1]:  # chains of nearby x within a value
            if i >= 0 and run and positions[i] - positions[run[-1]] < step:
                run.append(i)
                continue
            if len(run) > 1:
                gap = min(step, 0.7 / (len(run) - 1)) if categories is not None else step
                centre = sum(positions[j] for j in run) / len(run)
                for k, j in enumerate(run):
                    spread[j] = centre + (k - (len(run) - 1) / 2) * gap
            run = [i]
    return [(10 ** spread[i] if log else spread[i]) if i in spread else x for i, x in enumerate(xs)]


def _log_axis(ax: Axes, low: float, high: float) -> None:
    """A log x axis with room around the points and labels at 1, 2 and 5 x 10^k only, so a narrow range (a
    factor of 2) still shows readable ticks instead of overlapping minor labels."""
    ax.set_xscale("log")
    ax.set_xlim(low / 1.6, high * 1.6)
    ax.xaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    ax.xaxis.set_major_formatter(LogFormatterSciNotation(labelOnlyBase=False))
    ax.xaxis.set_minor_formatter(NullFormatter())


def _positions(ax: Axes, values: list[Any], scale: str | None) -> tuple[list[float], bool]:
    """x positions of sampled values and whether they are choices: the values themselves, or for a choice,
    evenly spaced ticks labelled with the choices in sorted order (so 3, 7, 15 sit side by side, and strings
    work too)."""
    if scale != CATEGORICAL and all(is_finite_number(v) for v in values):
        return [float(v) for v in values], False
    choices = sorted(set(values), key=lambda v: (not is_finite_number(v), v if is_finite_number(v) else str(v)))
    ax.set_xticks(range(len(choices)), [str(c) for c in choices])
    ax.set_xlim(-0.5, len(choices) - 0.5)
    return [float(choices.index(v)) for v in values], True


def curves_figure(summary: SweepSummary, curves: Sequence[Curve]) -> Figure:
    """The selection metric per epoch, one line per run (the selected trial, then its replicates)."""
    figure, ax = plt.subplots(figsize=(6.4, 4.8), layout="constrained")
    for curve in curves:
        ax.plot(list(curve.epochs), [100 * v for v in curve.values], marker="o", label=curve.label)
    ax.set_xlabel("epoch")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_ylabel(axis_label(summary.selection.metric, split_labels(summary)))
    words = key_words(summary.selection.metric, split_labels(summary))
    figure.suptitle(_wrap(_title(summary, f"{words} per epoch of the selected config and its replicates"), figure),
                    fontsize="medium")
    ax.grid(alpha=0.3)
    if not curves:
        ax.text(0.5, 0.5, "no per-epoch values recorded", transform=ax.transAxes, ha="center", color="dimgray")
    _legend_below(figure, [ax], columns=2)
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


def _points(runs: Sequence[TrialRecord], id_key: str, ood_key: str) -> list[tuple[float, float]]:
    return [(100 * r.metrics[id_key], 100 * r.metrics[ood_key]) for r in runs
            if is_finite_number(r.metrics.get(id_key)) and is_finite_number(r.metrics.get(ood_key))]


def replicate_spread(summary: SweepSummary, key: str) -> tuple[float, float, int] | None:
    """(mean, std, n) of `key` over the replicates, times 100: the replicate summary's cell, else the OK runs'
    values (std 0 for a single one); None without a finite mean."""
    values = [r.metrics[key] for r in summary.replicates.runs if is_finite_number(r.metrics.get(key))]
    cell = summary.replicates.summary.get(key)
    if cell and is_finite_number(cell.get("mean")):
        std = cell.get("std")
        return 100 * cell["mean"], 100 * std if is_finite_number(std) else 0.0, int(cell.get("n") or len(values))
    if not values:
        return None
    return 100 * statistics.fmean(values), 100 * statistics.stdev(values) if len(values) > 1 else 0.0, len(values)


def id_ood_figure(summary: SweepSummary) -> Figure | None:
    """ID against OOD test of every trial (circles, the selected one starred) and replicate (triangles), with
    the replicates' mean ± std in both (error bars, from two replicates on), and the OOD = ID line where it
    crosses the points (the axes stay the points' own, so a large drop does not squeeze them into a corner);
    None without both splits."""
    keys = id_ood_keys(summary)
    if keys is None:
        return None
    id_key, ood_key, _metric = keys
    labels = split_labels(summary)
    figure, ax = plt.subplots(figsize=(6.4, 5.6), layout="constrained")
    trials = _points(summary.trials, id_key, ood_key)
    if trials:
        ax.scatter(*zip(*trials), label="search trial", **TRIAL_STYLE)
    selected_id = summary.selected.trial_id if summary.selected else None
    selected = _points([t for t in summary.trials if t.trial_id == selected_id][:1], id_key, ood_key)
    if selected:
        ax.scatter(*zip(*selected), label="selected trial", **SELECTED_STYLE)
    replicates = _points(summary.replicates.runs, id_key, ood_key)
    if replicates:
        ax.scatter(*zip(*replicates), label="replicate of the selected config", **REPLICATE_STYLE)
    spread = replicate_spread(summary, id_key), replicate_spread(summary, ood_key)
    if spread[0] and spread[1] and spread[0][2] > 1:  # one replicate has no spread: its triangle says it all
        (x, x_std, n), (y, y_std, _) = spread
        ax.errorbar([x], [y], xerr=[x_std], yerr=[y_std], label=f"replicates' mean ± std (n = {n})", **MEAN_STYLE)
    (x_low, x_high), (y_low, y_high) = ax.get_xlim(), ax.get_ylim()
    low, high = max(x_low, y_low), min(x_high, y_high)
    if low < high:  # the no-drop line where it crosses the points' box; the box stays the points' own
        ax.plot([low, high], [low, high], color="gray", linestyle="--", linewidth=1, label="OOD = ID (no drop)")
        ax.set_xlim(x_low, x_high)
        ax.set_ylim(y_low, y_high)
    id_words, ood_words = key_words(id_key, labels), key_words(ood_key, labels)
    ax.set_xlabel(id_words + _unit(id_key))
    ax.set_ylabel(ood_words + _unit(ood_key))
    figure.suptitle(_wrap(_title(summary, f"{id_words} against {ood_words}"), figure), fontsize="medium")
    ax.grid(alpha=0.3)
    _legend_below(figure, [ax], columns=2)
    return figure


def importance_figure(summary: SweepSummary, found: Importances) -> Figure | None:
    """Each rated hyperparameter's share of the main effects as a horizontal bar, the most important on top; the
    evaluator, the trial count and how much the main effects explain in the title, the caveats (left-out or
    stopped trials, too few trials, what was not rated and why) under the axis. None when no hyperparameter
    could be rated (`raybench results` says why)."""
    rated = [p for p in found.params if p.share is not None]
    if not rated:
        return None
    footer = _importance_caveats(found, FOOTER_WIDTH)
    lines = footer.count("\n") + 1 if footer else 0
    figure, ax = plt.subplots(figsize=(6.4, 2.8 + 0.45 * len(rated) + 0.17 * lines))
    rows = list(reversed(rated))  # barh draws bottom-up: the most important ends on top
    percents = [100 * (p.share or 0.0) for p in rows]
    bars = ax.barh(range(len(rows)), percents, color="tab:blue", alpha=0.85, height=0.6)
    ax.bar_label(bars, labels=[f"{v:.1f}%" for v in percents], padding=3)
    ax.set_yticks(range(len(rows)), [f"{p.name} ({p.scale})" for p in rows])
    ax.set_ylim(-0.75, len(rows) - 0.25)  # a lone bar stays a bar, not a filled axis
    ax.set_xlim(0, 120)  # room for the label past a bar at 100 %
    ax.set_xticks(range(0, 101, 20))  # no tick past 100 %: a share never gets there
    ax.set_xlabel(f"share of the main effects (%) on {key_words(found.metric, split_labels(summary))}")
    ax.set_ylabel("searched hyperparameter")
    title = _wrap(_title(summary, "which hyperparameters matter"), figure)
    method = found.evaluator.partition(" (")[0]
    figure.suptitle(f"{title}\n{method} over {found.n_trials} of {found.n_search_trials} trials; main effects explain "
                 f"{100 * (found.explained or 0.0):.0f}% of the variance", fontsize="medium")
    ax.grid(alpha=0.3, axis="x")
    if footer:
        figure.text(0.01, 0.01, footer, fontsize="small", va="bottom", ha="left", color="dimgray")
    footer_inches = 0.08 + 0.16 * lines if footer else 0.0  # small lines, about 0.16 inch each
    figure.tight_layout(rect=(0, footer_inches / figure.get_figheight(), 1, 1))
    return figure


def _importance_caveats(found: Importances, width: int = 150) -> str:
    """The notes and each unrated hyperparameter's reason, wrapped at `width` characters (importance_figure: its
    own width): a chart read without `raybench results` beside it still says when its numbers are rough or
    what it leaves out."""
    lines = [*found.notes, *(f"not rated: {p.name}, {p.reason}" for p in found.params if p.share is None)]
    return "\n".join(textwrap.fill(line, width=width, subsequent_indent="  ") for line in lines)


def sweep_figures(summary: SweepSummary, scales: Mapping[str, str], curves: Sequence[Curve],
                  found: Importances | None = None) -> dict[str, Figure]:
    """Every figure of one sweep, by file name; `found`: the importances already rated on these scales. With two
    or more searched hyperparameters, each panel of search.png also as its own figure (search_panel_name)."""
    figures = {"search.png": search_figure(summary, scales)}
    names = searched_names(summary)
    if len(names) > 1:
        for name in names:
            file = search_panel_name(name)
            while file in figures:  # two names that read alike as a file name
                file = file.removesuffix(".png") + "_.png"
            figures[file] = search_panel_figure(summary, scales, name)
    figures["curves.png"] = curves_figure(summary, curves)
    id_ood = id_ood_figure(summary)
    if id_ood is not None:
        figures["id_vs_ood.png"] = id_ood
    importance = importance_figure(summary, found or importances(summary, scales))
    if importance is not None:
        figures["importance.png"] = importance
    return figures


def comparison_figure(table: DatasetTable) -> Figure:
    """Each method's mean ± std over replicates (error bars) in every report column, side by side; the best
    entry of the ranking column ringed, analysis-only (oracle) rows labelled as such. The legend, between the
    title and the axis, names each column in words; the artists keep the table's column labels."""
    from raybench.report.compare import BEST

    rows = table.ranked + table.analysis_only
    labels = _table_split_labels(table)
    figure, ax = plt.subplots(figsize=(max(6.4, 1.0 * len(rows) + 2.5), 5.2), layout="constrained")
    legend: dict[str, Any] = {}
    rings: dict[str, Any] = {}  # the best entries' rings, after the columns in the legend
    width = 0.7 / max(len(table.columns), 1)
    for i, column in enumerate(table.columns):
        offset = (i - (len(table.columns) - 1) / 2) * width
        points = [(j + offset, cell) for j, row in enumerate(rows) if (cell := row.cells.get(column.key)) is not None]
        bars = ax.errorbar([x for x, _ in points], [100 * c.mean for _, c in points],
                           yerr=[100 * c.std if math.isfinite(c.std) else 0.0 for _, c in points],
                           fmt="o", capsize=4, label=column.label)
        legend[key_words(column.key, labels)] = bars
        best = [(x, c) for x, c in points if c.mark == BEST]
        if best:  # a ring, so the error bar inside stays visible
            words = f"best {key_words(column.key, labels)}"
            rings[words] = ax.scatter([best[0][0]], [100 * best[0][1].mean], label=words, **BEST_STYLE)
    ax.set_xticks(range(len(rows)), [_method_label(r) for r in rows], rotation=30, ha="right")
    ax.set_xlim(-0.6, len(rows) - 0.4)
    if table.analysis_only:  # the oracle rows stand apart: they are not a result of the protocol
        ax.axvline(len(table.ranked) - 0.5, color="gray", linestyle=":", linewidth=1)
    metrics = dict.fromkeys(key_words(c.key.partition("/")[2], labels) for c in table.columns)
    unit = _unit(table.columns[0].key) if table.columns else " (%)"
    ax.set_ylabel(f"{', '.join(metrics)}{unit}\nmean ± std over replicates")  # two lines: fits a 4.8-inch axis
    ax.set_xlabel("method (search space), selected on its validation metric")
    # the title stands clear of the legend above the axis: a row of small text, about 20 points high
    ax.set_title(f"{table.dataset}: methods compared", fontsize="medium", pad=24 if rows else 6)
    ax.grid(alpha=0.3, axis="y")
    legend.update(rings)
    if legend:  # above the axis, under the title: never over a method's bars
        ax.legend(list(legend.values()), list(legend), loc="lower center", bbox_to_anchor=(0.5, 1.01),
                  borderaxespad=0.0, ncols=min(len(legend), 3), **LEGEND_STYLE)
    return figure


def _method_label(row: Any) -> str:
    """A method's tick label, with what its row must not be read without: oracle, raised epochs (the convergence
    rule), not converged, collapsed pseudo-labels; one line each, as `compare`'s checks column says them."""
    notes = [f"epochs x{row.epochs_scale:g}"] if row.epochs_scale != 1 else []
    notes += ["not converged"] if row.health.not_converged else []
    notes += ["pseudo-labels collapsed"] if row.health.collapsed else []
    return "\n".join([row.method + (" (oracle)" if row.analysis_only else ""), *(f"({note})" for note in notes)])


def _table_split_labels(table: DatasetTable) -> dict[str, str]:
    """What the table's dataset calls its splits: the statistics carry them; otherwise each column label is
    `<split label> <metric label>` (raybench.labels.column_label), so the split's label is what precedes the
    metric's."""
    if table.stats is not None:
        return dict(table.stats.split_labels)
    labels = {}
    for column in table.columns:
        split, _, metric = column.key.partition("/")
        suffix = f" {METRIC_LABELS.get(metric, metric)}"
        if column.label.endswith(suffix) and column.label != suffix.strip():
            labels[split] = column.label.removesuffix(suffix)
    return labels


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
