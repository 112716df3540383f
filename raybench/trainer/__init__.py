"""The trainer: one loop for every algorithm (`Trainer`), its config and its callback interface.

Names resolve on first use (PEP 562), so a process that needs only the callback records, such as Ray
Train's controller unpickling a report callback, does not import torch."""
from __future__ import annotations

from raybench.lazy import names_on_first_use

_HOMES = {
    "Callback": "callbacks", "EpochReport": "callbacks", "StageReport": "callbacks",
    "ConfigError": "config", "TrainConfig": "config",
    "BEST_MODEL_FILE": "loop", "STATE_FILE": "loop", "DivergenceError": "loop", "FitResult": "loop", "Trainer": "loop",
}
__all__ = sorted(_HOMES)  # noqa: PLE0605  the lazily imported names, from the one table above


__getattr__ = names_on_first_use(globals(), {name: f"raybench.trainer.{home}" for name, home in _HOMES.items()})
