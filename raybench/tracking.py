"""Everything raybench says to MLflow goes through this module.

One parent run per sweep; one nested child run per trial and per replicate, and under a trial one
nested run per earlier stage of a multi-stage method (reference model, group inference), each found again by a
`raybench.key` tag so a resumed sweep reuses its runs instead of orphaning them. Metrics are sent
with `log_batch` (one request per epoch, not one per key), which matters over HTTP.
"""
from __future__ import annotations

import base64
import contextlib
import dataclasses
import json
import logging
import math
import os
import queue
import socket
import subprocess
import tempfile
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")  # `raybench results` prints one table, no bars

from mlflow.entities import Metric, Param, RunTag
from mlflow.tracking import MlflowClient

# A new SQLite store logs its schema creation and migrations at INFO on every first use: not the user's news.
logging.getLogger("mlflow.store.db.utils").setLevel(logging.WARNING)
logging.getLogger("alembic").setLevel(logging.WARNING)

import raybench
from raybench.paths import writable_dir_problem
from raybench.records import RecordError, StoredRun, SweepSummary
from raybench.records import SweepState as State  # this module's SweepState is where a sweep stands, in words
from raybench.report_keys import SCHEMA_VERSION, STAGE_WEIGHTS_FACT, SUMMARY_SCHEMA

if TYPE_CHECKING:
    from raybench.newt_suite import SuiteResult, TaskResult

EXPERIMENT = "raybench"
PARENT_TAG = "mlflow.parentRunId"
KEY_TAG = "raybench.key"
SWEEP_TAG = "raybench.sweep"
BENCHMARK_TAG = "raybench.benchmark"
EPOCH_METRIC = "epoch"  # every epoch's report carries it, at its own step
STATE_TAG = "raybench.state"  # running, interrupted, finished, failed: what `raybench results` reports
# A sweep's state for its parent run's MLflow status (the state tag, where written, says more: "driver-gone").
SWEEP_STATE_OF_STATUS = {"RUNNING": State.RUNNING, "FINISHED": State.FINISHED, "KILLED": State.INTERRUPTED,
                         "FAILED": State.FAILED}
DRIVER_TAG = "raybench.driver"  # host:pid:start of the process running the sweep, to tell a dead one
RESUME_TAG = "raybench.resume_command"
LOCK_TAG = "raybench.lock"  # the sweep lock on --storage its driver holds, and who (host, pid) took it
BLIND_TAG = "raybench.selection_blind"
# MLflow 3's UI opens an experiment of this kind on its runs table (nested trials under the sweep), where an
# untagged one lands on the GenAI traces overview ("No data available").
EXPERIMENT_KIND_TAG = "mlflow.experimentKind"
MODEL_TRAINING_KIND = "custom_model_development"
DESCRIPTION_TAG = "mlflow.note.content"  # the run page's Description panel (Markdown)
DESCRIPTION_LIMIT = 8000  # MLflow's longest run tag value (MAX_TAG_VAL_LENGTH)
MAX_PARAM_LENGTH = 6000
# Tracking-store schemes MLflow ships (a "+driver" suffix is allowed: postgresql+psycopg2://...).
SCHEMES = ("file", "sqlite", "postgresql", "mysql", "mssql", "http", "https", "databricks")


class TrackingError(RuntimeError):
    """MLflow is unreachable or a sweep is not where it should be; the message says which and why."""


def default_tracking_uri() -> str:
    """A local SQLite store in the working directory (`./mlflow.db`), unless MLFLOW_TRACKING_URI is set."""
    return os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{Path('mlflow.db').resolve()}"


def redact_uri(uri: str | None) -> str | None:
    """`uri` with any user:password replaced by ***, for everything that is shown or logged."""
    if not uri or "@" not in uri:
        return uri
    parts = urllib.parse.urlsplit(uri)
    if parts.username is None and parts.password is None:
        return uri
    host = parts.netloc.rpartition("@")[2]
    return urllib.parse.urlunsplit(parts._replace(netloc=f"***@{host}"))


def without_credentials(uri: str) -> str:
    """`uri` with its user:password removed; MLflow then reads them from MLFLOW_TRACKING_USERNAME/PASSWORD,
    so they never travel in a URI that Tune pickles into its experiment state or a log line prints."""
    parts = urllib.parse.urlsplit(uri)
    if parts.username is None and parts.password is None:
        return uri
    return urllib.parse.urlunsplit(parts._replace(netloc=parts.netloc.rpartition("@")[2]))


def credentials_to_environment(uri: str) -> str:
    """Move an http(s) URI's user:password into MLflow's own environment variables; returns the bare URI."""
    parts = urllib.parse.urlsplit(uri)
    if parts.scheme in ("http", "https") and parts.username is not None:
        os.environ["MLFLOW_TRACKING_USERNAME"] = urllib.parse.unquote(parts.username)
        os.environ["MLFLOW_TRACKING_PASSWORD"] = urllib.parse.unquote(parts.password or "")
        return without_credentials(uri)
    return uri


def check_uri(uri: str) -> None:
    """A tracking URI MLflow can open and, for SQLite, a database file raybench can create: checked before
    anything is written, so a typo is one line instead of a traceback after Ray has started."""
    scheme = urllib.parse.urlsplit(uri).scheme.split("+")[0]
    if scheme not in SCHEMES:
        raise TrackingError(f"expected a URI with one of the schemes {', '.join(SCHEMES)}, got {redact_uri(uri)!r}")
    if scheme == "sqlite":
        path = Path(uri.removeprefix("sqlite:///"))
        if uri.startswith("sqlite:///") and str(path) not in ("", ":memory:"):
            problem = None if path.is_file() else writable_dir_problem(path.parent)
            if path.exists() and not path.is_file():
                problem = f"{str(path)!r} is not a file"
            if problem is None and path.is_file():  # a damaged store: one line now, not SQLAlchemy's traceback later
                problem = sqlite_damage(path)
            if problem:
                raise TrackingError(f"cannot use the SQLite database {str(path)!r}: {problem}")


def _health_request(uri: str) -> urllib.request.Request:
    """GET <server>/health, with user:password from the URI sent as HTTP basic auth (urllib ignores it)."""
    parts = urllib.parse.urlsplit(uri)
    request = urllib.request.Request(without_credentials(uri).rstrip("/") + "/health")
    if parts.username is not None:
        pair = f"{urllib.parse.unquote(parts.username)}:{urllib.parse.unquote(parts.password or '')}"
        request.add_header("Authorization", "Basic " + base64.b64encode(pair.encode()).decode())
    return request


def check_reachable(uri: str, timeout_s: float = 5.0) -> None:
    """Fail fast, before any training, when an HTTP tracking server does not answer its health check."""
    check_uri(uri)
    if not uri.startswith(("http://", "https://")):
        return
    shown = redact_uri(uri)
    try:
        with urllib.request.urlopen(_health_request(uri), timeout=timeout_s) as response:
            if response.status != 200:
                raise TrackingError(f"MLflow server at {shown} answered /health with HTTP {response.status}")
    except urllib.error.HTTPError as err:
        raise TrackingError(f"MLflow server at {shown} answered /health with HTTP {err.code}") from None
    except (urllib.error.URLError, OSError) as err:
        reason = getattr(err, "reason", err)
        raise TrackingError(f"MLflow server at {shown} is unreachable ({reason}); start it or pass another --tracking-uri") from None


def quoted(value: str) -> str:
    """`value` as a string literal of an MLflow filter: single-quoted, or double-quoted if it holds a quote."""
    if "'" not in value:
        return f"'{value}'"
    if '"' not in value:
        return f'"{value}"'
    raise TrackingError(f"cannot search MLflow for a value holding both quote characters: {value!r}")


def driver_identity() -> str:
    """host:pid:start-time of this process, so a later reader can tell whether the sweep's driver still lives."""
    return f"{socket.gethostname()}:{os.getpid()}:{_process_start(os.getpid())}"


def _process_start(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return "?"


def driver_alive(identity: str | None) -> bool | None:
    """Whether the process named by `driver_identity()` still runs; None when it ran on another host."""
    if not identity or identity.count(":") < 2:
        return None
    host, pid, start = identity.rsplit(":", 2)
    if host != socket.gethostname():
        return None
    return pid.isdigit() and _process_start(int(pid)) == start


def git_commit() -> str | None:
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


def ui_link(server: str, experiment_id: str, run_id: str | None = None) -> str:
    """The MLflow UI page of a run (or of the experiment's runs) in the model-training view: MLflow 3's UI
    otherwise opens in its GenAI view, on traces this experiment does not have."""
    page = f"#/experiments/{experiment_id}" + (f"/runs/{run_id}" if run_id else "")
    return f"{server.rstrip('/')}/{page}?workflowType=machine_learning"


def run_description(markdown: str, limit: int = DESCRIPTION_LIMIT) -> str:
    """`markdown` as a run description: whole when it fits MLflow's tag limit, else cut at a line end with a
    pointer to the full text (the summary artifact), so the selected config and the table always show."""
    if len(markdown) <= limit:
        return markdown
    tail = "\n\n(cut here to fit MLflow's description limit; the whole summary is the artifact summary.md)\n"
    cut = markdown.rfind("\n", 0, limit - len(tail))
    return markdown[:max(cut, 0)] + tail


def flatten(values: Mapping[str, Any], prefix: str = "") -> dict[str, str]:
    flat: dict[str, str] = {}
    for key, value in values.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            flat.update(flatten(value, f"{name}."))
        else:
            flat[name] = str(value)[:MAX_PARAM_LENGTH]
    return flat


# ----- every call to the store, counted, timed and (when safe) retried ------------------------------------
# Calls a retry cannot duplicate: reads, tag and status writes, and log_batch, whose metrics carry their own
# timestamp and step (the SQL store drops rows it already has). create_run is not among them: a retry
# after a lost response would make a second run.
IDEMPOTENT = frozenset({"log_batch", "set_tag", "set_terminated", "update_run", "search_runs", "get_run",
                        "get_experiment_by_name", "get_metric_history", "set_experiment_tag"})
RETRIES = 4  # after MLflow's own HTTP retries (MLFLOW_HTTP_REQUEST_MAX_RETRIES) have given up
TRANSIENT = ("database is locked", "database table is locked", "Max retries exceeded", "Connection refused",
             "Connection reset", "Read timed out", "RemoteDisconnected", "error code 429", "error code 500",
             "error code 502", "error code 503", "error code 504")
# urllib3's NewConnectionError: no TCP connection was made, so no byte of the request left. Any call, create_run
# included, is safe to send again; a lost response (a read timeout, a reset after sending) is not.
NEVER_SENT = "Failed to establish a new connection"
# A tracking server that refuses connections (stopped, restarting) is waited for this long by a background
# client (the trial-run writer) before its call fails: a server down for a minute or a few costs a sweep nothing.
OUTAGE_S = 300.0
OUTAGE_BACKOFF_S = 0.5  # its first wait, doubled on each refusal up to OUTAGE_BACKOFF_MAX_S
OUTAGE_BACKOFF_MAX_S = 5.0  # so the writer is back within seconds of the server, not after MLflow's 2-minute backoff
PROBE_IDLE_S = 1.0  # a background call after this long without one first checks that the server takes connections
PROBE_TIMEOUT_S = 5.0


@dataclass
class TrackingStats:
    """What this process asked of the tracking store: calls, calls that failed for good, and attempts repeated,
    by raybench after a transient error or by MLflow's HTTP client (urllib3's retries). `seconds` is what the
    sweep waited on the store (its own calls, and its waits for the trial-run writer to drain);
    `background_seconds` is the writer's own calls, made while the sweep went on (TrialRunWriter)."""

    calls: int = 0
    seconds: float = 0.0
    failed: int = 0
    retried: int = 0
    http_retries: int = 0
    background_seconds: float = 0.0

    def as_dict(self) -> dict[str, float]:
        return dataclasses.asdict(self)

    def since(self, start: TrackingStats) -> TrackingStats:
        return TrackingStats(*(getattr(self, f.name) - getattr(start, f.name) for f in dataclasses.fields(self)))


PROCESS_STATS = TrackingStats()  # every counted client of this process adds to it


class _HttpRetryCounter(logging.Handler):
    """urllib3 logs each retry of MLflow's HTTP client as "Retrying (Retry(total=...))"."""

    def emit(self, record: logging.LogRecord) -> None:
        if record.getMessage().startswith("Retrying"):
            PROCESS_STATS.http_retries += 1


logging.getLogger("urllib3.connectionpool").addHandler(_HttpRetryCounter(level=logging.WARNING))


def is_transient(err: Exception) -> bool:
    return any(marker in str(err) for marker in TRANSIENT)


def never_sent(err: Exception) -> bool:
    """Whether the request provably never reached the server (the connection itself failed)."""
    return isinstance(err, ConnectionRefusedError) or NEVER_SENT in str(err)


def server_address(uri: str | None) -> tuple[str, int] | None:
    """(host, port) of an http(s) tracking URI that MLflow reaches directly; None for a local store (no server to
    be down) and for one reached through a proxy (HTTP(S)_PROXY), where the host may refuse what the proxy gets."""
    parts = urllib.parse.urlsplit(uri or "")
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return None
    if parts.scheme in urllib.request.getproxies() and not urllib.request.proxy_bypass(parts.hostname):
        return None
    return parts.hostname, parts.port or (443 if parts.scheme == "https" else 80)


def refuses_connections(address: tuple[str, int]) -> bool:
    """Whether the server refuses a TCP connection: it is down. A timeout or an unreachable network proves
    nothing (a slow or distant server), and is left to the call and its retries."""
    try:
        with socket.create_connection(address, timeout=PROBE_TIMEOUT_S):
            return False
    except ConnectionRefusedError:
        return True
    except OSError:
        return False


class OutageWait:
    """One call's wait for a server that refuses connections: a capped backoff, OUTAGE_S in all from the first
    refusal. MLflow's own HTTP client also retries a refused connection, but its backoff doubles to two minutes,
    so after a one-minute outage it could sit idle for another minute; this one looks again every few seconds."""

    def __init__(self) -> None:
        self.started: float | None = None
        self.waits = 0

    def another(self) -> bool:
        """Sleep the next backoff and say True, or say False once OUTAGE_S have passed since the first refusal."""
        now = time.monotonic()
        self.started = now if self.started is None else self.started
        if now - self.started >= OUTAGE_S:
            return False
        time.sleep(min(OUTAGE_BACKOFF_S * 2 ** self.waits, OUTAGE_BACKOFF_MAX_S))
        self.waits += 1
        return True


class CountedClient:
    """An MlflowClient whose every call is counted and timed in PROCESS_STATS; idempotent calls that meet a
    transient error (a locked SQLite file, a refused or dropped connection, a 5xx) are tried again with a
    backoff, so a busy store slows a sweep down instead of losing a trial's record.

    A `background` client (the trial-run writer's, which the sweep does not wait on) also outlasts a server that
    is down: any call whose connection is refused, create_run included (its request never arrived), is tried
    again for up to OUTAGE_S, and a call after an idle spell first waits, the same way, until the server at
    `uri` takes connections, so it never enters MLflow's own slower retries when the server is known to be down."""

    BACKOFF_S = 0.5

    def __init__(self, client: MlflowClient, background: bool = False, uri: str | None = None) -> None:
        self._client, self._background = client, background
        self._address = server_address(uri) if background else None
        self._last_call = -math.inf  # when this client's last call ended (time.monotonic)

    def __getattr__(self, name: str) -> Any:
        attribute = getattr(self._client, name)
        if not callable(attribute):
            return attribute

        def counted(*args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            try:
                return self._call(name, attribute, args, kwargs)
            except Exception:
                PROCESS_STATS.failed += 1
                raise
            finally:
                PROCESS_STATS.calls += 1
                if self._background:
                    PROCESS_STATS.background_seconds += time.perf_counter() - start
                else:
                    PROCESS_STATS.seconds += time.perf_counter() - start

        return counted

    def _call(self, name: str, method: Any, args: tuple, kwargs: dict) -> Any:
        outage, attempt = OutageWait(), 0
        while True:
            if self._server_down() and outage.another():
                continue
            try:
                return method(*args, **kwargs)
            except Exception as err:
                if self._background and never_sent(err) and outage.another():
                    PROCESS_STATS.retried += 1
                    continue
                if name not in IDEMPOTENT or attempt == RETRIES or not is_transient(err):
                    raise
                PROCESS_STATS.retried += 1
                time.sleep(self.BACKOFF_S * 2 ** attempt)
                attempt += 1
            finally:
                self._last_call = time.monotonic()

    def _server_down(self) -> bool:
        """Whether a background client's server refuses connections, looked at only after an idle spell: a call
        right after another finds the server as that one did, and a busy writer pays no extra round trip."""
        if self._address is None or time.monotonic() - self._last_call < PROBE_IDLE_S:
            return False
        down = refuses_connections(self._address)
        if not down:
            self._last_call = time.monotonic()
        return down


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

    def __init__(self, uri: str, experiment: str = EXPERIMENT, background: bool = False) -> None:
        """A foreground tracker checks the store at once, so a sweep fails fast before any training. A
        `background` one (the trial-run writer's, made when a stage's first trial starts) asks nothing of the
        store until its first write, in the writer's thread, which waits out a server that is down."""
        if not background:
            check_reachable(uri)
        self.uri = credentials_to_environment(uri)
        self.client = CountedClient(MlflowClient(tracking_uri=self.uri), background, self.uri)
        self._experiment_name = experiment
        self._experiment_id = None if background else self._experiment(experiment)
        self.parent_id: str | None = None

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
            if EXPERIMENT_KIND_TAG not in found.tags:
                self.client.set_experiment_tag(found.experiment_id, EXPERIMENT_KIND_TAG, MODEL_TRAINING_KIND)
            return found.experiment_id
        location = None
        if self.uri.startswith("sqlite:"):  # keep artifacts next to the database, not in the cwd of whoever reads
            location = (Path(self.uri.removeprefix("sqlite:///")).parent / "mlartifacts").resolve().as_uri()
        return self.client.create_experiment(name, artifact_location=location,
                                             tags={EXPERIMENT_KIND_TAG: MODEL_TRAINING_KIND})

    def _find(self, filter_string: str) -> Any | None:
        runs = self.client.search_runs([self.experiment_id], filter_string, max_results=1, order_by=["attributes.start_time DESC"])
        return runs[0] if runs else None

    # ----- the sweep's parent run ------------------------------------------------------------------
    def start_sweep(self, name: str, params: Mapping[str, Any], tags: Mapping[str, str],
                    parent_run: str | None = None) -> str:
        """The sweep's parent run, reused when resuming; nested under `parent_run` (a benchmark's) if given."""
        existing = self._find(f"tags.`{SWEEP_TAG}` = {quoted(name)} and tags.stage = 'sweep'")
        nesting = {PARENT_TAG: parent_run} if parent_run else {}
        if existing is not None:
            self.parent_id = existing.info.run_id
            self.client.update_run(self.parent_id, status="RUNNING")
            self._tag(self.parent_id, nesting)
        else:
            run = self.client.create_run(self.experiment_id, run_name=name,
                                         tags={**tags, **nesting, SWEEP_TAG: name, "stage": "sweep"})
            self.parent_id = run.info.run_id
            self._log(self.parent_id, params=flatten(params))
        self._tag(self.parent_id, {STATE_TAG: State.RUNNING.value, DRIVER_TAG: driver_identity(),
                                   **{k: v for k, v in tags.items() if k == RESUME_TAG}})
        return self.parent_id

    def check_parent_run(self, run_id: str) -> str | None:
        """A parent run must exist in this store's experiment: a mistyped id would nest the sweep under nothing.
        Returns the parent's resume command when the parent is a benchmark's run (a sweep nested in a benchmark
        is resumed by resuming the benchmark), else None."""
        try:
            run = self.client.get_run(run_id)
        except Exception:  # noqa: BLE001  MLflow raises several types for an unknown or malformed id
            raise TrackingError(f"expected a run id in the MLflow store at {redact_uri(self.uri)}, got {run_id!r}") from None
        if run.info.experiment_id != self.experiment_id:
            raise TrackingError(f"expected a run of the raybench experiment, got {run_id!r} (in experiment "
                                f"{run.info.experiment_id})")
        return run.data.tags.get(RESUME_TAG) if run.data.tags.get("stage") == "benchmark" else None

    def end_sweep(self, status: str, note: str | None = None) -> None:
        """Close the parent run; an interrupted sweep (KILLED) also closes every child still RUNNING, so no
        run claims to be alive after its driver has gone. The stage's trial-run writers are drained first (their
        error, if any, already ended the sweep and is its note) and stopped."""
        assert self.parent_id is not None
        TrialRunWriter.close_all()
        if note:
            self.client.set_tag(self.parent_id, "failure_reason", note[:5000])
        state = SWEEP_STATE_OF_STATUS.get(status, State.FAILED)
        self.client.set_tag(self.parent_id, STATE_TAG, state.value)
        if status != "FINISHED":
            for run in self.children(nested=True):
                if run.info.status == "RUNNING":
                    self.client.set_terminated(run.info.run_id, status="KILLED")
        self.client.set_terminated(self.parent_id, status=status)

    def _tag(self, run_id: str, tags: Mapping[str, str]) -> None:
        if tags:  # one request for all of them
            self.client.log_batch(run_id, tags=[RunTag(k, str(v)) for k, v in tags.items()])

    def set_tags(self, run_id: str, tags: Mapping[str, str]) -> None:
        self._tag(run_id, tags)

    def log_artifacts(self, directory: Path, artifact_path: str | None = None) -> None:
        assert self.parent_id is not None
        self.client.log_artifacts(self.parent_id, str(directory), artifact_path)

    def log_artifact(self, file: Path, artifact_path: str | None = None, run_id: str | None = None) -> None:
        self.client.log_artifact(run_id or self.parent_id, str(file), artifact_path)

    def log_summary(self, markdown: str, metrics: Mapping[str, float]) -> None:
        """The sweep's short markdown summary (an artifact, and the parent run's description in the UI) and its
        headline numbers, on the parent run."""
        assert self.parent_id is not None
        self.client.log_text(self.parent_id, markdown, "summary.md")
        self.client.set_tag(self.parent_id, DESCRIPTION_TAG, run_description(markdown))
        self._log(self.parent_id, metrics=numeric_metrics(metrics))

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
        tags = {"stage": "method_stage", "raybench.method_stage": name, "cached": str(stage.get("cached", False))}
        params = {"stage_key": stage.get("key") or "-", **dict(stage.get("facts", {}))}
        run, created = self._nested(trial_run, f"{trial_key}/{name}", f"{name}-{trial_key}", params, tags, look_up)
        if not created:
            return
        for step, metrics in enumerate(stage.get("history") or []):
            self._log(run, metrics=numeric_metrics(metrics), step=int(metrics.get("epoch", step)))
        self._log(run, metrics=numeric_metrics({f"final/{k}": v for k, v in stage.get("metrics", {}).items()}
                                               | {"seconds": stage.get("seconds", 0.0)}))
        weights = Path(str(stage.get("facts", {}).get(STAGE_WEIGHTS_FACT, "")))
        if weights.is_file():  # a pre-trained featurizer, so a later run can start from it (absent on another host)
            self.client.log_artifact(run, str(weights), name)
        self.client.set_terminated(run, status="FINISHED")

    def _nested(self, parent: str, key: str, run_name: str, params: Mapping[str, Any],
                tags: Mapping[str, str], look_up: bool = True) -> tuple[str, bool]:
        existing = self._find(f"tags.`{KEY_TAG}` = {quoted(key)} and tags.`{PARENT_TAG}` = {quoted(parent)}") \
            if look_up else None
        if existing is not None:
            self.client.update_run(existing.info.run_id, status="RUNNING")
            return existing.info.run_id, False
        run = self.client.create_run(self.experiment_id, run_name=run_name, tags={**tags, KEY_TAG: key, PARENT_TAG: parent})
        self._log(run.info.run_id, params=flatten(params))
        return run.info.run_id, True

    def log_metrics(self, run_id: str, metrics: Mapping[str, Any], step: int,
                    tags: Mapping[str, str] | None = None, timestamp_ms: int | None = None) -> None:
        self._log(run_id, metrics=numeric_metrics(metrics), step=step, tags=tags, timestamp_ms=timestamp_ms)

    def end_child(self, run_id: str, status: str, reason: str | None = None,
                  tags: Mapping[str, str] | None = None) -> None:
        self._tag(run_id, {**({"failure_reason": reason[:5000]} if reason else {}), **(tags or {})})
        self.client.set_terminated(run_id, status=status)

    def _log(self, run_id: str, params: dict[str, str] | None = None, metrics: dict[str, float] | None = None,
             step: int = 0, tags: Mapping[str, str] | None = None, timestamp_ms: int | None = None) -> None:
        now = timestamp_ms or now_ms()
        self.client.log_batch(
            run_id,
            metrics=[Metric(k, v, now, step) for k, v in (metrics or {}).items()],
            params=[Param(k, v) for k, v in (params or {}).items()],
            tags=[RunTag(k, str(v)) for k, v in (tags or {}).items()],
        )

    def children(self, nested: bool = False) -> list[Any]:
        """The trial and replicate runs of this sweep; with `nested`, their stage runs too."""
        assert self.parent_id is not None
        found, frontier = [], [self.parent_id]
        while frontier:
            runs = [run for parent in frontier for run in self.client.search_runs(
                [self.experiment_id], f"tags.`{PARENT_TAG}` = {quoted(parent)}", max_results=10000)]
            found += runs
            frontier = [run.info.run_id for run in runs] if nested else []
        return found


    def selection_curves(self, metric: str, trial_id: str) -> list[tuple[str, list[int], list[float]]]:
        """(label, epochs, values) of `metric` per epoch for the search run of `trial_id`, then every replicate."""
        curves = []
        for run in sorted(self.children(), key=lambda r: (r.data.tags.get("stage") != "search", r.info.start_time)):
            tags = run.data.tags
            if tags.get("stage") == "search" and tags.get("trial_id") == trial_id:
                label = f"selected trial {trial_id}"
            elif tags.get("stage") == "replicate":
                label = f"replicate, seed {tags.get('seed', '?')}"
            else:
                continue
            history = sorted(self.client.get_metric_history(run.info.run_id, metric), key=lambda m: m.step)
            curves.append((label, [m.step for m in history], [m.value for m in history]))
        return curves


# ----- a sweep stage's trial runs, written beside the sweep instead of in its way -------------------------
TRIAL_JOURNAL = "tracking-journal.jsonl"  # in a stage's Tune experiment folder under --storage


def now_ms() -> int:
    return int(time.time() * 1000)


class WriteKind(str, Enum):
    OPEN = "open"  # the trial's run: created, or found again when resuming
    EPOCH = "epoch"  # one epoch's metrics (and node tags), at the epoch's step
    TAGS = "tags"
    STAGE = "stage"  # an earlier stage of a multi-stage method, as a run nested in the trial's
    END = "end"  # the run's closing metrics (what it used), its status and failure reason


@dataclass(frozen=True)
class RunWrite:
    """One write to a trial's run, which it names by the run's key: what the sweep's Tune callback hands the
    writer, and one line of the stage's journal. Metrics carry the time they were reported, so writing them
    again changes nothing: MLflow's SQL store keeps a metric row (key, time, step, value) once."""

    kind: WriteKind
    key: str
    run_name: str = ""
    params: dict[str, Any] = field(default_factory=dict)
    tags: dict[str, str] = field(default_factory=dict)
    metrics: dict[str, float] = field(default_factory=dict)
    step: int = 0
    timestamp_ms: int = 0
    status: str = ""
    reason: str | None = None
    stage: dict[str, Any] | None = None

    def line(self) -> str:
        return json.dumps({**dataclasses.asdict(self), "kind": self.kind.value}, default=str)

    @classmethod
    def from_line(cls, line: str) -> RunWrite:
        values = json.loads(line)
        return cls(**{**values, "kind": WriteKind(values["kind"])})


def read_journal(path: Path) -> list[RunWrite]:
    """The writes a stage's earlier drivers handed over; a last line cut short by a kill is dropped (its write
    was never handed over: the journal is appended before the queue)."""
    if not path.is_file():
        return []
    writes = []
    for line in path.read_text().splitlines():
        try:
            writes.append(RunWrite.from_line(line))
        except (ValueError, TypeError, KeyError):
            continue
    return writes


class TrialRunWriter:
    """The trial runs of one sweep stage, written to MLflow in order by one background thread, so that Tune's
    callback only hands writes over and the driver never waits on the store between trials (over HTTP each
    call costs tens of milliseconds, and Tune's loop, which schedules the next trial, runs the callback).

    Nothing is lost: each write is appended to the stage's journal (TRIAL_JOURNAL, on --storage) before it is
    queued. The writer is drained at every stage's end (Tune returns from a Ctrl-C too) and before the sweep's
    parent run is closed (a SIGTERM or an error), and a resumed sweep writes its journal again first: a driver
    killed outright (SIGKILL) leaves writes the store never got, and writing again those it did get changes
    nothing (runs are found by key, metrics keep their time, tags and statuses are set to the same values). A
    write that fails for good stops the writer: the sweep ends with that error, and `--resume` writes the rest.
    A tracking server that is down is no such failure: the writer's client waits for it (OUTAGE_S, CountedClient)
    and the sweep goes on meanwhile, so a server stopped for a minute in a stage costs nothing; the writer only
    asks the store for anything in its own thread, never when Tune's callback makes it at a stage's start.
    One writer per stage journal in a process: a copy of Tune's callback restored from its experiment state
    finds the same one."""

    _open: ClassVar[dict[Path, TrialRunWriter]] = {}
    _lock: ClassVar[threading.Lock] = threading.Lock()

    def __init__(self, uri: str, parent_id: str, journal: Path, resuming: bool) -> None:
        self.tracker = SweepTracker(uri, background=True)
        self.tracker.parent_id = parent_id
        self.journal, self.resuming = journal, resuming
        self.runs: dict[str, str] = {}  # run key -> run id; below, the writer thread's own bookkeeping
        self.logged_through: dict[str, int] = {}  # per key, the last epoch in the store
        self.ended: set[str] = set()
        self.live: set[str] = set()  # opened by this driver's trials, not only named by the journal
        self.stages: set[str] = set()
        self.error: Exception | None = None
        self.error_raised = False
        self.queue: queue.Queue[tuple[RunWrite, bool] | None] = queue.Queue()
        for write in read_journal(journal) if resuming else []:
            self.queue.put((write, True))
        journal.parent.mkdir(parents=True, exist_ok=True)
        self._journal = journal.open("a")
        self.thread = threading.Thread(target=self._work, name="raybench-tracking-writer", daemon=True)
        self.thread.start()

    @classmethod
    def for_stage(cls, uri: str, parent_id: str, journal: Path, resuming: bool) -> TrialRunWriter:
        with cls._lock:
            writer = cls._open.get(journal)
            if writer is None:
                writer = cls._open[journal] = cls(uri, parent_id, journal, resuming)
            return writer

    @classmethod
    def drain_all(cls) -> None:
        """Wait until every write handed over in this process is in the store; raise the first write that failed."""
        for writer in list(cls._open.values()):
            writer.drain()

    @classmethod
    def close_all(cls) -> None:
        """Drain every writer, without raising (the sweep is ending: a failed write is already its error), and
        stop their threads."""
        with cls._lock:
            writers, cls._open = list(cls._open.values()), {}
        for writer in writers:
            writer.close()

    def submit(self, write: RunWrite) -> None:
        self._raise_failure()
        self._journal.write(write.line() + "\n")
        self._journal.flush()  # in the kernel's hands: a killed driver's journal still has it
        self.queue.put((write, False))

    def drain(self) -> None:
        start = time.perf_counter()
        self.queue.join()
        PROCESS_STATS.seconds += time.perf_counter() - start
        self._raise_failure()

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.drain()
        self.queue.put(None)
        self.thread.join()
        self._journal.close()

    def _raise_failure(self) -> None:
        if self.error is not None and not self.error_raised:
            self.error_raised = True
            raise TrackingError(f"tracking store {redact_uri(self.tracker.uri)}: {self.error}") from self.error

    def _work(self) -> None:
        while (item := self.queue.get()) is not None:
            try:
                if self.error is None:
                    self._apply(*item)
            except Exception as err:  # noqa: BLE001  kept for the sweep's thread to raise; the journal keeps the write
                self.error = err
            finally:
                self.queue.task_done()
        self.queue.task_done()

    def _apply(self, write: RunWrite, replayed: bool) -> None:
        if write.kind is WriteKind.OPEN:
            self._open_run(write, replayed)
            return
        run = self.runs[write.key]
        if write.kind is WriteKind.EPOCH:
            self._log_epoch(run, write, replayed)
        elif write.kind is WriteKind.TAGS:
            self.tracker.set_tags(run, write.tags)
        elif write.kind is WriteKind.STAGE and write.stage is not None:
            self._log_stage(run, write)
        elif write.kind is WriteKind.END:
            self._end(run, write)

    def _open_run(self, write: RunWrite, replayed: bool) -> None:
        """A key seen before in this process (a repeated config, a replayed record, a run the journal named)
        reuses its run, set running again as a resumed run is."""
        key = write.key
        if key not in self.runs:
            self.runs[key], self.logged_through[key] = self.tracker.open_child(
                key, write.run_name, write.params, write.tags, look_up=self.resuming)
        elif not replayed and (key in self.ended or key not in self.live):
            self.tracker.client.update_run(self.runs[key], status="RUNNING")
        if not replayed:
            self.live.add(key)
            self.ended.discard(key)

    def _log_epoch(self, run: str, write: RunWrite, replayed: bool) -> None:
        """An epoch the store already has (a resumed trial ran it again after its last checkpoint) sends only
        its tags; one written again from the journal is sent whole, as its metrics keep their time."""
        if not replayed and write.step <= self.logged_through[write.key]:
            if write.tags:
                self.tracker.set_tags(run, write.tags)
            return
        self.tracker.log_metrics(run, write.metrics, step=write.step, tags=write.tags, timestamp_ms=write.timestamp_ms)
        self.logged_through[write.key] = max(self.logged_through[write.key], write.step)

    def _log_stage(self, run: str, write: RunWrite) -> None:
        stage_key = f"{write.key}/{write.stage['name']}"
        if stage_key not in self.stages:
            self.tracker.log_stage(run, write.key, write.stage, look_up=self.resuming)
            self.stages.add(stage_key)

    def _end(self, run: str, write: RunWrite) -> None:
        tags = write.tags
        if write.metrics:  # what the run used, with the tags in one request
            self.tracker.log_metrics(run, write.metrics, step=write.step, tags=tags, timestamp_ms=write.timestamp_ms)
            tags = {}
        self.tracker.end_child(run, write.status, reason=write.reason, tags=tags)
        self.ended.add(write.key)


# ----- a NeWT-style task suite ---------------------------------------------------------------------------
SUITE_STAGE = "newt_suite"
SUITE_TASK_STAGE = "newt_task"


def suite_params(result: SuiteResult) -> dict[str, Any]:
    """What a suite run was asked for, as the parent run's params (model and per_class as run)."""
    s = result.settings
    return {"dataset": s.dataset, "model": s.model, "features_from": s.features_from, "seed": s.seed,
            "per_class": s.per_class, "c_grid": s.c_grid, "folds": s.folds, "n_tasks": len(result.tasks)}


def suite_metrics(result: SuiteResult) -> dict[str, float]:
    """The suite's headline numbers: mean test accuracy per cluster (`accuracy/<cluster>`) and overall."""
    return {**{f"accuracy/{cluster}": mean for cluster, mean in result.cluster_means.items()},
            "accuracy/overall": result.overall_mean}


def task_params(task: TaskResult) -> dict[str, Any]:
    return {"pair": task.task, "first": task.first, "second": task.second, "cluster": task.cluster,
            "n_train": task.n_train, "n_test": task.n_test}


def task_metrics(task: TaskResult) -> dict[str, float]:
    return {"accuracy": task.accuracy, "best_c": task.best_c, "cv_accuracy": task.cv_accuracy,
            "unconverged_fits": task.unconverged_fits}


def log_task_suite(uri: str, result: SuiteResult, experiment: str = EXPERIMENT) -> str:
    """A finished suite as one parent run (settings, cluster and overall means) with one nested run per task
    (its pair, cluster, accuracy, chosen C, cross-validated accuracy); returns the parent's run id.

    Every run is new: a suite takes a minute, so a re-run is a fresh measurement, not a resumption. A failure
    half way marks the parent FAILED, so the store never shows a suite with a silently missing task.
    """
    tracker = SweepTracker(uri, experiment)
    client, s = tracker.client, result.settings
    tags = {**base_tags(s.dataset, "newt_probe"), "stage": SUITE_STAGE, "model": str(s.model),
            "features_source": result.features_source[:5000]}
    parent = client.create_run(tracker.experiment_id, run_name=result.name, tags=tags).info.run_id
    try:
        tracker._log(parent, params=flatten(suite_params(result)), metrics=numeric_metrics(suite_metrics(result)))
        for task in result.tasks:
            child = client.create_run(tracker.experiment_id, run_name=f"{task.task} ({task.cluster})", tags={
                "stage": SUITE_TASK_STAGE, "cluster": task.cluster, PARENT_TAG: parent,
                KEY_TAG: f"{result.name}/{task.task}"}).info.run_id
            tracker._log(child, params=flatten(task_params(task)), metrics=numeric_metrics(task_metrics(task)))
            client.set_terminated(child, status="FINISHED")
    except BaseException:
        client.set_terminated(parent, status="FAILED")
        raise
    client.set_terminated(parent, status="FINISHED")
    return parent


class BenchmarkTracker(SweepTracker):
    """A benchmark's parent run: its sweeps' parent runs nest under it; the comparison is attached to it."""

    def start_benchmark(self, name: str, params: Mapping[str, Any], resume_command: str | None) -> str:
        existing = self._find(f"tags.`{BENCHMARK_TAG}` = {quoted(name)} and tags.stage = 'benchmark'")
        if existing is not None:
            self.parent_id = existing.info.run_id
            self.client.update_run(self.parent_id, status="RUNNING")
        else:
            run = self.client.create_run(self.experiment_id, run_name=f"benchmark {name}",
                                         tags={BENCHMARK_TAG: name, "stage": "benchmark"})
            self.parent_id = run.info.run_id
            self._log(self.parent_id, params=flatten(params))
        self._tag(self.parent_id, {STATE_TAG: State.RUNNING.value, DRIVER_TAG: driver_identity(),
                                   **({RESUME_TAG: resume_command} if resume_command else {})})
        return self.parent_id

    def end_benchmark(self, markdown: str, status: str, note: str | None = None) -> None:
        """The pairs' table as the run's description and `summary.md`, then the run closed with `status`."""
        assert self.parent_id is not None
        self.client.log_text(self.parent_id, markdown, "summary.md")
        self.client.set_tag(self.parent_id, DESCRIPTION_TAG, run_description(markdown))
        self.end_sweep(status, note)


# ----- reading a finished sweep back ------------------------------------------------------------------
@dataclass(frozen=True)
class SweepState:
    """Where a sweep stands, as its parent run says: the line `raybench results` prints above the table."""

    state: str  # a records.SweepState value (finished, interrupted, failed, running, driver-gone) or a hand-set tag
    resume_command: str | None

    @property
    def resumable(self) -> bool:
        return self.state not in (State.FINISHED, State.RUNNING)

    def line(self, name: str) -> str:
        words = {
            State.FINISHED: f"sweep {name}: finished",
            State.RUNNING: f"sweep {name}: running (its driver is alive, or on another host)",
            State.INTERRUPTED: f"sweep {name}: INTERRUPTED before it finished; its results are partial",
            State.DRIVER_GONE: f"sweep {name}: INTERRUPTED (its driver process is gone); its results are partial",
            State.FAILED: f"sweep {name}: FAILED; its results are partial",
        }
        line = words.get(self.state, f"sweep {name}: {self.state}")
        if self.resumable and self.resume_command:
            line += f"; resume with: {self.resume_command}"
        return line


def sweep_state(parent: Any) -> SweepState:
    tags = parent.data.tags
    state = tags.get(STATE_TAG) or SWEEP_STATE_OF_STATUS.get(parent.info.status, State.RUNNING).value
    if parent.info.status == "RUNNING" and driver_alive(tags.get(DRIVER_TAG)) is False:
        state = State.DRIVER_GONE.value
    elif parent.info.status == "RUNNING":
        state = State.RUNNING.value
    return SweepState(state, tags.get(RESUME_TAG))


@dataclass(frozen=True)
class RecordedSweep:
    """A sweep's parent run as the store has it: the flags it was started with (its params, as logged) and
    where it stands, so a new driver can tell an existing sweep and a resume with changed flags apart."""

    run_id: str
    params: dict[str, str]
    status: str  # MLflow's: RUNNING, FINISHED, KILLED, FAILED
    state: SweepState


def find_recorded_sweep(uri: str, name: str) -> RecordedSweep | None:
    """The parent run of sweep `name` in the store at `uri`, read without writing anything: None when the
    store has no such run, or is no MLflow store yet (a SQLite file that is missing or has no MLflow tables).
    Such a file is not opened: MlflowClient would create the schema, which the sweep's own tracker does once
    its driver holds the sweep lock, so two drivers never race to create it."""
    if _missing_sqlite_file(uri) is not None or _not_an_mlflow_sqlite_file(uri) is not None:
        return None
    check_reachable(uri)
    client = CountedClient(MlflowClient(tracking_uri=credentials_to_environment(uri)))
    experiment = client.get_experiment_by_name(EXPERIMENT)
    if experiment is None:
        return None
    runs = client.search_runs([experiment.experiment_id], f"tags.`{SWEEP_TAG}` = {quoted(name)} and tags.stage = 'sweep'",
                              max_results=1, order_by=["attributes.start_time DESC"])
    if not runs:
        return None
    run = runs[0]
    return RecordedSweep(run.info.run_id, dict(run.data.params), run.info.status, sweep_state(run))


def download_plots(uri: str, parent_id: str, directory: Path) -> list[Path]:
    """The sweep's figures (the parent run's artifact folder `plots`) copied into `directory`."""
    client = MlflowClient(tracking_uri=credentials_to_environment(uri))
    with tempfile.TemporaryDirectory() as tmp:
        try:
            found = Path(client.download_artifacts(parent_id, "plots", tmp))
        except Exception:  # noqa: BLE001  MLflow raises several types for a missing artifact
            raise TrackingError("this sweep has no plots (it ended before its results were recorded)") from None
        directory.mkdir(parents=True, exist_ok=True)
        copies = []
        for png in sorted(found.glob("*.png")):
            partial = directory / f".{png.name}.partial"  # a reader of DIR never sees half a figure
            partial.write_bytes(png.read_bytes())
            partial.replace(directory / png.name)
            copies.append(directory / png.name)
    return copies


def load_sweep_results(uri: str, name: str) -> SweepSummary:
    """The parent run of sweep `name` and its `results/summary.json` artifact, with where the sweep stands."""
    client, parent = _sweep_parent(uri, name)
    summary = _parent_summary(client, parent)
    if summary is None:
        raise TrackingError(f"{sweep_state(parent).line(name)}; no results were recorded yet")
    return summary


def _sweep_parent(uri: str, name: str) -> tuple[MlflowClient, Any]:
    """The store at `uri` and sweep `name`'s parent run in it; a TrackingError naming the sweep when it has none."""
    client, experiment_id = _sweep_store(uri)
    runs = client.search_runs([experiment_id], f"tags.`{SWEEP_TAG}` = {quoted(name)} and tags.stage = 'sweep'",
                              max_results=1)
    if not runs:
        raise TrackingError(f"no sweep named {name!r} in the MLflow store at {redact_uri(uri)}")
    return client, runs[0]


SELECTED_CHECKPOINT = "selected_checkpoint/best_model.pt"  # the parent run's copy of the selected trial's model


def download_selected_checkpoint(tracking_uri: str, sweep_name: str, destination: Path) -> Path:
    """The selected trial's `best_model.pt`, which the sweep logged on its parent run, copied into the folder
    `destination` (made if missing); returns the file, whole or not there. A sweep that logged none (it ended
    before selecting, or no trial finished) is a TrackingError naming the sweep."""
    client, parent = _sweep_parent(tracking_uri, sweep_name)
    destination = Path(destination)
    destination.mkdir(parents=True, exist_ok=True)
    target = destination / Path(SELECTED_CHECKPOINT).name
    with tempfile.TemporaryDirectory(dir=destination) as tmp:
        try:
            found = Path(client.download_artifacts(parent.info.run_id, SELECTED_CHECKPOINT, tmp))
        except Exception:  # noqa: BLE001  MLflow raises several types for a missing artifact
            raise TrackingError(f"{sweep_state(parent).line(sweep_name)}; it logged no selected checkpoint "
                                f"({SELECTED_CHECKPOINT} on its parent run {parent.info.run_id})") from None
        found.replace(target)  # a rename within `destination`: a reader never sees half a file
    return target


@dataclass(frozen=True)
class SweepRecord:
    """One sweep found in the store: its summary if it recorded one, else only where it stands."""

    name: str
    dataset: str
    algorithm: str
    state_line: str
    summary: SweepSummary | None
    damage: str | None = None  # why its recorded results cannot be read (then summary is None)


def find_sweeps(uri: str, names: tuple[str, ...] = (), dataset: str | None = None,
                algorithms: tuple[str, ...] = ()) -> list[SweepRecord]:
    """Every sweep matching the filter, oldest first (the order they were run in), summaries read back."""
    client, experiment_id = _sweep_store(uri)
    clauses = ["tags.stage = 'sweep'"] + ([f"tags.dataset = {quoted(dataset)}"] if dataset else [])
    parents = client.search_runs([experiment_id], " and ".join(clauses), order_by=["attributes.start_time ASC"],
                                 max_results=50000)
    records = []
    for parent in parents:
        tags = parent.data.tags
        name = tags.get(SWEEP_TAG, parent.info.run_name)
        if (names and name not in names) or (algorithms and tags.get("algorithm") not in algorithms):
            continue
        try:
            summary, damage = _parent_summary(client, parent), None
        except DamagedRecord as err:  # one damaged sweep is named and skipped; the others are still read
            summary, damage = None, str(err)
        records.append(SweepRecord(name, tags.get("dataset", "?"), tags.get("algorithm", "?"),
                                   sweep_state(parent).line(name), summary, damage))
    return records


def _sweep_store(uri: str) -> tuple[MlflowClient, str]:
    """The store a reading command (`results`, `compare`) reads; a SQLite file that is not there is an error,
    never a new empty database left behind."""
    missing = _missing_sqlite_file(uri)
    if missing is not None:
        raise TrackingError(f"no MLflow store at {redact_uri(uri)}: {str(missing)!r} does not exist")
    problem = _not_an_mlflow_sqlite_file(uri)
    if problem is not None:
        raise TrackingError(f"no MLflow store at {redact_uri(uri)}: {problem}")
    check_reachable(uri)
    client = MlflowClient(tracking_uri=credentials_to_environment(uri))
    experiment = client.get_experiment_by_name(EXPERIMENT)
    if experiment is None:
        raise TrackingError(f"no raybench sweeps in the MLflow store at {redact_uri(uri)}")
    return client, experiment.experiment_id


def is_new_sqlite_store(uri: str) -> bool:
    """Whether `uri` names a SQLite file that does not exist yet, which MLflow's client creates with its whole
    schema (Alembic's migrations, seconds of one core) when a tracker first opens it."""
    return _missing_sqlite_file(uri) is not None


def _missing_sqlite_file(uri: str) -> Path | None:
    scheme, _, rest = uri.partition(":///")
    if scheme.split("+")[0] != "sqlite" or not rest or rest == ":memory:":
        return None
    path = Path(rest.split("?")[0])
    return None if path.exists() else path


# Tables every MLflow SQL store has; MlflowClient creates them (about 65 in all) in any SQLite file it opens.
MLFLOW_TABLES = frozenset({"experiments", "runs", "alembic_version"})


def _not_an_mlflow_sqlite_file(uri: str) -> str | None:
    """Why an existing SQLite file of `uri` is not an MLflow store, read without writing to it; None if it is
    one (or `uri` is not a SQLite file). Reading commands check this first: MlflowClient would otherwise
    write MLflow's schema into any SQLite file it is pointed at, and a damaged file would end in a traceback."""
    scheme, _, rest = uri.partition(":///")
    if scheme.split("+")[0] != "sqlite" or not rest or rest == ":memory:":
        return None
    path = Path(rest.split("?")[0])
    import sqlite3

    damage = sqlite_damage(path)
    if damage is not None:
        return f"{str(path)!r} is {damage}"
    try:
        with contextlib.closing(sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True)) as db:
            tables = {row[0] for row in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    except sqlite3.DatabaseError as err:
        return f"{str(path)!r} is not a readable SQLite database ({err})"
    if not MLFLOW_TABLES <= tables:
        found = ", ".join(sorted(tables)[:5]) + (", ..." if len(tables) > 5 else "") if tables else "none"
        return f"{str(path)!r} has no MLflow tables (its tables: {found}); reading commands never create them"
    return None


def sqlite_damage(path: Path) -> str | None:
    """Why an existing SQLite file cannot be read whole, read without writing to it: not a database at all (random
    bytes), or pages cut off or overwritten (a truncated copy), which SQLite finds only when a query reaches them.
    `PRAGMA quick_check` reads every page of every table and index once (about a second per few hundred MB), so
    every command meets a damaged store in one line before MLflow opens it. None for a sound file."""
    import sqlite3

    try:
        with contextlib.closing(sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True)) as db:
            found = [str(row[0]) for row in db.execute("PRAGMA quick_check(3)")]
    except sqlite3.DatabaseError as err:
        return f"not a readable SQLite database ({err})"
    if found != ["ok"]:
        return f"a damaged SQLite database (SQLite's quick_check: {' '.join(' '.join(found).split())[:300]})"
    return None


class DamagedRecord(TrackingError):
    """A sweep's recorded results that cannot be read: that sweep is skipped and named, the rest go on."""


def read_summary(data: Any) -> SweepSummary:
    """A parsed summary.json as the typed record; a RecordError saying why it cannot be a sweep's results: not a
    mapping, a schema version this raybench does not read, a key missing or of the wrong type (the keys are
    SweepSummary.from_json's to judge)."""
    version = data.get(SCHEMA_VERSION, 0) if isinstance(data, dict) else 0
    if not isinstance(version, int) or isinstance(version, bool) or version < 0:
        raise RecordError(f"{SCHEMA_VERSION!r} is not a whole number >= 0")
    if version > SUMMARY_SCHEMA:
        raise RecordError(f"schema version {version}, newer than this raybench {raybench.__version__} reads "
                          f"(up to {SUMMARY_SCHEMA}): read it with the raybench that wrote it")
    return SweepSummary.from_json(data)


def _parent_summary(client: MlflowClient, parent: Any) -> SweepSummary | None:
    """The sweep's `results/summary.json` with where it stands; None before it recorded results. A file that
    is cut, not JSON, or not shaped like a summary is a DamagedRecord naming the sweep and the file."""
    name = parent.data.tags.get(SWEEP_TAG, parent.info.run_name)
    state = sweep_state(parent)
    with tempfile.TemporaryDirectory() as tmp:
        try:
            path = client.download_artifacts(parent.info.run_id, "results/summary.json", tmp)
        except Exception:  # noqa: BLE001  MLflow raises several types for a missing artifact
            return None
        text = Path(path).read_text(errors="replace")
    try:
        data = json.loads(text)
    except ValueError as err:
        raise _damaged(name, parent, f"not JSON ({err})") from None
    try:
        summary = read_summary(data)
    except RecordError as err:
        raise _damaged(name, parent, str(err)) from None
    return dataclasses.replace(summary, stored=StoredRun(parent.info.run_id, parent.info.status, state.line(name),
                                                         state.state))


def _damaged(name: str, parent: Any, damage: str) -> DamagedRecord:
    return DamagedRecord(f"sweep {name}: its results/summary.json (run {parent.info.run_id}) is damaged: {damage}; "
                         f"skipped")
