"""Group balancing: ERM on batches that weigh every (class, spurious attribute) group equally."""
from __future__ import annotations

from raybench.algorithms.base import SamplingPlan, balanced_plan
from raybench.algorithms.cb import BalancedHparams
from raybench.algorithms.erm import ERM
from raybench.algorithms.registry import register
from raybench.data.base import Split, TaskKind


@register("gb")
class GroupBalanced(ERM):
    """GB (SpuCo Sec. 3.1.1): mini-batches that weigh every training group equally.

    loss = E_(x,y)~group-balanced batches [ CE(h(x), y) ]; uses the training group labels. By default the
    batches are balanced in expectation, as SpuCo's GroupBalanceBatchERM draws them (`balanced_plan`).
    """

    Hparams = BalancedHparams
    supported_tasks = frozenset({TaskKind.CLASSIFICATION})

    def sampling(self, train: Split) -> SamplingPlan | None:
        return balanced_plan(train.group, self.hparams.batches)
