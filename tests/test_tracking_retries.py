"""Every call raybench makes to the tracking store is counted and timed; a transient error (a locked SQLite
file, a dropped connection, a 5xx) is retried only for calls a retry cannot duplicate."""
from __future__ import annotations

import dataclasses

import pytest
from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient

from raybench import tracking
from raybench.report.results import tracking_line
from raybench.tracking import TrackingStats
from raybench.tracking import client as store_client
from raybench.tracking.client import CountedClient


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
    monkeypatch.setattr(store_client, "PROCESS_STATS", fresh)
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
    assert len(store.calls) == store_client.RETRIES + 1 and (stats.retried, stats.failed) == (store_client.RETRIES, 1)


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
    assert found.data.metrics == {"ood_val/acc": 0.5} and found.info.status == "FINISHED"  # MLflow's name
    line = tracking_line(used.as_dict(), wall_s=used.seconds * 10, runs=1)
    assert line.startswith(f"Tracking: {used.calls} calls ({used.calls:.1f} a run), ") and "(10.0% of the wall time)" in line


# ----- a tracking server that is down: the background writer waits for it ---------------------------------
REFUSED = MlflowException("API request to http://127.0.0.1:5000/api/2.0/mlflow/runs/create failed with exception "
                          "HTTPConnectionPool(host='127.0.0.1', port=5000): Max retries exceeded (Caused by "
                          "NewConnectionError('Failed to establish a new connection: [Errno 111] Connection refused'))")
LOST = MlflowException("API request to http://127.0.0.1:5000/api/2.0/mlflow/runs/create failed with exception "
                       "HTTPConnectionPool(host='127.0.0.1', port=5000): Read timed out. (read timeout=120)")


@pytest.fixture
def no_waits(stats, monkeypatch):
    monkeypatch.setattr(store_client, "OUTAGE_BACKOFF_S", 0.0)
    return stats


def test_the_outage_budget_covers_minutes_and_looks_again_within_seconds():
    assert store_client.OUTAGE_S >= 60 and store_client.OUTAGE_BACKOFF_MAX_S <= 10


def test_a_background_create_run_whose_connection_was_refused_is_sent_again(no_waits):
    """The request never reached the server, so sending it again cannot make a second run."""
    store = FlakyStore(3, REFUSED)
    assert CountedClient(store, background=True).create_run("experiment") == "create_run"
    assert store.calls == ["create_run"] * 4 and (no_waits.retried, no_waits.failed) == (3, 0)


def test_a_create_run_whose_response_was_lost_is_never_sent_again(no_waits):
    store = FlakyStore(1, LOST)
    with pytest.raises(MlflowException, match="Read timed out"):
        CountedClient(store, background=True).create_run("experiment")
    assert store.calls == ["create_run"]


def test_the_sweeps_own_calls_leave_a_refused_create_run_to_mlflow(no_waits):
    """In the foreground MLflow's own HTTP retries are the only ones: a sweep starting against a server that is
    down fails instead of waiting minutes."""
    store = FlakyStore(1, REFUSED)
    with pytest.raises(MlflowException, match="Connection refused"):
        CountedClient(store).create_run("experiment")
    assert store.calls == ["create_run"]


def test_a_refusal_past_the_outage_budget_fails_the_call(no_waits, monkeypatch):
    monkeypatch.setattr(store_client, "OUTAGE_S", 0.0)
    store = FlakyStore(99, REFUSED)
    with pytest.raises(MlflowException, match="Connection refused"):
        CountedClient(store, background=True).create_run("experiment")
    assert store.calls == ["create_run"] and no_waits.failed == 1


def test_a_background_call_after_an_idle_spell_waits_until_the_server_takes_connections(no_waits, monkeypatch):
    """It never enters MLflow's own retries, whose backoff doubles to two minutes, while the server is down."""
    answers = iter([True, True, False])  # refused twice, then listening
    looked = []

    def refuses(address):
        looked.append(address)
        return next(answers)

    monkeypatch.setattr(store_client, "refuses_connections", refuses)
    store = FlakyStore(0, REFUSED)
    client = CountedClient(store, background=True, uri="http://127.0.0.1:5000")
    assert client.log_batch("run") == "log_batch" and store.calls == ["log_batch"]
    assert looked == [("127.0.0.1", 5000)] * 3
    assert client.log_batch("run") == "log_batch" and len(looked) == 3, "a call right after another looks not again"


def test_refuses_connections_tells_a_listening_port_from_a_closed_one():
    import socket

    with socket.create_server(("127.0.0.1", 0)) as server:
        address = server.getsockname()
        assert not store_client.refuses_connections(address)
    assert store_client.refuses_connections(address)


def test_a_server_behind_a_proxy_is_never_probed_directly(monkeypatch):
    monkeypatch.setenv("HTTP_PROXY", "http://proxy.invalid:3128")
    monkeypatch.delenv("NO_PROXY", raising=False)
    monkeypatch.delenv("no_proxy", raising=False)
    assert store_client.server_address("http://mlflow.example:5000") is None
    monkeypatch.setenv("NO_PROXY", "mlflow.example")
    assert store_client.server_address("http://mlflow.example:5000") == ("mlflow.example", 5000)
    assert store_client.server_address("sqlite:///mlflow.db") is None
