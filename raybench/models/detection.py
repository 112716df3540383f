"""Faster R-CNN (ResNet-50-FPN) for globalwheat, set up as WILDS' `fasterrcnn` (examples/models/detection).

As in WILDS: torchvision's Faster R-CNN with a ResNet-50-FPN backbone, `n_outputs` object classes plus
background (1 + 1 for wheat heads), images resized to 1024 px (min_size = max_size = 1024, here taken from
`spec.input_shape`), no normalization inside the model (image_mean 0, image_std 1: the data pipeline
normalizes, as WILDS' transform does), at most 100 detections per image, score threshold 0.05, NMS 0.5,
RPN and box-sampling settings torchvision's defaults (which FastWILDS repeats). The backbone's batch norms
are frozen (FrozenBatchNorm2d, eps 0: WILDS ran torchvision 0.8, whose frozen norm had eps 0 and whose
COCO checkpoint expects it); with weights the stem and layer1 stay frozen (3 trainable stages), without
all 5 train, WILDS' rule.

`spec.weights` (optional) is a local state dict of torchvision's COCO Faster R-CNN
(fasterrcnn_resnet50_fpn_coco-258fb6c6.pth) or of this model: every key must be present, and only the
box predictor's class-count-dependent keys may differ in shape; those keep their fresh initialization
(WILDS replaces the COCO predictor by a new one with n_outputs + 1 classes the same way).

Losses: torchvision's batch losses (RPN objectness + box, RoI classifier + box), summed. WILDS computes the
same four terms per image and averages over the batch; the per-image split matters only for group-aware
losses, which raybench does not run on detection.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import torch
from torch import Tensor, nn

if TYPE_CHECKING:  # torchvision is imported when a detector is built: it costs seconds in every Ray worker
    from torchvision.models.detection import FasterRCNN
    from torchvision.ops.misc import FrozenBatchNorm2d

from raybench.models.base import FeaturizerHead, load_local_weights
from raybench.models.registry import MODELS, ModelSpec

DETECTIONS_PER_IMAGE = 100
PREDICTOR_PREFIX = "roi_heads.box_predictor."


def _frozen_norm(num_features: int) -> FrozenBatchNorm2d:
    from torchvision.ops.misc import FrozenBatchNorm2d

    return FrozenBatchNorm2d(num_features, eps=0.0)


def faster_rcnn(n_classes: int, min_size: int, max_size: int, trainable_layers: int) -> FasterRCNN:
    """The network torchvision's `fasterrcnn_resnet50_fpn` assembles (same modules, same state-dict keys)."""
    from torchvision.models.detection import FasterRCNN
    from torchvision.models.detection.backbone_utils import resnet_fpn_backbone

    backbone = resnet_fpn_backbone(backbone_name="resnet50", weights=None, norm_layer=_frozen_norm,
                                   trainable_layers=trainable_layers)
    return FasterRCNN(backbone, num_classes=n_classes + 1, min_size=min_size, max_size=max_size,
                      image_mean=[0.0, 0.0, 0.0], image_std=[1.0, 1.0, 1.0],
                      box_detections_per_img=DETECTIONS_PER_IMAGE)


class Detector(FeaturizerHead):
    """A torchvision detector as a raybench model: `forward` predicts, `fit_loss` trains.

    A detector has no per-image feature vector, so `featurizer` and `head` are the two ends of the
    network rather than a split with `head(featurizer(x)) == model(x)`:

    - `featurizer` is the ResNet-50-FPN backbone (images -> multi-scale maps of `n_features` = 256
      channels). CORAL and DANN need feature vectors and are not run on detection.
    - `head` is the RoI box predictor (a classifier and a box regressor on each proposal's 1024-d
      representation). Assigning `model.head = m` installs `m` as the box predictor, so Noisy Student's
      `nn.Sequential(nn.Dropout(p), model.head)` puts dropout on the RoI features before the classifier.

    The state dict is torchvision's, under `rcnn.`.
    """

    def __init__(self, rcnn: FasterRCNN) -> None:
        nn.Module.__init__(self)  # featurizer and head are views into `rcnn`, not modules of their own
        self.rcnn = rcnn
        self.n_features = int(rcnn.backbone.out_channels)

    @property
    def featurizer(self) -> nn.Module:  # type: ignore[override]
        return self.rcnn.backbone

    @property
    def head(self) -> nn.Module:  # type: ignore[override]
        return self.rcnn.roi_heads.box_predictor

    def __setattr__(self, name: str, value: object) -> None:
        if name == "head":
            self.rcnn.roi_heads.box_predictor = value
        elif name == "featurizer":
            raise AttributeError("a Detector's featurizer is its backbone, rcnn.backbone; replace that instead")
        else:
            super().__setattr__(name, value)

    def forward(self, images: Sequence[Tensor]) -> list[dict[str, Tensor]]:  # type: ignore[override]
        """Detections per image: boxes (xyxy, input pixels), labels (1..n_outputs) and scores."""
        if self.training:
            raise RuntimeError("Detector(images) predicts and needs eval mode (model.eval()); train with fit_loss")
        return self.rcnn(list(images))

    def fit_loss(self, images: Sequence[Tensor], targets: Sequence[dict[str, Tensor]],  # type: ignore[override]
                 criterion: Callable[..., Tensor] | None = None) -> Tensor:
        """The sum of torchvision's four training losses; `criterion` is unused (the losses are the model's).

        Targets: one dict per image with `boxes` float [N, 4] (xyxy pixels) and `labels` int64 [N] in
        1..n_outputs; N = 0 is fine (every proposal is then background).
        """
        if not self.training:
            raise RuntimeError("Detector.fit_loss needs train mode (model.train()): torchvision only returns losses then")
        images = list(images)
        device = images[0].device if images else None
        targets = [{"boxes": t["boxes"].to(device, torch.float32).reshape(-1, 4),
                    "labels": t["labels"].to(device, torch.int64).reshape(-1)} for t in targets]
        losses = self.rcnn(images, targets)
        return sum(losses.values())  # type: ignore[return-value]


@MODELS.register("fasterrcnn")
def build_fasterrcnn(spec: ModelSpec) -> Detector:
    """`spec.input_shape` (3, H, W) sets the resize (min_size = min(H, W), max_size = max(H, W);
    globalwheat: 1024); `spec.n_outputs` counts object classes without background (globalwheat: 1)."""
    if len(spec.input_shape) != 3 or spec.input_shape[0] != 3:
        raise ValueError(f"fasterrcnn needs input_shape=(3, H, W), got {spec.input_shape}")
    height, width = spec.input_shape[1:]
    rcnn = faster_rcnn(spec.n_outputs, min_size=min(height, width), max_size=max(height, width),
                       trainable_layers=3 if spec.weights is not None else 5)
    if spec.weights is not None:
        load_local_weights(rcnn, spec.weights, resizable=(PREDICTOR_PREFIX,),
                           expected="a state dict of torchvision's fasterrcnn_resnet50_fpn")
    return Detector(rcnn)
