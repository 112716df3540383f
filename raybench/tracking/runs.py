"""Writing runs into one experiment of a store: a run created or found again by its key (a `raybench.key` tag, so
a resumed sweep reuses its runs instead of orphaning them), its params, its metrics under their MLflow names
(names.mlflow_metric_name), its tags and its end. Metrics are sent with `log_batch` (one request per epoch, not
one per key), which matters over HTTP.

RunWriter is what a sweep's tracker (sweep_writer.SweepTracker) and the trial-run writer's background client
(trial_writer.TrialRunWriter) share; log_run_group logs a finished group of runs whole (a task suite's).
"""
from __future__ import annotations

import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mlflow.entities import Metric, Param, RunTag

from raybench.paths import StorageFull
from raybench.report_keys import STAGE_WEIGHTS_FACT
from raybench.tracking.client import counted_client, first_contact, runs_tagged
from raybench.tracking.names import (
    EPOCH_METRIC,
    EXPERIMENT,
    EXPERIMENT_KIND_TAG,
    FAILURE_TAG,
    FINAL_PREFIX,
    KEY_TAG,
    METHOD_STAGE,
    METHOD_STAGE_TAG,
    MODEL_TRAINING_KIND,
    PARENT_TAG,
    RUN_FAILED,
    RUN_FINISHED,
    RUN_RUNNING,
    STAGE_TAG,
    SWEEPS_EXPERIMENT_TAG,
    mlflow_metric_name,
)
from raybench.tracking.store import (
    check_reachable,
    credentials_to_environment,
    is_new_sqlite_store,
    remove_sqlite_file,
    sqlite_path,
)

MAX_PARAM_LENGTH = 6000
REASON_LIMIT = 5000  # the longest failure reason kept on a run, well under MLflow's tag limit


def now_ms() -> int:
    return int(time.time() * 1000)


def flatten(values: Mapping[str, Any], prefix: str = "") -> dict[str, str]:
    """MLflow params from nested values: `a.b.c` keys, each value as text cut to MAX_PARAM_LENGTH
    characters (a longer one, such as a long --set value, is stored truncated: the store refuses it whole)."""
    flat: dict[str, str] = {}
    for key, value in values.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            flat.update(flatten(value, f"{name}."))
        else:
            flat[name] = str(value)[:MAX_PARAM_LENGTH]
    return flat


def numeric_metrics(metrics: Mapping[str, Any]) -> dict[str, float]:
    """The finite numbers among a result's values (Tune adds strings, bools and bookkeeping)."""
    out = {}
    for key, value in metrics.items():
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            continue
        out[key] = float(value)
    return out


@dataclass(frozen=True)
class RunRecord:
    """One finished run to log whole: its name, its params (nested values are flattened), its numbers under
    raybench's keys (those that are no finite number are left out) and its tags; `key` is its `raybench.key`."""

    name: str
    params: Mapping[str, Any] = field(default_factory=dict)
    metrics: Mapping[str, Any] = field(default_factory=dict)
    tags: Mapping[str, str] = field(default_factory=dict)
    key: str | None = None


# What an experiment raybench writes to is tagged with: a model-training experiment, so that the MLflow UI opens on
# its runs (an older raybench's is marked when met again), and one that holds sweeps, for reading to find them.
EXPERIMENT_TAGS = {EXPERIMENT_KIND_TAG: MODEL_TRAINING_KIND, SWEEPS_EXPERIMENT_TAG: "true"}


class RunWriter:
    """The runs of one experiment in the store at `uri`, under the run `parent_id` once a caller sets it."""

    def __init__(self, uri: str, experiment: str = EXPERIMENT, background: bool = False) -> None:
        """A foreground writer checks the store at once, so a sweep fails fast before any training. A
        `background` one (the trial-run writer's, made when a stage's first trial starts) asks nothing of the
        store until its first write, in the writer's thread, which waits out a server that is down."""
        if not background:
            check_reachable(uri)
        self.uri = credentials_to_environment(uri)
        self._experiment_name = experiment
        self.parent_id: str | None = None
        if background:
            self.client = counted_client(self.uri, background=True)
            self._experiment_id: str | None = None
            return
        new_file = sqlite_path(self.uri) if is_new_sqlite_store(self.uri) else None
        try:
            self.client = first_contact(uri, lambda: counted_client(self.uri))
            self._experiment_id = first_contact(uri, lambda: self._experiment(experiment))
        except StorageFull:
            if new_file is not None:  # a schema cut off half way would refuse every later command: not kept
                remove_sqlite_file(new_file)
            raise

    @property
    def experiment_name(self) -> str:
        return self._experiment_name

    @property
    def experiment_id(self) -> str:
        if self._experiment_id is None:
            self._experiment_id = self._experiment(self._experiment_name)
        return self._experiment_id

    @experiment_id.setter
    def experiment_id(self, value: str) -> None:
        self._experiment_id = value

    def _experiment(self, name: str) -> str:
        """The experiment's id, created as a model-training experiment (or marked one, if an older raybench
        made it), so that the MLflow UI opens on its runs."""
        found = self.client.get_experiment_by_name(name)
        if found is not None:
            for tag, value in EXPERIMENT_TAGS.items():
                if tag not in found.tags:
                    self.client.set_experiment_tag(found.experiment_id, tag, value)
            return found.experiment_id
        location = None
        database = sqlite_path(self.uri)
        if database is not None:  # keep artifacts next to the database, not in the cwd of whoever reads
            location = (database.parent / "mlartifacts").resolve().as_uri()
        return self.client.create_experiment(name, artifact_location=location, tags=EXPERIMENT_TAGS)

    def _find(self, tags: Mapping[str, str]) -> Any | None:
        """The latest run whose tags hold `tags` exactly."""
        runs = runs_tagged(self.client, self.experiment_id, tags, order_by=["attributes.start_time DESC"], max_results=1)
        return runs[0] if runs else None

    # ----- child runs (trials and replicates) --------------------------------------------------
    def start_child(self, key: str, run_name: str, params: Mapping[str, Any], tags: Mapping[str, str]) -> str:
        """The child run for `key`, reused if a resumed sweep already made it."""
        return self.open_child(key, run_name, params, tags)[0]

    def open_child(self, key: str, run_name: str, params: Mapping[str, Any],
                   tags: Mapping[str, str], look_up: bool = True) -> tuple[str, int]:
        """The child run for `key` and the last epoch it has logged (-1 for a new run). A driver killed outright
        (SIGKILL) leaves a trial whose epochs after Tune's last saved checkpoint run again on resume; the caller
        skips those already logged, so every epoch is in MLflow once. Without `look_up` (a sweep that is not
        resuming has no earlier run of the key) the run is created without asking the store first."""
        assert self.parent_id is not None
        run, created = self._nested(self.parent_id, key, run_name, params, tags, look_up)
        if created:
            return run, -1
        return run, max((int(m.step) for m in self.client.get_metric_history(run, EPOCH_METRIC)), default=-1)

    def log_stage(self, trial_run: str, trial_key: str, stage: Mapping[str, Any], look_up: bool = True) -> None:
        """One stage of a multi-stage method as a run nested in its trial's run: per-epoch history if it
        trained, its final numbers, where it came from (trained or cache key). Logged once, also on resume."""
        name = str(stage["name"])
        tags = {STAGE_TAG: METHOD_STAGE, METHOD_STAGE_TAG: name, "cached": str(stage.get("cached", False))}
        params = {"stage_key": stage.get("key") or "-", **dict(stage.get("facts", {}))}
        run, created = self._nested(trial_run, f"{trial_key}/{name}", f"{name}-{trial_key}", params, tags, look_up)
        if not created:
            return
        for step, metrics in enumerate(stage.get("history") or []):
            self._log(run, metrics=numeric_metrics(metrics), step=int(metrics.get("epoch", step)))
        self._log(run, metrics=numeric_metrics({f"{FINAL_PREFIX}{k}": v for k, v in stage.get("metrics", {}).items()}
                                               | {"seconds": stage.get("seconds", 0.0)}))
        weights = Path(str(stage.get("facts", {}).get(STAGE_WEIGHTS_FACT, "")))
        if weights.is_file():  # a pre-trained featurizer, so a later run can start from it (absent on another host)
            self.client.log_artifact(run, str(weights), name)
        self.client.set_terminated(run, status=RUN_FINISHED)

    def _nested(self, parent: str, key: str, run_name: str, params: Mapping[str, Any],
                tags: Mapping[str, str], look_up: bool = True) -> tuple[str, bool]:
        existing = self._find({KEY_TAG: key, PARENT_TAG: parent}) if look_up else None
        if existing is not None:
            self.client.update_run(existing.info.run_id, status=RUN_RUNNING)
            return existing.info.run_id, False
        run = self.client.create_run(self.experiment_id, run_name=run_name, tags={**tags, KEY_TAG: key, PARENT_TAG: parent})
        self._log(run.info.run_id, params=flatten(params))
        return run.info.run_id, True

    def log_metrics(self, run_id: str, metrics: Mapping[str, Any], step: int,
                    tags: Mapping[str, str] | None = None, timestamp_ms: int | None = None) -> None:
        self._log(run_id, metrics=numeric_metrics(metrics), step=step, tags=tags, timestamp_ms=timestamp_ms)

    def end_child(self, run_id: str, status: str, reason: str | None = None,
                  tags: Mapping[str, str] | None = None) -> None:
        self._tag(run_id, {**({FAILURE_TAG: reason[:REASON_LIMIT]} if reason else {}), **(tags or {})})
        self.client.set_terminated(run_id, status=status)

    def children(self, nested: bool = False) -> list[Any]:
        """The trial and replicate runs under the parent run; with `nested`, their stage runs too."""
        assert self.parent_id is not None
        found, frontier = [], [self.parent_id]
        while frontier:
            runs = [run for parent in frontier
                    for run in runs_tagged(self.client, self.experiment_id, {PARENT_TAG: parent}, max_results=10000)]
            found += runs
            frontier = [run.info.run_id for run in runs] if nested else []
        return found

    # ----- a finished group of runs, logged whole ------------------------------------------------
    def log_run_group(self, parent: RunRecord, children: Sequence[RunRecord]) -> str:
        """`parent` as a new run and each of `children` as a new run nested in it, each FINISHED once logged;
        returns the parent's run id. A failure half way marks the parent FAILED, so the store never shows a group
        with a silently missing run. Nothing is looked up: a group logged again is a new group."""
        parent_id = self._create(parent)
        try:
            self._log_record(parent_id, parent)
            for child in children:
                run = self._create(child, {PARENT_TAG: parent_id})
                self._log_record(run, child)
                self.client.set_terminated(run, status=RUN_FINISHED)
        except BaseException:
            self.client.set_terminated(parent_id, status=RUN_FAILED)
            raise
        self.client.set_terminated(parent_id, status=RUN_FINISHED)
        return parent_id

    def _create(self, record: RunRecord, nesting: Mapping[str, str] | None = None) -> str:
        tags = {**record.tags, **(nesting or {}), **({KEY_TAG: record.key} if record.key else {})}
        return self.client.create_run(self.experiment_id, run_name=record.name, tags=tags).info.run_id

    def _log_record(self, run_id: str, record: RunRecord) -> None:
        self._log(run_id, params=flatten(record.params), metrics=numeric_metrics(record.metrics))

    # ----- tags and batches ----------------------------------------------------------------------
    def set_tags(self, run_id: str, tags: Mapping[str, str]) -> None:
        self._tag(run_id, tags)

    def drop_tag(self, run_id: str, key: str) -> None:
        """The run's tag `key` removed, if it has one. MLflow refuses to delete a tag a run does not have, so the
        run is read first, and a delete that fails is done when the tag is gone (a retry after a lost answer)."""
        if key not in self.client.get_run(run_id).data.tags:
            return
        try:
            self.client.delete_tag(run_id, key)
        except Exception:
            if key in self.client.get_run(run_id).data.tags:
                raise

    def _tag(self, run_id: str, tags: Mapping[str, str]) -> None:
        if tags:  # one request for all of them
            self.client.log_batch(run_id, tags=[RunTag(k, str(v)) for k, v in tags.items()])

    def _log(self, run_id: str, params: dict[str, str] | None = None, metrics: dict[str, float] | None = None,
             step: int = 0, tags: Mapping[str, str] | None = None, timestamp_ms: int | None = None) -> None:
        """One log_batch; each metric under its MLflow name (names.mlflow_metric_name: `val/acc` as `ood_val/acc`)."""
        now = timestamp_ms or now_ms()
        self.client.log_batch(
            run_id,
            metrics=[Metric(mlflow_metric_name(k), v, now, step) for k, v in (metrics or {}).items()],
            params=[Param(k, v) for k, v in (params or {}).items()],
            tags=[RunTag(k, str(v)) for k, v in (tags or {}).items()],
        )
