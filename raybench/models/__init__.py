"""Models: featurizer + head builders behind one registry; `build_model(name, spec)` is the entry point."""
from __future__ import annotations

from raybench.models.base import FeaturizerHead, load_local_weights
from raybench.models.registry import MODELS, ModelSpec
from raybench.registry import import_every_module

import_every_module(__name__, __path__)  # each module registers itself: no list to keep


def build_model(name: str, spec: ModelSpec) -> FeaturizerHead:
    return MODELS.get(name)(spec)


__all__ = ["MODELS", "FeaturizerHead", "ModelSpec", "build_model", "load_local_weights"]
