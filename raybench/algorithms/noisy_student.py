"""Noisy Student: a noised student learns from a teacher's hard pseudo-labels, then becomes the teacher."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

import torch
from torch import nn

from raybench.algorithms.base import Algorithm, AlgorithmContext, Hparams, RoundContext, StepOutput
from raybench.algorithms.registry import register
from raybench.algorithms.pseudo_targets import hard_targets
from raybench.data.base import Batch, TaskKind, move_to
from raybench.models.base import FeaturizerHead


@dataclass
class NoisyStudentHparams(Hparams):
    dropout: float = 0.5
    iterations: int = 2
    teacher_checkpoint: Optional[str] = None  # None: train an ERM+augmentation teacher first
    augment: bool = True


@register("noisy_student")
class NoisyStudent(Algorithm):
    """Noisy Student (Xie et al., 2020), as adapted by WILDS 2.0 App. B.6.

    Each of `iterations` rounds: the teacher labels the whole unlabeled split once (weak view, hard
    labels); a freshly initialised student f -> Dropout(0.5) -> g minimises
        L(h(A_strong(x_l)), y_l) + L(h(A_strong(x_u)), teacher(x_u)),
    L the task's loss (CE; masked BCE on 1[p > 0.5] for multi-label; MSE on the teacher's value for
    regression; the detector's own losses on its boxes scoring >= 0.5, see pseudo_targets.py), labeled and
    unlabeled batches in separate forward passes (separate batch norm). The best student
    becomes the next round's teacher. The first teacher is read from `teacher_checkpoint`, or, when none
    is given, trained first by the trainer as ERM with strong augmentation; which one was used is logged
    as `teacher_source`.
    """

    Hparams = NoisyStudentHparams
    uses_unlabeled = True
    supported_tasks = frozenset(TaskKind)  # hard targets per task: raybench.algorithms.pseudo_targets

    def __init__(self, model: FeaturizerHead, hparams: NoisyStudentHparams, context: AlgorithmContext) -> None:
        super().__init__(model, hparams, context)
        wrapped = isinstance(model.head, nn.Sequential) and isinstance(model.head[0], nn.Dropout)
        if hparams.dropout > 0 and not wrapped:  # no dropout (ogb-molpcba, globalwheat): the model stays as built
            model.head = nn.Sequential(nn.Dropout(hparams.dropout), model.head)
        self.pseudo_labels: Any = torch.empty(0, dtype=torch.long)

    def get_extra_state(self) -> dict[str, Any]:
        """The teacher's labels are part of a resumable checkpoint (their size is only known at run time)."""
        return {"pseudo_labels": self.pseudo_labels}

    def set_extra_state(self, state: dict[str, Any]) -> None:
        self.pseudo_labels = state["pseudo_labels"]

    @property
    def rounds(self) -> int:
        return self.hparams.iterations

    def begin_round(self, context: RoundContext) -> dict[str, str]:
        if context.unlabeled is None:
            raise ValueError("Noisy Student needs an unlabeled split")
        if context.previous_model is not None:
            teacher, source = context.previous_model, f"best student of round {context.round - 1}"
        elif self.hparams.teacher_checkpoint:
            teacher = context.load_model(self.hparams.teacher_checkpoint)
            source = f"checkpoint {self.hparams.teacher_checkpoint}"
        else:
            teacher, source = context.train_teacher()
        outputs = context.predict(teacher, context.unlabeled, self.context.views.weak)
        self.pseudo_labels = hard_targets(outputs, self.context.task.kind)
        return {f"round_{context.round}/teacher_source": source}

    def objective(self, labeled: Batch, unlabeled: Optional[Batch], step: int) -> StepOutput:
        assert unlabeled is not None, "Noisy Student needs an unlabeled batch"
        supervised = self.model.fit_loss(self.view(labeled.x, self.hparams.augment), labeled.y, self.supervised_loss)
        targets = move_to(self.pseudo_labels[unlabeled.index], unlabeled.domain.device)
        unsupervised = self.model.fit_loss(self.view(unlabeled.x, self.hparams.augment), targets, self.supervised_loss)
        loss = supervised + unsupervised
        return StepOutput(loss, {"loss/supervised": supervised.detach(), "loss/pseudo": unsupervised.detach()})
