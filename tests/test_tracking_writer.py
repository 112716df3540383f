"""The trial-run writer: Tune's callback hands writes over and goes on; the writer sends them in order beside it,
journals them on --storage first, and a resumed sweep sends its journal again without writing anything twice."""
from __future__ import annotations

import threading

import pytest
from mlflow.tracking import MlflowClient

from raybench import tracking
from raybench.tracking import RunWrite, SweepTracker, TrackingError, TrialRunWriter, WriteKind, mlflow_metric_name
from raybench.tracking import client as store_client
from raybench.tracking.trial_writer import read_journal

KEY = "t0001-seed0"


@pytest.fixture
def sweep(tmp_path, monkeypatch):
    """A sweep's parent run in a fresh SQLite store, its stage journal's path, and no writer left behind."""
    monkeypatch.setattr(store_client, "PROCESS_STATS", tracking.TrackingStats())
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    tracker = SweepTracker(uri)
    tracker.start_sweep("writer", params={}, tags={})
    yield uri, tracker.parent_id, tmp_path / "runs" / "writer-search" / tracking.TRIAL_JOURNAL
    TrialRunWriter.close_all()


def trial_writes(key: str = KEY, epochs: int = 2) -> list[RunWrite]:
    """What the callback hands over for one trial: its run, its epochs (at distinct times), its end."""
    return [RunWrite(WriteKind.OPEN, key, run_name=f"search {key}", params={"lr": 0.1}, tags={"stage": "search"}),
            *(RunWrite(WriteKind.EPOCH, key, metrics={"val/acc": 0.5 + epoch / 10, "epoch": float(epoch)},
                       step=epoch, timestamp_ms=1_000 + epoch) for epoch in range(epochs)),
            RunWrite(WriteKind.END, key, metrics={"time/wall_s": 3.0}, step=epochs - 1, timestamp_ms=2_000,
                     status="FINISHED", tags={"raybench.stopped_early": "no"})]


def runs_of(uri: str, parent: str) -> list:
    return MlflowClient(tracking_uri=uri).search_runs(
        [MlflowClient(tracking_uri=uri).get_experiment_by_name("raybench").experiment_id],
        f"tags.`mlflow.parentRunId` = '{parent}'")


def history(uri: str, run_id: str, metric: str = "ood_val/acc") -> list[tuple[int, float]]:
    """`metric`'s history as MLflow holds it: under its MLflow name (raybench's `val/acc` is `ood_val/acc`)."""
    return sorted((m.step, m.value) for m in MlflowClient(tracking_uri=uri).get_metric_history(run_id, metric))


def test_submit_returns_while_the_store_is_busy_and_drain_waits_for_every_write(sweep):
    uri, parent, journal = sweep
    writer = TrialRunWriter.for_stage(uri, parent, journal, resuming=False)
    gate, entered = threading.Event(), threading.Event()
    log_batch = writer.tracker.client.log_batch

    def held_log_batch(*args, **kwargs):  # the store answers only once the test lets it
        entered.set()
        assert gate.wait(30)
        return log_batch(*args, **kwargs)

    writer.tracker.client.log_batch = held_log_batch
    for write in trial_writes():
        writer.submit(write)  # returns at once: the writer is held inside the store
    assert entered.wait(30) and not runs_of(uri, parent)[0].data.metrics
    assert len(read_journal(journal)) == 4, "each write is journalled before it is queued"
    gate.set()
    TrialRunWriter.drain_all()
    [run] = runs_of(uri, parent)
    assert history(uri, run.info.run_id) == [(0, 0.5), (1, 0.6)] and run.info.status == "FINISHED"
    assert run.data.tags["raybench.key"] == KEY and run.data.tags["raybench.stopped_early"] == "no"
    assert run.data.metrics["time/wall_s"] == 3.0 and run.data.params == {"lr": "0.1"}
    stats = store_client.PROCESS_STATS
    assert stats.background_seconds > 0 and stats.seconds > 0  # drain waited


def test_a_fresh_sweep_creates_its_runs_without_looking_them_up_and_reuses_a_repeated_key(sweep, monkeypatch):
    uri, parent, journal = sweep
    writer = TrialRunWriter.for_stage(uri, parent, journal, resuming=False)

    def no_lookup(*args, **kwargs):
        raise AssertionError("a sweep that is not resuming looked a run up")

    writer.tracker.client.search_runs = no_lookup
    for write in [*trial_writes(), *trial_writes()[:1]]:  # the same config again: a repeat, replayed from its record
        writer.submit(write)
    writer.drain()
    [run] = runs_of(uri, parent)
    assert run.info.status == "RUNNING", "the repeat runs again in its first run"
    assert TrialRunWriter.for_stage(uri, parent, journal, resuming=True) is writer, "a restored callback's copy shares it"


def test_a_killed_drivers_unsent_writes_are_sent_on_resume_and_none_twice(sweep, monkeypatch):
    """The first driver's store refuses the second epoch (as if the driver died there: writes journalled but
    never sent). A resumed driver sends the whole journal again: the run is found by key, the first epoch is not
    logged twice (it keeps its time), the rest arrive, and the run ends FINISHED."""
    uri, parent, journal = sweep
    first = TrialRunWriter.for_stage(uri, parent, journal, resuming=False)
    log_batch, sent = first.tracker.client.log_batch, []

    def refuses_the_second_epoch(run_id, metrics=(), **kwargs):
        if any(m.key == "ood_val/acc" and m.step == 1 for m in metrics):
            raise RuntimeError("the store went away")
        sent.append([m.step for m in metrics])
        return log_batch(run_id, metrics=metrics, **kwargs)

    first.tracker.client.log_batch = refuses_the_second_epoch
    for write in trial_writes():
        first.submit(write)
    with pytest.raises(TrackingError, match="the store went away"):
        first.drain()
    first.drain()  # the error is raised once; the sweep is ending with it
    TrialRunWriter.close_all()
    [run] = runs_of(uri, parent)
    assert history(uri, run.info.run_id) == [(0, 0.5)] and run.info.status == "RUNNING"

    resumed = TrialRunWriter.for_stage(uri, parent, journal, resuming=True)
    resumed.drain()
    [run] = runs_of(uri, parent)
    assert history(uri, run.info.run_id) == [(0, 0.5), (1, 0.6)], "every epoch once"
    assert run.info.status == "FINISHED" and run.data.metrics["time/wall_s"] == 3.0
    # A resumed trial that runs its second epoch again (after its last checkpoint) adds nothing to it.
    resumed.submit(trial_writes()[0])
    resumed.submit(RunWrite(WriteKind.EPOCH, KEY, metrics={"val/acc": 0.9}, step=1, timestamp_ms=5_000,
                            tags={"raybench.nodes": "worker-1"}))
    resumed.drain()
    [run] = runs_of(uri, parent)
    assert history(uri, run.info.run_id) == [(0, 0.5), (1, 0.6)] and run.data.tags["raybench.nodes"] == "worker-1"
    assert run.info.status == "RUNNING", "a trial of the journal that runs again is running again"


@pytest.fixture(scope="module")
def trainer_reports(tiny_dataset) -> list[dict[str, float]]:
    """What a real training loop reports, epoch by epoch: the raybench trainer's own epoch reports (some twenty
    numbers each: every split's metrics, losses, the budget) on the tiny dataset, best values included."""
    from raybench.trainer import Callback, TrainConfig, Trainer

    reports: list[dict[str, float]] = []

    class Collect(Callback):
        def on_epoch_end(self, report) -> None:
            reports.append(tracking.numeric_metrics(
                {**report.metrics, **{f"best/{key}": value for key, value in report.best_metrics.items()}}))

    config = TrainConfig.from_flat({"dataset": "tiny", "algorithm": "erm", "device": "cpu", "epochs": 3,
                                    "max_steps_per_epoch": 2})
    Trainer(config, dataset=tiny_dataset, callbacks=[Collect()]).fit()
    return reports


@pytest.fixture
def seeded_sweep(store_uri, tmp_path, monkeypatch):
    """As `sweep`, in a copy of the session's migrated empty store (no migrations to wait for)."""
    monkeypatch.setattr(store_client, "PROCESS_STATS", tracking.TrackingStats())
    parent = SweepTracker(store_uri).start_sweep("writer", params={}, tags={})
    yield store_uri, parent, tmp_path / "runs" / "writer-search" / tracking.TRIAL_JOURNAL
    TrialRunWriter.close_all()


def test_every_number_of_every_reported_epoch_reaches_the_store(seeded_sweep, trainer_reports):
    """Each epoch's report goes to MLflow in one log_batch of all its numbers: the store must hold every key at
    every step, with the value reported, and nothing at a step no epoch reported. A writer that lost some keys
    of a batch (or a batch) would still pass checks that read one or two keys."""
    uri, parent, journal = seeded_sweep
    assert all(len(report) > 20 for report in trainer_reports), "a real report has many numbers"
    writer = TrialRunWriter.for_stage(uri, parent, journal, resuming=False)
    writer.submit(RunWrite(WriteKind.OPEN, KEY, run_name=f"search {KEY}", params={"lr": 0.1}, tags={"stage": "search"}))
    for epoch, report in enumerate(trainer_reports):
        writer.submit(RunWrite(WriteKind.EPOCH, KEY, metrics=report, step=epoch, timestamp_ms=1_000 + epoch))
    writer.submit(RunWrite(WriteKind.END, KEY, step=len(trainer_reports) - 1, status="FINISHED"))
    writer.drain()
    [run] = runs_of(uri, parent)
    client = MlflowClient(tracking_uri=uri)
    keys = {key for report in trainer_reports for key in report}
    stored = {key: sorted((m.step, m.value) for m in client.get_metric_history(run.info.run_id, name))
              for key, name in ((key, mlflow_metric_name(key)) for key in keys)}  # each under its MLflow name
    expected = {key: sorted((epoch, report[key]) for epoch, report in enumerate(trainer_reports) if key in report)
                for key in keys}
    assert stored == expected, [key for key in keys if stored[key] != expected[key]]
    assert set(run.data.metrics) == {mlflow_metric_name(key) for key in keys}, "the store holds a key no epoch reported"


def test_the_store_shows_the_ood_splits_spelled_out_and_the_id_splits_as_they_are(seeded_sweep, trainer_reports):
    """What a real trainer reported, as the trial-run writer leaves it in a real SQLite store: `val/acc` as
    `ood_val/acc`, `best/test/acc` as `best/ood_test/acc`, `id_val/acc` as it is, and no bare OOD split left."""
    uri, parent, journal = seeded_sweep
    writer = TrialRunWriter.for_stage(uri, parent, journal, resuming=False)
    writer.submit(RunWrite(WriteKind.OPEN, KEY, run_name=f"search {KEY}", params={"lr": 0.1}, tags={"stage": "search"}))
    writer.submit(RunWrite(WriteKind.EPOCH, KEY, metrics=trainer_reports[-1], step=0, timestamp_ms=1_000))
    writer.submit(RunWrite(WriteKind.END, KEY, step=0, status="FINISHED"))
    writer.drain()
    [run] = runs_of(uri, parent)
    names = set(run.data.metrics)
    assert {"ood_val/acc", "ood_test/acc", "id_val/acc", "id_test/acc", "best/ood_val/acc", "best/ood_test/acc",
            "best/id_test/acc"} <= names, sorted(names)
    assert run.data.metrics["ood_val/acc"] == trainer_reports[-1]["val/acc"]
    assert not [name for name in names if name.split("/")[0] in ("val", "test") or name.startswith(("best/val/",
                                                                                                 "best/test/"))]


def test_a_journal_line_cut_short_by_a_kill_is_dropped(tmp_path):
    journal = tmp_path / tracking.TRIAL_JOURNAL
    whole = trial_writes()
    journal.write_text("".join(write.line() + "\n" for write in whole) + whole[0].line()[:25])
    assert read_journal(journal) == whole


def test_a_callback_tune_restores_resumes_and_shares_the_stages_writer(sweep):
    """Tune pickles its callbacks into the experiment state and restores the copy: that copy must look its runs
    up (a resume), journal to the same file, and hand its writes to the writer the sweep drains."""
    import pickle
    from types import SimpleNamespace

    from raybench.sweep.ray_callbacks import TrackingCallback

    uri, parent, journal = sweep
    original = TrackingCallback(SimpleNamespace(uri=uri, parent_id=parent, experiment_name="raybench"), space=None, stage="search", tags={},
                                records=None, journal=journal, resuming=False)
    restored = pickle.loads(pickle.dumps(original))
    assert not original.resuming and restored.resuming and restored.journal == journal
    assert restored.writer is original.writer


def test_a_writer_made_while_the_server_is_down_asks_nothing_of_it(tmp_path):
    """Tune's callback makes a stage's writer when the stage's first trial starts, in Tune's loop: a server that
    is down then must not fail the sweep or hold the loop. The writer asks the store only in its own thread."""
    import socket

    with socket.create_server(("127.0.0.1", 0)) as server:
        port = server.getsockname()[1]
    writer = TrialRunWriter.for_stage(f"http://127.0.0.1:{port}", "parent", tmp_path / tracking.TRIAL_JOURNAL,
                                      resuming=False)
    try:
        assert writer.tracker._experiment_id is None and writer.error is None
    finally:
        TrialRunWriter.close_all()
