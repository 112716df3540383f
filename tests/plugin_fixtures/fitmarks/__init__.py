"""A test plug-in: ERM that appends one line to the file `$RAYBENCH_TEST_FIT_MARKS` each time it starts training
(its first optimisation step), naming the Tune trial it trains for. A test counts the lines to know how often each
trial really trained: a trial that replays its finished record, or never starts, adds none; one resumed from a
checkpoint adds one more. Its trials must run under the function executor (the trial's own process knows its Tune
trial id) and inherit the variable from the driver (a private Ray, started by the driver)."""
import os
from pathlib import Path

from ray import tune

from raybench.algorithms.base import AlgorithmContext, Hparams, StepOutput
from raybench.algorithms.erm import ERM
from raybench.algorithms.registry import register
from raybench.data.base import Batch
from raybench.models.base import FeaturizerHead
from raybench.plugins import add_search_spaces

MARKS_VARIABLE = "RAYBENCH_TEST_FIT_MARKS"


def mark_training_start() -> None:
    """One line, `<tune trial id> <pid>`, appended in one write (O_APPEND: lines of several trials never mix)."""
    path = os.environ.get(MARKS_VARIABLE)
    if not path:
        raise RuntimeError(f"plug-in fitmarks: ${MARKS_VARIABLE} names no file to mark training starts in")
    with Path(path).open("a") as marks:
        marks.write(f"{tune.get_context().get_trial_id()} {os.getpid()}\n")


@register("erm_fitmarks")
class ERMFitMarks(ERM):
    """ERM, marking each start of its training in `$RAYBENCH_TEST_FIT_MARKS`."""

    def __init__(self, model: FeaturizerHead, hparams: Hparams, context: AlgorithmContext) -> None:
        super().__init__(model, hparams, context)
        self.training_started = False  # a trainer also builds one to hold the best weights: it never trains

    def objective(self, labeled: Batch, unlabeled: Batch | None, step: int) -> StepOutput:
        if not self.training_started:
            self.training_started = True
            mark_training_start()
        return super().objective(labeled, unlabeled, step)


add_search_spaces(Path(__file__).parent / "spaces")
