"""DFR: keep a trained ERM featurizer, refit only the last layer on group-balanced validation embeddings."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Optional

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
    reference_epochs: Optional[int] = setting(None, allowed=AT_LEAST_ONE, help="T_r; none: the full ERM run "
                                                                               "(SpuCo: no early stopping)")
    # DFR's only searched settings are its ERM model's (SpuCo App. C grid): C is chosen inside.
    reference_lr: Optional[float] = setting(None, allowed=POSITIVE, suggest=Suggest.choice(0.01, 0.001, 0.0001),
                                            help="the ERM model's lr; none: the dataset's")
    reference_weight_decay: Optional[float] = setting(None, allowed=NON_NEGATIVE,
                                                      suggest=Suggest.choice(0.01, 0.005, 0.0005, 0.0001),
                                                      help="the ERM model's weight decay; none: the dataset's")
    c_grid: str = setting(DEFAULT_C_GRID, help="inverse l1 strengths tried (comma-separated); the best on the "
                                               "held-out half is used")
    n_ensemble: int = setting(10, allowed=AT_LEAST_ONE, help="l1 logistic regressions averaged, each fit on a "
                                                             "group-balanced subsample")
    tune_fraction: float = setting(0.5, allowed=OPEN_FRACTION, help="share of the validation split the head is fit "
                                                                    "on; the rest chooses C and the trial")

    def __post_init__(self) -> None:
        parse_grid(self.c_grid, "c_grid")


@dataclass
class LinearHead:
    """A fitted last layer in the model's own feature space: logits = z @ weight.T + bias."""

    weight: np.ndarray
    bias: np.ndarray

    def logits(self, z: np.ndarray) -> np.ndarray:
        return z @ self.weight.T + self.bias


def fit_l1_logistic(z: np.ndarray, y: np.ndarray, c: float, n_classes: int, seed: int) -> LinearHead:
    """scikit-learn's l1 logistic regression (liblinear, one-vs-rest as in DFR's code) on standardised
    embeddings, folded back into one linear layer (W / sigma, b - W mu / sigma), so the model's head
    computes exactly the fitted decision function."""
    from sklearn.linear_model import LogisticRegression  # here: scikit-learn costs seconds in every Ray worker
    from sklearn.multiclass import OneVsRestClassifier
    from sklearn.preprocessing import StandardScaler

    scaler = StandardScaler().fit(z)
    model = OneVsRestClassifier(LogisticRegression(C=c, l1_ratio=1.0, solver="liblinear", random_state=seed))
    model.fit(scaler.transform(z), y)
    weight, bias = np.zeros((n_classes, z.shape[1])), np.zeros(n_classes)
    rows = model.classes_[1:] if len(model.classes_) == 2 else model.classes_  # binary: one model scores class 1
    for row, estimator in zip(rows, model.estimators_):
        weight[row], bias[row] = estimator.coef_[0], estimator.intercept_[0]
    scale = scaler.scale_
    return LinearHead(weight / scale, bias - (weight / scale) @ scaler.mean_)


def balanced_subsample(group: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Indices with the same number of examples from every group: the size of the smallest group."""
    groups = np.unique(group)
    size = min(int((group == g).sum()) for g in groups)
    return np.concatenate([rng.choice(np.flatnonzero(group == g), size, replace=False) for g in groups])


def average_heads(heads: list[LinearHead]) -> LinearHead:
    return LinearHead(np.mean([h.weight for h in heads], axis=0), np.mean([h.bias for h in heads], axis=0))


@register("dfr")
class DFR(Algorithm):
    """DFR (Kirichenko et al., 2022; SpuCo Sec. 3.1.3, App. B): refit the last layer on group-balanced validation data.

    Stages:
      1. reference: ERM (all epochs, weights after the last);
      2. last_layer: with the featurizer f frozen, embeddings z = f(x) of the group-labeled validation split,
         partitioned (stratified by group) into a fit part (`tune_fraction`) and a held-out rest; for each C
         in `c_grid`, average `n_ensemble` l1 logistic regressions fit on group-balanced subsamples of the
         fit part and score worst-group accuracy on the held-out rest; the best C's head becomes g.
    Nothing is trained by gradient descent afterwards: the trainer evaluates the refitted model once, on
    `val` scoring only the held-out rows (`scored_rows`), so the sweep selects on data the head never saw.
    (The paper refits on all of `val` after choosing C; here those rows would then score their own fit.)
    """

    Hparams = DFRHparams
    supported_tasks = frozenset({TaskKind.CLASSIFICATION})
    stages = ("reference", "last_layer")
    trains_by_gradient = False

    def __init__(self, model: FeaturizerHead, hparams: DFRHparams, context: AlgorithmContext) -> None:
        super().__init__(model, hparams, context)
        self.held_out = torch.empty(0, dtype=torch.long)  # rows of `val` the head was not fit on

    def get_extra_state(self) -> dict[str, Any]:
        return {"held_out": self.held_out}

    def set_extra_state(self, state: dict[str, Any]) -> None:
        self.held_out = state["held_out"]

    def objective(self, labeled: Batch, unlabeled: Optional[Batch], step: int) -> StepOutput:
        loss = self.supervised_loss(self.model(self.view(labeled.x, False)), labeled.y)
        return StepOutput(loss, {"loss/supervised": loss.detach()})

    def scored_rows(self) -> Mapping[str, ScoredRows]:
        if len(self.held_out) == 0:  # before the head is fit
            return {}
        n = len(self.held_out)
        if self.hparams.tune_fraction == 0.5:
            note = f"val metrics on the held-out half of val (n={n}); the other half fit the last layer"
        else:
            note = f"val metrics on the {n} held-out rows of val; the other {self.hparams.tune_fraction:.0%} fit the last layer"
        return {"val": ScoredRows(self.held_out, note)}

    def begin_round(self, context: RoundContext) -> dict[str, str]:
        assert context.split is not None and context.report_stage is not None
        reference = train_reference(context, self.hparams)
        self.model.load_state_dict(reference.model.state_dict())
        self.prepare(context)
        val = context.split("val")
        assert val.y is not None
        z, y, group = self.embed(context, val), val.y.numpy(), val.group.numpy()
        fit, held_out = (i.numpy() for i in split_halves(val, self.hparams.tune_fraction, context.seed))
        scores = [(self.score(z, y, group, fit, held_out, setting, context.seed), setting) for setting in self.settings()]
        best_score, best = max(scores, key=lambda pair: pair[0])  # ties: the first in grid order
        self.set_head(self.fit_ensemble(z[fit], y[fit], group[fit], best, context.seed))  # the head never sees held_out
        self.held_out = torch.as_tensor(held_out, dtype=torch.long)
        context.report_stage("last_layer", {**{f"best_{k}": v for k, v in best.items()}, "heldout_worst_group_acc": best_score},
                             {"scores": str([(round(sc, 4), st) for sc, st in scores]), "reference": reference.key})
        return {"reference_model": reference.key, **{f"best_{k}": str(v) for k, v in best.items()}}

    def prepare(self, context: RoundContext) -> None:
        """Anything the fits need beyond the validation embeddings (Dispel: the training embeddings)."""

    def embed(self, context: RoundContext, split: Split) -> np.ndarray:
        return context.predict(self.model.featurizer, split, self.context.views.plain).double().numpy()

    def settings(self) -> list[dict[str, float]]:
        """The grid chosen from on the held-out validation half."""
        return [{"c": c} for c in parse_grid(self.hparams.c_grid, "c_grid")]

    def score(self, z: np.ndarray, y: np.ndarray, group: np.ndarray, fit: np.ndarray, held_out: np.ndarray,
              setting: dict[str, float], seed: int) -> float:
        head = self.fit_ensemble(z[fit], y[fit], group[fit], setting, seed)
        predictions = torch.from_numpy(head.logits(z[held_out]))
        return worst_group_accuracy(predictions, torch.from_numpy(y[held_out]), torch.from_numpy(group[held_out]))

    def fit_ensemble(self, z: np.ndarray, y: np.ndarray, group: np.ndarray, setting: dict[str, float],
                     seed: int) -> LinearHead:
        rng = np.random.default_rng(seed)
        heads = []
        for member in range(self.hparams.n_ensemble):
            index = balanced_subsample(group, rng)
            heads.append(self.fit_member(z[index], y[index], setting, rng, seed + member))
        return average_heads(heads)

    def fit_member(self, z: np.ndarray, y: np.ndarray, setting: dict[str, float], rng: np.random.Generator,
                   seed: int) -> LinearHead:
        return fit_l1_logistic(z, y, setting["c"], self.context.task.n_outputs, seed)

    def set_head(self, head: LinearHead) -> None:
        linear = self.model.head
        assert isinstance(linear, nn.Linear), "DFR refits a plain linear head"
        with torch.no_grad():
            linear.weight.copy_(torch.as_tensor(head.weight, dtype=linear.weight.dtype))
            linear.bias.copy_(torch.as_tensor(head.bias, dtype=linear.bias.dtype))
