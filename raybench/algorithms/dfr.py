"""DFR: keep a trained ERM featurizer, refit only the last layer on group-balanced validation embeddings."""
from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import nn

from raybench.algorithms.base import Algorithm, AlgorithmContext, RoundContext, ScoredRows, StepOutput
from raybench.algorithms.groups import ReferenceHparams, parse_grid, train_reference
from raybench.algorithms.registry import register
from raybench.algorithms.ssa import split_halves
from raybench.data.base import Batch, Split, TaskKind
from raybench.metrics import worst_group_accuracy
from raybench.models.base import FeaturizerHead
from raybench.settings import AT_LEAST_ONE, NON_NEGATIVE, OPEN_FRACTION, POSITIVE, Suggest, setting

DEFAULT_C_GRID = "1.0,0.7,0.3,0.1,0.07,0.03,0.01"  # SpuCo App. B


@dataclass
class DFRHparams(ReferenceHparams):
    reference_epochs: int | None = setting(None, allowed=AT_LEAST_ONE, help="T_r; none: the full ERM run at the "
                                                                               "dataset's epochs (SpuCo: no early stopping)")
    # DFR's only searched settings are its ERM model's (SpuCo App. C grid): C is chosen inside.
    reference_lr: float | None = setting(None, allowed=POSITIVE, suggest=Suggest.choice(0.01, 0.001, 0.0001),
                                            help="the ERM model's lr; none: the dataset's")
    reference_weight_decay: float | None = setting(None, allowed=NON_NEGATIVE,
                                                      suggest=Suggest.choice(0.01, 0.005, 0.0005, 0.0001),
                                                      help="the ERM model's weight decay; none: the dataset's")
    c_grid: str = setting(DEFAULT_C_GRID, help="inverse l1 strengths tried (comma-separated); the best on the "
                                               "held-out part is used")
    n_ensemble: int = setting(20, allowed=AT_LEAST_ONE, help="l1 logistic regressions averaged in the final head, "
                                                             "each fit on a group-balanced subsample (SpuCo: 20)")
    tune_fraction: float = setting(0.5, allowed=OPEN_FRACTION, help="share of the validation split each setting is "
                                                                    "fit on; the rest scores it")

    def __post_init__(self) -> None:
        parse_grid(self.c_grid, "c_grid")


@dataclass
class LinearHead:
    """A fitted last layer in the model's own feature space: logits = z @ weight.T + bias."""

    weight: np.ndarray
    bias: np.ndarray

    def logits(self, z: np.ndarray) -> np.ndarray:
        return z @ self.weight.T + self.bias


@dataclass
class Standardizer:
    """Per-feature standardisation fit once on the training split's embeddings and shared by every fit, as
    SpuCo's scripts pass `data_for_scaler=trainset` (a feature constant there gets scale 1, as scikit-learn)."""

    mean: np.ndarray
    scale: np.ndarray

    @classmethod
    def fit(cls, z: np.ndarray) -> Standardizer:
        from sklearn.preprocessing import StandardScaler  # here: scikit-learn costs seconds in every Ray worker

        scaler = StandardScaler().fit(z)
        return cls(scaler.mean_, scaler.scale_)

    def __call__(self, z: np.ndarray) -> np.ndarray:
        return (z - self.mean) / self.scale

    def fold(self, head: LinearHead) -> LinearHead:
        """The head on raw embeddings that computes `head` on standardised ones: (W / sigma, b - W mu / sigma)."""
        weight = head.weight / self.scale
        return LinearHead(weight, head.bias - weight @ self.mean)


def fit_l1_logistic(z: np.ndarray, y: np.ndarray, c: float, n_classes: int, seed: int) -> LinearHead:
    """scikit-learn's l1 logistic regression (liblinear, one-vs-rest as in SpuCo's and DFR's code) as one
    linear layer over `z`."""
    from sklearn.linear_model import LogisticRegression  # here: scikit-learn costs seconds in every Ray worker
    from sklearn.multiclass import OneVsRestClassifier

    model = OneVsRestClassifier(LogisticRegression(C=c, l1_ratio=1.0, solver="liblinear", random_state=seed))
    model.fit(z, y)
    weight, bias = np.zeros((n_classes, z.shape[1])), np.zeros(n_classes)
    rows = model.classes_[1:] if len(model.classes_) == 2 else model.classes_  # binary: one model scores class 1
    for row, estimator in zip(rows, model.estimators_):
        weight[row], bias[row] = estimator.coef_[0], estimator.intercept_[0]
    return LinearHead(weight, bias)


def balanced_subsample(group: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Indices with the same number of examples from every group: the size of the smallest group."""
    groups = np.unique(group)
    size = min(int((group == g).sum()) for g in groups)
    return np.concatenate([rng.choice(np.flatnonzero(group == g), size, replace=False) for g in groups])


def average_heads(heads: list[LinearHead]) -> LinearHead:
    return LinearHead(np.mean([h.weight for h in heads], axis=0), np.mean([h.bias for h in heads], axis=0))


@dataclass
class ScoredSetting:
    """One candidate of the inner grid: its held-out worst-group accuracy and the head that earned it."""

    score: float
    setting: dict[str, float]
    head: LinearHead


def blind_grid_note(candidates: list[ScoredSetting]) -> str | None:
    """A line when every candidate of a grid of two or more scored the same: choosing among them chose nothing."""
    scores = {c.score for c in candidates}
    if len(candidates) < 2 or len(scores) > 1:
        return None
    return (f"all {len(candidates)} last-layer settings scored the same held-out worst-group accuracy "
            f"({scores.pop():.4f}): selection is blind")


@register("dfr")
class DFR(Algorithm):
    """DFR (Kirichenko et al., 2022; SpuCo Sec. 3.1.3, App. B): refit the last layer on group-balanced validation data.

    Stages:
      1. reference: ERM for the dataset's epochs, weights after the last (SpuCo: no early stopping);
      2. last_layer: with the featurizer f frozen, embeddings z = f(x), standardised with the training split's
         mean and scale; the group-labeled validation split (group-balanced on SpuCoMNIST) is partitioned,
         stratified by group, into a fit part (`tune_fraction`) and a held-out rest. Each C in `c_grid` is
         scored by one l1 logistic regression fit on a group-balanced subsample of the fit part, by its
         worst-group accuracy on the held-out rest; the best C (ties: the first) is then refit on all of val,
         `n_ensemble` regressions on group-balanced subsamples averaged into the head g.
    As SpuCo's code does (last_layer_retrain/dfr.py: `hyperparam_selection` scores one `train_single_model`
    per C on a random half, `train` then averages `n_lin_models` = 20 on all the labeled data; its scripts
    fit the scaler on the training set). The paper's text says only "tunable l1 regularization".

    Nothing is trained by gradient descent afterwards: the trainer evaluates the refitted model once. Its
    `val` metrics are the chosen C's own model on the held-out rows (`scored_rows`): the final head has seen
    every val row, so those rows are what the sweep can select trials on without scoring a fit on itself.
    A grid whose candidates all scored the same is reported as a blind selection.
    """

    Hparams = DFRHparams
    supported_tasks = frozenset({TaskKind.CLASSIFICATION})
    stages = ("reference", "last_layer")
    trains_by_gradient = False

    def __init__(self, model: FeaturizerHead, hparams: DFRHparams, context: AlgorithmContext) -> None:
        super().__init__(model, hparams, context)
        self.held_out = torch.empty(0, dtype=torch.long)  # rows of `val` the chosen setting's model never saw
        self.selection_head: LinearHead | None = None  # that model's head, on raw embeddings
        self._selection_model: nn.Module | None = None
        self.standardize = Standardizer(np.zeros(0), np.ones(0))  # fit on the training embeddings in begin_round

    def get_extra_state(self) -> dict[str, Any]:
        head = self.selection_head
        return {"held_out": self.held_out,
                "selection_head": None if head is None else (torch.from_numpy(head.weight), torch.from_numpy(head.bias))}

    def set_extra_state(self, state: dict[str, Any]) -> None:
        self.held_out = state["held_out"]
        head = state.get("selection_head")
        self.selection_head = None if head is None else LinearHead(head[0].numpy(), head[1].numpy())
        self._selection_model = None

    def objective(self, labeled: Batch, unlabeled: Batch | None, step: int) -> StepOutput:
        loss = self.supervised_loss(self.model(self.view(labeled.x, False)), labeled.y)
        return StepOutput(loss, {"loss/supervised": loss.detach()})

    def scored_rows(self) -> Mapping[str, ScoredRows]:
        if len(self.held_out) == 0 or self.selection_head is None:  # before the head is fit
            return {}
        n, share = len(self.held_out), self.hparams.tune_fraction
        note = (f"val metrics: the chosen setting's model, fit on {share:.0%} of val, scored on the held-out "
                f"{n} rows; the final head is refit on all of val")
        return {"val": ScoredRows(self.held_out, note, model=self.selection_model())}

    def selection_model(self) -> nn.Module:
        """The model with the selection head in place of the final one (built once, then reused)."""
        if self._selection_model is None:
            model = copy.deepcopy(self.model)
            self.write_head(model, self.selection_head)
            self._selection_model = model
        return self._selection_model

    def begin_round(self, context: RoundContext) -> dict[str, str]:
        assert context.split is not None and context.train is not None and context.report_stage is not None
        reference = train_reference(context, self.hparams)
        self.model.load_state_dict(reference.model.state_dict())
        train_z = self.embed(context, context.train)
        self.standardize = Standardizer.fit(train_z)
        self.prepare(context, self.standardize(train_z))
        val = context.split("val")
        assert val.y is not None
        z, y, group = self.standardize(self.embed(context, val)), val.y.numpy(), val.group.numpy()
        fit, held_out = (i.numpy() for i in split_halves(val, self.hparams.tune_fraction, context.seed))
        candidates = [self.score(z, y, group, fit, held_out, setting, context.seed) for setting in self.settings()]
        best = max(candidates, key=lambda c: c.score)  # ties: the first in grid order
        final = self.fit_ensemble(z, y, group, best.setting, context.seed)  # every val row, as SpuCo refits
        self.set_head(self.standardize.fold(final))
        self.selection_head, self._selection_model = self.standardize.fold(best.head), None
        self.held_out = torch.as_tensor(held_out, dtype=torch.long)
        blind = blind_grid_note(candidates)
        context.report_stage("last_layer", {**{f"best_{k}": v for k, v in best.setting.items()},
                                            "heldout_worst_group_acc": best.score},
                             {"scores": str([(round(c.score, 4), c.setting) for c in candidates]),
                              "reference": reference.key, **({"selection_blind": blind} if blind else {})})
        facts = {"reference_model": reference.key, **{f"best_{k}": str(v) for k, v in best.setting.items()}}
        return {**facts, **({"selection_blind": blind} if blind else {})}

    def prepare(self, context: RoundContext, train_z: np.ndarray) -> None:
        """Anything the fits need beyond the validation embeddings, given the standardised training ones
        (Dispel mixes them)."""

    def embed(self, context: RoundContext, split: Split) -> np.ndarray:
        return context.predict(self.model.featurizer, split, self.context.views.plain).double().numpy()

    def settings(self) -> list[dict[str, float]]:
        """The grid chosen from on the held-out validation part."""
        return [{"c": c} for c in parse_grid(self.hparams.c_grid, "c_grid")]

    def score(self, z: np.ndarray, y: np.ndarray, group: np.ndarray, fit: np.ndarray, held_out: np.ndarray,
              setting: dict[str, float], seed: int) -> ScoredSetting:
        """One model fit on a group-balanced subsample of the fit part, scored on the held-out rows."""
        rng = np.random.default_rng(seed)
        index = fit[balanced_subsample(group[fit], rng)]
        head = self.fit_member(z[index], y[index], setting, rng, seed)
        predictions = torch.from_numpy(head.logits(z[held_out]))
        score = worst_group_accuracy(predictions, torch.from_numpy(y[held_out]), torch.from_numpy(group[held_out]))
        return ScoredSetting(score, setting, head)

    def fit_ensemble(self, z: np.ndarray, y: np.ndarray, group: np.ndarray, setting: dict[str, float],
                     seed: int) -> LinearHead:
        """`n_ensemble` members averaged, each fit on a group-balanced subsample. When every group is already the
        same size (a group-balanced val, as SpuCoMNIST's), each subsample is the whole set: the members would all
        fit the same rows, so one fit stands for them (an l1 fit of 12,500 rows takes minutes on one core)."""
        rng = np.random.default_rng(seed)
        members = 1 if self.members_see_the_same_rows(group) else self.hparams.n_ensemble
        heads = []
        for member in range(members):
            index = balanced_subsample(group, rng)
            heads.append(self.fit_member(z[index], y[index], setting, rng, seed + member))
        return average_heads(heads)

    def members_see_the_same_rows(self, group: np.ndarray) -> bool:
        """Whether every member's balanced subsample is all of `group`'s rows (Dispel's members still differ:
        each mixes its own draw of training embeddings)."""
        return len(set(np.unique(group, return_counts=True)[1].tolist())) == 1

    def fit_member(self, z: np.ndarray, y: np.ndarray, setting: dict[str, float], rng: np.random.Generator,
                   seed: int) -> LinearHead:
        return fit_l1_logistic(z, y, setting["c"], self.context.task.n_outputs, seed)

    def set_head(self, head: LinearHead) -> None:
        self.write_head(self.model, head)

    @staticmethod
    def write_head(model: nn.Module, head: LinearHead | None) -> None:
        linear = model.head
        assert isinstance(linear, nn.Linear) and head is not None, "DFR refits a plain linear head"
        with torch.no_grad():
            linear.weight.copy_(torch.as_tensor(head.weight, dtype=linear.weight.dtype))
            linear.bias.copy_(torch.as_tensor(head.bias, dtype=linear.bias.dtype))
