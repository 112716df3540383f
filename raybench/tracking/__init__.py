"""Everything raybench says to MLflow goes through this package; MLflow is imported nowhere else.

One parent run per sweep; one nested child run per trial and per replicate, and under a trial one nested run per
earlier stage of a multi-stage method (reference model, group inference), each found again by a `raybench.key`
tag so a resumed sweep reuses its runs instead of orphaning them.

Each job has its module:

- names.py: the vocabulary: the experiment, every tag and the words it holds (the stage of a run, a sweep's
  state for an MLflow status), and the metric names: raybench's keys keep WILDS's split names (`val/acc`),
  MLflow shows the OOD splits spelled out (`ood_val/acc`): mlflow_metric_name and internal_metric_key.
- identity.py: who wrote a run: the driver's identity (alive or gone) and the tags every run starts with.
- store.py: tracking URIs and stores, checked before anything is written (check_uri, check_reachable),
  shown without credentials (redact_uri), local stores judged without opening them (is_new_sqlite_store,
  sqlite_damage), whose a sweep's name is (storage_problem), the MLflow UI over a store (ui_command, ui_link);
  and TrackingError, which everything here fails with.
- client.py: the one client of a store: every call counted and timed (TrackingStats, PROCESS_STATS), retried
  where a retry cannot duplicate it, a background client outlasting a server that is down (CountedClient); a
  store's failures as one line (first_contact, reads_in_one_line); runs found by their tags (runs_tagged).
- runs.py: runs written into an experiment (RunWriter): created or found again by key, params, metrics under
  their MLflow names, tags, ends; a finished group of runs logged whole (RunRecord, RunWriter.log_run_group).
- sweep_writer.py: a sweep's parent run by its driver (SweepTracker: start_sweep, end_sweep, set_tags,
  log_summary, ...), the lock tag while the driver holds the sweep's lock, and a benchmark's (BenchmarkTracker).
- trial_writer.py: a stage's trial runs, written by a background thread from a journal on --storage
  (TrialRunWriter, RunWrite, TRIAL_JOURNAL).
- reading.py: a sweep read back: where it stands, its record, figures and checkpoint, its metrics' histories
  under either name (find_recorded_sweep, load_sweep_results, find_sweeps, selection_curves).
- summary.py: the summary.json codec: one reader (read_summary_text), one exception (DamagedRecord).

The names below are those raybench's other floors import; a name used only within this package (or by a test of
one job) is imported from its module.
"""
from __future__ import annotations

import logging
import os

os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")  # `raybench results` prints one table, no bars
# MLflow's client prints "View run NAME at: URL" each time it ends a run on a server (in the driver, a benchmark,
# a Ray job's log), a link without ?workflowType=machine_learning that opens MLflow 3's GenAI view; raybench
# prints its own link (ui_link) once. Every process that ends a run imports this package (MLflow is imported
# nowhere else; trial and Train worker processes end none: the sweep's process writes their runs), so this
# reaches all of them. MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT=false brings MLflow's links back. Set here, before
# any module of the package imports MLflow: importing one of them runs this first.
os.environ.setdefault("MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT", "true")

# A new SQLite store logs its schema creation and migrations at INFO on every first use: not the user's news.
logging.getLogger("mlflow.store.db.utils").setLevel(logging.WARNING)
logging.getLogger("alembic").setLevel(logging.WARNING)
# A Databricks URI without credentials logs its SDK's failure, then fails again in the error raybench prints.
logging.getLogger("mlflow.utils.databricks_utils").setLevel(logging.ERROR)

from raybench.tracking.client import PROCESS_STATS, TrackingStats
from raybench.tracking.identity import base_tags
from raybench.tracking.names import (
    DRIVER_TAG,
    EXPERIMENT,
    LOCK_TAG,
    PARENT_TAG,
    RESUME_TAG,
    RUN_FAILED,
    RUN_FINISHED,
    RUN_KILLED,
    STAGE_TAG,
    STATE_TAG,
    STORAGE_TAG,
    SUPERSEDED_TAG,
    SWEEP_TAG,
    internal_metric_key,
    mlflow_metric_name,
)
from raybench.tracking.reading import (
    RecordedSweep,
    SweepRecord,
    SweepStanding,
    download_plots,
    download_selected_checkpoint,
    find_recorded_sweep,
    find_sweeps,
    load_sweep_results,
)
from raybench.tracking.runs import RunRecord, RunWriter, flatten, now_ms, numeric_metrics
from raybench.tracking.store import (
    UI_PORT,
    TrackingError,
    check_reachable,
    check_uri,
    default_tracking_uri,
    is_new_sqlite_store,
    redact_uri,
    storage_problem,
    ui_command,
    ui_link,
)
from raybench.tracking.summary import DamagedRecord, read_summary_text
from raybench.tracking.sweep_writer import BenchmarkTracker, SweepTracker
from raybench.tracking.trial_writer import TRIAL_JOURNAL, RunWrite, TrialRunWriter, WriteKind

__all__ = [
    "DRIVER_TAG",
    "EXPERIMENT",
    "LOCK_TAG",
    "PARENT_TAG",
    "PROCESS_STATS",
    "RESUME_TAG",
    "RUN_FAILED",
    "RUN_FINISHED",
    "RUN_KILLED",
    "STAGE_TAG",
    "STATE_TAG",
    "STORAGE_TAG",
    "SUPERSEDED_TAG",
    "SWEEP_TAG",
    "TRIAL_JOURNAL",
    "UI_PORT",
    "BenchmarkTracker",
    "DamagedRecord",
    "RecordedSweep",
    "RunRecord",
    "RunWrite",
    "RunWriter",
    "SweepRecord",
    "SweepStanding",
    "SweepTracker",
    "TrackingError",
    "TrackingStats",
    "TrialRunWriter",
    "WriteKind",
    "base_tags",
    "check_reachable",
    "check_uri",
    "default_tracking_uri",
    "download_plots",
    "download_selected_checkpoint",
    "find_recorded_sweep",
    "find_sweeps",
    "flatten",
    "internal_metric_key",
    "is_new_sqlite_store",
    "load_sweep_results",
    "mlflow_metric_name",
    "now_ms",
    "numeric_metrics",
    "read_summary_text",
    "redact_uri",
    "storage_problem",
    "ui_command",
    "ui_link",
]
