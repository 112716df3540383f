"""torchvision's ResNet and DenseNet as featurizers, their classifier replaced by our own head.

Weights are never downloaded: pass `weights=PATH` to a state dict saved with `torch.save`
(e.g. ImageNet weights fetched once on a machine with internet).
"""
from __future__ import annotations

from typing import Callable

from torch import nn
from torchvision import models as tvm

from raybench.models.base import FeaturizerHead, load_local_weights
from raybench.models.registry import MODELS, ModelSpec


def _with_input_channels(conv: nn.Conv2d, channels: int) -> nn.Conv2d:
    """A first convolution for `channels` inputs (e.g. 8-band satellite images); weights are loaded after."""
    if channels == conv.in_channels:
        return conv
    return nn.Conv2d(channels, conv.out_channels, conv.kernel_size, conv.stride, conv.padding, bias=conv.bias is not None)


def _resnet(factory: Callable[..., tvm.ResNet]) -> Callable[[ModelSpec], FeaturizerHead]:
    def build(spec: ModelSpec) -> FeaturizerHead:
        net = factory(weights=None)
        n_features = net.fc.in_features
        net.fc = nn.Identity()
        net.conv1 = _with_input_channels(net.conv1, spec.input_shape[0])
        load_local_weights(net, spec.weights)
        return FeaturizerHead(net, n_features, spec.n_outputs)

    return build


def _densenet(factory: Callable[..., tvm.DenseNet]) -> Callable[[ModelSpec], FeaturizerHead]:
    def build(spec: ModelSpec) -> FeaturizerHead:
        net = factory(weights=None)
        n_features = net.classifier.in_features
        net.classifier = nn.Identity()
        net.features.conv0 = _with_input_channels(net.features.conv0, spec.input_shape[0])
        load_local_weights(net, spec.weights)
        return FeaturizerHead(net, n_features, spec.n_outputs)

    return build


MODELS.register("resnet18")(_resnet(tvm.resnet18))
MODELS.register("resnet50")(_resnet(tvm.resnet50))
MODELS.register("densenet121")(_densenet(tvm.densenet121))
