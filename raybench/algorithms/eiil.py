"""EIIL: infer the environments a reference model is least invariant across, then run GroupDRO on them."""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from raybench.algorithms.base import AlgorithmContext, RoundContext
from raybench.algorithms.groupdro import GroupDROHparams, InferredGroupDRO
from raybench.algorithms.groups import ReferenceHparams, inference_quality, train_reference
from raybench.algorithms.registry import register
from raybench.settings import AT_LEAST_ONE, POSITIVE, setting

N_ENVIRONMENTS = 2


@dataclass
class EIILHparams(GroupDROHparams, ReferenceHparams):
    ei_steps: int = setting(20_000, allowed=AT_LEAST_ONE, help="Adam steps of the environment inference")
    ei_lr: float = setting(0.01, allowed=POSITIVE, help="the environment inference's Adam lr")


def scale_gradients(logits: Tensor, y: Tensor) -> Tensor:
    """d CE(w * logits_i, y_i) / dw at w = 1, per example: (softmax(logits_i) - onehot(y_i)) . logits_i."""
    probs = torch.softmax(logits.double(), dim=-1)
    return ((probs - F.one_hot(y, logits.shape[-1]).double()) * logits.double()).sum(dim=-1)


def infer_environments(logits: Tensor, y: Tensor, steps: int, lr: float, generator: torch.Generator) -> Tensor:
    """EIIL's environment inference (Creager et al., 2021, Eq. 4) with Adam on soft assignments q = sigmoid(u):

        max_q  1/2 sum_e || grad_w (1/N) sum_i q_i^e CE(w * f_ref(x_i), y_i) |_{w=1} ||^2,  q^1 = q, q^2 = 1 - q.

    The gradient with respect to the dummy scale w is linear in q, so it is computed in closed form.
    Returns the hard environment (0/1) of every example.
    """
    grads = scale_gradients(logits, y)
    u = torch.randn(len(y), generator=generator, dtype=torch.float64).requires_grad_()
    optimizer = torch.optim.Adam([u], lr=lr)
    for _ in range(steps):
        q = torch.sigmoid(u)
        penalty = ((q * grads).mean() ** 2 + ((1 - q) * grads).mean() ** 2) / 2
        optimizer.zero_grad()
        (-penalty).backward()
        optimizer.step()
    return (torch.sigmoid(u.detach()) > 0.5).long()


@register("eiil")
class EIIL(InferredGroupDRO):
    """EIIL (Creager et al., 2021; SpuCo Sec. 3.1.2): GroupDRO on environments inferred from a reference.

    Stages:
      1. reference: ERM for T_r epochs;
      2. infer_groups: environments e_i from `infer_environments` on the reference logits; group = (y, e);
      3. train: GroupDRO (eta, group-balanced batches) on the inferred groups.
    """

    Hparams = EIILHparams
    stages = ("reference", "infer_groups", "train")

    def group_count(self, context: AlgorithmContext) -> int:
        return context.task.n_outputs * N_ENVIRONMENTS

    def begin_round(self, context: RoundContext) -> dict[str, str]:
        assert context.train is not None and context.train.y is not None and context.report_stage is not None
        reference = train_reference(context, self.hparams)
        logits = context.predict(reference.model, context.train, self.context.views.plain)
        generator = torch.Generator().manual_seed(context.seed)
        environments = infer_environments(logits, context.train.y, self.hparams.ei_steps, self.hparams.ei_lr, generator)
        self.inferred = context.train.y * N_ENVIRONMENTS + environments
        # The smaller environment of each class plays the part of its minority group.
        smaller = torch.zeros_like(environments, dtype=torch.bool)
        for c in torch.unique(context.train.y).tolist():
            in_class = context.train.y == c
            ones = int(environments[in_class].sum())
            smaller[in_class] = environments[in_class] == (1 if ones <= int(in_class.sum()) - ones else 0)
        context.report_stage("infer_groups", inference_quality(smaller, context.train.y, context.train.group),
                             {"reference": reference.key})
        return {"reference_model": reference.key}
