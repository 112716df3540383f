"""Group balancing: ERM on batches with equal counts of every (class, spurious attribute) group."""
from __future__ import annotations

from raybench.algorithms.base import SamplingPlan
from raybench.algorithms.erm import ERM
from raybench.algorithms.registry import register
from raybench.data.base import Split, TaskKind


@register("gb")
class GroupBalanced(ERM):
    """GB (SpuCo Sec. 3.1.1): every mini-batch holds equal numbers of examples of each training group.

    loss = E_(x,y)~group-balanced batches [ CE(h(x), y) ]; uses the training group labels.
    """

    supported_tasks = frozenset({TaskKind.CLASSIFICATION})

    def sampling(self, train: Split) -> SamplingPlan | None:
        return SamplingPlan(balance_by=train.group)
