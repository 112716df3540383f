"""Class balancing: ERM on batches that weigh every class equally."""
from __future__ import annotations

from dataclasses import dataclass

from raybench.algorithms.base import BALANCE_DRAWS, SamplingPlan, balanced_plan
from raybench.algorithms.erm import ERM, ERMHparams
from raybench.algorithms.registry import register
from raybench.data.base import Split, TaskKind
from raybench.settings import Allowed, setting


@dataclass
class BalancedHparams(ERMHparams):
    batches: str = setting("expected", allowed=Allowed(choices=BALANCE_DRAWS),
                           help="expected: SpuCo's draw, with replacement, P(i) proportional to 1/|key(i)|; "
                                "exact: equal counts of every key in every batch")


@register("cb")
class ClassBalanced(ERM):
    """CB (SpuCo Sec. 3.1.1): mini-batches that weigh every class equally.

    loss = E_(x,y)~class-balanced batches [ CE(h(x), y) ]; needs no group labels. By default the batches are
    balanced in expectation, as SpuCo's ClassBalanceBatchERM draws them (`balanced_plan`).
    """

    Hparams = BalancedHparams
    supported_tasks = frozenset({TaskKind.CLASSIFICATION})

    def sampling(self, train: Split) -> SamplingPlan | None:
        assert train.y is not None
        return balanced_plan(train.y, self.hparams.batches)
