"""The record a sweep leaves at its end, and at an interruption: results as CSV, Parquet, JSON and markdown
under `<storage>/<name>/results`, its figures under `<storage>/<name>/plots`, both on the parent MLflow run with
the headline metrics, and the selected checkpoint. raybench.sweep.runner calls it through its SweepRecorder
protocol; SWEEP_RECORD is what raybench.commands.sweep and raybench.api hand in."""
from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from raybench.paths import storage_writes
from raybench.records import Importances, SweepSummary, TrialRecord
from raybench.report import results as tables
from raybench.report.importance import MIN_TRIALS, importances
from raybench.report_keys import REPLICATES_PREFIX

if TYPE_CHECKING:
    from raybench.sweep.runner import Prepared
    from raybench.tracking import SweepTracker

PLOT_MODULES = ("raybench.report.plots",)  # matplotlib
IMPORTANCE_MODULES = ("optuna.importance",)  # Optuna's fANOVA: scikit-learn, SciPy


class SweepRecord:
    """raybench's SweepRecorder (raybench.sweep.runner): the record described above."""

    def modules(self, trials: int, searched: bool) -> tuple[str, ...]:
        """The modules the record imports at its end, to import beside Ray's start: the plots always, and
        fANOVA only for a search that can count MIN_TRIALS trials over something searched. Below that,
        `importances` gives each parameter its reason without importing Optuna's fANOVA, whose scikit-learn is
        the largest import a small sweep's driver would otherwise make for nothing."""
        rated = searched and trials >= MIN_TRIALS
        return PLOT_MODULES + (IMPORTANCE_MODULES if rated else ())

    def record(self, prepared: Prepared, tracker: SweepTracker, summary: SweepSummary, trials: list[TrialRecord],
               replicates: list[TrialRecord], selected: TrialRecord | None) -> None:
        """Each file is written all or nothing; a full --storage is one StorageFull naming the file, before
        MLflow is told."""
        summary.mlflow = {"experiment_id": tracker.experiment_id, "run_id": tracker.parent_id}
        found = importances(summary)  # rated once: summary.md, the parent run's description and importance.png
        summary.importances = found  # and summary.json keeps it, for `results` and `compare --stats` to read
        directory = prepared.storage / prepared.name / "results"
        with storage_writes(prepared.storage, f"the results of sweep {prepared.name!r}"):
            tables.write_results(directory, summary, tables.trials_frame(trials), tables.replicates_frame(replicates),
                                 found)
        tracker.log_artifacts(directory, "results")
        tracker.log_summary(tables.markdown(summary, found), headline_metrics(summary))
        log_plots(prepared, tracker, summary, found)
        checkpoint = Path(selected.checkpoint) / "best_model.pt" if selected and selected.checkpoint else None
        if checkpoint is not None and checkpoint.is_file():
            tracker.log_artifact(checkpoint, "selected_checkpoint")


SWEEP_RECORD = SweepRecord()


def headline_metrics(summary: SweepSummary) -> dict[str, float]:
    """The parent run's metrics: each replicate metric's mean and std, the compute of each stage, the wall
    time, and an attempt's epochs scale (the convergence rule)."""
    headline = {f"{REPLICATES_PREFIX}{key}/{stat}": cell[stat] for key, cell in summary.replicates.summary.items()
                for stat in ("mean", "std")}
    headline.update({f"compute/{stage}/{name}": value for stage, totals in (summary.compute or {}).items()
                     for name, value in totals.items()})
    headline["wall_seconds"] = summary.wall_seconds
    if summary.epochs_scale is not None:  # an attempt of the convergence rule: its epochs were raised
        headline["epochs_scale"] = summary.epochs_scale
    return headline


def log_plots(prepared: Prepared, tracker: SweepTracker, summary: SweepSummary, found: Importances) -> None:
    """The sweep's figures (raybench.report.plots) under `<storage>/<name>/plots` and on the parent run."""
    from raybench.report import plots  # matplotlib is imported when a sweep ends, not when the CLI starts

    selected = summary.selected
    curves = [plots.Curve(*curve) for curve in tracker.selection_curves(prepared.selection_metric, selected.trial_id)] \
        if selected else []
    directory = prepared.storage / prepared.name / "plots"
    with storage_writes(prepared.storage, f"the plots of sweep {prepared.name!r}"):
        plots.save(plots.sweep_figures(summary, summary.space_scales, curves, found), directory)
    tracker.log_artifacts(directory, "plots")
