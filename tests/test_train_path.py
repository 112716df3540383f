"""How raybench shapes each Ray Train run (raybench.sweep.ray_trial.TrainPath): the callback it drops must
be the one the installed Ray Train really creates, or the saving silently disappears."""
from __future__ import annotations

import os
import shutil
import sys
import tempfile
from pathlib import Path

import pytest
import ray.train
from helpers.processes import stop_processes_under
from ray.train.v2._internal.callbacks.backend_setup import BackendSetupCallback
from ray.train.v2._internal.callbacks.datasets import DatasetsCallback
from ray.train.v2._internal.callbacks.placement_group_callback import PlacementGroupCleanerCallback
from ray.train.v2.api.data_parallel_trainer import DataParallelTrainer

from raybench.sweep.ray_search import DEFAULT_TRAIN_PATH
from raybench.sweep.ray_trial import ShapedDataParallelTrainer, ShapedTorchTrainer, TrainPath


def _loop(config: dict) -> None:
    raise AssertionError("never run: only the run's callbacks are inspected")


def _callbacks(trainer_class: type, **kwargs: object) -> list:
    trainer = trainer_class(_loop, scaling_config=ray.train.ScalingConfig(num_workers=1),
                            run_config=ray.train.RunConfig(name="shape"), **kwargs)
    return trainer._create_default_callbacks()


def _kinds(callbacks: list) -> list[type]:
    return [type(c) for c in callbacks]


def test_ray_train_itself_starts_a_dataset_manager_for_every_run():
    assert _kinds(_callbacks(DataParallelTrainer)).count(DatasetsCallback) == 1


def test_raybench_runs_start_no_dataset_manager_and_keep_everything_else():
    unshaped = _kinds(_callbacks(DataParallelTrainer))
    shaped = _kinds(_callbacks(ShapedDataParallelTrainer, train_path=DEFAULT_TRAIN_PATH))
    assert DatasetsCallback not in shaped
    assert shaped == [kind for kind in unshaped if kind is not DatasetsCallback]
    assert PlacementGroupCleanerCallback in shaped  # frees the run's CPUs if its controller dies


def test_the_dataset_manager_can_be_switched_back_for_the_ablation():
    shaped = _kinds(_callbacks(ShapedDataParallelTrainer, train_path=TrainPath(dataset_manager=True)))
    assert shaped == _kinds(_callbacks(DataParallelTrainer))


def test_a_data_parallel_run_keeps_its_process_group():
    shaped = _kinds(_callbacks(ShapedTorchTrainer, train_path=DEFAULT_TRAIN_PATH))
    assert BackendSetupCallback in shaped and DatasetsCallback not in shaped


# ----- reports from a Train run into Tune ---------------------------------------------------------------
class InstantRun:
    """Stands in for a Ray Train run whose reports all reach the queue just as `fit()` returns: the timing
    that lost a trial's last epoch with Ray's TuneReportCallback (the trial then stayed RUNNING for good)."""

    def __init__(self, queue: object, reports: int, error: Exception | None = None) -> None:
        self.queue, self.reports, self.error = queue, reports, error

    def fit(self) -> str:
        for epoch in range(self.reports):
            self.queue.put({"epoch": epoch})
        if self.error is not None:
            raise self.error
        return "result"


def _relayed(config: dict) -> None:
    from raybench.sweep.ray_trial import ReportRelay

    relay = ReportRelay()
    error = RuntimeError("the run failed after its reports") if config["fail"] else None
    assert relay.fit(InstantRun(relay.queue, 3, error)) == "result"
    assert relay.last == {"epoch": 2}, relay.last  # what the run's record keeps: the last report Tune was sent


@pytest.fixture(scope="module")
def ray_here():
    import ray

    ray_tmp = tempfile.mkdtemp(prefix="rbt-relay-", dir="/tmp")
    saved = os.environ.get("RAY_TMPDIR")
    os.environ["RAY_TMPDIR"] = ray_tmp
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the trainable is defined here, not installed
    try:
        yield
    finally:
        ray.shutdown()
        stop_processes_under(ray_tmp)
        shutil.rmtree(ray_tmp, ignore_errors=True)
        os.environ.pop("RAY_TMPDIR") if saved is None else os.environ.update(RAY_TMPDIR=saved)


def test_every_report_of_a_run_reaches_tune_before_its_trial_ends(ray_here, tmp_path):
    from ray import tune

    tuner = tune.Tuner(_relayed, param_space={"fail": tune.grid_search([False, True])},
                       tune_config=tune.TuneConfig(time_budget_s=300),  # a lost report would hang the trial
                       run_config=tune.RunConfig(storage_path=str(tmp_path), name="relay", verbose=0))
    grid = tuner.fit()
    by_outcome = {result.config["fail"]: result for result in grid}
    finished, failed = by_outcome[False], by_outcome[True]
    assert finished.error is None and list(finished.metrics_dataframe["epoch"]) == [0, 1, 2]
    assert "the run failed after its reports" in str(failed.error)
    assert list(failed.metrics_dataframe["epoch"]) == [0, 1, 2]  # reports before a failure still count


class OneEpoch:
    """The fields of a trainer's EpochReport that a function trial's reporter reads."""

    def __init__(self, epoch: int) -> None:
        self.metrics = {"epoch": epoch, "epochs_since_best": 0, "val/acc": 0.5 + epoch / 10}
        self.best_metrics = {"val/acc": 0.5 + epoch / 10}

    def write_checkpoint(self, directory: Path) -> None:
        (directory / "state.txt").write_text(str(self.metrics["epoch"]))


def _reported_twice(config: dict) -> None:
    import json

    from raybench.sweep.ray_trial import TuneReporter

    reporter = TuneReporter()
    for epoch in range(2):
        reporter.on_epoch_end(OneEpoch(epoch))
    Path(config["out"]).write_text(json.dumps(reporter.recorded()))


def test_a_function_trials_record_names_the_checkpoint_tune_persisted(ray_here, tmp_path):
    """A function trial's record is the one source of its TrialRecord, its checkpoint's path included: the path
    Tune persisted the last report's checkpoint at, as a Train run's record names Train's."""
    import json

    from ray import tune

    from raybench.sweep.ray_worker import CHECKPOINT_PATH_KEY, EPOCHS_DONE

    out = tmp_path / "recorded.json"
    (result,) = tune.Tuner(_reported_twice, param_space={"out": str(out)},
                           run_config=tune.RunConfig(storage_path=str(tmp_path), name="persisted", verbose=0)).fit()
    assert result.error is None, result.error
    recorded = json.loads(out.read_text())
    assert recorded[CHECKPOINT_PATH_KEY] == result.checkpoint.path and recorded[EPOCHS_DONE] == 2
    assert (Path(recorded[CHECKPOINT_PATH_KEY]) / "state.txt").read_text() == "1"  # the last epoch's, persisted
