"""Empirical risk minimisation, optionally with strong augmentation."""
from __future__ import annotations

from dataclasses import dataclass

from raybench.algorithms.base import Algorithm, Hparams, StepOutput
from raybench.algorithms.registry import register
from raybench.data.base import Batch, TaskKind
from raybench.settings import setting


@dataclass
class ERMHparams(Hparams):
    augment: bool = setting(False, per_dataset=True, help="strong augmentation (RandAugment + Cutout): ERM+aug; "
                                                          "off where a dataset has none")


@register("erm")
class ERM(Algorithm):
    """ERM (Vapnik, 1992); WILDS 2.0 App. B.1, with A_strong = RandAugment + Cutout when `augment` (ERM+aug).

    loss = E_(x,y)~labeled [ CE(h(A(x)), y) ],  A = A_strong if augment else identity.
    Unlabeled data is ignored.
    """

    Hparams = ERMHparams
    supported_tasks = frozenset(TaskKind)

    def objective(self, labeled: Batch, unlabeled: Batch | None, step: int) -> StepOutput:
        loss = self.model.fit_loss(self.view(labeled.x, self.hparams.augment), labeled.y, self.supervised_loss)
        return StepOutput(loss, {"loss/supervised": loss.detach()})
