"""Noisy Student: a noised student learns from a teacher's hard pseudo-labels, then becomes the teacher."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from raybench.algorithms.base import Algorithm, AlgorithmContext, Hparams, RoundContext, StepOutput
from raybench.algorithms.registry import register
from raybench.data.base import Batch, TaskKind
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
        CE(h(A_strong(x_l)), y_l) + CE(h(A_strong(x_u)), teacher(x_u)),
    labeled and unlabeled batches in separate forward passes (separate batch norm). The best student
    becomes the next round's teacher. The first teacher is read from `teacher_checkpoint`, or, when none
    is given, trained first by the trainer as ERM with strong augmentation; which one was used is logged
    as `teacher_source`.
    """

    Hparams = NoisyStudentHparams
    uses_unlabeled = True
    supported_tasks = frozenset({TaskKind.CLASSIFICATION})

    def __init__(self, model: FeaturizerHead, hparams: NoisyStudentHparams, context: AlgorithmContext) -> None:
        super().__init__(model, hparams, context)
        if not isinstance(model.head, nn.Sequential) or not isinstance(model.head[0], nn.Dropout):
            model.head = nn.Sequential(nn.Dropout(hparams.dropout), model.head)
        self.pseudo_labels = torch.empty(0, dtype=torch.long)

    def get_extra_state(self) -> dict[str, Tensor]:
        """The teacher's labels are part of a resumable checkpoint (their size is only known at run time)."""
        return {"pseudo_labels": self.pseudo_labels}

    def set_extra_state(self, state: dict[str, Tensor]) -> None:
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
        self.pseudo_labels = outputs.argmax(dim=-1)
        return {f"round_{context.round}/teacher_source": source}

    def objective(self, labeled: Batch, unlabeled: Optional[Batch], step: int) -> StepOutput:
        assert unlabeled is not None, "Noisy Student needs an unlabeled batch"
        supervised = self.supervised_loss(self.model(self.view(labeled.x, self.hparams.augment)), labeled.y)
        targets: Tensor = self.pseudo_labels[unlabeled.index].to(unlabeled.x.device)
        student = self.model(self.view(unlabeled.x, self.hparams.augment))
        unsupervised = F.cross_entropy(student, targets)
        loss = supervised + unsupervised
        return StepOutput(loss, {"loss/supervised": supervised.detach(), "loss/pseudo": unsupervised.detach()})
