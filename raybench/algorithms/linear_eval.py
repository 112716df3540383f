"""DABS's linear evaluation: a fresh linear layer trained on a frozen featurizer's features."""
from __future__ import annotations

from raybench.algorithms.base import RoundContext, StepOutput
from raybench.algorithms.frozen import FrozenFeaturizer, FrozenHparams
from raybench.algorithms.registry import register
from raybench.data.base import Batch, TaskKind


@register("linear_eval")
class LinearEval(FrozenFeaturizer):
    """Linear evaluation as DABS transfers its pre-trained encoders (Tamkin et al., 2021, Sec. 5.3).

    The featurizer f (from `features_from`, see raybench/algorithms/frozen.py) is frozen and in eval mode;
    only the model's fresh linear head g is trained, on the plain view of the labeled train split:
        loss = E_(x,y)~labeled [ L(g(stopgrad f(x)), y) ],   L the task's loss (CE for classification).
    DABS trains g with Adam at lr 1e-4 for 100 epochs; here the trainer's `optimizer` and `lr` (searched in
    raybench/search_spaces/linear_eval.yaml) drive it, and the epoch is selected on validation like any model.
    """

    Hparams = FrozenHparams
    supported_tasks = frozenset({TaskKind.CLASSIFICATION, TaskKind.REGRESSION, TaskKind.MULTILABEL})

    def begin_round(self, context: RoundContext) -> dict[str, str]:
        return self.take_featurizer(context)

    def objective(self, labeled: Batch, unlabeled: Batch | None, step: int) -> StepOutput:
        loss = self.supervised_loss(self.model.head(self.features(labeled.x, labeled.index)), labeled.y)
        return StepOutput(loss, {"loss/supervised": loss.detach()})
