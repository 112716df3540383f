"""Pseudo-labels beyond classification, as WILDS 2.0 adapted Pseudo-Label and Noisy Student (App. B.4, B.6).

A teacher's (or the model's own) outputs become training targets for the task's own loss:
- classification: the argmax class;
- multi-label (ogb-molpcba): per task 1[sigmoid > 0.5]; tasks whose confidence max(p, 1 - p) is below
  the threshold are set to NaN, which the masked BCE ignores, exactly as unknown labels;
- regression (PovertyMap, Noisy Student only): the teacher's prediction itself;
- detection (GlobalWheat): the predicted boxes whose score passes the threshold.
Noisy Student takes hard targets with no threshold beyond detection's 0.5; Pseudo-Label thresholds them.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from raybench.data.base import Records, TaskKind

DETECTION_SCORE = 0.5  # the score GlobalWheat's metric itself counts a box from


def _classes(outputs: Tensor, threshold: float) -> Tensor:
    return outputs.argmax(dim=-1)


def _binary(outputs: Tensor, threshold: float) -> Tensor:
    probs = torch.sigmoid(outputs.float())
    targets = (probs > 0.5).float()
    confident = torch.maximum(probs, 1 - probs) >= threshold
    return targets.masked_fill(~confident, float("nan"))


def _values(outputs: Tensor, threshold: float) -> Tensor:
    return outputs.float().view(len(outputs), -1)[:, 0]


def _boxes(outputs: list[dict[str, Tensor]], threshold: float) -> Records:
    kept = []
    for record in outputs:
        keep = record["scores"] >= threshold
        kept.append({"boxes": record["boxes"][keep].detach(), "labels": record["labels"][keep].detach()})
    return Records(kept)


TARGETS: dict[TaskKind, Callable[[Any, float], Any]] = {
    TaskKind.CLASSIFICATION: _classes,
    TaskKind.MULTILABEL: _binary,
    TaskKind.REGRESSION: _values,
    TaskKind.DETECTION: _boxes,
}


def hard_targets(outputs: Any, task: TaskKind) -> Any:
    """Noisy Student's targets from a teacher's outputs on the whole unlabeled split."""
    threshold = DETECTION_SCORE if task is TaskKind.DETECTION else 0.5
    return TARGETS[task](outputs, threshold)


def confident_binary_targets(outputs: Tensor, threshold: float) -> tuple[Tensor, Tensor]:
    """Pseudo-Label for multi-label outputs: (targets with NaN where not confident, kept fraction of labels)."""
    targets = _binary(outputs.detach(), threshold)
    return targets, (~torch.isnan(targets)).float().mean()


def confident_boxes(outputs: list[dict[str, Tensor]], threshold: float) -> tuple[Records, Tensor]:
    """Pseudo-Label for a detector: boxes scoring at least `threshold`, and the fraction of images with one."""
    targets = _boxes(outputs, threshold)
    with_boxes = sum(len(t["boxes"]) > 0 for t in targets.items)
    return targets, torch.tensor(with_boxes / max(len(targets), 1))
