"""Reading a sweep back from the store, without writing to it: where it stands (its parent run's status and
state tag), the flags it was started with (a new driver's check of an existing sweep), its summary.json and
figures and selected checkpoint (`results`, `compare`, `api.load_model`), and its metrics' histories (the
learning curves of its record's figures).

Metrics are read under their MLflow names and under the keys a store written before those names were spelled
out holds (names.mlflow_metric_name, names.internal_metric_key): `val/acc` is found as `ood_val/acc` or as
`val/acc`, whichever the store has.
"""
from __future__ import annotations

import dataclasses
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mlflow.tracking import MlflowClient

from raybench.records import StoredRun, SweepSummary
from raybench.records import SweepState as State
from raybench.tracking.client import counted_client, first_contact, reads_in_one_line, runs_tagged, store_client
from raybench.tracking.identity import driver_alive
from raybench.tracking.names import (
    ALGORITHM_TAG,
    DATASET_TAG,
    DRIVER_TAG,
    EXPERIMENT,
    REPLICATE_STAGE,
    RESUME_TAG,
    RUN_RUNNING,
    SEARCH_STAGE,
    STAGE_TAG,
    STATE_TAG,
    STORAGE_TAG,
    SWEEP_STAGE,
    SWEEP_STATE_OF_STATUS,
    SWEEP_TAG,
    SWEEPS_EXPERIMENT_TAG,
    mlflow_metric_name,
)
from raybench.tracking.store import (
    TrackingError,
    check_reachable,
    missing_local_store,
    not_an_mlflow_sqlite_file,
    redact_uri,
    refuse_bad_uri,
    without_secrets,
)
from raybench.tracking.summary import SUMMARY_ARTIFACT, DamagedRecord, read_summary_text


@dataclass(frozen=True)
class SweepStanding:
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


def sweep_state(parent: Any) -> SweepStanding:
    tags = parent.data.tags
    state = tags.get(STATE_TAG) or SWEEP_STATE_OF_STATUS.get(parent.info.status, State.RUNNING).value
    if parent.info.status == RUN_RUNNING and driver_alive(tags.get(DRIVER_TAG)) is False:
        state = State.DRIVER_GONE.value
    elif parent.info.status == RUN_RUNNING:
        state = State.RUNNING.value
    return SweepStanding(state, tags.get(RESUME_TAG))


@dataclass(frozen=True)
class RecordedSweep:
    """A sweep's parent run as the store has it: the flags it was started with (its params, as logged) and
    where it stands, so a new driver can tell an existing sweep and a resume with changed flags apart."""

    run_id: str
    params: dict[str, str]
    status: str  # MLflow's: RUNNING, FINISHED, KILLED, FAILED
    state: SweepStanding
    storage: str | None = None  # the --storage its driver ran it from (STORAGE_TAG); None: recorded before it was kept
    resume_command: str | None = None  # the command that resumes it (RESUME_TAG); None: the API ran it


@reads_in_one_line
def find_recorded_sweep(uri: str, name: str) -> RecordedSweep | None:
    """The parent run of sweep `name` in the store at `uri`, read without writing anything: None when the
    store has no such run, or is no MLflow store yet (a SQLite file that is missing or has no MLflow tables).
    Such a file is not opened: MlflowClient would create the schema, which the sweep's own tracker does once
    its driver holds the sweep lock, so two drivers never race to create it."""
    refuse_bad_uri(uri)
    if missing_local_store(uri) is not None or not_an_mlflow_sqlite_file(uri) is not None:
        return None
    check_reachable(uri)
    client = first_contact(uri, lambda: counted_client(uri))
    default = first_contact(uri, lambda: client.get_experiment_by_name(EXPERIMENT))
    runs = runs_tagged(client, sweep_experiments(client, default), {SWEEP_TAG: name, STAGE_TAG: SWEEP_STAGE}, max_results=1,
                       order_by=["attributes.start_time DESC"])
    if not runs:
        return None
    run = runs[0]
    return RecordedSweep(run.info.run_id, dict(run.data.params), run.info.status, sweep_state(run),
                         run.data.tags.get(STORAGE_TAG), run.data.tags.get(RESUME_TAG))


@reads_in_one_line
def download_plots(uri: str, parent_id: str, directory: Path) -> list[Path]:
    """The sweep's figures (the parent run's artifact folder `plots`) copied into `directory`."""
    client = store_client(uri)
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


@reads_in_one_line
def load_sweep_results(uri: str, name: str) -> SweepSummary:
    """The parent run of sweep `name` and its `results/summary.json` artifact, with where the sweep stands."""
    client, parent = _sweep_parent(uri, name)
    summary = _parent_summary(client, parent)
    if summary is None:
        raise TrackingError(f"{sweep_state(parent).line(name)}; no results were recorded yet")
    return summary


def _sweep_parent(uri: str, name: str) -> tuple[MlflowClient, Any]:
    """The store at `uri` and sweep `name`'s parent run in it; a TrackingError naming the sweep when it has none."""
    client, experiment_ids = _sweep_store(uri)
    runs = runs_tagged(client, experiment_ids, {SWEEP_TAG: name, STAGE_TAG: SWEEP_STAGE}, max_results=1,
                       order_by=["attributes.start_time DESC"])
    if not runs:
        raise TrackingError(f"no sweep named {name!r} in the MLflow store at {redact_uri(uri)}")
    return client, runs[0]


SELECTED_CHECKPOINT = "selected_checkpoint/best_model.pt"  # the parent run's copy of the selected trial's model


@reads_in_one_line
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


@reads_in_one_line
def find_sweeps(uri: str, names: tuple[str, ...] = (), dataset: str | None = None,
                algorithms: tuple[str, ...] = ()) -> list[SweepRecord]:
    """Every sweep matching the filter, oldest first (the order they were run in), summaries read back."""
    client, experiment_ids = _sweep_store(uri)
    wanted = {STAGE_TAG: SWEEP_STAGE, **({DATASET_TAG: dataset} if dataset else {})}
    parents = runs_tagged(client, experiment_ids, wanted, order_by=["attributes.start_time ASC"])
    records = []
    for parent in parents:
        tags = parent.data.tags
        name = tags.get(SWEEP_TAG, parent.info.run_name)
        if (names and name not in names) or (algorithms and tags.get(ALGORITHM_TAG) not in algorithms):
            continue
        try:
            summary, damage = _parent_summary(client, parent), None
        except DamagedRecord as err:  # one damaged sweep is named and skipped; the others are still read
            summary, damage = None, str(err)
        records.append(SweepRecord(name, tags.get(DATASET_TAG, "?"), tags.get(ALGORITHM_TAG, "?"),
                                   sweep_state(parent).line(name), summary, damage))
    return records


def _sweep_store(uri: str) -> tuple[MlflowClient, list[str]]:
    """The store a reading command (`results`, `compare`) reads; a SQLite file that is not there is an error,
    never a new empty database left behind."""
    refuse_bad_uri(uri)
    missing = missing_local_store(uri)
    if missing is not None:
        raise TrackingError(without_secrets(f"no MLflow store at {uri}: {str(missing)!r} does not exist", uri))
    problem = not_an_mlflow_sqlite_file(uri)
    if problem is not None:
        raise TrackingError(without_secrets(f"no MLflow store at {uri}: {problem}", uri))
    check_reachable(uri)
    client = first_contact(uri, lambda: store_client(uri))
    default = first_contact(uri, lambda: client.get_experiment_by_name(EXPERIMENT))
    experiments = sweep_experiments(client, default)
    if not experiments:
        raise TrackingError(f"no raybench sweeps in the MLflow store at {redact_uri(uri)}")
    return client, experiments


def sweep_experiments(client: Any, default: Any | None) -> list[str]:
    """The ids of the experiments that may hold sweeps: every one raybench marked as holding them
    (SWEEPS_EXPERIMENT_TAG: `sweep --experiment` files a sweep under any name), and the default one by name, which
    an older raybench did not mark (`default`, found first: the call every reading command's first contact makes).
    A sweep is found by its name in whichever of them holds it."""
    marked = client.search_experiments(filter_string=f"tags.`{SWEEPS_EXPERIMENT_TAG}` = 'true'")
    ids = [experiment.experiment_id for experiment in marked]
    if default is not None and default.experiment_id not in ids:
        ids.append(default.experiment_id)
    return ids


def _parent_summary(client: MlflowClient, parent: Any) -> SweepSummary | None:
    """The sweep's `results/summary.json` with where it stands; None before it recorded results. A file that
    is cut, not JSON, nested past any record, not shaped like a summary, or another sweep's is a DamagedRecord
    naming the sweep and the file."""
    name = parent.data.tags.get(SWEEP_TAG, parent.info.run_name)
    state = sweep_state(parent)
    with tempfile.TemporaryDirectory() as tmp:
        try:
            path = client.download_artifacts(parent.info.run_id, SUMMARY_ARTIFACT, tmp)
        except Exception:  # noqa: BLE001  MLflow raises several types for a missing artifact
            return None
        text = Path(path).read_text(errors="replace")
    try:
        summary = read_summary_text(text, name, parent.info.run_id)
    except DamagedRecord as err:
        raise err.in_store(name, parent.info.run_id) from None
    return dataclasses.replace(summary, stored=StoredRun(parent.info.run_id, parent.info.status, state.line(name),
                                                         state.state))



# ----- metric histories -----------------------------------------------------------------------------------
def metric_history(client: Any, run_id: str, key: str) -> list[Any]:
    """The history of raybench's metric `key` on a run, by step: logged under its MLflow name, or under the key
    itself by a raybench that did not spell the OOD splits out yet; a run resumed across that change holds both,
    and where both have a step the MLflow name's value is the one kept."""
    by_step = {}
    for name in dict.fromkeys((key, mlflow_metric_name(key))):  # the old name first: the new one overrides it
        by_step.update({metric.step: metric for metric in client.get_metric_history(run_id, name)})
    return [by_step[step] for step in sorted(by_step)]


def selection_curves(client: Any, runs: Iterable[Any], metric: str,
                     trial_id: str) -> list[tuple[str, list[int], list[float]]]:
    """(label, epochs, values) of raybench's metric `metric` per epoch for the search run of `trial_id`, then
    every replicate, among a sweep's child `runs`."""
    curves = []
    for run in sorted(runs, key=lambda r: (r.data.tags.get(STAGE_TAG) != SEARCH_STAGE, r.info.start_time)):
        tags = run.data.tags
        if tags.get(STAGE_TAG) == SEARCH_STAGE and tags.get("trial_id") == trial_id:
            label = f"selected trial {trial_id}"
        elif tags.get(STAGE_TAG) == REPLICATE_STAGE:
            label = f"replicate, seed {tags.get('seed', '?')}"
        else:
            continue
        history = metric_history(client, run.info.run_id, metric)
        curves.append((label, [m.step for m in history], [m.value for m in history]))
    return curves
