"""Just Train Twice: upsample what a briefly trained ERM model gets wrong, then train ERM again."""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from raybench.algorithms.base import RoundContext, SamplingPlan
from raybench.algorithms.erm import ERM
from raybench.algorithms.groups import ReferenceHparams, inference_quality, train_reference
from raybench.algorithms.registry import register
from raybench.data.base import Split, TaskKind
from raybench.settings import AT_LEAST_ONE, NON_NEGATIVE, POSITIVE, Suggest, setting


@dataclass
class JTTHparams(ReferenceHparams):
    reference_epochs: int | None = setting(2, allowed=AT_LEAST_ONE, suggest=Suggest.choice(1, 2, 5, 10),
                                              help="T_r, the reference ERM model's epochs (SpuCo App. C: 2 at "
                                                   "large magnitude); none: the dataset's")
    reference_lr: float | None = setting(None, allowed=POSITIVE, help="the reference model's lr; none: this "
                                                                         "run's own (SpuCo shares it)")
    reference_weight_decay: float | None = setting(None, allowed=NON_NEGATIVE, help="the reference model's weight "
                                                                                       "decay; none: this run's own")
    upsample: int = setting(800, allowed=AT_LEAST_ONE, suggest=Suggest.choice(20, 100, 800),
                            help="S_r: how many times each error-set example appears (SpuCo App. C: 800)")
    augment: bool = setting(False, per_dataset=True, help="strong augmentation in the second training; off where a "
                                                          "dataset has none")


def upsampled_indices(errors: Tensor, factor: int) -> Tensor:
    """Every example once, and each error-set example `factor` times in all."""
    everyone = torch.arange(len(errors))
    extra = torch.nonzero(errors).flatten().repeat(max(factor - 1, 0))
    return torch.cat([everyone, extra])


@register("jtt")
class JTT(ERM):
    """JTT (Liu et al., 2021; SpuCo Sec. 3.1.2): upsample a brief ERM model's errors, train ERM again.

    Stages:
      1. reference: ERM for T_r epochs (`reference_epochs`) at this run's lr and weight decay;
      2. infer_groups: the error set E = {i : argmax f_ref(x_i) != y_i} on the training split;
      3. train: ERM from a fresh model on the training set with E upsampled S_r times (`upsample`),
         loss = E_(x,y)~upsampled [ CE(h(x), y) ]; an epoch is one pass over the upsampled set,
         |train| + (S_r - 1) |E| examples.
    As SpuCo runs it (paper App. C.3 for SpuCoMNIST: S_r = 800 at every magnitude, T_r = 2 at large; "the
    ERM model for the group inference phase and the training phase share the same hyperparameters"; code:
    quickstart/celebA/celebA_jtt.py trains the reference with the run's own lr and weight decay and
    CustomSampleERM's sampler iterates every upsampled index each epoch). So an epoch's compute grows with
    S_r |E|: the planned budget shows it (`budget/planned_steps` against `budget/planned_protocol_steps`).
    """

    Hparams = JTTHparams
    supported_tasks = frozenset({TaskKind.CLASSIFICATION})
    stages = ("reference", "infer_groups", "train")
    budget_note = ("an epoch covers the upsampled set, |train| + (S_r - 1) |E| examples, and |E| is known only once "
                   "the reference has run: the steps above count |train|; the trial records what it planned and spent")

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)
        self.errors = torch.empty(0, dtype=torch.bool)

    def get_extra_state(self) -> dict[str, Tensor]:
        return {"errors": self.errors}

    def set_extra_state(self, state: dict[str, Tensor]) -> None:
        self.errors = state["errors"]

    def begin_round(self, context: RoundContext) -> dict[str, str]:
        assert context.train is not None and context.train.y is not None and context.report_stage is not None
        reference = train_reference(context, self.hparams, follow_run=True)
        outputs = context.predict(reference.model, context.train, self.context.views.plain)
        self.errors = outputs.argmax(dim=-1) != context.train.y
        quality = inference_quality(self.errors, context.train.y, context.train.group)
        context.report_stage("infer_groups", {"error_set_size": float(self.errors.sum()), **quality},
                             {"reference": reference.key})
        return {"reference_model": reference.key, "error_set_size": str(int(self.errors.sum()))}

    def sampling(self, train: Split) -> SamplingPlan | None:
        indices = upsampled_indices(self.errors, self.hparams.upsample)
        return SamplingPlan(indices=indices, epoch_examples=len(indices))
