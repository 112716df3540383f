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

from raybench.algorithms import (  # noqa: E402,F401
    cb, coral, dann, dfr, dispel, eiil, emix, erm, fixmatch, gb, groupdro, jtt, linear_eval, mlm, newt_probe,
    noisy_student, pseudolabel, shed, spare, ssa, swav,
)


def parse_hparams(name: str, values: dict[str, Any]) -> Hparams:
    return ALGORITHMS.get(name).Hparams.from_dict(values, name)


def build_algorithm(name: str, model: FeaturizerHead, hparams: dict[str, Any], context: AlgorithmContext) -> Algorithm:
    cls = ALGORITHMS.get(name)
    return cls(model, cls.Hparams.from_dict(hparams, name), context)


__all__ = [
    "ALGORITHMS", "Algorithm", "AlgorithmContext", "Hparams", "RoundContext", "SamplingPlan", "ScoredRows", "StageModel",
    "StepOutput", "build_algorithm", "parse_hparams", "register",
]
