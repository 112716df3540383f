"""Models: featurizer + head builders behind one registry; `build_model(name, spec)` is the entry point.

The registry reads each module's `@MODELS.register("name")` from its source and imports the module when that
model is first built, and the base names resolve on first use (PEP 562): listing the models imports no torch."""
from __future__ import annotations

from typing import TYPE_CHECKING

from raybench.lazy import names_on_first_use
from raybench.models.registry import MODELS, ModelSpec

if TYPE_CHECKING:
    from raybench.models.base import FeaturizerHead, load_local_weights

MODELS.discover(__name__, __path__)  # each module registers itself: no list to keep

_FROM_BASE = ("FeaturizerHead", "load_local_weights")  # imported from raybench.models.base when first asked for


# The base module imports torch, which listing the models must not.
__getattr__ = names_on_first_use(globals(), dict.fromkeys(_FROM_BASE, "raybench.models.base"))


def build_model(name: str, spec: ModelSpec) -> FeaturizerHead:
    return MODELS.get(name)(spec)


__all__ = ["MODELS", "FeaturizerHead", "ModelSpec", "build_model", "load_local_weights"]
