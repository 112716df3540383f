"""Evaluation metrics over whole splits, as torch ops so they run where the predictions are.

Outputs are raw model outputs (logits for classification, values for regression, per-task logits
for multi-label). Each function is checked against scikit-learn or numpy in tests/test_metrics.py.
"""
from __future__ import annotations

import torch
from torch import Tensor


def predicted_class(outputs: Tensor) -> Tensor:
    return outputs.argmax(dim=-1) if outputs.ndim > 1 else outputs


def accuracy(outputs: Tensor, y: Tensor) -> float:
    return float((predicted_class(outputs) == y).float().mean())


def per_group_accuracy(outputs: Tensor, y: Tensor, group: Tensor) -> dict[int, float]:
    """Accuracy of every group that has examples, keyed by group id."""
    correct = (predicted_class(outputs) == y).float()
    out: dict[int, float] = {}
    for g in torch.unique(group).tolist():
        mask = group == g
        out[int(g)] = float(correct[mask].mean())
    return out


def worst_group_accuracy(outputs: Tensor, y: Tensor, group: Tensor) -> float:
    return min(per_group_accuracy(outputs, y, group).values())


def macro_f1(outputs: Tensor, y: Tensor, n_classes: int | None = None) -> float:
    """F1 averaged over classes that occur in `y` or in the predictions (scikit-learn's `average="macro"`)."""
    pred = predicted_class(outputs).long()
    y = y.long()
    k = n_classes or int(max(pred.max(), y.max())) + 1
    tp = torch.bincount(y[pred == y], minlength=k).float()
    n_pred = torch.bincount(pred, minlength=k).float()
    n_true = torch.bincount(y, minlength=k).float()
    present = (n_pred + n_true) > 0
    f1 = torch.where(n_pred + n_true > 0, 2 * tp / (n_pred + n_true).clamp(min=1), torch.zeros_like(tp))
    return float(f1[present].mean())


def pearson_r(pred: Tensor, y: Tensor) -> float:
    pred, y = pred.double().flatten(), y.double().flatten()
    pc, yc = pred - pred.mean(), y - y.mean()
    denom = pc.norm() * yc.norm()
    return float((pc * yc).sum() / denom) if denom > 0 else 0.0


def domain_percentile_accuracy(outputs: Tensor, y: Tensor, domain: Tensor, q: float = 10.0) -> float:
    """The q-th percentile (numpy's linear interpolation) of per-domain accuracies; WILDS Amazon uses q=10."""
    accs = torch.tensor(list(per_group_accuracy(outputs, y, domain).values()), dtype=torch.float64)
    return float(torch.quantile(accs, q / 100.0))


def _binary_average_precision(scores: Tensor, labels: Tensor) -> float:
    """AP = sum_n (R_n - R_{n-1}) P_n over distinct score thresholds, as scikit-learn computes it."""
    order = torch.argsort(scores, descending=True, stable=True)
    scores, labels = scores[order].double(), labels[order].double()
    tps = torch.cumsum(labels, 0)
    fps = torch.cumsum(1 - labels, 0)
    last_of_tie = torch.ones_like(scores, dtype=torch.bool)
    last_of_tie[:-1] = scores[1:] != scores[:-1]
    tps, fps = tps[last_of_tie], fps[last_of_tie]
    precision = tps / (tps + fps)
    recall = tps / tps[-1]
    recall_prev = torch.cat([torch.zeros(1, dtype=recall.dtype), recall[:-1]])
    return float(((recall - recall_prev) * precision).sum())


def average_precision(outputs: Tensor, y: Tensor) -> float:
    """Mean over tasks of AP, ignoring NaN labels and tasks without both a positive and a negative (OGB's rule)."""
    if outputs.ndim == 1:
        outputs, y = outputs[:, None], y[:, None]
    aps = []
    for t in range(y.shape[1]):
        known = ~torch.isnan(y[:, t])
        labels = y[known, t]
        if labels.numel() == 0 or labels.min() == labels.max():
            continue
        aps.append(_binary_average_precision(outputs[known, t], labels))
    if not aps:
        raise ValueError("average_precision: no task has both a positive and a negative label")
    return float(sum(aps) / len(aps))
