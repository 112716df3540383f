"""SSA: learn to predict the spurious attribute from a few group-labeled examples, then GroupDRO."""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from raybench.algorithms.base import AlgorithmContext, RoundContext
from raybench.algorithms.groupdro import GroupDROHparams, InferredGroupDRO
from raybench.algorithms.groups import inference_quality, minority_mask
from raybench.algorithms.registry import register
from raybench.data.base import ShiftDataset, Split, Task, TaskKind
from raybench.metrics import accuracy, worst_group_accuracy
from raybench.settings import AT_LEAST_ONE, OPEN_FRACTION, PROBABILITY, Suggest, setting


@dataclass
class SSAHparams(GroupDROHparams):
    threshold: float = setting(0.95, allowed=PROBABILITY, suggest=Suggest.uniform(0.8, 0.99),
                               help="tau: confidence needed to pseudo-label a training example's attribute")
    labeled_fraction: float = setting(0.5, allowed=OPEN_FRACTION, suggest=Suggest.choice(0.3, 0.5, 0.7),
                                      help="share of the group-labeled validation split that trains the predictor")
    predictor_epochs: int = setting(3, allowed=AT_LEAST_ONE, help="epochs of the attribute predictor")


def split_halves(split: Split, fraction: float, seed: int) -> tuple[Tensor, Tensor]:
    """Indices of a `fraction` / rest partition of `split`, stratified by group so every group is in both."""
    generator = torch.Generator().manual_seed(seed)
    first, second = [], []
    for g in torch.unique(split.group).tolist():
        members = torch.nonzero(split.group == g).flatten()
        members = members[torch.randperm(len(members), generator=generator)]
        cut = max(1, min(len(members) - 1, round(fraction * len(members)))) if len(members) > 1 else len(members)
        first.append(members[:cut])
        second.append(members[cut:])
    return torch.cat(first), torch.cat(second)


def attribute_dataset(dataset: ShiftDataset, val: Split, train: Split, fraction: float, seed: int) -> ShiftDataset:
    """The semi-supervised problem SSA solves: predict the spurious attribute (the domain) from x, with
    labels on part of the validation split, the training split as unlabeled data, and the rest of the
    validation split to select on by worst-group attribute accuracy."""
    labeled, held_out = split_halves(val, fraction, seed)

    def attribute_split(name: str, index: Tensor) -> Split:
        return Split(name, val.x[index], val.domain[index], val.domain[index], val.group[index])

    return ShiftDataset(
        name=f"{dataset.name}/ssa-attributes",
        task=Task(TaskKind.CLASSIFICATION, dataset.n_domains),
        splits={
            "train": attribute_split("train", labeled),
            "val": attribute_split("val", held_out),
            "train_unlabeled": Split("train_unlabeled", train.x, None, train.domain, train.group),
        },
        metrics={"acc": lambda out, y, g: accuracy(out, y), "worst_group_acc": worst_group_accuracy},
        selection_metric="val/worst_group_acc",
        defaults=dataset.defaults,
        views=dataset.views,
        domain_names=dataset.domain_names,
        input_shape=dataset.input_shape,
    )


@register("ssa")
class SSA(InferredGroupDRO):
    """SSA (Nam et al., 2022; SpuCo Sec. 3.1.3): GroupDRO on attributes predicted semi-supervised.

    Stages:
      1. group_predictor: a model of the spurious attribute a, trained with the one trainer as Pseudo-Label
         (threshold tau, no augmentation, which could change colours) on `labeled_fraction` of the
         group-labeled validation split plus the unlabeled training inputs, selected on the rest by
         worst-group attribute accuracy:  CE(p(a|x_v), a_v) + 1[max p(a|x_t) >= tau] CE(p(a|x_t), argmax p(a|x_t));
      2. infer_groups: the predictor labels every training example's attribute;
      3. train: GroupDRO on the inferred groups (y, argmax p(a|x)) of the training split.
    Groups are (class, attribute) pairs, group id = y * n_attributes + a, as the dataset declares.
    """

    Hparams = SSAHparams
    stages = ("group_predictor", "infer_groups", "train")

    def group_count(self, context: AlgorithmContext) -> int:
        return context.task.n_outputs * context.n_domains

    def begin_round(self, context: RoundContext) -> dict[str, str]:
        assert context.train is not None and context.train.y is not None and context.split is not None
        assert context.dataset is not None and context.train_stage is not None and context.report_stage is not None
        h = self.hparams
        problem = attribute_dataset(context.dataset, context.split("val"), context.train, h.labeled_fraction, context.seed)
        predictor = context.train_stage(
            "group_predictor",
            {"algorithm": "pseudolabel", "threshold": h.threshold, "augment": False, "epochs": h.predictor_epochs,
             "unlabeled_split": "train_unlabeled", "selection_metric": "val/worst_group_acc", "patience": None},
            dataset=problem, identity={"labeled_fraction": h.labeled_fraction}, use_final=False,
        )
        attributes = context.predict(predictor.model, context.train, self.context.views.plain).argmax(dim=-1)
        self.inferred = context.train.y * self.context.n_domains + attributes
        inferred_minority = minority_mask(context.train.y, self.inferred)
        quality = inference_quality(inferred_minority, context.train.y, context.train.group)
        quality["attribute_acc_train"] = float((attributes == context.train.domain).float().mean())
        context.report_stage("infer_groups", quality, {"group_predictor": predictor.key})
        return {"group_predictor": predictor.key}
