"""Each metric against scikit-learn or numpy on random data."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from sklearn.metrics import accuracy_score, average_precision_score, f1_score

from raybench import metrics


@pytest.fixture
def classification() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(500, 7, generator=g)
    y = torch.randint(0, 7, (500,), generator=g)
    y[:200] = logits[:200].argmax(1)  # make it better than chance
    group = torch.randint(0, 5, (500,), generator=g)
    return logits, y, group


def test_accuracy_matches_sklearn(classification):
    logits, y, _ = classification
    assert metrics.accuracy(logits, y) == pytest.approx(accuracy_score(y.numpy(), logits.argmax(1).numpy()))


def test_per_group_and_worst_group_accuracy(classification):
    logits, y, group = classification
    pred = logits.argmax(1).numpy()
    expected = {g: accuracy_score(y.numpy()[group.numpy() == g], pred[group.numpy() == g]) for g in range(5)}
    got = metrics.per_group_accuracy(logits, y, group)
    assert got == pytest.approx(expected)
    assert metrics.worst_group_accuracy(logits, y, group) == pytest.approx(min(expected.values()))


def test_macro_f1_matches_sklearn(classification):
    logits, y, _ = classification
    assert metrics.macro_f1(logits, y) == pytest.approx(f1_score(y.numpy(), logits.argmax(1).numpy(), average="macro"))


def test_macro_f1_with_absent_classes_matches_sklearn():
    y = torch.tensor([0, 0, 2, 2, 5])
    pred = torch.tensor([0, 2, 2, 2, 1])
    assert metrics.macro_f1(pred, y) == pytest.approx(f1_score(y.numpy(), pred.numpy(), average="macro"))


def test_pearson_r_matches_numpy():
    g = torch.Generator().manual_seed(1)
    y = torch.randn(300, generator=g)
    pred = 0.6 * y + torch.randn(300, generator=g)
    assert metrics.pearson_r(pred, y) == pytest.approx(np.corrcoef(pred.numpy(), y.numpy())[0, 1], rel=1e-9)


def test_domain_percentile_accuracy_matches_numpy(classification):
    logits, y, group = classification
    pred = logits.argmax(1).numpy()
    accs = [accuracy_score(y.numpy()[group.numpy() == g], pred[group.numpy() == g]) for g in range(5)]
    assert metrics.domain_percentile_accuracy(logits, y, group, q=10) == pytest.approx(np.percentile(accs, 10))


def test_average_precision_ignores_nan_labels_like_sklearn():
    g = torch.Generator().manual_seed(2)
    scores = torch.randn(400, 6, generator=g)
    labels = (torch.rand(400, 6, generator=g) < 0.3).float()
    labels[torch.rand(400, 6, generator=g) < 0.25] = float("nan")
    scores[:, 0] = torch.round(scores[:, 0])  # ties exercise the threshold grouping
    expected = []
    for t in range(6):
        known = ~np.isnan(labels[:, t].numpy())
        expected.append(average_precision_score(labels[known, t].numpy(), scores[known, t].numpy()))
    assert metrics.average_precision(scores, labels) == pytest.approx(np.mean(expected))


def test_average_precision_skips_tasks_without_both_classes():
    scores = torch.tensor([[0.9, 0.1], [0.2, 0.8], [0.4, 0.3]])
    labels = torch.tensor([[1.0, 1.0], [0.0, 1.0], [float("nan"), float("nan")]])
    assert metrics.average_precision(scores, labels) == pytest.approx(1.0)  # only task 0 counts
