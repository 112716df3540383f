"""Shared pieces of the group-robustness methods (SpuCo): reference models and inferred groups.

Several methods start from a reference ERM model (JTT, EIIL, Spare, DFR, Dispel). It is trained by the
trainer as an earlier stage at the dataset's default settings plus the method's own reference
hyperparameters, so every trial that agrees on those shares one cached model. Inferred groups are
kept as extra state of the algorithm, so a resumed trial keeps them without re-inferring.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from raybench.algorithms.base import Hparams, RoundContext, StageModel
from raybench.settings import AT_LEAST_ONE, NON_NEGATIVE, POSITIVE, Suggest, setting


@dataclass
class ReferenceHparams(Hparams):
    """The reference ERM model: T_r epochs (None: the dataset's default) at the dataset's optimiser settings,
    unless `reference_lr` / `reference_weight_decay` say otherwise."""

    reference_epochs: int | None = setting(1, allowed=AT_LEAST_ONE, suggest=Suggest.choice(1, 2, 5),
                                              help="T_r, the reference ERM model's epochs; none: the dataset's")
    reference_lr: float | None = setting(None, allowed=POSITIVE, help="the reference model's lr; none: the "
                                                                         "dataset's")
    reference_weight_decay: float | None = setting(None, allowed=NON_NEGATIVE, help="the reference model's weight "
                                                                                       "decay; none: the dataset's")


def train_reference(context: RoundContext, hparams: ReferenceHparams, follow_run: bool = False) -> StageModel:
    """The reference ERM model after its last epoch (JTT and Spare read it at T_r, not at its best epoch).

    An unset `reference_lr` / `reference_weight_decay` is the dataset's, or this run's own when `follow_run`
    (JTT, whose two stages share their hyperparameters in SpuCo: its batch size too)."""
    assert context.train_stage is not None
    overrides: dict[str, Any] = {"algorithm": "erm", "patience": None}
    lr, weight_decay = hparams.reference_lr, hparams.reference_weight_decay
    if follow_run:
        lr = context.lr if lr is None else lr
        weight_decay = context.weight_decay if weight_decay is None else weight_decay
        if context.batch_size is not None:
            overrides["batch_size"] = context.batch_size
    for key, value in (("epochs", hparams.reference_epochs), ("lr", lr), ("weight_decay", weight_decay)):
        if value is not None:
            overrides[key] = value
    return context.train_stage("reference", overrides)


def minority_mask(y: Tensor, group: Tensor) -> Tensor:
    """True for examples outside their class's largest group: how inferred groups are checked against truth."""
    minority = torch.ones_like(y, dtype=torch.bool)
    for c in torch.unique(y).tolist():
        in_class = y == c
        majority = torch.mode(group[in_class]).values
        minority[in_class & (group == majority)] = False
    return minority


def inference_quality(inferred_minority: Tensor, y: Tensor, group: Tensor) -> dict[str, float]:
    """Precision and recall of an inferred minority set against the true minority groups (diagnostics only)."""
    truth = minority_mask(y, group)
    hits = float((inferred_minority & truth).sum())
    return {
        "inferred_minority_size": float(inferred_minority.sum()),
        "true_minority_size": float(truth.sum()),
        "minority_precision": hits / max(float(inferred_minority.sum()), 1.0),
        "minority_recall": hits / max(float(truth.sum()), 1.0),
    }


def parse_grid(text: str, name: str) -> list[float]:
    """A comma-separated grid hyperparameter ("1.0,0.7,0.3") as floats, with one clear error."""
    try:
        values = [float(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise ValueError(f"{name}: expected comma-separated numbers, got {text!r}") from None
    if not values:
        raise ValueError(f"{name}: expected at least one number, got {text!r}")
    return values
