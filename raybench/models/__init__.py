"""Models: featurizer + head builders behind one registry; `build_model(name, spec)` is the entry point."""
from __future__ import annotations

from raybench.models.base import FeaturizerHead, load_local_weights
from raybench.models.registry import MODELS, ModelSpec

from raybench.models import lenet, lenet5, torchvision_models  # noqa: E402,F401  (registers the builders)
from raybench.models import gin  # noqa: E402,F401
from raybench.models import text  # noqa: E402,F401
from raybench.models import detection  # noqa: E402,F401
from raybench.models import dabs  # noqa: E402,F401


def build_model(name: str, spec: ModelSpec) -> FeaturizerHead:
    return MODELS.get(name)(spec)


__all__ = ["MODELS", "FeaturizerHead", "ModelSpec", "build_model", "load_local_weights"]
