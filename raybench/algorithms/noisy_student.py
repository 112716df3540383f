"""Noisy Student: a noised student learns from a teacher's hard pseudo-labels, then becomes the teacher."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from raybench.algorithms.base import (
    Algorithm,
    AlgorithmContext,
    Hparams,
    RoundContext,
    StepOutput,
    pseudo_label_logs,
)
from raybench.algorithms.pseudo_targets import hard_targets
from raybench.algorithms.registry import register
from raybench.checkpoints import load_state_dict_into
from raybench.data.base import Batch, TaskKind, concat_inputs, move_to
from raybench.models.base import FeaturizerHead
from raybench.settings import AT_LEAST_ONE, PROBABILITY, Allowed, setting

TEACHER_STAGE = "teacher"
STUDENT_INITS = ("teacher", "scratch")


@dataclass
class NoisyStudentHparams(Hparams):
    dropout: float = setting(0.5, allowed=PROBABILITY, help="the student's dropout before its head")
    iterations: int = setting(2, allowed=AT_LEAST_ONE, help="teacher-student rounds")
    teacher_checkpoint: str | None = setting(None, help="none: the dataset's ERM(+augmentation) model, a cached "
                                                           "stage")
    teacher_epochs: int | None = setting(None, allowed=AT_LEAST_ONE, help="that teacher's epochs; none: the "
                                                                             "dataset's ERM epochs (the paper's "
                                                                             "budget)")
    augment: bool = setting(True, per_dataset=True, help="strong augmentation of the student's inputs; off where a "
                                                         "dataset has none")
    student_init: str = setting("teacher", allowed=Allowed(choices=STUDENT_INITS),
                                help="where each round's student starts: its teacher's weights (the authors' "
                                     "warm start), or scratch (a fresh initialisation, an ablation)")


@register("noisy_student")
class NoisyStudent(Algorithm):
    """Noisy Student (Xie et al., 2020), as adapted by WILDS 2.0 App. B.6.

    Each of `iterations` rounds: the teacher labels the whole unlabeled split once (weak view, hard
    labels); a student f -> Dropout(0.5) -> g, warm-started from that teacher's weights (below), minimises
        L(h(A_strong(x_l)), y_l) + L(h(A_strong(x_u)), teacher(x_u)),
    L the task's loss (CE; masked BCE on 1[p > 0.5] for multi-label; MSE on the teacher's value for
    regression; the detector's own losses on its boxes scoring >= 0.5, see pseudo_targets.py), each loss the
    mean over its own rows, weighted 1 and 1 (the paper: lambda(t) = 1). Labeled and unlabeled inputs share one
    forward pass, so batch norm sees both, and the outputs are split back by rows, as the authors' code does
    (p-lambda/wilds examples/algorithms/noisy_student.py lines 126-130: concat_input, one get_model_output,
    y_pred = outputs[:n_lab], unlabeled_y_pred = outputs[n_lab:]; lines 137-158: the labeled loss on the labeled
    rows plus the unlabeled loss, the same loss for hard pseudo-labels, examples/algorithms/initializer.py lines
    116-119, unweighted). Detection is the exception: a detector's `fit_loss` takes one batch with its targets and
    returns that batch's averaged losses, which cannot be split by rows, so its labeled and unlabeled images stay
    in two calls (a deviation forced by the detector API; the authors' detector takes the joint batch with its
    targets, lines 126-128; here the backbone's batch norms are frozen, raybench/models/detection.py, so the
    joint pass's point, shared batch statistics, does not arise). The best student
    becomes the next round's teacher; the trial is selected among the last round's students only. The
    first teacher is read from `teacher_checkpoint`, or, when none is given, is the paper's: the best
    epoch of a full ERM run with strong augmentation (plain ERM where the data has none) at the dataset's
    own settings, trained once as a cached stage that every trial of a sweep with the same data, seed and
    model shares. Which teacher each round used is logged as `round_<r>/teacher_source`.

    The student starts from its teacher's weights, featurizer and classifier, with the dropout added on top
    (`student_init=teacher`, the default): the authors' multi-round driver says "Students are all warm-started
    with the current teacher's weights" (p-lambda/wilds examples/noisy_student_wrapper.py line 15) and passes
    `--pretrained_model_path {teacher_weights}  # warm starting` beside the teacher's path (line 96), which
    examples/models/initializer.py lines 111-132 load into featurizer and classifier before
    examples/algorithms/noisy_student.py lines 62-68 wrap them in its DropoutModel ("To warm start the student
    model, point config.pretrained_model_path to config.teacher_model_path", line 32). The paper's text (App. B.6)
    does not say; the code is followed. `student_init=scratch` keeps the fresh initialisation as a named ablation:
    with WILDS's short per-round schedule a student trained from scratch is weak, and as the next teacher its
    pseudo-labels collapse. The round's `round_<r>/student_init` says which it was.
    """

    Hparams = NoisyStudentHparams
    uses_unlabeled = True
    supported_tasks = frozenset(TaskKind)  # hard targets per task: raybench.algorithms.pseudo_targets
    ratio_epochs_factor = 1.0  # its search space's epochs rule: ceil(E / (k + 1)) per iteration
    stages = (TEACHER_STAGE, "train")  # "teacher" only when no teacher_checkpoint is given
    # The FixMatch lr decay where the dataset sets no schedule, over each round's own optimiser steps (a WILDS run
    # is one iteration): p-lambda/wilds examples/configs/algorithm.py line 78 ('scheduler': 'FixMatchLR'); the
    # paper's text names none, the code is followed (base.py explains).
    default_scheduler = "fixmatch"

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

    @classmethod
    def rounds_for(cls, hparams: NoisyStudentHparams) -> int:  # type: ignore[override]
        return hparams.iterations

    @classmethod
    def model_files(cls, hparams: NoisyStudentHparams) -> dict[str, str]:
        return {"teacher_checkpoint": hparams.teacher_checkpoint} if hparams.teacher_checkpoint else {}

    def begin_round(self, context: RoundContext) -> dict[str, str]:
        """Label the whole unlabeled split once with this round's teacher (the trainer's `predict` seeds the
        weak view by seed and round, so every data-parallel rank gets the same labels)."""
        if context.unlabeled is None:
            raise ValueError("Noisy Student needs an unlabeled split")
        teacher, source = self.teacher(context)
        outputs = context.predict(teacher, context.unlabeled, self.context.views.weak)
        self.pseudo_labels = hard_targets(outputs, self.context.task.kind)
        return {f"round_{context.round}/teacher_source": source,
                f"round_{context.round}/student_init": self.start_student(teacher, source)}

    def start_student(self, teacher: FeaturizerHead, source: str) -> str:
        """Warm-start the student from the teacher's weights (its dropout stays as it is: it has none), or leave
        its fresh initialisation for `student_init=scratch`; returns which, in words."""
        if self.hparams.student_init == "scratch":
            return "a fresh initialisation (student_init=scratch)"
        load_state_dict_into(self.model, teacher.state_dict(), f"the teacher ({source})")
        return "the teacher's weights"

    def teacher(self, context: RoundContext) -> tuple[FeaturizerHead, str]:
        """This round's teacher and, in words, where it came from."""
        if context.previous_model is not None:
            return context.previous_model, f"best student of round {context.round - 1}"
        if self.hparams.teacher_checkpoint:
            path = self.hparams.teacher_checkpoint
            return context.load_model(path, "teacher_checkpoint"), f"checkpoint {path}"
        return self.first_teacher(context)

    def first_teacher(self, context: RoundContext) -> tuple[FeaturizerHead, str]:
        """The paper's first teacher, not one at this trial's sampled lr and shortened epochs: a full-budget
        ERM(+augmentation) run at the dataset's defaults, its best epoch, from the stage cache when any trial
        trained it before (its key holds none of this trial's sampled values)."""
        assert context.train_stage is not None and context.dataset is not None
        augment = "strong_augmentation" in context.dataset.capabilities
        overrides: dict[str, Any] = {"algorithm": "erm", "augment": augment, "patience": None}
        if self.hparams.teacher_epochs is not None:  # a shorter teacher for smoke runs and tests
            overrides["epochs"] = self.hparams.teacher_epochs
        stage = context.train_stage(TEACHER_STAGE, overrides, use_final=False)
        metric = context.dataset.selection_metric
        kind = "ERM+augmentation" if augment else "ERM"
        how = "cached" if stage.cached else "trained"
        score = stage.metrics.get(metric, float("nan"))
        return stage.model, f"{kind} teacher {how} (stage {stage.key}, best {metric}={score:.4f})"

    def objective(self, labeled: Batch, unlabeled: Batch | None, step: int) -> StepOutput:
        assert unlabeled is not None, "Noisy Student needs an unlabeled batch"
        labeled_x = self.view(labeled.x, self.hparams.augment)
        unlabeled_x = self.view(unlabeled.x, self.hparams.augment)
        targets = move_to(self.pseudo_labels[unlabeled.index], unlabeled.domain.device)
        if self.context.task.kind is TaskKind.DETECTION:  # the detector's own losses, one call per batch (see above)
            supervised = self.model.fit_loss(labeled_x, labeled.y, self.supervised_loss)
            unsupervised = self.model.fit_loss(unlabeled_x, targets, self.supervised_loss)
        else:  # one joint forward pass (joint batch norm), split by rows: the authors' lines 126-130
            outputs = self.model(concat_inputs(labeled_x, unlabeled_x))
            n = len(labeled)
            supervised = self.supervised_loss(outputs[:n], labeled.y)
            unsupervised = self.supervised_loss(outputs[n:], targets)
        loss = supervised + unsupervised
        logs = {"loss/supervised": supervised.detach(), "loss/pseudo": unsupervised.detach()}
        if self.context.task.kind is TaskKind.CLASSIFICATION:  # every row keeps its teacher's hard label
            logs.update(pseudo_label_logs(targets, torch.ones_like(targets, dtype=torch.float), self.context.task.n_outputs))
        return StepOutput(loss, logs)
