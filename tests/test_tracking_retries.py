"""Every call raybench makes to the tracking store is counted and timed; a transient error (a locked SQLite
file, a dropped connection, a 5xx) is retried only for calls a retry cannot duplicate."""
from __future__ import annotations

import dataclasses

import pytest
from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient

from raybench import tracking
from raybench.sweep.results import tracking_line
from raybench.tracking import CountedClient, TrackingStats


class FlakyStore:
    """Fails each method's first `failures` calls with `error`, then answers."""

    def __init__(self, failures: int, error: Exception) -> None:
        self.failures, self.error, self.calls = failures, error, []

    def _answer(self, name: str) -> str:
        self.calls.append(name)
        if self.calls.count(name) <= self.failures:
            raise self.error
        return name

    def log_batch(self, *args, **kwargs):
        return self._answer("log_batch")

    def create_run(self, *args, **kwargs):
        return self._answer("create_run")


@pytest.fixture
def stats(monkeypatch):
    fresh = TrackingStats()
    monkeypatch.setattr(tracking, "PROCESS_STATS", fresh)
    monkeypatch.setattr(CountedClient, "BACKOFF_S", 0.0)
    return fresh


def test_a_locked_store_is_retried_for_log_batch_and_counted(stats):
    store = FlakyStore(2, MlflowException("(sqlite3.OperationalError) database is locked"))
    assert CountedClient(store).log_batch("run") == "log_batch"
    assert store.calls == ["log_batch"] * 3
    assert (stats.calls, stats.retried, stats.failed) == (1, 2, 0)


def test_create_run_is_never_retried_a_retry_could_make_a_second_run(stats):
    store = FlakyStore(1, MlflowException("API request failed with error code 503 != 200"))
    with pytest.raises(MlflowException):
        CountedClient(store).create_run("experiment")
    assert store.calls == ["create_run"] and (stats.calls, stats.retried, stats.failed) == (1, 0, 1)


def test_a_real_error_is_raised_at_once(stats):
    store = FlakyStore(1, MlflowException("RESOURCE_DOES_NOT_EXIST: run 503abc not found"))
    with pytest.raises(MlflowException, match="not found"):
        CountedClient(store).log_batch("run")
    assert store.calls == ["log_batch"] and (stats.retried, stats.failed) == (0, 1)


def test_a_store_that_stays_locked_fails_after_the_retries(stats):
    store = FlakyStore(99, MlflowException("database is locked"))
    with pytest.raises(MlflowException):
        CountedClient(store).log_batch("run")
    assert len(store.calls) == tracking.RETRIES + 1 and (stats.retried, stats.failed) == (tracking.RETRIES, 1)


def test_a_sweep_tracker_counts_what_it_asks_of_a_real_store(stats, tmp_path):
    tracker = tracking.SweepTracker(f"sqlite:///{tmp_path}/mlflow.db")
    before = dataclasses.replace(stats)
    tracker.start_sweep("counted", params={"a": 1}, tags={})
    run = tracker.start_child("key", "name", {"lr": 0.1}, {"stage": "search"})
    tracker.log_metrics(run, {"val/acc": 0.5, "note": "not a number"}, step=0, tags={"raybench.nodes": "head"})
    tracker.end_child(run, "FINISHED", tags={"raybench.stopped_early": "after epoch 0"})
    used = stats.since(before)
    assert used.calls >= 6 and used.seconds > 0 and used.failed == used.retried == 0
    found = MlflowClient(tracking_uri=f"sqlite:///{tmp_path}/mlflow.db").get_run(run)
    assert found.data.tags["raybench.nodes"] == "head" and found.data.tags["raybench.stopped_early"] == "after epoch 0"
    assert found.data.metrics == {"val/acc": 0.5} and found.info.status == "FINISHED"
    line = tracking_line(used.as_dict(), wall_s=used.seconds * 10, runs=1)
    assert line.startswith(f"Tracking: {used.calls} calls ({used.calls:.1f} a run), ") and "(10.0% of the wall time)" in line
