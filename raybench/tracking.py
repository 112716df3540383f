"""Everything raybench says to MLflow goes through this module.

One parent run per sweep; one nested child run per trial and per replicate, and under a trial one
nested run per earlier stage of a multi-stage method (reference model, group inference), each found again by a
`raybench.key` tag so a resumed sweep reuses its runs instead of orphaning them. Metrics are sent
with `log_batch` (one request per epoch, not one per key), which matters over HTTP.
"""
from __future__ import annotations

import json
import math
import os
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any, Mapping, Optional

os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")

from mlflow.entities import Metric, Param  # noqa: E402
from mlflow.tracking import MlflowClient  # noqa: E402

import raybench  # noqa: E402

EXPERIMENT = "raybench"
PARENT_TAG = "mlflow.parentRunId"
KEY_TAG = "raybench.key"
SWEEP_TAG = "raybench.sweep"
MAX_PARAM_LENGTH = 6000


class TrackingError(RuntimeError):
    """MLflow is unreachable or a sweep is not where it should be; the message says which and why."""


def default_tracking_uri() -> str:
    """A local SQLite store in the working directory (`./mlflow.db`), unless MLFLOW_TRACKING_URI is set."""
    return os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{Path('mlflow.db').resolve()}"


def check_reachable(uri: str, timeout_s: float = 5.0) -> None:
    """Fail fast, before any training, when an HTTP tracking server does not answer its health check."""
    if not uri.startswith(("http://", "https://")):
        return
    try:
        with urllib.request.urlopen(uri.rstrip("/") + "/health", timeout=timeout_s) as response:
            if response.status != 200:
                raise TrackingError(f"MLflow server at {uri} answered /health with HTTP {response.status}")
    except (urllib.error.URLError, OSError) as err:
        reason = getattr(err, "reason", err)
        raise TrackingError(f"MLflow server at {uri} is unreachable ({reason}); start it or pass another --tracking-uri") from None


def git_commit() -> Optional[str]:
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5,
                             cwd=Path(__file__).resolve().parent)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None if out.returncode == 0 else None


def base_tags(dataset: str, algorithm: str) -> dict[str, str]:
    tags = {"dataset": dataset, "algorithm": algorithm, "raybench_version": raybench.__version__}
    commit = git_commit()
    if commit:
        tags["git_commit"] = commit
    return tags


def flatten(values: Mapping[str, Any], prefix: str = "") -> dict[str, str]:
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


class SweepTracker:
    """A sweep's view of MLflow: its parent run, its child runs and its artifacts."""

    def __init__(self, uri: str, experiment: str = EXPERIMENT) -> None:
        check_reachable(uri)
        self.uri = uri
        self.client = MlflowClient(tracking_uri=uri)
        self.experiment_id = self._experiment(experiment)
        self.parent_id: Optional[str] = None

    def _experiment(self, name: str) -> str:
        found = self.client.get_experiment_by_name(name)
        if found is not None:
            return found.experiment_id
        location = None
        if self.uri.startswith("sqlite:"):  # keep artifacts next to the database, not in the cwd of whoever reads
            location = (Path(self.uri.removeprefix("sqlite:///")).parent / "mlartifacts").resolve().as_uri()
        return self.client.create_experiment(name, artifact_location=location)

    def _find(self, filter_string: str) -> Optional[Any]:
        runs = self.client.search_runs([self.experiment_id], filter_string, max_results=1, order_by=["attributes.start_time DESC"])
        return runs[0] if runs else None

    # ----- the sweep's parent run ------------------------------------------------------------------
    def start_sweep(self, name: str, params: Mapping[str, Any], tags: Mapping[str, str]) -> str:
        existing = self._find(f"tags.`{SWEEP_TAG}` = '{name}' and tags.stage = 'sweep'")
        if existing is not None:
            self.parent_id = existing.info.run_id
            self.client.update_run(self.parent_id, status="RUNNING")
        else:
            run = self.client.create_run(self.experiment_id, run_name=name,
                                         tags={**tags, SWEEP_TAG: name, "stage": "sweep"})
            self.parent_id = run.info.run_id
            self._log(self.parent_id, params=flatten(params))
        return self.parent_id

    def end_sweep(self, status: str, note: Optional[str] = None) -> None:
        assert self.parent_id is not None
        if note:
            self.client.set_tag(self.parent_id, "failure_reason", note[:5000])
        self.client.set_terminated(self.parent_id, status=status)

    def log_artifacts(self, directory: Path, artifact_path: Optional[str] = None) -> None:
        assert self.parent_id is not None
        self.client.log_artifacts(self.parent_id, str(directory), artifact_path)

    def log_artifact(self, file: Path, artifact_path: Optional[str] = None, run_id: Optional[str] = None) -> None:
        self.client.log_artifact(run_id or self.parent_id, str(file), artifact_path)

    def log_summary(self, markdown: str, metrics: Mapping[str, float]) -> None:
        """The sweep's short markdown summary and its headline numbers, on the parent run."""
        assert self.parent_id is not None
        self.client.log_text(self.parent_id, markdown, "summary.md")
        self._log(self.parent_id, metrics=numeric_metrics(metrics))

    # ----- child runs (trials and replicates) --------------------------------------------------
    def start_child(self, key: str, run_name: str, params: Mapping[str, Any], tags: Mapping[str, str]) -> str:
        """The child run for `key`, reused if a resumed sweep already made it."""
        assert self.parent_id is not None
        return self._nested(self.parent_id, key, run_name, params, tags)[0]

    def log_stage(self, trial_run: str, trial_key: str, stage: Mapping[str, Any]) -> None:
        """One stage of a multi-stage method as a run nested in its trial's run: per-epoch history if it
        trained, its final numbers, where it came from (trained or cache key). Logged once, also on resume."""
        name = str(stage["name"])
        tags = {"stage": "method_stage", "raybench.method_stage": name, "cached": str(stage.get("cached", False))}
        params = {"stage_key": stage.get("key") or "-", **dict(stage.get("facts", {}))}
        run, created = self._nested(trial_run, f"{trial_key}/{name}", f"{name}-{trial_key}", params, tags)
        if not created:
            return
        for step, metrics in enumerate(stage.get("history") or []):
            self._log(run, metrics=numeric_metrics(metrics), step=int(metrics.get("epoch", step)))
        self._log(run, metrics=numeric_metrics({f"final/{k}": v for k, v in stage.get("metrics", {}).items()}
                                               | {"seconds": stage.get("seconds", 0.0)}))
        self.client.set_terminated(run, status="FINISHED")

    def _nested(self, parent: str, key: str, run_name: str, params: Mapping[str, Any],
                tags: Mapping[str, str]) -> tuple[str, bool]:
        existing = self._find(f"tags.`{KEY_TAG}` = '{key}' and tags.`{PARENT_TAG}` = '{parent}'")
        if existing is not None:
            self.client.update_run(existing.info.run_id, status="RUNNING")
            return existing.info.run_id, False
        run = self.client.create_run(self.experiment_id, run_name=run_name, tags={**tags, KEY_TAG: key, PARENT_TAG: parent})
        self._log(run.info.run_id, params=flatten(params))
        return run.info.run_id, True

    def log_metrics(self, run_id: str, metrics: Mapping[str, Any], step: int) -> None:
        self._log(run_id, metrics=numeric_metrics(metrics), step=step)

    def end_child(self, run_id: str, status: str, reason: Optional[str] = None) -> None:
        if reason:
            self.client.set_tag(run_id, "failure_reason", reason[:5000])
        self.client.set_terminated(run_id, status=status)

    def _log(self, run_id: str, params: Optional[dict[str, str]] = None, metrics: Optional[dict[str, float]] = None,
             step: int = 0) -> None:
        now = int(time.time() * 1000)
        self.client.log_batch(
            run_id,
            metrics=[Metric(k, v, now, step) for k, v in (metrics or {}).items()],
            params=[Param(k, v) for k, v in (params or {}).items()],
            tags=[],
        )

    def children(self) -> list[Any]:
        assert self.parent_id is not None
        return self.client.search_runs([self.experiment_id], f"tags.`{PARENT_TAG}` = '{self.parent_id}'", max_results=10000)


# ----- reading a finished sweep back ------------------------------------------------------------------
def load_sweep_results(uri: str, name: str) -> dict[str, Any]:
    """The parent run of sweep `name` and its `results/summary.json` artifact."""
    check_reachable(uri)
    client = MlflowClient(tracking_uri=uri)
    experiment = client.get_experiment_by_name(EXPERIMENT)
    if experiment is None:
        raise TrackingError(f"no raybench sweeps in the MLflow store at {uri}")
    runs = client.search_runs([experiment.experiment_id], f"tags.`{SWEEP_TAG}` = '{name}' and tags.stage = 'sweep'",
                              max_results=1)
    if not runs:
        raise TrackingError(f"no sweep named {name!r} in the MLflow store at {uri}")
    parent = runs[0]
    with tempfile.TemporaryDirectory() as tmp:
        try:
            path = client.download_artifacts(parent.info.run_id, "results/summary.json", tmp)
        except Exception as err:  # MLflow raises several types for a missing artifact
            raise TrackingError(f"sweep {name!r} has no results yet (status {parent.info.status}): {err}") from None
        summary = json.loads(Path(path).read_text())
    summary["mlflow_run_id"] = parent.info.run_id
    summary["mlflow_status"] = parent.info.status
    return summary
