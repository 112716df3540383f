"""MLflow shows the OOD splits spelled out: raybench's keys keep WILDS's names (`val/acc`, `best/test/acc`), what a
run logs to MLflow is `ood_val/acc`, `best/ood_test/acc`, and whatever raybench reads back from MLflow is found
under either name, so a store written before the names were spelled out reads as it did."""
from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from mlflow.entities import Metric
from mlflow.tracking import MlflowClient

from raybench.tracking import SweepTracker, internal_metric_key, mlflow_metric_name
from raybench.tracking.names import MLFLOW_SPLIT_NAMES

# (raybench's key, the name MLflow shows): every place a split stands in a key raybench logs.
NAMES = [
    ("val/acc", "ood_val/acc"),
    ("test/acc", "ood_test/acc"),
    ("test/worst_group_acc", "ood_test/worst_group_acc"),
    ("val/group_acc/3_red", "ood_val/group_acc/3_red"),
    ("best/val/acc", "best/ood_val/acc"),
    ("best/test/macro_f1", "best/ood_test/macro_f1"),
    ("final/val/worst_group_acc", "final/ood_val/worst_group_acc"),  # a method stage's closing numbers
    ("replicates/best/test/acc/mean", "replicates/best/ood_test/acc/mean"),  # a parent run's headline
    ("replicates/best/val/acc/std", "replicates/best/ood_val/acc/std"),
    ("id_val/acc", "id_val/acc"),
    ("id_test/acc", "id_test/acc"),
    ("best/id_test/acc", "best/id_test/acc"),
    ("replicates/best/id_test/acc/mean", "replicates/best/id_test/acc/mean"),
    ("train/loss/total", "train/loss/total"),
    ("best/train/pseudo/kept", "best/train/pseudo/kept"),
    ("epoch", "epoch"),
    ("selection/best", "selection/best"),
    ("time/wall_s", "time/wall_s"),
    ("accuracy/test", "accuracy/test"),  # a split name that is not where a split stands is no split
    ("test", "test"),
]


def test_the_ood_splits_are_those_raybench_labels_ood():
    assert dict(MLFLOW_SPLIT_NAMES) == {"val": "ood_val", "test": "ood_test"}


@pytest.mark.parametrize("key, name", NAMES)
def test_a_key_is_logged_under_its_mlflow_name(key, name):
    assert mlflow_metric_name(key) == name


@pytest.mark.parametrize("key, name", NAMES)
def test_an_mlflow_name_reads_back_as_the_key_and_so_does_the_name_written_before(key, name):
    assert internal_metric_key(name) == key
    assert internal_metric_key(key) == key, "a store written before the OOD splits were spelled out holds the key"


PART = st.sampled_from(["val", "test", "id_val", "id_test", "train", "best", "final", "replicates", "acc",
                        "ood_val", "mean", "loss", "x_1"])


@settings(max_examples=300, deadline=None, derandomize=True, database=None)
@given(parts=st.lists(PART, min_size=1, max_size=6))
def test_a_key_that_holds_no_mlflow_name_comes_back_from_its_mlflow_name(parts):
    """Every raybench key (its split a WILDS split, never an MLflow one) survives the way to MLflow and back."""
    key = "/".join(parts)
    if any(part.startswith("ood_") for part in parts):
        return  # no raybench key is spelled so
    assert internal_metric_key(mlflow_metric_name(key)) == key
    assert mlflow_metric_name(mlflow_metric_name(key)) == mlflow_metric_name(key)


# ----- in a real store ------------------------------------------------------------------------------------------
def sweep_with_trials(uri: str) -> SweepTracker:
    tracker = SweepTracker(uri)
    tracker.start_sweep("names", {}, {})
    return tracker


def test_what_a_tracker_logs_is_under_the_mlflow_names(store_uri):
    """Trial metrics, a stage's closing numbers and the parent's replicate headline, as a store holds them."""
    tracker = sweep_with_trials(store_uri)
    run = tracker.start_child("t1", "search t1", {}, {"stage": "search", "trial_id": "t1"})
    tracker.log_metrics(run, {"val/acc": 0.5, "id_val/acc": 0.7, "best/test/acc": 0.4, "epoch": 0}, step=0)
    tracker.log_stage(run, "t1", {"name": "reference", "metrics": {"val/worst_group_acc": 0.3}})
    tracker.log_summary("# names", {"replicates/best/test/acc/mean": 0.4, "replicates/best/test/acc/std": 0.01})
    client = MlflowClient(tracking_uri=store_uri)
    assert set(client.get_run(run).data.metrics) == {"ood_val/acc", "id_val/acc", "best/ood_test/acc", "epoch"}
    (stage,) = [r for r in tracker.children(nested=True) if r.data.tags.get("stage") == "method_stage"]
    assert set(stage.data.metrics) == {"final/ood_val/worst_group_acc", "seconds"}
    assert set(client.get_run(tracker.parent_id).data.metrics) == {"replicates/best/ood_test/acc/mean",
                                                                   "replicates/best/ood_test/acc/std"}


def log_old(client: MlflowClient, run_id: str, key: str, values: dict[int, float]) -> None:
    """Metrics as a raybench that did not spell the OOD splits out logged them: under raybench's own key."""
    client.log_batch(run_id, metrics=[Metric(key, value, 1_000 + step, step) for step, value in values.items()])


def test_a_store_written_with_the_old_names_gives_the_same_curves(store_uri):
    """The selection curves of a sweep's figures, read from a store whose runs hold `val/acc` (written before),
    from one whose runs hold `ood_val/acc` (now), and from a run resumed across the change (both, by step)."""
    tracker = sweep_with_trials(store_uri)
    client = MlflowClient(tracking_uri=store_uri)
    old = tracker.start_child("t1", "search t1", {}, {"stage": "search", "trial_id": "t1"})
    log_old(client, old, "val/acc", {0: 0.5, 1: 0.6})
    new = tracker.start_child("t1-seed1", "replicate", {}, {"stage": "replicate", "seed": "1"})
    for step, value in {0: 0.55, 1: 0.65}.items():
        tracker.log_metrics(new, {"val/acc": value}, step=step)
    both = tracker.start_child("t1-seed2", "replicate", {}, {"stage": "replicate", "seed": "2"})
    log_old(client, both, "val/acc", {0: 0.1, 1: 0.2})  # before the driver was upgraded and resumed
    tracker.log_metrics(both, {"val/acc": 0.3}, step=2)
    tracker.log_metrics(both, {"val/acc": 0.25}, step=1)  # an epoch run again after its last checkpoint
    curves = {label: (steps, values) for label, steps, values in tracker.selection_curves("val/acc", "t1")}
    assert curves == {"selected trial t1": ([0, 1], [0.5, 0.6]), "replicate, seed 1": ([0, 1], [0.55, 0.65]),
                      "replicate, seed 2": ([0, 1, 2], [0.1, 0.25, 0.3])}
