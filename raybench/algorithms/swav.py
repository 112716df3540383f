"""SwAV pre-training on the unlabeled target split, then ERM(+augmentation) fine-tuning (WILDS 2.0 App. B)."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from raybench.algorithms.base import Algorithm, AlgorithmContext, RoundContext, StepOutput
from raybench.algorithms.pretext import PretrainHparams, PretrainThenTransfer, pretrain_stage, transfer_featurizer
from raybench.algorithms.registry import register
from raybench.data.base import Batch, TaskKind
from raybench.models.base import FeaturizerHead
from raybench.settings import AT_LEAST_ONE, AT_LEAST_TWO, NON_NEGATIVE, POSITIVE, Allowed, setting


@dataclass
class SwAVHparams(PretrainHparams):
    """Fine-tuning is ERM(+aug); every other field configures the pre-training stage (fixed in a sweep).

    Crop scales default to SwAV's ImageNet values (the WILDS datasets use them; their other settings are in
    datasets.yaml); digits-shift sets its own, larger crops and no low-resolution crops (SWAV_PRETRAINING).
    The fields those datasets set are `per_dataset`. Swapped prediction needs K >= 2 prototypes and two
    assignment crops.
    """

    augment: bool = setting(True, per_dataset=True, help="strong augmentation in fine-tuning (ERM+aug); off where "
                                                         "a dataset has none")
    prototypes: int = setting(30, allowed=AT_LEAST_TWO, per_dataset=True, help="K, the number of prototypes")
    high_crops: int = setting(2, allowed=AT_LEAST_TWO, per_dataset=True,
                              help="assignment crops (codes are computed on these)")
    high_size: int = setting(16, allowed=AT_LEAST_ONE, per_dataset=True, help="px of a high-resolution crop")
    low_crops: int = setting(4, allowed=NON_NEGATIVE, per_dataset=True, help="low-resolution crops per image")
    low_size: int = setting(8, allowed=AT_LEAST_ONE, per_dataset=True, help="px of a low-resolution crop")
    high_scale: float = setting(0.14, allowed=Allowed(low=0, high=1, low_open=True), per_dataset=True,
                                help="min area fraction of a high-resolution crop (max 1); SwAV's ImageNet value")
    low_scale: float = setting(0.05, allowed=Allowed(low=0, high=1, low_open=True),
                               help="low-resolution crops cover [low_scale, high_scale] of the image; SwAV's "
                                    "ImageNet value")
    temperature: float = setting(0.1, allowed=POSITIVE, help="tau")
    sinkhorn_epsilon: float = setting(0.03, allowed=POSITIVE, help="WILDS; lightly's default is 0.05")
    frozen_prototype_steps: int = setting(0, allowed=NON_NEGATIVE, per_dataset=True,
                                          help="WILDS: 5005 iterations of 400 epochs; scaled with the epochs")
    projection_hidden: int = setting(2048, allowed=AT_LEAST_ONE, help="width of the projection MLP's hidden layer")
    projection_dim: int = setting(128, allowed=AT_LEAST_ONE, help="width of the projection (prototype) space")


def random_resized_crops(x: Tensor, n: int, size: int, scale: tuple[float, float], out_size: int,
                         generator: torch.Generator | None = None) -> list[Tensor]:
    """`n` per-example random crops of area fraction U(scale) and aspect 3/4..4/3, rendered at `size` px and
    brought to `out_size` px (a fixed-input featurizer such as LeNet needs every crop at its input size; the
    low-resolution crops still only hold `size` px of information)."""
    b = x.shape[0]
    crops = []
    for _ in range(n):
        area = torch.empty(b, device=x.device).uniform_(*scale)
        ratio = torch.exp(torch.empty(b, device=x.device).uniform_(math.log(3 / 4), math.log(4 / 3)))
        w, h = (area * ratio).sqrt().clamp(max=1.0), (area / ratio).sqrt().clamp(max=1.0)
        cx, cy = (torch.rand(b, device=x.device) * 2 - 1) * (1 - w), (torch.rand(b, device=x.device) * 2 - 1) * (1 - h)
        theta = torch.zeros(b, 2, 3, device=x.device)
        theta[:, 0, 0], theta[:, 0, 2], theta[:, 1, 1], theta[:, 1, 2] = w, cx, h, cy
        grid = F.affine_grid(theta, [b, x.shape[1], size, size], align_corners=False)
        crop = F.grid_sample(x, grid, mode="bilinear", padding_mode="reflection", align_corners=False)
        if size != out_size:
            crop = F.interpolate(crop, size=(out_size, out_size), mode="bilinear", align_corners=False)
        crops.append(crop)
    return crops


def colour_views(x: Tensor) -> Tensor:
    """SwAV's per-crop photometric views on normalised images of any channel count: flip, colour jitter with
    p 0.8 (brightness, contrast, saturation by factors U(0.2, 1.8); hue is left out), grayscale with p 0.2.
    Gaussian blur is left out: at 16 px it erases the digit."""
    b, shape = x.shape[0], (x.shape[0], 1, 1, 1)
    x = torch.where((torch.rand(b, device=x.device) < 0.5).view(shape), x.flip(-1), x)
    factor = lambda: 1 + (torch.rand(shape, device=x.device) * 2 - 1) * 0.8
    spread = x.std((1, 2, 3), keepdim=True)
    jittered = x + (factor() - 1) * spread  # brightness, as a shift of about one standard deviation
    mean = jittered.mean((1, 2, 3), keepdim=True)
    jittered = (jittered - mean) * factor() + mean  # contrast
    gray = jittered.mean(1, keepdim=True)
    jittered = (jittered - gray) * factor() + gray  # saturation
    x = torch.where((torch.rand(b, device=x.device) < 0.8).view(shape), jittered, x)
    return torch.where((torch.rand(b, device=x.device) < 0.2).view(shape), x.mean(1, keepdim=True).expand_as(x), x)


def prototypes_in_use(high: list[Tensor]) -> Tensor:
    """How many prototypes are some crop's nearest prototype: collapse shows as a handful. Counted by marking
    each nearest prototype in a fixed-size table, as `unique` would make the host wait for its output size."""
    nearest = torch.cat([h.argmax(-1) for h in high])
    return torch.zeros(high[0].shape[-1], device=nearest.device).index_fill_(0, nearest, 1.0).sum()


@register("swav")
class SwAV(PretrainThenTransfer, Algorithm):
    """SwAV (Caron et al., 2020) as WILDS 2.0 used it (App. B.4): continued pre-training, then ERM fine-tuning.

    Pretext phase (a stage, one pass over the unlabeled split per epoch, no labels): per crop v,
    z_v = normalize(proj(f(x_v))); prototypes C (K unit vectors); codes q_a = Sinkhorn(exp(z_a^T C / eps))
    with equal prototype use, no gradient, for the assignment crops a; the loss swaps them:
        L = 1/|A| sum_a 1/(V-1) sum_{v != a} -sum_k q_a,k log softmax(z_v^T C / tau)_k      (lightly.SwaVLoss)
    Fine-tuning phase (the trial): only the pre-trained featurizer f is kept, the head starts fresh, and
        loss = E_(x,y)~labeled [ CE(h(A(x)), y) ]   (ERM, A = RandAugment + Cutout when `augment`).
    """

    Hparams = SwAVHparams
    supported_tasks = frozenset({TaskKind.CLASSIFICATION, TaskKind.REGRESSION})
    dataset_settings = "its multi-crop views, prototypes K and pre-training budget"

    def __init__(self, model: FeaturizerHead, hparams: SwAVHparams, context: AlgorithmContext) -> None:
        super().__init__(model, hparams, context)
        if hparams.phase == "pretext":
            from lightly.loss import SwaVLoss
            from lightly.models.modules import SwaVProjectionHead, SwaVPrototypes

            self.projection = SwaVProjectionHead(model.n_features, hparams.projection_hidden, hparams.projection_dim)
            self.prototypes = SwaVPrototypes(hparams.projection_dim, hparams.prototypes, hparams.frozen_prototype_steps)
            self.criterion = SwaVLoss(temperature=hparams.temperature, sinkhorn_iterations=3,
                                      sinkhorn_epsilon=hparams.sinkhorn_epsilon)

    @classmethod
    def inapplicable_reason(cls, hparams: Hparams, task: TaskKind, capabilities: frozenset[str]) -> str | None:
        if "strong_augmentation" not in capabilities:  # images are the datasets with image views
            return ("SwAV's multi-crop views need images (WILDS 2.0 pre-trained it on iwildcam, camelyon17, fmow "
                    "and poverty only; not on detection, graphs or text)")
        return super().inapplicable_reason(hparams, task, capabilities)

    def objective(self, labeled: Batch | None, unlabeled: Batch | None, step: int) -> StepOutput:
        if self.hparams.phase == "pretext":
            assert unlabeled is not None, "SwAV's pretext phase trains on unlabeled batches"
            return self.pretext_objective(unlabeled.x, step)
        assert labeled is not None
        loss = self.model.fit_loss(self.view(labeled.x, self.hparams.augment), labeled.y, self.supervised_loss)
        return StepOutput(loss, {"loss/supervised": loss.detach()})

    def multicrop(self, x: Tensor) -> tuple[list[Tensor], list[Tensor]]:
        """(high-resolution crops, low-resolution crops) of the plain (normalised) view, each with its own
        photometric view. The first `high_crops` are the assignment crops."""
        h = self.hparams
        images = self.context.views.plain(x)
        size = images.shape[-1]
        high = random_resized_crops(images, h.high_crops, h.high_size, (h.high_scale, 1.0), size)
        low = random_resized_crops(images, h.low_crops, h.low_size, (h.low_scale, h.high_scale), size)
        return [colour_views(c) for c in high], [colour_views(c) for c in low]

    def scores(self, crop: Tensor, step: int) -> Tensor:
        """z^T C for one crop: normalised projection against the (unit-norm) prototypes."""
        z = F.normalize(self.projection(self.model.featurizer(crop)), dim=1)
        return self.prototypes(z, step)

    def pretext_objective(self, x: Tensor, step: int) -> StepOutput:
        with torch.no_grad():
            self.prototypes.normalize()  # C stays on the unit sphere (SwAV normalises before every step)
        high, low = self.multicrop(x)
        high_scores = [self.scores(c, step) for c in high]
        low_scores = [self.scores(c, step) for c in low]
        loss = self.criterion(high_scores, low_scores).reshape(())
        return StepOutput(loss, {"loss/swav": loss.detach(), "swav/prototypes_in_use": prototypes_in_use(high_scores),
                                 "swav/ln_K": torch.tensor(math.log(self.hparams.prototypes))})

    def begin_round(self, context: RoundContext) -> dict[str, str]:
        if self.hparams.phase == "pretext":
            return {}
        stage = pretrain_stage(context, self.hparams, self.name, self.stage_overrides())
        transfer_featurizer(stage.model, self.model)
        return {"pretrained_featurizer": stage.key, "pretrain_cached": str(stage.cached)}

    def stage_overrides(self) -> dict[str, Any]:
        h = self.hparams
        return {
            "optimizer": "lars", "lr": h.pretrain_lr, "weight_decay": 1e-6, "momentum": 0.9, "scheduler": "cosine",
            "augment": False, **{k: getattr(h, k) for k in (
                "prototypes", "high_crops", "high_size", "low_crops", "low_size", "high_scale", "low_scale",
                "temperature", "sinkhorn_epsilon", "frozen_prototype_steps", "projection_hidden", "projection_dim")},
        }

