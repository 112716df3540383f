"""Pseudo-Label: confident predictions on unlabeled data become training labels."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

from raybench.algorithms.base import Algorithm, Hparams, StepOutput, pseudo_label_loss
from raybench.algorithms.registry import register
from raybench.data.base import Batch, TaskKind


@dataclass
class PseudoLabelHparams(Hparams):
    threshold: float = 0.7
    penalty: float = 1.0
    ramp_fraction: float = 0.4
    augment: bool = True


@register("pseudolabel")
class PseudoLabel(Algorithm):
    """Pseudo-Label (Lee, 2013), as adapted by WILDS 2.0 App. B.4.

    loss = CE(h(x_l), y_l) + lambda(t) * (1/|U|) sum_u 1[max p(x_u) >= tau] CE(h(x_u), argmax p(x_u)),
    p the detached softmax of the same joint forward pass, lambda(t) = lambda * min(1, t / (0.4 T)),
    T the total number of training steps. Inputs are A_strong-augmented when `augment`.
    """

    Hparams = PseudoLabelHparams
    uses_unlabeled = True
    supported_tasks = frozenset({TaskKind.CLASSIFICATION})

    def unlabeled_weight(self, step: int) -> float:
        ramp_steps = self.hparams.ramp_fraction * self.context.total_steps
        return self.hparams.penalty * (min(1.0, step / ramp_steps) if ramp_steps > 0 else 1.0)

    def objective(self, labeled: Batch, unlabeled: Optional[Batch], step: int) -> StepOutput:
        assert unlabeled is not None, "Pseudo-Label needs an unlabeled batch"
        n = len(labeled)
        x = torch.cat([self.view(labeled.x, self.hparams.augment), self.view(unlabeled.x, self.hparams.augment)])
        outputs = self.model(x)
        supervised = self.supervised_loss(outputs[:n], labeled.y)
        unsupervised, kept = pseudo_label_loss(outputs[n:], outputs[n:], self.hparams.threshold)
        weight = self.unlabeled_weight(step)
        loss = supervised + weight * unsupervised
        logs = {"loss/supervised": supervised.detach(), "loss/pseudo": unsupervised.detach(), "pseudo/kept": kept}
        return StepOutput(loss, logs)
