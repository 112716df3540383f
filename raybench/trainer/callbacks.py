"""How the trainer talks to the outside (console, Ray, MLflow) without importing any of them."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class EpochReport:
    """One epoch's outcome. `write_checkpoint(dir)` saves a resumable state plus the best model so far.

    `best_metrics` are all metrics at the best epoch so far, so the last report alone says how a run
    scored at its selected epoch (a sweep's searcher only sees last results).
    """

    epoch: int
    round: int
    metrics: dict[str, float]
    best_metrics: dict[str, float]
    is_best: bool
    write_checkpoint: Callable[[Path], None]


@dataclass
class StageReport:
    """One finished stage of a multi-stage method (reference model, group inference, last-layer refit).

    `key` is the stage's identity in the stage cache ("" for stages that train nothing), `cached` whether
    it was loaded rather than trained, `history` its per-epoch metrics when it trained.
    """

    name: str
    key: str
    cached: bool
    metrics: dict[str, float]
    history: list[dict[str, float]] = field(default_factory=list)
    facts: dict[str, str] = field(default_factory=dict)
    seconds: float = 0.0


class Callback:
    """Override what you need; the trainer calls these in order for every callback it was given."""

    def on_info(self, facts: dict[str, str]) -> None:
        """Facts about the run decided while it runs (e.g. Noisy Student's teacher source)."""

    def on_epoch_end(self, report: EpochReport) -> None:
        """After evaluation of each epoch."""

    def on_stage(self, report: StageReport) -> None:
        """After each earlier stage of a multi-stage method, before the trial's own training."""

    def should_stop(self) -> bool:
        """Asked after every epoch's report: True ends the run there, as finished (a sweep's scheduler
        stopping an unpromising trial early). Its best epoch so far stays its result."""
        return False
