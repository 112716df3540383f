"""Algorithms, one file each, registered by name; `build_algorithm` is how the trainer makes one."""
from __future__ import annotations

from typing import Any

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
from raybench.algorithms.registry import ALGORITHMS, register
from raybench.models.base import FeaturizerHead
from raybench.registry import import_every_module

import_every_module(__name__, __path__)  # each module registers itself: no list to keep


def parse_hparams(name: str, values: dict[str, Any]) -> Hparams:
    return ALGORITHMS.get(name).Hparams.from_dict(values, name)


def build_algorithm(name: str, model: FeaturizerHead, hparams: dict[str, Any], context: AlgorithmContext) -> Algorithm:
    cls = ALGORITHMS.get(name)
    return cls(model, cls.Hparams.from_dict(hparams, name), context)


__all__ = [
    "ALGORITHMS", "Algorithm", "AlgorithmContext", "Hparams", "RoundContext", "SamplingPlan", "ScoredRows", "StageModel",
    "StepOutput", "build_algorithm", "parse_hparams", "register",
]
