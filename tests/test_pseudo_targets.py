"""Pseudo-labels beyond classification (WILDS 2.0 App. B.4/B.6): multi-label, regression, detection."""
from __future__ import annotations

import math

import torch

from raybench.algorithms.base import masked_bce
from raybench.algorithms.pseudo_targets import confident_binary_targets, confident_boxes, hard_targets
from raybench.data.base import Records, TaskKind


def test_multilabel_targets_keep_only_confident_tasks_and_masked_bce_ignores_the_rest():
    logits = torch.tensor([[4.0, -4.0, 0.1], [0.0, 3.0, -3.0]])  # sigmoid: .982 .018 .525 / .5 .953 .047
    targets, kept = confident_binary_targets(logits, threshold=0.9)
    expected = torch.tensor([[1.0, 0.0, math.nan], [math.nan, 1.0, 0.0]])
    torch.testing.assert_close(targets, expected, equal_nan=True)
    assert math.isclose(float(kept), 4 / 6, rel_tol=1e-6)
    by_hand = torch.nn.functional.binary_cross_entropy_with_logits(
        torch.tensor([4.0, -4.0, 3.0, -3.0]), torch.tensor([1.0, 0.0, 1.0, 0.0]))
    torch.testing.assert_close(masked_bce(logits, targets), by_hand)


def test_noisy_student_hard_targets_per_task():
    logits = torch.tensor([[2.0, -1.0, 0.5], [0.1, 0.2, 3.0]])
    assert hard_targets(logits, TaskKind.CLASSIFICATION).tolist() == [0, 2]
    assert hard_targets(logits, TaskKind.MULTILABEL).tolist() == [[1.0, 0.0, 1.0], [1.0, 1.0, 1.0]]
    values = torch.tensor([[0.25], [-1.5]])
    assert hard_targets(values, TaskKind.REGRESSION).tolist() == [0.25, -1.5]


def test_detection_targets_are_the_boxes_that_pass_the_score():
    predictions = [
        {"boxes": torch.tensor([[0.0, 0, 4, 4], [1, 1, 5, 5]]), "labels": torch.tensor([1, 1]),
         "scores": torch.tensor([0.9, 0.3])},
        {"boxes": torch.zeros(0, 4), "labels": torch.zeros(0, dtype=torch.long), "scores": torch.zeros(0)},
    ]
    targets, with_boxes = confident_boxes(predictions, threshold=0.5)
    assert isinstance(targets, Records) and len(targets) == 2
    assert targets[0]["boxes"].tolist() == [[0.0, 0, 4, 4]] and targets[1]["boxes"].shape == (0, 4)
    assert float(with_boxes) == 0.5
    hard = hard_targets(predictions, TaskKind.DETECTION)
    assert [len(t["boxes"]) for t in hard.items] == [1, 0]
