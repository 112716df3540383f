"""Pretext mode of the one trainer and the cached pre-training stage (SwAV on images here; MLM in test_mlm.py)."""
from __future__ import annotations

import dataclasses

import pytest
import torch

from raybench.algorithms import AlgorithmContext, build_algorithm
from raybench.checkpoints import load_state_dict_into
from raybench.data import Split
from raybench.models import ModelSpec, build_model
from raybench.trainer import TrainConfig, Trainer
from raybench.trainer.callbacks import Callback
from raybench.trainer.stages import StageCache

PRETEXT = {"algorithm": "swav", "phase": "pretext", "prototypes": 8, "device": "cpu", "epochs": 2, "batch_size": 32,
           "lr": 0.5, "optimizer": "lars", "scheduler": "cosine", "weight_decay": 1e-6, "momentum": 0.9}


class Stages(Callback):
    def __init__(self) -> None:
        self.reports = []

    def on_stage(self, report) -> None:
        self.reports.append(report)


class NoLabels(Split):
    """A labeled split that fails the moment anyone draws a batch from it."""

    def take(self, index):
        raise AssertionError("pretext mode drew a labeled batch")


def test_pretext_epoch_is_one_pass_over_unlabeled_and_draws_no_labeled_batch(tiny_dataset, tmp_path):
    train = tiny_dataset.split("train")
    guarded = dataclasses.replace(tiny_dataset, splits={**tiny_dataset.splits, "train": NoLabels(
        train.name, train.x, train.y, train.domain, train.group)})
    trainer = Trainer(TrainConfig.from_flat({**PRETEXT, "dataset": "tiny", "stage_cache": str(tmp_path)}), dataset=guarded)
    assert trainer.steps_per_epoch == len(tiny_dataset.split("test_unlabeled")) // 32
    result = trainer.fit()
    assert len(result.history) == 2
    last = result.history[-1]
    assert "train/loss/swav" in last and "train/swav/prototypes_in_use" in last
    assert not any(k.startswith(("val/", "test/", "id_val/")) for k in last), "a pretext epoch scored labeled splits"
    assert result.final_state, "the stage hands on the final weights"


def fine_tune(dataset, tmp_path, seed=0, **hparams):
    config = TrainConfig.from_flat({"dataset": dataset.name, "algorithm": "swav", "epochs": 1, "device": "cpu",
                                    "stage_cache": str(tmp_path), "seed": seed, "prototypes": 8,
                                    "pretrain_batch_size": 32, **hparams})
    stages = Stages()
    trainer = Trainer(config, callbacks=[stages], dataset=dataset)
    context = AlgorithmContext(dataset.task, dataset.views, dataset.n_domains, 10, dataset.n_groups)
    torch.manual_seed(123)
    model = build_model("lenet", ModelSpec(dataset.input_shape, dataset.task.n_outputs))
    algorithm = build_algorithm("swav", model, config.resolve(dataset).hparams, context)
    fresh_head = {k: v.clone() for k, v in algorithm.model.head.state_dict().items()}
    facts = algorithm.begin_round(trainer._round_context(0))
    return algorithm, fresh_head, facts, stages.reports


def test_only_the_featurizer_transfers_and_equals_the_cached_one(tiny_dataset, tmp_path):
    algorithm, fresh_head, facts, reports = fine_tune(tiny_dataset, tmp_path)
    (report,) = reports
    assert report.name == "pretrain" and not report.cached and facts["pretrained_featurizer"] == report.key
    cached = StageCache(tmp_path).get_or_make(report.key, lambda: pytest.fail("the stage was not cached"))
    pretrained = load_state_dict_into(build_model("lenet", ModelSpec(tiny_dataset.input_shape, 4)), cached.state)
    for name, value in algorithm.model.featurizer.state_dict().items():
        assert torch.equal(value, pretrained.featurizer.state_dict()[name]), f"featurizer {name} differs from the cache"
    for name, value in algorithm.model.head.state_dict().items():
        assert torch.equal(value, fresh_head[name]), "the head did not start fresh"
        assert not torch.equal(value, pretrained.head.state_dict()[name])
    assert report.history and "train/loss/swav" in report.history[0]
    assert report.facts["weights"].endswith("model.pt")


def test_trials_and_replicates_share_one_pretraining_unless_asked_otherwise(tiny_dataset, tmp_path):
    keys = []
    for seed, lr in [(0, 0.01), (0, 0.1), (7, 0.01)]:  # two trials and a replicate with another seed
        _, _, _facts, (report,) = fine_tune(tiny_dataset, tmp_path, seed=seed, lr=lr)
        keys.append((report.key, report.cached))
    assert keys[0][0] == keys[1][0] == keys[2][0] and [c for _, c in keys] == [False, True, True]
    _, _, _, (other,) = fine_tune(tiny_dataset, tmp_path, seed=7, pretrain_seed="none")
    _, _, _, (again,) = fine_tune(tiny_dataset, tmp_path, seed=8, pretrain_seed="none")
    assert other.key != keys[0][0] and again.key != other.key and not other.cached and not again.cached


def test_a_short_run_on_digits_shift_keeps_half_the_prototypes_in_use(tmp_path):
    from raybench.data import load_dataset

    torch.set_num_threads(1)
    dataset = load_dataset("digits-shift", tmp_path / "data", 0)
    k = dataset.defaults.algorithm_hparams["swav"]["prototypes"]
    config = TrainConfig.from_flat({"dataset": "digits-shift", "algorithm": "swav", "phase": "pretext", "epochs": 1,
                                    "max_steps_per_epoch": 25, "device": "cpu", "optimizer": "lars", "lr": 0.6,
                                    "scheduler": "cosine", "batch_size": 64, "weight_decay": 1e-6, "momentum": 0.9,
                                    "stage_cache": str(tmp_path)})
    result = Trainer(config, dataset=dataset).fit()
    in_use = result.history[-1]["train/swav/prototypes_in_use"]
    assert in_use >= k / 2, f"{in_use} of {k} prototypes in use: collapse"
