"""SwAV: Sinkhorn codes, the loss at initialisation, the crops, applicability, and the featurizer hand-over."""
from __future__ import annotations

import math

import pytest
import torch
from lightly.loss.swav_loss import sinkhorn

from raybench.algorithms import ALGORITHMS, AlgorithmContext, build_algorithm
from raybench.algorithms.swav import SwAV, random_resized_crops
from raybench.data.base import TaskKind
from raybench.models import ModelSpec, build_model

PRETEXT = {"phase": "pretext", "prototypes": 20}


def context_for(dataset) -> AlgorithmContext:
    return AlgorithmContext(dataset.task, dataset.views, dataset.n_domains, 100, dataset.n_groups)


def pretext_swav(dataset, **hparams) -> SwAV:
    model = build_model("lenet", ModelSpec(dataset.input_shape, dataset.task.n_outputs))
    algorithm = build_algorithm("swav", model, {**PRETEXT, **hparams}, context_for(dataset))
    assert isinstance(algorithm, SwAV)
    return algorithm


def test_sinkhorn_codes_use_every_prototype_equally():
    """Column sums of the codes are B/K (equal use), row sums 1 (each example one unit of assignment): exact
    once Sinkhorn has converged, close after SwAV's 3 iterations on scores of unit vectors at initialisation."""
    torch.manual_seed(0)
    b, k = 64, 16
    scores = torch.nn.functional.normalize(torch.randn(b, 8), dim=1) @ torch.nn.functional.normalize(torch.randn(k, 8), dim=1).T
    converged = sinkhorn(scores, iterations=200, epsilon=0.03)
    assert torch.allclose(converged.sum(0), torch.full((k,), b / k), rtol=1e-3)
    assert torch.allclose(converged.sum(1), torch.ones(b), atol=1e-4)
    early = sinkhorn(scores * 0.1, iterations=3, epsilon=0.03)  # near-uniform scores, as at initialisation
    assert torch.allclose(early.sum(0), torch.full((k,), b / k), rtol=0.1)
    plain_softmax = torch.softmax(scores / 0.03, dim=1).sum(0)  # without Sinkhorn: far from equal use
    assert not torch.allclose(plain_softmax, torch.full((k,), b / k), rtol=0.1)


def test_loss_at_initialisation_is_about_ln_k(tiny_dataset):
    torch.manual_seed(0)
    algorithm = pretext_swav(tiny_dataset)
    x = tiny_dataset.split("test_unlabeled").take(torch.arange(64)).x
    loss = algorithm.pretext_objective(x, step=0).loss.item()
    assert abs(loss - math.log(20)) < 0.15 * math.log(20), loss


class Recorder(torch.nn.Module):
    """Stands in for the loss and records which crops it was given as assignment (high) and other (low) crops."""

    def forward(self, high, low):
        self.shapes = (len(high), len(low))
        return sum(h.sum() for h in high) * 0.0


def test_codes_come_from_the_high_resolution_crops(tiny_dataset):
    """The `high_crops` assignment crops go first: swapping the two lists turns this red."""
    torch.manual_seed(0)
    algorithm = pretext_swav(tiny_dataset, high_crops=2, low_crops=3)
    algorithm.criterion = Recorder()
    algorithm.pretext_objective(tiny_dataset.split("test_unlabeled").take(torch.arange(16)).x, step=0)
    assert algorithm.criterion.shapes == (2, 3)


def swapped_prediction(high, low, codes):
    """The SwAV loss written out with the given codes, averaged over assignment crops and their other crops."""
    total = 0
    for a in range(len(high)):
        others = [high[v] for v in range(len(high)) if v != a] + low
        total = total + sum(-(codes[a] * torch.log_softmax(o / 0.1, 1)).sum(1).mean() for o in others) / len(others)
    return total / len(high)


def test_codes_carry_no_gradient(tiny_dataset):
    """The loss's gradient equals that of the same loss with the codes held fixed (stop-gradient on q)."""
    torch.manual_seed(1)
    algorithm = pretext_swav(tiny_dataset)
    high = [(torch.rand(8, 20) * 2 - 1).requires_grad_(True) for _ in range(2)]  # cosines, as z^T C are
    low = [(torch.rand(8, 20) * 2 - 1).requires_grad_(True)]
    algorithm.criterion(high, low).backward()
    codes = [sinkhorn(h.detach(), iterations=3, epsilon=0.03) for h in high]
    fixed_high = [h.detach().requires_grad_(True) for h in high]
    swapped_prediction(fixed_high, [low[0].detach()], codes).backward()
    assert torch.allclose(high[0].grad, fixed_high[0].grad, atol=1e-5)
    assert torch.allclose(high[1].grad, fixed_high[1].grad, atol=1e-5)


def test_low_resolution_crops_hold_only_their_pixels():
    """A crop rendered at 4 px and brought to 16 px is smooth; one rendered at 16 px keeps the fine pattern."""
    torch.manual_seed(0)
    x = torch.rand(4, 3, 16, 16)
    (high,) = random_resized_crops(x, 1, 16, (0.9, 1.0), 16)
    (low,) = random_resized_crops(x, 1, 4, (0.9, 1.0), 16)
    roughness = lambda t: (t[..., 1:] - t[..., :-1]).abs().mean()
    assert high.shape == low.shape == (4, 3, 16, 16)
    assert roughness(low) < 0.5 * roughness(high)


@pytest.mark.parametrize("dataset,capabilities,task,accepted", [
    ("camelyon17", {"strong_augmentation", "features"}, TaskKind.CLASSIFICATION, True),
    ("poverty", {"strong_augmentation", "features"}, TaskKind.REGRESSION, True),
    ("digits-shift", {"strong_augmentation", "features"}, TaskKind.CLASSIFICATION, True),
    ("civilcomments", {"features", "text"}, TaskKind.CLASSIFICATION, False),
    ("ogb-molpcba", {"features"}, TaskKind.MULTILABEL, False),
    ("globalwheat", set(), TaskKind.DETECTION, False),
])
def test_applicability(dataset, capabilities, task, accepted):
    cls = ALGORITHMS.get("swav")
    reason = cls.inapplicable_reason(cls.Hparams(), task, frozenset(capabilities))
    assert (reason is None) == accepted, (dataset, reason)
    if not accepted:
        assert "images" in reason


def test_wilds_settings_are_declared_for_the_four_image_datasets():
    from raybench.data.wilds.spec import load_specs

    specs = load_specs()
    expected = {"camelyon17": (20, 6, 96), "fmow": (620, 8, 224), "iwildcam": (1860, 4, 448), "poverty": (1000, 8, 224)}
    for name, (k, crops, high_size) in expected.items():
        settings = specs[name].defaults.algorithm_hparams["swav"]
        hparams = ALGORITHMS.get("swav").Hparams(**settings)
        assert (hparams.prototypes, hparams.high_crops + hparams.low_crops, hparams.high_size) == (k, crops, high_size)
        assert hparams.pretrain_epochs == 400


def test_only_datasets_that_declare_swav_settings_accept_it(tiny_dataset):
    """WILDS ran SwAV on iwildcam, camelyon17, fmow and poverty; raybench adds digits-shift. Every other dataset
    is refused by name, with the reason, before any data or model work."""
    import dataclasses

    from raybench.data import load_dataset
    from raybench.data.spuco import BASES
    from raybench.data.wilds.spec import load_specs
    from raybench.trainer import ConfigError, TrainConfig

    wilds = {name for name, spec in load_specs().items() if "swav" in spec.defaults.algorithm_hparams}
    assert wilds == {"camelyon17", "fmow", "iwildcam", "poverty"}
    assert "swav" in load_dataset("digits-shift").defaults.algorithm_hparams
    assert not any("swav" in base.defaults.algorithm_hparams for base in BASES.values())  # spuco-*: refused
    TrainConfig.from_flat({"dataset": "tiny", "algorithm": "swav"}).resolve(tiny_dataset)  # declares them
    bare = dataclasses.replace(tiny_dataset, defaults=dataclasses.replace(tiny_dataset.defaults, algorithm_hparams={}))
    with pytest.raises(ConfigError) as refused:
        TrainConfig.from_flat({"dataset": "tiny", "algorithm": "swav"}).resolve(bare)
    assert "'swav' cannot run on 'tiny': the dataset declares no swav settings" in str(refused.value)
