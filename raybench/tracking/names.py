"""What raybench calls things in MLflow: its experiment, the tags its runs carry and the words those hold, and the
names its numbers are logged under.

Metric names: raybench's keys use WILDS's split names, where plain `val` and `test` are the OOD splits
(`val/acc`, `best/test/acc`). A reader of MLflow's run pages sees no dataset's documentation, so MLflow shows those
two spelled out (`ood_val/acc`, `best/ood_test/acc`) and `id_val`, `id_test` as they are. mlflow_metric_name turns
a key into the name it is logged under; internal_metric_key turns a name read back into the key, for names of
either spelling, since a store written before the OOD splits were spelled out holds `val/acc` itself.

No MLflow here, and no I/O: every module of raybench.tracking reads these.
"""
from __future__ import annotations

from collections.abc import Mapping

from raybench.labels import SHIFT_SPLIT_LABELS
from raybench.records import SweepState as State
from raybench.report_keys import BEST_PREFIX, REPLICATES_PREFIX
from raybench.words import REPLICATE_STAGE, SEARCH_STAGE  # noqa: F401  (the stage tags' words)

EXPERIMENT = "raybench"  # the experiment a sweep is filed under unless `sweep --experiment NAME` names another
# Marks an experiment raybench filed sweeps under, so that reading finds a sweep by name in any of them.
SWEEPS_EXPERIMENT_TAG = "raybench.sweeps"

# ----- tags -------------------------------------------------------------------------------------------------
PARENT_TAG = "mlflow.parentRunId"
KEY_TAG = "raybench.key"  # a run's key within its sweep, by which a resumed sweep finds the run again
SWEEP_TAG = "raybench.sweep"
BENCHMARK_TAG = "raybench.benchmark"
STATE_TAG = "raybench.state"  # running, interrupted, finished, failed: what `raybench results` reports
DRIVER_TAG = "raybench.driver"  # host:pid:start of the process running the sweep, to tell a dead one
RESUME_TAG = "raybench.resume_command"
STORAGE_TAG = "raybench.storage"  # the --storage folder (resolved) whose driver owns the sweep's name
# The sweep lock on --storage that its driver holds, and who (host, pid) took it: set while the driver runs the
# sweep, removed when it ends the sweep (whatever the status), so a finished sweep names no lock holder.
LOCK_TAG = "raybench.lock"
SUPERSEDED_TAG = "raybench.superseded"  # an extended search's selection that replaced the earlier one, in words
METHOD_STAGE_TAG = "raybench.method_stage"  # which earlier stage of a multi-stage method a stage run is
FAILURE_TAG = "failure_reason"
DESCRIPTION_TAG = "mlflow.note.content"  # the run page's Description panel (Markdown)
# MLflow 3's UI opens an experiment of this kind on its runs table (nested trials under the sweep), where an
# untagged one lands on the GenAI traces overview ("No data available").
EXPERIMENT_KIND_TAG = "mlflow.experimentKind"
MODEL_TRAINING_KIND = "custom_model_development"

# What every run of a sweep is tagged with (identity.base_tags), a table's filters read them back.
DATASET_TAG = "dataset"
ALGORITHM_TAG = "algorithm"
VERSION_TAG = "raybench_version"
COMMIT_TAG = "git_commit"

# ----- the stage tag: what kind of run a run is -------------------------------------------------------------
STAGE_TAG = "stage"
SWEEP_STAGE = "sweep"  # a sweep's parent run
BENCHMARK_STAGE = "benchmark"  # a benchmark's parent run, above its sweeps' parents
METHOD_STAGE = "method_stage"  # an earlier stage of a multi-stage method, nested in its trial's run

# MLflow's run statuses, as raybench ends its runs with them.
RUN_RUNNING, RUN_FINISHED, RUN_KILLED, RUN_FAILED = "RUNNING", "FINISHED", "KILLED", "FAILED"
# A sweep's state for its parent run's MLflow status (the state tag, where written, says more: "driver-gone").
SWEEP_STATE_OF_STATUS = {RUN_RUNNING: State.RUNNING, RUN_FINISHED: State.FINISHED, RUN_KILLED: State.INTERRUPTED,
                         RUN_FAILED: State.FAILED}

# ----- metric names -----------------------------------------------------------------------------------------
EPOCH_METRIC = "epoch"  # every epoch's report carries it, at its own step
FINAL_PREFIX = "final/"  # a method stage's closing numbers, on its stage run
# The OOD splits as raybench's keys name them (those labels.SHIFT_SPLIT_LABELS calls OOD: `val`, `test`) and the
# names MLflow shows them under.
MLFLOW_SPLIT_NAMES: Mapping[str, str] = {split: f"ood_{split}" for split, label in SHIFT_SPLIT_LABELS.items()
                                         if label.startswith("OOD ")}
INTERNAL_SPLIT_NAMES: Mapping[str, str] = {name: split for split, name in MLFLOW_SPLIT_NAMES.items()}
# Prefixes that come before a key's split: its value at the best epoch, a stage's closing value, a replicate
# statistic on the parent run (`replicates/best/test/acc/mean`).
WRAPPING_PREFIXES = (REPLICATES_PREFIX, BEST_PREFIX, FINAL_PREFIX)


def mlflow_metric_name(key: str) -> str:
    """The MLflow name of raybench's metric key `key`: its OOD split spelled out (`val/acc` -> `ood_val/acc`,
    `best/test/acc` -> `best/ood_test/acc`, `replicates/best/val/acc/mean` -> `replicates/best/ood_val/acc/mean`);
    any other key (`id_val/acc`, `train/loss/total`, `epoch`) as it is."""
    return _renamed_split(key, MLFLOW_SPLIT_NAMES)


def internal_metric_key(name: str) -> str:
    """raybench's key for the MLflow metric `name`, whichever spelling the store holds: `ood_val/acc` and, as
    written before the OOD splits were spelled out, `val/acc` both give `val/acc`."""
    return _renamed_split(name, INTERNAL_SPLIT_NAMES)


def _renamed_split(key: str, names: Mapping[str, str]) -> str:
    """`key` with its split (the first part after any WRAPPING_PREFIXES, when a `/` follows it) renamed by `names`."""
    head, rest = "", key
    while prefix := next((p for p in WRAPPING_PREFIXES if rest.startswith(p)), None):
        head, rest = head + prefix, rest[len(prefix):]
    split, slash, tail = rest.partition("/")
    return f"{head}{names.get(split, split)}{slash}{tail}" if slash else key
