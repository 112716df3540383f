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


def parse_hparams(name: str, values: dict[str, Any]) -> Hparams:
    return ALGORITHMS.get(name).Hparams.from_dict(values, name)


def build_algorithm(name: str, model: FeaturizerHead, hparams: dict[str, Any], context: AlgorithmContext) -> Algorithm:
    cls = ALGORITHMS.get(name)
    return cls(model, cls.Hparams.from_dict(hparams, name), context)


__all__ = [
    "ALGORITHMS", "Algorithm", "AlgorithmContext", "Hparams", "RoundContext", "SamplingPlan", "ScoredRows", "StageModel",
    "StepOutput", "build_algorithm", "parse_hparams", "register",
]
