"""Group DRO: minimise the worst group's loss through online, exponentiated group weights."""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from raybench.algorithms.base import (
    BALANCE_DRAWS,
    Algorithm,
    AlgorithmContext,
    Hparams,
    SamplingPlan,
    StepOutput,
    balanced_plan,
)
from raybench.algorithms.registry import register
from raybench.data.base import Batch, Split, TaskKind
from raybench.models.base import FeaturizerHead
from raybench.settings import NON_NEGATIVE, Allowed, Suggest, setting


@dataclass
class GroupDROHparams(Hparams):
    eta: float = setting(0.01, allowed=NON_NEGATIVE, suggest=Suggest.loguniform(0.001, 0.1),
                         help="step size of the group weights' exponentiated-gradient ascent (SpuCo: 0.01)")
    balanced: bool = setting(True, help="group-balanced batches (false: uniform batches)")
    batches: str = setting("expected", allowed=Allowed(choices=BALANCE_DRAWS),
                           help="how balanced batches are drawn. expected: SpuCo's draw, with replacement, "
                                "P(i) proportional to 1/|group(i)|; exact: equal counts of every group in every batch")


def group_losses(losses: Tensor, groups: Tensor, n_groups: int) -> tuple[Tensor, Tensor]:
    """Mean loss of every group in the batch (0 where absent) and which groups are present."""
    sums = torch.zeros(n_groups, device=losses.device, dtype=losses.dtype).index_add(0, groups, losses)
    counts = torch.zeros_like(sums).index_add(0, groups, torch.ones_like(losses))  # bincount's size waits on the device
    return sums / counts.clamp(min=1), counts > 0


def group_dro_loss(losses: Tensor, groups: Tensor, weights: Tensor, eta: float) -> Tensor:
    """Sagawa et al. (2020), Alg. 1: q_g <- q_g exp(eta * loss_g) for the groups in the batch, renormalise
    (updating `weights` in place), then return sum_g q_g loss_g with the new weights.

    Step for step SpuCo's GroupWeightedLoss (src/spuco/robust_train/group_dro.py at
    91842463a577b0a90b4f829fec367308f3052e9f): q starts uniform (:42-43); loss_g is the mean loss of group g's
    examples in the batch, 0 for a group absent from it, so its factor is exp(0) = 1 (:51-55); the update and
    renormalisation come first (:56, :64-68) and the returned loss uses the updated q, through which no gradient
    flows (:59-60; :68 replaces the weights through `.data`). Its step size is `group_weight_lr`, default 0.01
    (:23), which SpuCo's GroupDRO never sets (:119): raybench's default eta is that 0.01."""
    per_group, present = group_losses(losses, groups, weights.numel())
    with torch.no_grad():
        updated = weights * torch.exp(eta * per_group.detach().float() * present)
        weights.copy_(updated / updated.sum())
    return (weights.to(per_group.dtype) * per_group).sum()


@register("groupdro")
class GroupDRO(Algorithm):
    """GroupDRO (Sagawa et al., 2020; SpuCo Sec. 3.1.1): min_theta max_q sum_g q_g E_(x,y)~g [CE(h(x), y)].

    Gradient descent on theta is interleaved with exponentiated-gradient ascent on q (step size eta)
    over online group losses; batches are group-balanced when `balanced`. Group ids come from the
    training labels here; EIIL and SSA subclass this and supply inferred groups instead.

    Batches, by default as SpuCo's GroupDRO draws them: |train| indices per epoch with replacement, example i
    with probability proportional to 1 / |group(i)| (src/spuco/robust_train/group_dro.py:132-151), so a batch is
    balanced only in expectation: at batch 32 over 25 groups a group is absent from about 27 % of them, and
    its weight then stays put for that step. `batches: exact` holds every group in equal counts instead.
    """

    Hparams = GroupDROHparams
    supported_tasks = frozenset({TaskKind.CLASSIFICATION})

    def __init__(self, model: FeaturizerHead, hparams: GroupDROHparams, context: AlgorithmContext) -> None:
        super().__init__(model, hparams, context)
        n = self.group_count(context)
        self.register_buffer("group_weights", torch.full((n,), 1.0 / n))

    def group_count(self, context: AlgorithmContext) -> int:
        return context.n_groups

    def train_groups(self, train: Split) -> Tensor:
        """The group id of every training example (true labels here; inferred in subclasses)."""
        return train.group

    def batch_groups(self, batch: Batch) -> Tensor:
        return batch.group

    def sampling(self, train: Split) -> SamplingPlan | None:
        return balanced_plan(self.train_groups(train), self.hparams.batches) if self.hparams.balanced else None

    def objective(self, labeled: Batch, unlabeled: Batch | None, step: int) -> StepOutput:
        outputs = self.model(self.view(labeled.x, False))
        losses = F.cross_entropy(outputs, labeled.y, reduction="none")
        loss = group_dro_loss(losses, self.batch_groups(labeled).to(losses.device), self.group_weights, self.hparams.eta)
        return StepOutput(loss, {"loss/supervised": losses.mean().detach(), "dro/max_weight": self.group_weights.max().detach()})


class InferredGroupDRO(GroupDRO):
    """GroupDRO on groups a method inferred for the training split (EIIL, SSA), not on its labels.

    The inferred ids are extra state, so a resumed trial keeps them without inferring again.
    """

    def __init__(self, model: FeaturizerHead, hparams: GroupDROHparams, context: AlgorithmContext) -> None:
        super().__init__(model, hparams, context)
        self.inferred = torch.empty(0, dtype=torch.long)

    def get_extra_state(self) -> dict[str, Tensor]:
        return {"inferred": self.inferred}

    def set_extra_state(self, state: dict[str, Tensor]) -> None:
        self.inferred = state["inferred"]

    def train_groups(self, train: Split) -> Tensor:
        return self.inferred

    def batch_groups(self, batch: Batch) -> Tensor:
        return self.inferred[batch.index]
