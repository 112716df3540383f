"""Class balancing: ERM on batches with equal counts of every class."""
from __future__ import annotations

from raybench.algorithms.base import SamplingPlan
from raybench.algorithms.erm import ERM
from raybench.algorithms.registry import register
from raybench.data.base import Split, TaskKind


@register("cb")
class ClassBalanced(ERM):
    """CB (SpuCo Sec. 3.1.1): every mini-batch holds equal numbers of examples of each class.

    loss = E_(x,y)~class-balanced batches [ CE(h(x), y) ]; needs no group labels.
    """

    supported_tasks = frozenset({TaskKind.CLASSIFICATION})

    def sampling(self, train: Split) -> SamplingPlan | None:
        assert train.y is not None
        return SamplingPlan(balance_by=train.y)
