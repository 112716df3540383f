"""How raybench shapes each Ray Train run (raybench.sweep.ray_backend.TrainPath): the callback it drops must
be the one the installed Ray Train really creates, or the saving silently disappears."""
from __future__ import annotations

import ray.train
from ray.train.v2._internal.callbacks.backend_setup import BackendSetupCallback
from ray.train.v2._internal.callbacks.datasets import DatasetsCallback
from ray.train.v2._internal.callbacks.placement_group_callback import PlacementGroupCleanerCallback
from ray.train.v2.api.data_parallel_trainer import DataParallelTrainer

from raybench.sweep.ray_backend import (
    DEFAULT_TRAIN_PATH, ShapedDataParallelTrainer, ShapedTorchTrainer, TrainPath,
)


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
