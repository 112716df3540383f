"""Spare: cluster a briefly trained model's outputs within each class, then sample clusters evenly."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from raybench.algorithms.base import RoundContext, SamplingPlan
from raybench.algorithms.erm import ERM
from raybench.algorithms.groups import ReferenceHparams, inference_quality, train_reference
from raybench.algorithms.registry import register
from raybench.data.base import Split, TaskKind
from raybench.settings import AT_LEAST_ONE, NON_NEGATIVE, Suggest, setting


@dataclass
class SpareHparams(ReferenceHparams):
    n_clusters: int = setting(2, allowed=AT_LEAST_ONE, suggest=Suggest.choice(2, 3, 4),
                              help="k-means clusters per class")
    sampling_power: float = setting(1.0, allowed=NON_NEGATIVE, suggest=Suggest.choice(1.0, 2.0, 3.0),
                                    help="p in the sampling weights |cluster(i)|^-p")
    augment: bool = setting(False, per_dataset=True, help="strong augmentation in the final training; off where a "
                                                          "dataset has none")


def cluster_within_classes(outputs: Tensor, y: Tensor, n_clusters: int, seed: int) -> Tensor:
    """k-means (scikit-learn) on each class's softmax outputs; returns a cluster id unique across classes."""
    clusters = torch.zeros_like(y)
    probs = torch.softmax(outputs.float(), dim=-1).numpy()
    for c in torch.unique(y).tolist():
        members = torch.nonzero(y == c).flatten()
        k = min(n_clusters, len(members))
        from sklearn.cluster import KMeans  # here: scikit-learn costs seconds in every Ray worker

        labels = KMeans(n_clusters=k, n_init=10, random_state=seed).fit_predict(probs[members.numpy()])
        clusters[members] = c * n_clusters + torch.from_numpy(labels.astype(np.int64))
    return clusters


def cluster_weights(clusters: Tensor, power: float) -> Tensor:
    """Importance weights |cluster(i)|^-p: with p = 1 every cluster is drawn equally often."""
    sizes = torch.bincount(clusters).double()
    return sizes[clusters] ** -power


@register("spare")
class Spare(ERM):
    """Spare (Yang et al., 2023; SpuCo Sec. 3.1.2): sample evenly from clusters of early outputs.

    Stages:
      1. reference: ERM for a few epochs T_r (early in training outputs are mostly spurious);
      2. infer_groups: k-means with `n_clusters` per class on the reference's softmax outputs;
      3. train: ERM with importance sampling, P(i) proportional to |cluster(i)|^-p (`sampling_power`).
    """

    Hparams = SpareHparams
    supported_tasks = frozenset({TaskKind.CLASSIFICATION})
    stages = ("reference", "infer_groups", "train")

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)
        self.clusters = torch.empty(0, dtype=torch.long)

    def get_extra_state(self) -> dict[str, Tensor]:
        return {"clusters": self.clusters}

    def set_extra_state(self, state: dict[str, Tensor]) -> None:
        self.clusters = state["clusters"]

    def begin_round(self, context: RoundContext) -> dict[str, str]:
        assert context.train is not None and context.train.y is not None and context.report_stage is not None
        reference = train_reference(context, self.hparams)
        outputs = context.predict(reference.model, context.train, self.context.views.plain)
        self.clusters = cluster_within_classes(outputs, context.train.y, self.hparams.n_clusters, context.seed)
        sizes = torch.bincount(self.clusters)
        largest = torch.zeros(int(context.train.y.max()) + 1, dtype=sizes.dtype)
        for c in torch.unique(context.train.y).tolist():
            largest[c] = sizes[self.clusters[context.train.y == c]].max()
        smaller = sizes[self.clusters] < largest[context.train.y]  # all but each class's largest cluster
        context.report_stage("infer_groups", inference_quality(smaller, context.train.y, context.train.group),
                             {"reference": reference.key, "cluster_sizes": str(sizes.tolist())})
        return {"reference_model": reference.key}

    def sampling(self, train: Split) -> SamplingPlan | None:
        return SamplingPlan(weights=cluster_weights(self.clusters, self.hparams.sampling_power))
