"""The model registry: builders take a `ModelSpec` and return a `FeaturizerHead`."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from raybench.registry import Registry

if TYPE_CHECKING:  # the model classes import torch; the registry's names and summaries need none
    from raybench.models.base import FeaturizerHead


@dataclass(frozen=True)
class ModelSpec:
    input_shape: tuple[int, ...]
    n_outputs: int
    weights: Path | None = None
    # "spectrogram": a (bands, frames) input is a time-frequency image (ShiftDataset.input_layout)
    layout: str = ""


ModelBuilder = Callable[[ModelSpec], "FeaturizerHead"]
MODELS: Registry[ModelBuilder] = Registry("model")
