"""Algorithms, one file each, registered by name; `build_algorithm` is how the trainer makes one.

The registry reads each module's `@register("name")` from its source and imports the module when that algorithm
is first used, and the base classes resolve on first use (PEP 562): listing the algorithms imports no torch."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from raybench.algorithms.registry import ALGORITHMS, register
from raybench.lazy import names_on_first_use

if TYPE_CHECKING:
    from raybench.algorithms.base import (
        Algorithm,
        AlgorithmContext,
        Hparams,
        RoundContext,
        SamplingPlan,
        ScoredRows,
        StageModel,
        StepOutput,
    )
    from raybench.models.base import FeaturizerHead

ALGORITHMS.discover(__name__, __path__)  # each module registers itself: no list to keep

# The names raybench.algorithms.base defines, imported from there when first asked for.
_FROM_BASE = ("Algorithm", "AlgorithmContext", "Hparams", "RoundContext", "SamplingPlan", "ScoredRows", "StageModel",
              "StepOutput")


# The base module imports torch, which listing the algorithms must not.
__getattr__ = names_on_first_use(globals(), dict.fromkeys(_FROM_BASE, "raybench.algorithms.base"))


def build_algorithm(name: str, model: FeaturizerHead, hparams: Hparams | dict[str, Any],
                    context: AlgorithmContext) -> Algorithm:
    """The algorithm `name` on `model`: `hparams` as the trainer's config parsed them (TrainConfig.typed_hparams), or
    as a mapping to parse (tests and scripts)."""
    cls = ALGORITHMS.get(name)
    if not isinstance(hparams, cls.Hparams):
        hparams = cls.Hparams.from_dict(dict(hparams), name)
    return cls(model, hparams, context)


__all__ = [
    "ALGORITHMS", "Algorithm", "AlgorithmContext", "Hparams", "RoundContext", "SamplingPlan", "ScoredRows", "StageModel",
    "StepOutput", "build_algorithm", "register",
]
