"""The trainer: one loop for every algorithm (`Trainer`), its config and its callback interface.

Names resolve on first use (PEP 562), so a process that needs only the callback records, such as Ray
Train's controller unpickling a report callback, does not import torch."""
from __future__ import annotations

from importlib import import_module
from typing import Any

_HOMES = {
    "Callback": "callbacks", "EpochReport": "callbacks", "StageReport": "callbacks",
    "ConfigError": "config", "TrainConfig": "config",
    "BEST_MODEL_FILE": "loop", "STATE_FILE": "loop", "DivergenceError": "loop", "FitResult": "loop", "Trainer": "loop",
}
__all__ = sorted(_HOMES)  # noqa: PLE0605  the lazily imported names, from the one table above


def __getattr__(name: str) -> Any:
    if name not in _HOMES:
        raise AttributeError(f"module 'raybench.trainer' has no attribute {name!r}")
    value = getattr(import_module(f"raybench.trainer.{_HOMES[name]}"), name)
    globals()[name] = value
    return value
