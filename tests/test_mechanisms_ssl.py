"""Each self-supervised or frozen-feature algorithm's defining mechanism, checked inside the real algorithm.

e-Mix's mixed targets and ShED's moved-token targets are recomputed by hand from what the algorithm actually fed
its encoder; NeWT's probe must read the features `features_from` names and pick C by cross-validation; linear
evaluation and e-Mix pre-training must learn on a tiny seeded problem. The free functions have their own
tests in test_dabs.py and test_probes.py; these go red when the algorithm stops using them as it should.
"""
from __future__ import annotations

import ast
import math

import pytest
import torch
import torch.nn.functional as F
from helpers.datasets import make_tiny_dataset, tiny_text_dataset
from torch import nn

from raybench.algorithms import AlgorithmContext, build_algorithm
from raybench.data import Batch
from raybench.models import FeaturizerHead, ModelSpec, build_model
from raybench.models.dabs import DabsFeaturizer, EncoderSize, TokenEmbedding
from raybench.trainer import TrainConfig, Trainer

SMALL = "dabs_transformer_small"
TINY = EncoderSize(layers=2, width=32, heads=4, mlp=64, dropout=0.0)


def context_for(dataset) -> AlgorithmContext:
    return AlgorithmContext(dataset.task, dataset.views, dataset.n_domains, 100, dataset.n_groups)


def unlabeled_batch(dataset, n: int) -> Batch:
    return dataset.split("test_unlabeled").take(torch.arange(n))


@pytest.fixture
def one_thread():
    """Seeded runs give the same numbers on one thread; the caller's thread count is restored."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


# ----- e-Mix: the mixed example's target is lambda on its own source, 1 - lambda on its partner ----------------

class FixedDraws:
    """Stands in for e-Mix's two random draws (lambda_i ~ U(min_lambda, 1) and the partner permutation) with
    known values, and records the bounds lambda was asked for."""

    def __init__(self, lam: torch.Tensor, partner: torch.Tensor) -> None:
        self.lam, self.partner, self.bounds = lam, partner, []
        self.real_uniform, self.real_randperm = torch.Tensor.uniform_, torch.randperm

    def uniform_method(self):
        """A replacement for Tensor.uniform_ (a plain function, so the tensor binds as its first argument)."""

        def uniform_(tensor: torch.Tensor, low: float = 0.0, high: float = 1.0, **kwargs) -> torch.Tensor:
            if tensor.shape != self.lam.shape:
                return self.real_uniform(tensor, low, high, **kwargs)
            self.bounds.append((low, high))
            return tensor.copy_(self.lam)

        return uniform_

    def randperm(self, n: int, **kwargs) -> torch.Tensor:
        return self.partner.clone() if n == len(self.partner) else self.real_randperm(n, **kwargs)


def emix_loss_by_hand(algorithm, x: torch.Tensor, lam: torch.Tensor, partner: torch.Tensor, tau: float,
                      targets_partner: torch.Tensor) -> float:
    """Mix the token embeddings, encode both views with the algorithm's own modules, and take the soft
    cross-entropy whose row i puts lam_i on column i and 1 - lam_i on column targets_partner[i]."""
    featurizer, b = algorithm.model.featurizer, len(lam)
    with torch.no_grad():
        tokens, padding = featurizer.embed(x)
        weight = lam.view(-1, 1, 1)
        mixed = weight * tokens + (1 - weight) * tokens[partner]

        def project(t, p):
            return F.normalize(algorithm.projection(featurizer.pool(featurizer.encode(t, p), p)), dim=1)

        log_p = torch.log_softmax(project(mixed, padding & padding[partner]) @ project(tokens, padding).T / tau, 1)
        targets = torch.diag(lam)
        targets[torch.arange(b), targets_partner] += 1 - lam
        return -(targets * log_p).sum(1).mean().item()


def test_emix_loss_targets_lambda_on_the_own_source_and_one_minus_lambda_on_the_partner(tiny_dataset, monkeypatch):
    """With lambda and the permutation fixed, e-Mix's loss is the soft cross-entropy of the mixed rows against
    the clean columns whose targets follow the mix: lambda_i on i, 1 - lambda_i on pi(i). A loss that ignores
    the mix (lambda forced to 1, identity targets) or sends the partner's share to the wrong column (the
    inverse permutation, no permutation) differs from it by far more than the tolerance."""
    torch.manual_seed(0)
    b, tau = 8, 0.02  # a low temperature sharpens the untrained model's logits, so wrong targets show
    model = build_model(SMALL, ModelSpec(tiny_dataset.input_shape, tiny_dataset.task.n_outputs))
    algorithm = build_algorithm("emix", model, {"phase": "pretext", "temperature": tau}, context_for(tiny_dataset))
    algorithm.eval()  # no dropout: the hand computation replays the same encoder
    lam, partner = torch.linspace(0.5, 0.95, b), (torch.arange(b) + 3) % b  # a shift, not its own inverse
    draws = FixedDraws(lam, partner)
    batch = unlabeled_batch(tiny_dataset, b)
    with monkeypatch.context() as patch:
        patch.setattr(torch.Tensor, "uniform_", draws.uniform_method())
        patch.setattr(torch, "randperm", draws.randperm)
        loss = algorithm(None, batch, 0).loss.item()
    assert draws.bounds == [(0.5, 1.0)], "lambda was not drawn once from U(min_lambda, 1)"

    x = tiny_dataset.views.plain(batch.x)
    expected = emix_loss_by_hand(algorithm, x, lam, partner, tau, partner)
    assert loss == pytest.approx(expected, rel=1e-5)
    unmixed = emix_loss_by_hand(algorithm, x, torch.ones(b), partner, tau, partner)
    inverse = emix_loss_by_hand(algorithm, x, lam, partner, tau, torch.argsort(partner))
    own_only = emix_loss_by_hand(algorithm, x, lam, partner, tau, torch.arange(b))
    assert min(abs(expected - wrong) for wrong in (unmixed, inverse, own_only)) > 1e-2, "the check cannot tell"


# ----- ShED: the target marks exactly the positions whose embedding was moved --------------------------------

def letters(lengths: list[int]) -> list[str]:
    """Strings of distinct single letters (one token each), so a moved token always changes its position's
    embedding; different lengths pad the shorter ones."""
    return [" ".join(chr(ord("a") + (start + j) % 26) for j in range(n)) for start, n in enumerate(lengths)]


def shed_subject(modality: str, tiny_dataset):
    """(ShED in its pretext phase, an unlabeled batch): images on the small model, or padded text on a tiny one."""
    torch.manual_seed(0)
    if modality == "image":
        dataset = tiny_dataset
        model = build_model(SMALL, ModelSpec(dataset.input_shape, dataset.task.n_outputs))
        batch = unlabeled_batch(dataset, 12)
    else:
        dataset = tiny_text_dataset()
        model = FeaturizerHead(DabsFeaturizer([TokenEmbedding(20, TINY.width)], TINY), TINY.width, 4)
        texts = letters([20, 7, 13, 3, 16, 10])
        batch = Batch(texts, None, torch.zeros(len(texts)), torch.zeros(len(texts)), torch.arange(len(texts)))
    algorithm = build_algorithm("shed", model, {"phase": "pretext"}, context_for(dataset))
    algorithm.eval()
    return algorithm, batch


@pytest.mark.parametrize("modality", ["image", "text"])
def test_shed_targets_mark_exactly_the_positions_whose_embedding_moved(modality, tiny_dataset, monkeypatch):
    """ShED's loss equals the detector's cross-entropy, over real tokens only, against the positions whose
    embedding the shuffle actually changed (read off the tokens the encoder received): k = ceil(0.15 L), at
    least 2, per example, never padding. All-zero targets, targets from another shuffle than the one applied,
    or misaligned states would each give another number."""
    algorithm, batch = shed_subject(modality, tiny_dataset)
    featurizer = algorithm.model.featurizer
    received = []
    encode = featurizer.encode
    with monkeypatch.context() as patch:
        patch.setattr(featurizer, "encode", lambda t, p: received.append(t.detach().clone()) or encode(t, p))
        loss = algorithm(None, batch, 0).loss.item()

    x = algorithm.context.views.plain(batch.x)
    with torch.no_grad():
        tokens, padding = featurizer.embed(x)
        (shuffled,) = received
        moved = (shuffled != tokens).any(-1)
        real = ~padding
        assert not (moved & padding).any(), "a padding position moved"
        lengths = real.sum(1).tolist()
        assert moved.sum(1).tolist() == [max(2, math.ceil(0.15 * n)) for n in lengths]
        logits = algorithm.detector(featurizer.encode(shuffled, padding)[:, 1:])

        def by_hand(target: torch.Tensor) -> float:
            per_token = F.cross_entropy(logits.flatten(0, 1), target.flatten().long(), reduction="none")
            return (per_token.view(target.shape) * real).sum().item() / real.sum().item()

    assert loss == pytest.approx(by_hand(moved), rel=1e-5)
    assert abs(by_hand(moved) - by_hand(torch.zeros_like(moved))) > 1e-2, "the check cannot tell"


# ----- NeWT's probe: fit on the frozen features `features_from` names, C chosen by cross-validation ----------

class QuadrantsAndNoise(nn.Module):
    """Frozen features of the tiny images on which the SVM's C matters: the 4 quadrant brightnesses (the class)
    beside 56 projections of pixel noise that cancel every quadrant's and channel's offset (no class, no
    domain). Heavily regularised (C = 1e-4) the probe falls back to the majority class; at C = 1 it is exact."""

    n_features = 60

    def __init__(self) -> None:
        super().__init__()
        weight = torch.randn(self.n_features - 4, 3, 2, 8, 2, 8, generator=torch.Generator().manual_seed(0))
        self.register_buffer("noise", (weight - weight.mean(dim=(3, 5), keepdim=True)).flatten(1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        blocks = x.reshape(len(x), 3, 2, 8, 2, 8)
        quadrants = blocks.mean(dim=(1, 3, 5)).flatten(1)
        return torch.cat([quadrants - quadrants.mean(1, keepdim=True), blocks.flatten(1) @ self.noise.T / 10], 1)


def start(algorithm, dataset, tmp_path) -> dict[str, str]:
    """begin_round with the services a real trainer offers (its train split, prediction and seed)."""
    config = TrainConfig.from_flat({"dataset": dataset.name, "algorithm": algorithm.name, "epochs": 1,
                                    "device": "cpu", "stage_cache": str(tmp_path / "stages")})
    return algorithm.begin_round(Trainer(config, dataset=dataset)._round_context(0))


def accuracy(algorithm, split) -> float:
    algorithm.eval()
    return (algorithm.predict(split.x).argmax(1) == split.y).double().mean().item()


@pytest.mark.parametrize("c_grid", ["1e-4,1", "1,1e-4"])
def test_newt_probe_takes_the_c_that_cross_validates_best_wherever_it_sits_in_the_grid(c_grid, tiny_dataset, tmp_path):
    """On features where C = 1e-4 collapses to the majority class, the probe must try every C of its grid and
    keep the one that cross-validates best, in either order; a fixed C, the first or last of the grid, or the
    default grid in place of `c_grid` each fail at least one of the two orders."""
    model = FeaturizerHead(QuadrantsAndNoise(), QuadrantsAndNoise.n_features, tiny_dataset.task.n_outputs)
    algorithm = build_algorithm("newt_probe", model, {"c_grid": c_grid}, context_for(tiny_dataset))
    facts = start(algorithm, tiny_dataset, tmp_path)
    by_c = ast.literal_eval(facts["cv_accuracy_by_c"])
    assert set(by_c) == {"0.0001", "1"} and by_c["0.0001"] < 0.5 and by_c["1"] > 0.95
    assert facts["best_c"] == "1"
    assert accuracy(algorithm, tiny_dataset.split("val")) >= 0.95  # the head is the C = 1 fit


def lenet(dataset, seed: int) -> FeaturizerHead:
    torch.manual_seed(seed)
    return build_model("lenet", ModelSpec(dataset.input_shape, dataset.task.n_outputs))


def blank(model: FeaturizerHead) -> FeaturizerHead:
    """A featurizer whose features are all zero: nothing can be read off them."""
    with torch.no_grad():
        for p in model.featurizer.parameters():
            p.zero_()
    return model


def test_newt_probe_is_fit_on_the_features_of_the_checkpoint_it_names(tiny_dataset, tmp_path):
    """The model's own featurizer is blank and `features_from` names an informative one: the probe must be fit
    on the named featurizer's features (read after they are installed), so it classifies the unseen val
    domain well; a probe fit on the blank model's features predicts one class."""
    torch.save(lenet(tiny_dataset, seed=1).state_dict(), tmp_path / "best_model.pt")
    model = blank(lenet(tiny_dataset, seed=0))
    algorithm = build_algorithm("newt_probe", model, {"features_from": str(tmp_path)}, context_for(tiny_dataset))
    start(algorithm, tiny_dataset, tmp_path)
    assert accuracy(algorithm, tiny_dataset.split("val")) >= 0.9


# ----- learning: linear evaluation reads informative frozen features, e-Mix lowers its own loss ---------------

def linear_eval_test_accuracy(dataset, **settings) -> float:
    config = TrainConfig.from_flat({"dataset": dataset.name, "algorithm": "linear_eval", "epochs": 8,
                                    "device": "cpu", "optimizer": "adam", "lr": 3e-2, "seed": 0, **settings})
    return Trainer(config, dataset=dataset).fit().best_metrics["test/acc"]


def test_linear_eval_learns_from_informative_frozen_features_and_not_from_blank_ones(tiny_dataset, tmp_path,
                                                                                   one_thread):
    """Run by the Trainer, a linear head on a random LeNet's frozen features classifies the held-out test
    domain far above chance (1/4); on the features of a blank checkpoint named by `features_from` it cannot,
    so what it learns comes from the features it was told to read."""
    torch.save(blank(lenet(tiny_dataset, seed=0)).state_dict(), tmp_path / "blank.pt")
    assert linear_eval_test_accuracy(tiny_dataset) >= 0.8
    assert linear_eval_test_accuracy(tiny_dataset, features_from=str(tmp_path / "blank.pt")) <= 0.5


def test_emix_pretraining_lowers_its_loss_well_below_ln_b(tmp_path, one_thread):
    """e-Mix's loss starts at ln B (every clean column equally likely); ~100 Trainer steps of its pretext phase
    on the tiny images must bring it well below that, which needs the gradient to reach the encoder (with the
    encoder frozen the projection alone leaves it near ln B)."""
    dataset = make_tiny_dataset(n_unlabeled=512)
    b = 32
    config = TrainConfig.from_flat({"dataset": dataset.name, "algorithm": "emix", "phase": "pretext", "model": SMALL,
                                    "epochs": 6, "batch_size": b, "lr": 1e-3, "optimizer": "adamw",
                                    "weight_decay": 1e-4, "device": "cpu", "seed": 0, "stage_cache": str(tmp_path)})
    history = [epoch["train/loss/emix"] for epoch in Trainer(config, dataset=dataset).fit().history]
    assert history[0] < math.log(b) + 0.1  # the first epoch's mean, from ln B at initialisation (test_dabs.py)
    assert history[-1] < 0.7 * math.log(b), history
