"""FixMatch: pseudo-labels from a weak view supervise a strong view of the same image."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from raybench.algorithms.base import Algorithm, Hparams, StepOutput, pseudo_label_loss
from raybench.algorithms.registry import register
from raybench.data.base import Batch, TaskKind
from raybench.settings import NON_NEGATIVE, PROBABILITY, Suggest, setting


@dataclass
class FixMatchHparams(Hparams):
    threshold: float = setting(0.7, allowed=PROBABILITY, suggest=Suggest.uniform(0.7, 0.95),
                               help="tau: the weak view's confidence needed to pseudo-label")
    penalty: float = setting(1.0, allowed=NON_NEGATIVE, help="lambda, the weight of the consistency loss "
                                                             "(WILDS fixes 1)")


@register("fixmatch")
class FixMatch(Algorithm):
    """FixMatch (Sohn et al., 2020), as adapted by WILDS 2.0 App. B.5.

    loss = CE(h(A_strong(x_l)), y_l)
         + lambda * (1/|U|) sum_u 1[max p_u >= tau] CE(h(A_strong(x_u)), argmax p_u),
    p_u = softmax(h(A_weak(x_u))) from a separate no-grad forward pass; labeled and strong-unlabeled
    inputs share one forward pass, so they are batch-normalised jointly.
    """

    Hparams = FixMatchHparams
    uses_unlabeled = True
    supported_tasks = frozenset({TaskKind.CLASSIFICATION})
    requires = frozenset({"strong_augmentation"})
    # The FixMatch lr decay where the dataset sets no schedule: p-lambda/wilds examples/configs/algorithm.py
    # line 57 ('scheduler': 'FixMatchLR'); the paper's text names none, the code is followed (base.py explains).
    default_scheduler = "fixmatch"

    def objective(self, labeled: Batch, unlabeled: Batch | None, step: int) -> StepOutput:
        assert unlabeled is not None, "FixMatch needs an unlabeled batch"
        views = self.context.views
        with torch.no_grad():
            weak_logits = self.model(views.weak(unlabeled.x))
        n = len(labeled)
        outputs = self.model(torch.cat([views.strong(labeled.x), views.strong(unlabeled.x)]))
        supervised = self.supervised_loss(outputs[:n], labeled.y)
        unsupervised, health = pseudo_label_loss(outputs[n:], weak_logits, self.hparams.threshold)
        loss = supervised + self.hparams.penalty * unsupervised
        logs = {"loss/supervised": supervised.detach(), "loss/consistency": unsupervised.detach(), **health}
        return StepOutput(loss, logs)
