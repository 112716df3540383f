"""A sweep's parent run, written by its driver: started (or taken up again on resume) under a name that belongs
to one --storage, tagged with its state, its driver and, while the driver holds the sweep lock, that lock
(LOCK_TAG, removed at the end), given the sweep's summary and artifacts, and ended. A benchmark's parent run, above
its sweeps' parents, is written the same way (BenchmarkTracker)."""
from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from raybench.records import SweepState as State
from raybench.sweep.errors import SweepExists
from raybench.tracking.client import runs_tagged
from raybench.tracking.identity import driver_identity
from raybench.tracking.names import (
    BENCHMARK_STAGE,
    BENCHMARK_TAG,
    DESCRIPTION_TAG,
    DRIVER_TAG,
    FAILURE_TAG,
    LOCK_TAG,
    PARENT_TAG,
    RESUME_TAG,
    RUN_FINISHED,
    RUN_KILLED,
    RUN_RUNNING,
    STAGE_TAG,
    STATE_TAG,
    STORAGE_TAG,
    SWEEP_STAGE,
    SWEEP_STATE_OF_STATUS,
    SWEEP_TAG,
)
from raybench.tracking.reading import selection_curves
from raybench.tracking.runs import REASON_LIMIT, RunWriter, flatten, numeric_metrics
from raybench.tracking.store import TrackingError, redact_uri, storage_problem
from raybench.tracking.trial_writer import TrialRunWriter

DESCRIPTION_LIMIT = 8000  # MLflow's longest run tag value (MAX_TAG_VAL_LENGTH)


class SweepClaimed(SweepExists):
    """Another driver holds sweep NAME in the tracking store: it started it from another --storage, or it created
    the sweep's parent run at the same moment as this driver (the earlier run keeps the name)."""


def run_description(markdown: str, limit: int = DESCRIPTION_LIMIT) -> str:
    """`markdown` as a run description: whole when it fits MLflow's tag limit, else cut at a line end with a
    pointer to the full text (the summary artifact), so the selected config and the table always show."""
    if len(markdown) <= limit:
        return markdown
    tail = "\n\n(cut here to fit MLflow's description limit; the whole summary is the artifact summary.md)\n"
    cut = markdown.rfind("\n", 0, limit - len(tail))
    return markdown[:max(cut, 0)] + tail


class SweepTracker(RunWriter):
    """A sweep's view of MLflow: its parent run, its child runs and its artifacts."""

    # ----- the sweep's parent run ------------------------------------------------------------------
    def start_sweep(self, name: str, params: Mapping[str, Any], tags: Mapping[str, str],
                    parent_run: str | None = None, storage: Path | None = None, resuming: bool = True) -> str:
        """The sweep's parent run, reused when resuming; nested under `parent_run` (a benchmark's) if given.

        With `storage`, the name belongs to that --storage: the run records it (STORAGE_TAG), and a parent of
        another storage is never taken over (SweepClaimed). A new sweep (not `resuming`) never takes over an
        existing parent at all: one found now was made by another driver since this one looked. Two drivers
        that create a parent for one name at once each look again after creating theirs; the earlier parent
        (by start time, then run id) keeps the name, and the other driver deletes its own before any child run."""
        existing = self._find({SWEEP_TAG: name, STAGE_TAG: SWEEP_STAGE})
        nesting = {PARENT_TAG: parent_run} if parent_run else {}
        owner = {STORAGE_TAG: str(storage)} if storage is not None else {}
        if existing is not None:
            if storage is not None:
                self._check_owner(name, existing, storage, resuming)
            self.parent_id = existing.info.run_id
            self.client.update_run(self.parent_id, status=RUN_RUNNING)
            self._tag(self.parent_id, {**nesting, **owner})
        else:
            run = self.client.create_run(self.experiment_id, run_name=name,
                                         tags={**tags, **nesting, **owner, SWEEP_TAG: name, STAGE_TAG: SWEEP_STAGE})
            self.parent_id = run.info.run_id
            if storage is not None:
                self._hold_name(name, run)
            self._log(self.parent_id, params=flatten(params))
        self._tag(self.parent_id, {STATE_TAG: State.RUNNING.value, DRIVER_TAG: driver_identity(),
                                   **{k: v for k, v in tags.items() if k == RESUME_TAG}})
        return self.parent_id

    def _check_owner(self, name: str, existing: Any, storage: Path, resuming: bool) -> None:
        """Refuse an existing parent this driver may not take over: any, for a new sweep (another driver made it
        since this one looked), or one whose storage is not this driver's."""
        if not resuming:
            raise SweepClaimed(f"--name: sweep {name!r} was just started by another driver (its parent run "
                               f"{existing.info.run_id}, storage {existing.data.tags.get(STORAGE_TAG, '(not recorded)')})"
                               f"; pass --resume with that --storage to continue it, or another --name")
        problem = storage_problem(name, existing.data.tags.get(STORAGE_TAG), storage)
        if problem is not None:
            raise SweepClaimed(problem)

    def _hold_name(self, name: str, mine: Any) -> None:
        """The election after creating a parent: the earliest parent of `name` keeps it. Each of two drivers that
        created one at once sees at least the earlier one when it looks (it was made first), so exactly one goes on,
        where the drivers' clocks agree to better than the time between their creates (start times are theirs)."""
        parents = runs_tagged(self.client, self.experiment_id, {SWEEP_TAG: name, STAGE_TAG: SWEEP_STAGE},
                              order_by=["attributes.start_time ASC"])
        first = min(parents + [mine], key=lambda run: (run.info.start_time, run.info.run_id))
        if first.info.run_id == mine.info.run_id:
            return
        self.client.delete_run(mine.info.run_id)
        self.parent_id = None
        raise SweepClaimed(f"--name: sweep {name!r} was started by another driver at the same moment (its parent "
                           f"run {first.info.run_id}, storage {first.data.tags.get(STORAGE_TAG, '(not recorded)')}); "
                           f"this driver stopped before running anything: pass another --name, or --resume with that "
                           f"--storage once it has ended")

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
        return run.data.tags.get(RESUME_TAG) if run.data.tags.get(STAGE_TAG) == BENCHMARK_STAGE else None

    def end_sweep(self, status: str, note: str | None = None) -> None:
        """Close the parent run; an interrupted sweep (KILLED) also closes every child still RUNNING, so no
        run claims to be alive after its driver has gone. The stage's trial-run writers are drained first (their
        error, if any, already ended the sweep and is its note) and stopped. Whatever the status, the driver lets
        go of the sweep lock as it ends, so the lock tag goes: a sweep that has ended names no driver holding it."""
        assert self.parent_id is not None
        TrialRunWriter.close_all()
        if note:
            self.client.set_tag(self.parent_id, FAILURE_TAG, note[:REASON_LIMIT])
        state = SWEEP_STATE_OF_STATUS.get(status, State.FAILED)
        self.client.set_tag(self.parent_id, STATE_TAG, state.value)
        self.drop_tag(self.parent_id, LOCK_TAG)
        if status != RUN_FINISHED:
            for run in self.children(nested=True):
                if run.info.status == RUN_RUNNING:
                    self.client.set_terminated(run.info.run_id, status=RUN_KILLED)
        self.client.set_terminated(self.parent_id, status=status)

    def log_artifacts(self, directory: Path, artifact_path: str | None = None) -> None:
        assert self.parent_id is not None
        self.client.log_artifacts(self.parent_id, str(directory), artifact_path)

    def log_artifact(self, file: Path, artifact_path: str | None = None, run_id: str | None = None) -> None:
        self.client.log_artifact(run_id or self.parent_id, str(file), artifact_path)

    def log_summary(self, markdown: str, metrics: Mapping[str, float]) -> None:
        """The sweep's short markdown summary (an artifact, and the parent run's description in the UI) and its
        headline numbers, on the parent run, each under its MLflow name (`replicates/best/ood_test/acc/mean`)."""
        assert self.parent_id is not None
        self.client.log_text(self.parent_id, markdown, "summary.md")
        self.client.set_tag(self.parent_id, DESCRIPTION_TAG, run_description(markdown))
        self._log(self.parent_id, metrics=numeric_metrics(metrics))

    def selection_curves(self, metric: str, trial_id: str) -> list[tuple[str, list[int], list[float]]]:
        """(label, epochs, values) of `metric` (raybench's key) per epoch for the search run of `trial_id`, then
        every replicate (reading.selection_curves)."""
        return selection_curves(self.client, self.children(), metric, trial_id)


class BenchmarkTracker(SweepTracker):
    """A benchmark's parent run: its sweeps' parent runs nest under it; the comparison is attached to it."""

    def start_benchmark(self, name: str, params: Mapping[str, Any], resume_command: str | None) -> str:
        existing = self._find({BENCHMARK_TAG: name, STAGE_TAG: BENCHMARK_STAGE})
        if existing is not None:
            self.parent_id = existing.info.run_id
            self.client.update_run(self.parent_id, status=RUN_RUNNING)
        else:
            run = self.client.create_run(self.experiment_id, run_name=f"benchmark {name}",
                                         tags={BENCHMARK_TAG: name, STAGE_TAG: BENCHMARK_STAGE})
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

