"""Pseudo-Label: confident predictions on unlabeled data become training labels."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from raybench.algorithms.base import Algorithm, Hparams, StepOutput, masked_bce, pseudo_label_loss
from raybench.algorithms.pseudo_targets import confident_binary_targets, confident_boxes
from raybench.algorithms.registry import register
from raybench.data.base import Batch, TaskKind, concat_inputs
from raybench.report_keys import PSEUDO_KEPT
from raybench.settings import NON_NEGATIVE, PROBABILITY, Suggest, setting


@dataclass
class PseudoLabelHparams(Hparams):
    threshold: float = setting(0.7, allowed=PROBABILITY, suggest=Suggest.uniform(0.7, 0.95),
                               help="tau: the confidence needed to pseudo-label")
    penalty: float = setting(1.0, allowed=NON_NEGATIVE, help="lambda, the weight of the pseudo-label loss "
                                                             "(WILDS fixes 1)")
    ramp_fraction: float = setting(0.4, allowed=NON_NEGATIVE, help="lambda ramps up linearly over this share of "
                                                                   "the training steps")
    augment: bool = setting(True, per_dataset=True, help="strong augmentation of both batches; off where a dataset "
                                                         "has none")


@register("pseudolabel")
class PseudoLabel(Algorithm):
    """Pseudo-Label (Lee, 2013), as adapted by WILDS 2.0 App. B.4.

    loss = CE(h(x_l), y_l) + lambda(t) * (1/|U|) sum_u 1[max p(x_u) >= tau] CE(h(x_u), argmax p(x_u)),
    p the detached softmax of the same joint forward pass, lambda(t) = lambda * min(1, t / (0.4 T)),
    T the total number of training steps. Inputs are A_strong-augmented when `augment`. Multi-label
    outputs are thresholded per task and detections per box (pseudo_targets.py); a detector labels its
    unlabeled images in a separate no-gradient pass, as it cannot score boxes while training.
    """

    Hparams = PseudoLabelHparams
    uses_unlabeled = True
    # Not regression: a prediction has no confidence to threshold (the paper skips PovertyMap).
    supported_tasks = frozenset({TaskKind.CLASSIFICATION, TaskKind.MULTILABEL, TaskKind.DETECTION})
    # The FixMatch lr decay where the dataset sets no schedule: p-lambda/wilds examples/configs/algorithm.py
    # line 68 ('scheduler': 'FixMatchLR'); the paper's text names none, the code is followed (base.py explains).
    default_scheduler = "fixmatch"

    def unlabeled_weight(self, step: int) -> float:
        ramp_steps = self.hparams.ramp_fraction * self.context.total_steps
        return self.hparams.penalty * (min(1.0, step / ramp_steps) if ramp_steps > 0 else 1.0)

    def objective(self, labeled: Batch, unlabeled: Batch | None, step: int) -> StepOutput:
        assert unlabeled is not None, "Pseudo-Label needs an unlabeled batch"
        supervised, unsupervised, health = self._losses[self.context.task.kind](labeled, unlabeled)
        weight = self.unlabeled_weight(step)
        loss = supervised + weight * unsupervised
        logs = {"loss/supervised": supervised.detach(), "loss/pseudo": unsupervised.detach(), **health}
        return StepOutput(loss, logs)

    @property
    def _losses(self) -> dict[TaskKind, Callable[[Batch, Batch], tuple[Tensor, Tensor, dict[str, Tensor]]]]:
        """Per task: (supervised loss, pseudo-label loss, pseudo-label health logs)."""
        return {TaskKind.CLASSIFICATION: self._joint_classification, TaskKind.MULTILABEL: self._joint_multilabel,
                TaskKind.DETECTION: self._detection}

    def _joint_outputs(self, labeled: Batch, unlabeled: Batch) -> tuple[Tensor, Tensor]:
        """One forward pass over labeled + unlabeled (joint batch norm), split back apart."""
        x = concat_inputs(self.view(labeled.x, self.hparams.augment), self.view(unlabeled.x, self.hparams.augment))
        outputs = self.model(x)
        return outputs[:len(labeled)], outputs[len(labeled):]

    def _joint_classification(self, labeled: Batch, unlabeled: Batch) -> tuple[Tensor, Tensor, dict[str, Tensor]]:
        own, other = self._joint_outputs(labeled, unlabeled)
        unsupervised, health = pseudo_label_loss(other, other, self.hparams.threshold)
        return self.supervised_loss(own, labeled.y), unsupervised, health

    def _joint_multilabel(self, labeled: Batch, unlabeled: Batch) -> tuple[Tensor, Tensor, dict[str, Tensor]]:
        """Per task 1[p > 0.5] where max(p, 1 - p) passes the threshold, masked BCE, times the kept fraction."""
        own, other = self._joint_outputs(labeled, unlabeled)
        targets, kept = confident_binary_targets(other, self.hparams.threshold)
        unsupervised = masked_bce(other, targets) * kept if kept > 0 else other.sum() * 0.0
        return self.supervised_loss(own, labeled.y), unsupervised, {PSEUDO_KEPT: kept}

    def _detection(self, labeled: Batch, unlabeled: Batch) -> tuple[Tensor, Tensor, dict[str, Tensor]]:
        """The detector's boxes on unlabeled images (eval mode, no gradient) above the threshold are its targets."""
        unlabeled_x = self.view(unlabeled.x, False)
        self.model.eval()
        with torch.no_grad():
            predictions = self.model(unlabeled_x)
        self.model.train()
        targets, kept = confident_boxes(predictions, self.hparams.threshold)
        supervised = self.model.fit_loss(self.view(labeled.x, False), labeled.y, self.supervised_loss)
        unsupervised = self.model.fit_loss(unlabeled_x, targets.items, self.supervised_loss)
        return supervised, unsupervised, {PSEUDO_KEPT: kept.to(supervised.device)}
