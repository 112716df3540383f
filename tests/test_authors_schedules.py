"""Where raybench follows the WILDS authors' code (p-lambda/wilds, examples/) rather than a shortcut:

- the FixMatch learning-rate decay lr * (1 + 10 t / T)^-0.75 per optimiser step (examples/scheduler.py lines
  34-40), the default schedule of Pseudo-Label, FixMatch and Noisy Student (examples/configs/algorithm.py lines
  57, 68, 78) and of no other method;
- 4 steps of gradient accumulation for the methods that use unlabeled data (WILDS 2.0 App. D), on digits-shift too;
- Noisy Student's one forward pass over labeled + unlabeled inputs (examples/algorithms/noisy_student.py lines
  126-130), so batch norm normalises them together.
"""
from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.nn.functional as F
from helpers.datasets import make_tiny_dataset

from raybench.algorithms import ALGORITHMS, AlgorithmContext, build_algorithm
from raybench.algorithms.noisy_student import NoisyStudent
from raybench.data import Batch, ShiftDataset, Split, Task, TaskKind, TrainDefaults, Views, load_dataset
from raybench.models import ModelSpec, build_model
from raybench.sweep.authoring import new_space_text
from raybench.sweep.space import load_space
from raybench.trainer import TrainConfig
from raybench.trainer.optim import SCHEDULES, build_schedule

SEMI_SUPERVISED = ("pseudolabel", "fixmatch", "noisy_student")
ACCUMULATING_SPACES = ("coral", "dann", "pseudolabel", "fixmatch", "noisy_student")  # uses unlabeled data, no pretext
NOT_ACCUMULATING_SPACES = ("erm", "erm_aug", "swav")  # ERM; SwAV is a pre-training method (App. D: excluded)


# ----------------------------------------------------------------------------- the FixMatch lr decay


def lrs_over(total_steps: int, lr: float = 0.3) -> list[float]:
    """The learning rate at optimiser steps 0..total_steps of the 'fixmatch' schedule, stepped per batch."""
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=lr)
    schedule = build_schedule("fixmatch", optimizer, total_steps, gamma=0.5)
    seen = [optimizer.param_groups[0]["lr"]]
    for _ in range(total_steps):
        optimizer.step()
        schedule.step_batch()
        schedule.step_epoch()  # a per-step schedule ignores epochs: this must change nothing
        seen.append(optimizer.param_groups[0]["lr"])
    return seen


@pytest.mark.parametrize("total_steps", [10, 40])
def test_fixmatch_schedule_is_the_authors_decay_per_optimiser_step(total_steps):
    assert "fixmatch" in SCHEDULES
    lr = 0.3
    seen = lrs_over(total_steps, lr)
    assert seen[0] == pytest.approx(lr, rel=1e-12)
    assert seen[total_steps // 2] == pytest.approx(lr * 6.0 ** -0.75, rel=1e-12)
    assert seen[total_steps] == pytest.approx(lr * 11.0 ** -0.75, rel=1e-12)
    assert all(seen[t] == pytest.approx(lr * (1 + 10 * t / total_steps) ** -0.75, rel=1e-12)
               for t in range(total_steps + 1))


def test_the_fixmatch_schedule_is_per_step():
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    schedule = build_schedule("fixmatch", optimizer, 10, gamma=0.5)
    assert schedule.per_step
    schedule.step_epoch()
    assert optimizer.param_groups[0]["lr"] == 1.0


@pytest.mark.parametrize("algorithm", sorted(ALGORITHMS.names()))
def test_only_the_authors_three_self_training_methods_default_to_the_fixmatch_decay(algorithm):
    expected = "fixmatch" if algorithm in SEMI_SUPERVISED else None
    assert ALGORITHMS.get(algorithm).default_scheduler == expected


@pytest.mark.parametrize("algorithm, expected", [("pseudolabel", "fixmatch"), ("fixmatch", "fixmatch"),
                                                 ("noisy_student", "fixmatch"), ("erm", None), ("dann", None)])
def test_a_config_without_a_schedule_takes_the_methods_default_where_the_dataset_has_none(algorithm, expected):
    dataset = make_tiny_dataset(n_train=8, n_eval=8, n_unlabeled=8)
    assert dataset.defaults.scheduler is None
    config = TrainConfig.from_flat({"dataset": dataset.name, "algorithm": algorithm, "device": "cpu"})
    assert config.resolve(dataset).scheduler == expected
    with_step = dataclasses.replace(dataset, defaults=dataclasses.replace(dataset.defaults, scheduler="step"))
    assert config.resolve(with_step).scheduler == "step"  # a dataset's own schedule wins (WILDS: fmow, poverty)


# ----------------------------------------------------------------------------- gradient accumulation


@pytest.fixture(scope="module")
def digits(tmp_path_factory) -> ShiftDataset:
    return load_dataset("digits-shift", tmp_path_factory.mktemp("data"))


def trial_config(space_text_or_name: str, dataset: ShiftDataset) -> TrainConfig:
    """The trainer config of a sweep trial of this space on this dataset (first choice / lower bound sampled)."""
    resolved = load_space(space_text_or_name).for_dataset(dataset)
    sampled = {n: p.values[0] if p.values else p.low for n, p in resolved.search.items()}
    return TrainConfig.from_flat(resolved.materialize(sampled)).resolve(dataset)


@pytest.mark.parametrize("space", ACCUMULATING_SPACES)
def test_shipped_unlabeled_method_spaces_accumulate_4_steps_on_digits_shift(space, digits):
    assert trial_config(space, digits).grad_accum == 4
    assert load_space(space).for_dataset(digits).fixed["grad_accum"] == 4


@pytest.mark.parametrize("space", NOT_ACCUMULATING_SPACES)
def test_erm_and_pretraining_spaces_do_not_accumulate(space, digits):
    assert trial_config(space, digits).grad_accum == 1


@pytest.mark.parametrize("algorithm", ["coral", "dann", "pseudolabel", "fixmatch", "noisy_student"])
def test_space_new_keeps_the_papers_accumulation_on_digits_shift(algorithm, digits, tmp_path):
    path = tmp_path / f"{algorithm}.yaml"
    path.write_text(new_space_text(algorithm))
    assert "digits-shift" not in path.read_text()
    assert trial_config(str(path), digits).grad_accum == 4


# ----------------------------------------------------------------------------- Noisy Student's joint pass


def centred(x: torch.Tensor) -> torch.Tensor:
    return x.float() / 255 - 0.5


def deterministic_views() -> Views:
    """No random crops or RandAugment, so the objective's inputs can be recomputed exactly."""
    return Views(plain=centred, weak=centred, strong=lambda x: -centred(x))


@pytest.fixture(scope="module")
def image_data() -> ShiftDataset:
    return dataclasses.replace(make_tiny_dataset(), views=deterministic_views())


def student(dataset: ShiftDataset, **hparams) -> NoisyStudent:
    """A Noisy Student on LeNet (batch norm in every block) with teacher labels already in place."""
    torch.manual_seed(0)
    model = build_model("lenet", ModelSpec(dataset.input_shape, dataset.task.n_outputs))
    context = AlgorithmContext(dataset.task, dataset.views, dataset.n_domains, 100, dataset.n_groups)
    algorithm = build_algorithm("noisy_student", model, {"dropout": 0.0, **hparams}, context)
    assert isinstance(algorithm, NoisyStudent)
    n_unlabeled = len(dataset.split("test_unlabeled"))
    if dataset.task.kind is TaskKind.REGRESSION:
        algorithm.pseudo_labels = torch.linspace(-1.0, 1.0, n_unlabeled)
    else:
        algorithm.pseudo_labels = torch.arange(n_unlabeled) % dataset.task.n_outputs
    return algorithm.train()


def batches(dataset: ShiftDataset, n_labeled: int = 8, n_unlabeled: int = 24) -> tuple[Batch, Batch]:
    rows = torch.arange(n_unlabeled).flip(0) * 3  # out of order: targets follow the batch's own index
    return dataset.split("train").take(torch.arange(n_labeled)), dataset.split("test_unlabeled").take(rows)


def count_forwards(algorithm: NoisyStudent) -> list[int]:
    """The batch size of every forward call of the student model, in order."""
    sizes: list[int] = []
    algorithm.model.register_forward_hook(lambda module, args, output: sizes.append(len(args[0])))
    return sizes


def test_noisy_student_runs_one_forward_pass_over_labeled_and_unlabeled_rows(image_data):
    algorithm = student(image_data)
    labeled, unlabeled = batches(image_data)
    sizes = count_forwards(algorithm)
    algorithm(labeled, unlabeled, 0)
    assert sizes == [len(labeled) + len(unlabeled)]
    algorithm(labeled, unlabeled, 1)
    assert sizes == [len(labeled) + len(unlabeled)] * 2  # one call per step


def test_noisy_student_losses_are_the_joint_pass_split_by_rows_and_summed_unweighted(image_data):
    """With batch norm in training mode, outputs depend on the whole batch: the losses equal those of one pass
    over [labeled; unlabeled] (strong views), the labeled CE on the first rows and the pseudo-label CE on the rest,
    and differ from separate passes."""
    algorithm = student(image_data)
    labeled, unlabeled = batches(image_data)
    targets = algorithm.pseudo_labels[unlabeled.index]
    torch.manual_seed(1)
    out = algorithm(labeled, unlabeled, 0)
    n = len(labeled)
    with torch.no_grad():
        joint = algorithm.model(torch.cat([-centred(labeled.x), -centred(unlabeled.x)]))
        supervised, pseudo = F.cross_entropy(joint[:n], labeled.y), F.cross_entropy(joint[n:], targets)
        apart = F.cross_entropy(algorithm.model(-centred(labeled.x)), labeled.y)
    assert abs(apart - supervised) > 1e-3, "separate passes would give the same loss: the check would be vacuous"
    assert out.logs["loss/supervised"].item() == pytest.approx(supervised.item(), rel=1e-5)
    assert out.logs["loss/pseudo"].item() == pytest.approx(pseudo.item(), rel=1e-5)
    assert out.loss.item() == pytest.approx((supervised + pseudo).item(), rel=1e-5)


def regression_data() -> ShiftDataset:
    """The tiny images with a scalar target: Noisy Student's MSE on the teacher's values (PovertyMap's task)."""
    base = make_tiny_dataset(n_train=16, n_eval=8, n_unlabeled=32)
    splits = {name: Split(name, s.x, None if s.y is None else s.y.float() / 3, s.domain, s.group)
              for name, s in base.splits.items()}
    return dataclasses.replace(base, task=Task(TaskKind.REGRESSION, 1), splits=splits, views=deterministic_views(),
                               defaults=TrainDefaults(model="lenet", lr=1e-3, batch_size=8, epochs=1))


def test_noisy_student_regression_shares_the_pass_too():
    dataset = regression_data()
    algorithm = student(dataset)
    labeled, unlabeled = batches(dataset, n_labeled=4, n_unlabeled=8)
    sizes = count_forwards(algorithm)
    out = algorithm(labeled, unlabeled, 0)
    assert sizes == [12]
    with torch.no_grad():
        joint = algorithm.model(torch.cat([-centred(labeled.x), -centred(unlabeled.x)])).squeeze(-1)
    assert out.logs["loss/supervised"].item() == pytest.approx(F.mse_loss(joint[:4], labeled.y).item(), rel=1e-5)
    expected = F.mse_loss(joint[4:], algorithm.pseudo_labels[unlabeled.index])
    assert out.logs["loss/pseudo"].item() == pytest.approx(expected.item(), rel=1e-5)


def test_constant_opts_a_method_out_of_its_default_decay():
    config = TrainConfig.from_flat({"dataset": "digits-shift", "algorithm": "fixmatch", "scheduler": "constant"})
    resolved = config.resolve(load_dataset("digits-shift"))
    assert resolved.scheduler == "constant"
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.1)
    schedule = build_schedule("constant", optimizer, 100, 0.96)
    for _ in range(50):
        schedule.step_batch()
    assert optimizer.param_groups[0]["lr"] == 0.1
