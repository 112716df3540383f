"""Domain-adversarial training: a domain classifier behind a gradient-reversal layer."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from raybench.algorithms.base import Algorithm, AlgorithmContext, Hparams, StepOutput
from raybench.algorithms.registry import register
from raybench.data.base import Batch, concat_inputs
from raybench.models.base import FeaturizerHead
from raybench.settings import NON_NEGATIVE, POSITIVE, Suggest, setting


@dataclass
class DANNHparams(Hparams):
    penalty: float = setting(1.0, allowed=NON_NEGATIVE, suggest=Suggest.loguniform(0.1, 10),
                             help="lambda, the weight of the domain-classification loss")
    classifier_lr: float | None = setting(None, allowed=POSITIVE, help="none: the run's lr")
    discriminator_lr: float | None = setting(None, allowed=POSITIVE, help="none: the run's lr")
    featurizer_lr: float | None = setting(None, allowed=POSITIVE, help="none: classifier_lr / 10, as WILDS 2.0 "
                                                                          "App. D")
    augment: bool = setting(True, per_dataset=True, help="strong augmentation of both batches; off where a dataset "
                                                         "has none")


class GradientReversal(torch.autograd.Function):
    """Identity forward; multiplies the gradient by -coefficient backward (Ganin et al., 2016)."""

    @staticmethod
    def forward(ctx: Any, x: Tensor, coefficient: float) -> Tensor:
        ctx.coefficient = coefficient
        return x.view_as(x)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, None]:
        return -ctx.coefficient * grad, None


def domain_discriminator(n_features: int, n_domains: int, hidden: int = 1024) -> nn.Sequential:
    """Linear-BN-ReLU-Linear-BN-ReLU-Linear, as the WILDS DomainDiscriminator."""
    return nn.Sequential(
        nn.Linear(n_features, hidden), nn.BatchNorm1d(hidden), nn.ReLU(inplace=True),
        nn.Linear(hidden, hidden), nn.BatchNorm1d(hidden), nn.ReLU(inplace=True),
        nn.Linear(hidden, n_domains),
    )


@register("dann")
class DANN(Algorithm):
    """DANN (Ganin et al., 2016), as adapted by WILDS 2.0 App. B.3.

    loss = CE(g(f(x_l)), y_l) + lambda * CE(d(R(f([x_l; x_u]))), [domain_l; domain_u]),
    R the gradient-reversal layer (coefficient 1), d an MLP predicting each example's domain among all
    of the dataset's domains. Featurizer, classifier and discriminator have their own learning rates.
    """

    Hparams = DANNHparams
    uses_unlabeled = True
    requires = frozenset({"features"})

    def __init__(self, model: FeaturizerHead, hparams: DANNHparams, context: AlgorithmContext) -> None:
        super().__init__(model, hparams, context)
        self.discriminator = domain_discriminator(model.n_features, context.n_domains)

    def param_groups(self, lr: float) -> list[dict[str, Any]]:
        classifier_lr = self.hparams.classifier_lr or lr
        featurizer_lr = self.hparams.featurizer_lr or classifier_lr / 10
        return [
            {"params": list(self.model.featurizer.parameters()), "lr": featurizer_lr},
            {"params": list(self.model.head.parameters()), "lr": classifier_lr},
            {"params": list(self.discriminator.parameters()), "lr": self.hparams.discriminator_lr or lr},
        ]

    def objective(self, labeled: Batch, unlabeled: Batch | None, step: int) -> StepOutput:
        assert unlabeled is not None, "DANN needs an unlabeled batch"
        n = len(labeled)
        x = concat_inputs(self.view(labeled.x, self.hparams.augment), self.view(unlabeled.x, self.hparams.augment))
        features = self.model.featurizer(x)
        supervised = self.supervised_loss(self.model.head(features[:n]), labeled.y)
        domain_logits = self.discriminator(GradientReversal.apply(features, 1.0))
        domain_loss = F.cross_entropy(domain_logits, torch.cat([labeled.domain, unlabeled.domain]))
        loss = supervised + self.hparams.penalty * domain_loss
        return StepOutput(loss, {"loss/supervised": supervised.detach(), "loss/domain": domain_loss.detach()})
