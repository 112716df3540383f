"""A sweep nested under a parent run (`--parent-run`): the parent must be a run of the store's raybench
experiment, and a benchmark's parent hands its sweeps the benchmark's resume command."""
from __future__ import annotations

import pytest
from mlflow.tracking import MlflowClient

from raybench.tracking import LOCK_TAG, RESUME_TAG, STATE_TAG, BenchmarkTracker, SweepTracker, TrackingError

BENCHMARK_RESUME = "raybench benchmark grid.yaml --storage runs --resume"


def test_a_benchmarks_sweep_is_resumed_by_resuming_the_benchmark(tmp_path):
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    parent = BenchmarkTracker(uri).start_benchmark("grid", {}, BENCHMARK_RESUME)
    assert SweepTracker(uri).check_parent_run(parent) == BENCHMARK_RESUME


def test_a_parent_that_is_no_benchmark_gives_no_resume_command(tmp_path):
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    sweep = SweepTracker(uri)
    parent = sweep.start_sweep("outer", {}, {RESUME_TAG: "raybench sweep erm --name outer --resume"})
    assert SweepTracker(uri).check_parent_run(parent) is None


def test_a_parent_run_missing_from_the_store_is_refused(tmp_path):
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    with pytest.raises(TrackingError, match="expected a run id in the MLflow store"):
        SweepTracker(uri).check_parent_run("0123456789abcdef0123456789abcdef")


@pytest.mark.parametrize("status, state", [("FINISHED", "finished"), ("KILLED", "interrupted"), ("FAILED", "failed")])
def test_the_parent_names_the_sweep_lock_while_its_driver_runs_and_not_once_it_ended(store_uri, status, state):
    """The runner tags the parent with the lock its driver holds (set_tags, as raybench.sweep.runner does); the
    driver's end of the sweep, whatever its status, takes the tag away with the lock, and leaves the others."""
    tracker = SweepTracker(store_uri)
    parent = tracker.start_sweep("locked", {}, {RESUME_TAG: "raybench sweep erm --name locked --resume"})
    holder = "/runs/.raybench-locks/locked.lock (host here, pid 4242)"
    tracker.set_tags(parent, {LOCK_TAG: holder})
    client = MlflowClient(tracking_uri=store_uri)
    assert client.get_run(parent).data.tags[LOCK_TAG] == holder, "a running sweep names its lock"
    tracker.end_sweep(status, note="stopped" if status != "FINISHED" else None)
    ended = client.get_run(parent)
    assert ended.info.status == status and ended.data.tags[STATE_TAG] == state
    assert LOCK_TAG not in ended.data.tags, "an ended sweep still names its driver's lock"
    assert ended.data.tags[RESUME_TAG] == "raybench sweep erm --name locked --resume"


def test_a_run_that_never_held_the_lock_ends_as_before(store_uri):
    """A benchmark's parent (its pairs' sweeps hold the locks) carries no lock tag: ending it asks MLflow to delete
    none, which MLflow would refuse."""
    tracker = BenchmarkTracker(store_uri)
    parent = tracker.start_benchmark("grid", {}, BENCHMARK_RESUME)
    tracker.end_benchmark("| pair | state |", "FINISHED")
    ended = MlflowClient(tracking_uri=store_uri).get_run(parent)
    assert ended.info.status == "FINISHED" and LOCK_TAG not in ended.data.tags


def test_a_sweep_filed_under_its_own_experiment_is_found_by_name_and_its_trials_nest_there(store_uri, tmp_path):
    """`sweep --experiment NAME`: the parent run and the trial runs go to that experiment (MLflow nests runs only
    within one), and reading finds the sweep by its name without being told the experiment; so does a store an
    older raybench wrote, whose "raybench" experiment carries no mark."""
    from raybench.tracking import EXPERIMENT, TrialRunWriter, find_recorded_sweep
    from raybench.tracking.reading import sweep_experiments

    tracker = SweepTracker(store_uri, "my-study")
    parent = tracker.start_sweep("mine", {}, {RESUME_TAG: "raybench sweep erm --name mine --resume"})
    client = MlflowClient(tracking_uri=store_uri)
    mine = client.get_experiment_by_name("my-study")
    assert client.get_run(parent).info.experiment_id == mine.experiment_id
    assert find_recorded_sweep(store_uri, "mine").run_id == parent
    writer = TrialRunWriter(store_uri, parent, tmp_path / "journal.jsonl", resuming=False,
                            experiment=tracker.experiment_name)
    assert writer.tracker.experiment_id == mine.experiment_id  # the trials' runs sit beside their parent
    writer.close()
    older = client.create_experiment(EXPERIMENT)  # as an older raybench made it: no mark
    assert set(sweep_experiments(client, client.get_experiment(older))) == {mine.experiment_id, older}
    assert find_recorded_sweep(store_uri, "nobody") is None
