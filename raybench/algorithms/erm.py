"""Empirical risk minimisation, optionally with strong augmentation."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from raybench.algorithms.base import Algorithm, Hparams, StepOutput
from raybench.algorithms.registry import register
from raybench.data.base import Batch


@dataclass
class ERMHparams(Hparams):
    augment: bool = False


@register("erm")
class ERM(Algorithm):
    """ERM (Vapnik, 1992); WILDS 2.0 App. B.1, with A_strong = RandAugment + Cutout when `augment` (ERM+aug).

    loss = E_(x,y)~labeled [ CE(h(A(x)), y) ],  A = A_strong if augment else identity.
    Unlabeled data is ignored.
    """

    Hparams = ERMHparams

    def objective(self, labeled: Batch, unlabeled: Optional[Batch], step: int) -> StepOutput:
        outputs = self.model(self.view(labeled.x, self.hparams.augment))
        loss = self.supervised_loss(outputs, labeled.y)
        return StepOutput(loss, {"loss/supervised": loss.detach()})
