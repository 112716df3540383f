"""Every registered algorithm meets the contract; each loss has a property or hand-computed check."""
from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import pytest
import torch
from helpers.datasets import MINILM_FOLDER, text_model, tiny_text_dataset
from torch import nn

from raybench.algorithms import ALGORITHMS, AlgorithmContext, RoundContext, build_algorithm
from raybench.algorithms.coral import coral_penalty
from raybench.algorithms.dann import GradientReversal
from raybench.algorithms.fixmatch import FixMatch
from raybench.algorithms.pseudolabel import PseudoLabel
from raybench.data import Batch, ShiftDataset
from raybench.models import FeaturizerHead, ModelSpec, build_model
from raybench.trainer import TrainConfig, Trainer


def context_for(dataset, total_steps: int = 100) -> AlgorithmContext:
    return AlgorithmContext(dataset.task, dataset.views, dataset.n_domains, total_steps, dataset.n_groups)


def lenet(dataset) -> FeaturizerHead:
    return build_model("lenet", ModelSpec(dataset.input_shape, dataset.task.n_outputs))


def batches(dataset, n_labeled: int = 8, n_unlabeled: int = 24) -> tuple[Batch, Batch]:
    return (dataset.split("train").take(torch.arange(n_labeled)),
            dataset.split("test_unlabeled").take(torch.arange(n_unlabeled)))


def round_context(dataset, algorithm, stage_cache, make_model=lenet, **settings) -> RoundContext:
    """The services a real trainer offers (splits, stages, prediction), with a stub for model checkpoints."""
    config = TrainConfig.from_flat({"dataset": dataset.name, "algorithm": algorithm.name, "epochs": 1,
                                    "device": "cpu", "stage_cache": str(stage_cache), **settings})
    context = Trainer(config, dataset=dataset)._round_context(0)
    teacher = make_model(dataset)
    return dataclasses.replace(context, load_model=lambda path, setting: teacher)


@dataclasses.dataclass
class Subject:
    """Where an algorithm is exercised: a dataset it accepts, its model, and the settings that keep it short."""

    dataset: ShiftDataset
    model: Callable[[ShiftDataset], FeaturizerHead]
    hparams: dict[str, Any]
    settings: dict[str, Any]


def subject_for(name: str, tiny_dataset: ShiftDataset) -> Subject:
    """The tiny image dataset when the algorithm accepts it, else the tiny text dataset on MiniLM (mlm refuses
    images by design); either way the algorithm's own applicability check decides."""
    cls = ALGORITHMS.get(name)
    if cls.models is not None:  # a method that needs its own architecture (emix, shed) runs on it, pre-trained briefly
        model = min(cls.models)
        return Subject(tiny_dataset, lambda dataset: build_model(model, ModelSpec(dataset.input_shape, dataset.task.n_outputs)),
                       {"pretrain_steps": 1, "pretrain_batch_size": 8, "pretrain_epochs": 1}, {"model": model})
    if cls.inapplicable_reason(cls.Hparams(), tiny_dataset.task.kind, tiny_dataset.capabilities) is None:
        return Subject(tiny_dataset, lenet, {}, {})
    text = tiny_text_dataset()
    assert cls.inapplicable_reason(cls.Hparams(), text.task.kind, text.capabilities) is None, \
        f"{name} accepts neither the tiny image nor the tiny text dataset"
    return Subject(text, lambda dataset: text_model(dataset.task.n_outputs),
                   {"pretrain_steps": 1, "pretrain_batch_size": 8}, {"model_weights": str(MINILM_FOLDER)})


# A method's own set-up, shortened where its default is long; what it computes is tested at scale elsewhere
# (EIIL's 20,000 environment-inference steps: test_mechanisms_groups.py runs 1,500, test_group_methods.py 50).
SHORT_SETUP = {"eiil": {"ei_steps": 50}}


@pytest.mark.parametrize("name", ALGORITHMS.names())
def test_conformance_init_update_predict(name, tiny_dataset, tmp_path):
    """init -> begin_round -> a few updates -> predict: finite loss, gradient reaching the featurizer."""
    torch.manual_seed(0)
    subject = subject_for(name, tiny_dataset)
    dataset = subject.dataset
    hparams = {**subject.hparams, **SHORT_SETUP.get(name, {})}
    algorithm = build_algorithm(name, subject.model(dataset), hparams, context_for(dataset))
    algorithm.begin_round(round_context(dataset, algorithm, tmp_path, subject.model, **{**subject.settings, **hparams}))
    optimizer = torch.optim.SGD(algorithm.param_groups(0.01), lr=0.01)
    labeled, unlabeled = batches(dataset)
    for step in range(3):
        optimizer.zero_grad()
        out = algorithm(labeled, unlabeled if algorithm.uses_unlabeled else None, step)
        assert torch.isfinite(out.loss)
        if out.loss.requires_grad:  # newt_probe fits its probe in closed form: nothing takes a gradient
            out.loss.backward()
        trainable = [p for p in algorithm.model.featurizer.parameters() if p.requires_grad]
        if trainable:
            grads = [p.grad for p in trainable if p.grad is not None]
            assert grads and any(g.abs().sum() > 0 for g in grads), "no gradient reached the featurizer"
        elif algorithm.trains_by_gradient:  # linear transfer (emix, shed, linear_eval): only the fresh head learns
            assert all(p.grad is None for p in algorithm.model.featurizer.parameters())
            assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in algorithm.model.head.parameters())
        else:  # a closed-form probe (newt_probe): nothing is trainable
            assert not any(p.requires_grad for p in algorithm.parameters())
        optimizer.step()
        assert all(torch.isfinite(v).all() for v in out.logs.values())
    algorithm.eval()
    outputs = algorithm.predict(labeled.x)
    assert outputs.shape == (len(labeled), dataset.task.n_outputs)


def test_coral_penalty_zero_for_identical_batches():
    features = torch.randn(16, 5)
    assert coral_penalty(features, features.clone()).item() == pytest.approx(0.0, abs=1e-12)


def test_coral_penalty_hand_computed():
    a = torch.tensor([[0.0, 0.0], [2.0, 2.0]])  # mean (1,1), cov [[2,2],[2,2]]
    b = torch.tensor([[0.0, 0.0], [0.0, 2.0]])  # mean (0,1), cov [[0,0],[0,2]]
    # mean term: ((1-0)^2 + (1-1)^2) / 2 = 0.5; cov term: ((2)^2 + 2^2 + 2^2 + 0^2) / 4 = 3.0
    assert coral_penalty(a, b).item() == pytest.approx(3.5)


def test_gradient_reversal_negates_gradient():
    features = torch.randn(6, 4, requires_grad=True)
    discriminator = nn.Linear(4, 3)
    loss = discriminator(GradientReversal.apply(features, 1.0)).pow(2).sum()
    (reversed_grad,) = torch.autograd.grad(loss, features)
    plain = discriminator(features).pow(2).sum()
    (plain_grad,) = torch.autograd.grad(plain, features)
    assert torch.allclose(reversed_grad, -plain_grad)


def test_dann_has_three_learning_rates_with_featurizer_at_a_tenth(tiny_dataset):
    algorithm = build_algorithm("dann", lenet(tiny_dataset), {"discriminator_lr": 0.5}, context_for(tiny_dataset))
    lrs = [group["lr"] for group in algorithm.param_groups(0.1)]
    assert lrs == pytest.approx([0.01, 0.1, 0.5])


def test_pseudolabel_weight_ramps_to_lambda_at_40_percent(tiny_dataset):
    algorithm = build_algorithm("pseudolabel", lenet(tiny_dataset), {"penalty": 2.0}, context_for(tiny_dataset, 1000))
    assert isinstance(algorithm, PseudoLabel)
    assert algorithm.unlabeled_weight(0) == 0.0
    assert algorithm.unlabeled_weight(200) == pytest.approx(1.0)
    assert algorithm.unlabeled_weight(400) == pytest.approx(2.0)
    assert algorithm.unlabeled_weight(900) == pytest.approx(2.0)


class ConstantModel(FeaturizerHead):
    """Outputs fixed logits whatever the input, so FixMatch's confidence is known exactly."""

    def __init__(self, logits: torch.Tensor) -> None:
        super().__init__(nn.Flatten(), 1, logits.shape[-1], head=nn.Identity())
        self.logits = nn.Parameter(logits.clone())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.logits.expand(x.shape[0], -1) + 0 * x.flatten(1)[:, :1]


def test_fixmatch_masks_low_confidence_and_is_zero_when_none_passes(tiny_dataset):
    uniform = torch.zeros(1, tiny_dataset.task.n_outputs)  # confidence 1/4 everywhere
    algorithm = build_algorithm("fixmatch", ConstantModel(uniform), {"threshold": 0.9}, context_for(tiny_dataset))
    assert isinstance(algorithm, FixMatch)
    labeled, unlabeled = batches(tiny_dataset)
    out = algorithm(labeled, unlabeled, 0)
    assert out.logs["loss/consistency"].item() == 0.0 and out.logs["pseudo/kept"].item() == 0.0

    confident = torch.tensor([[10.0, 0.0, 0.0, 0.0]])
    algorithm = build_algorithm("fixmatch", ConstantModel(confident), {"threshold": 0.9}, context_for(tiny_dataset))
    out = algorithm(labeled, unlabeled, 0)
    expected = torch.nn.functional.cross_entropy(confident, torch.tensor([0]))
    assert out.logs["pseudo/kept"].item() == 1.0
    assert out.logs["loss/consistency"].item() == pytest.approx(expected.item(), rel=1e-5)


def test_noisy_student_has_dropout_before_the_head(tiny_dataset):
    algorithm = build_algorithm("noisy_student", lenet(tiny_dataset), {"dropout": 0.5}, context_for(tiny_dataset))
    head = algorithm.model.head
    assert isinstance(head, nn.Sequential) and isinstance(head[0], nn.Dropout) and head[0].p == 0.5
    assert isinstance(head[1], nn.Linear)


def test_noisy_student_learns_the_teachers_labels(tiny_dataset, tmp_path):
    hparams = {"teacher_checkpoint": "teacher.pt"}  # the stub context hands over a fixed teacher
    algorithm = build_algorithm("noisy_student", lenet(tiny_dataset), hparams, context_for(tiny_dataset))
    facts = algorithm.begin_round(round_context(tiny_dataset, algorithm, tmp_path))
    assert facts == {"round_0/teacher_source": "checkpoint teacher.pt", "round_0/student_init": "the teacher's weights"}
    assert algorithm.pseudo_labels.shape == (len(tiny_dataset.split("test_unlabeled")),)
    state = algorithm.state_dict()
    fresh = build_algorithm("noisy_student", lenet(tiny_dataset), hparams, context_for(tiny_dataset))
    fresh.load_state_dict(state)
    assert torch.equal(fresh.pseudo_labels, algorithm.pseudo_labels)


def test_unknown_hyperparameter_names_the_known_ones(tiny_dataset):
    with pytest.raises(ValueError, match="has no hyperparameter 'lambda'.*penalty"):
        build_algorithm("coral", lenet(tiny_dataset), {"lambda": 1.0}, context_for(tiny_dataset))


def test_unknown_algorithm_lists_known():
    with pytest.raises(KeyError, match="known: cb, coral, dann, dfr"):
        ALGORITHMS.get("nope")
