"""The trainer: one loop for every algorithm (`Trainer`), its config and its callback interface."""
from raybench.trainer.callbacks import Callback, EpochReport, StageReport
from raybench.trainer.config import ConfigError, TrainConfig
from raybench.trainer.loop import BEST_MODEL_FILE, STATE_FILE, DivergenceError, FitResult, Trainer

__all__ = [
    "BEST_MODEL_FILE", "STATE_FILE", "Callback", "StageReport", "ConfigError", "DivergenceError", "EpochReport", "FitResult",
    "TrainConfig", "Trainer",
]
