"""Deep CORAL: align the first two moments of labeled and unlabeled features."""
from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor

from raybench.algorithms.base import Algorithm, Hparams, StepOutput
from raybench.algorithms.registry import register
from raybench.data.base import Batch, TaskKind, concat_inputs
from raybench.settings import NON_NEGATIVE, Suggest, setting


@dataclass
class CORALHparams(Hparams):
    penalty: float = setting(1.0, allowed=NON_NEGATIVE, suggest=Suggest.loguniform(0.1, 10),
                             help="lambda, the weight of the CORAL penalty")
    augment: bool = setting(True, per_dataset=True, help="strong augmentation of both batches; off where a dataset "
                                                         "has none")


def coral_penalty(a: Tensor, b: Tensor) -> Tensor:
    """mean((mu_a - mu_b)^2) + mean((C_a - C_b)^2), C the unbiased covariance (DomainBed/WILDS form)."""
    a, b = a.float(), b.float()
    mean_a, mean_b = a.mean(0, keepdim=True), b.mean(0, keepdim=True)
    cov_a = (a - mean_a).T @ (a - mean_a) / (len(a) - 1)
    cov_b = (b - mean_b).T @ (b - mean_b) / (len(b) - 1)
    return (mean_a - mean_b).pow(2).mean() + (cov_a - cov_b).pow(2).mean()


@register("coral")
class CORAL(Algorithm):
    """Deep CORAL (Sun & Saenko, 2016), as adapted by WILDS 2.0 App. B.2.

    loss = CE(g(f(A(x_l))), y_l) + lambda * [ mean((mu_l - mu_u)^2) + mean((C_l - C_u)^2) ],
    mu and C the mean and unbiased covariance of f over the labeled and the unlabeled batch, which
    pass through f together (joint batch norm). A = A_strong when `augment`.
    """

    Hparams = CORALHparams
    uses_unlabeled = True
    supported_tasks = frozenset({TaskKind.CLASSIFICATION, TaskKind.REGRESSION, TaskKind.MULTILABEL})
    requires = frozenset({"features"})

    def objective(self, labeled: Batch, unlabeled: Batch | None, step: int) -> StepOutput:
        assert unlabeled is not None, "CORAL needs an unlabeled batch"
        n = len(labeled)
        x = concat_inputs(self.view(labeled.x, self.hparams.augment), self.view(unlabeled.x, self.hparams.augment))
        features = self.model.featurizer(x)
        supervised = self.supervised_loss(self.model.head(features[:n]), labeled.y)
        penalty = coral_penalty(features[:n], features[n:])
        loss = supervised + self.hparams.penalty * penalty
        return StepOutput(loss, {"loss/supervised": supervised.detach(), "loss/coral": penalty.detach()})
