"""torchvision's ResNet and DenseNet as featurizers, their classifier replaced by our own head.

torchvision is imported when one of them is built, not when the registry loads: it costs seconds in every
Ray worker, and most runs use another model.
Weights are never downloaded: pass `weights=PATH` to a state dict saved with `torch.save`
(e.g. ImageNet weights fetched once on a machine with internet).
"""
from __future__ import annotations

from collections.abc import Callable

from torch import nn

from raybench.models.base import FeaturizerHead, load_local_weights
from raybench.models.registry import MODELS, ModelSpec


def _with_input_channels(conv: nn.Conv2d, channels: int) -> nn.Conv2d:
    """A first convolution for `channels` inputs (e.g. 8-band satellite images); weights are loaded after."""
    if channels == conv.in_channels:
        return conv
    return nn.Conv2d(channels, conv.out_channels, conv.kernel_size, conv.stride, conv.padding, bias=conv.bias is not None)


def _factory(name: str) -> Callable[..., nn.Module]:
    from torchvision import models as tvm

    return getattr(tvm, name)


def _resnet(name: str) -> Callable[[ModelSpec], FeaturizerHead]:
    def build(spec: ModelSpec) -> FeaturizerHead:
        net = _factory(name)(weights=None)
        n_features = net.fc.in_features
        net.fc = nn.Identity()
        net.conv1 = _with_input_channels(net.conv1, spec.input_shape[0])
        load_local_weights(net, spec.weights)
        return FeaturizerHead(net, n_features, spec.n_outputs)

    return build


def _densenet(name: str) -> Callable[[ModelSpec], FeaturizerHead]:
    def build(spec: ModelSpec) -> FeaturizerHead:
        net = _factory(name)(weights=None)
        n_features = net.classifier.in_features
        net.classifier = nn.Identity()
        net.features.conv0 = _with_input_channels(net.features.conv0, spec.input_shape[0])
        load_local_weights(net, spec.weights)
        return FeaturizerHead(net, n_features, spec.n_outputs)

    return build


# Registered by decorators with their names written out, so the registry reads them from this file without
# importing it (raybench/registry.py); no docstrings, so `raybench list models` describes none of them.
@MODELS.register("resnet18")
def resnet18(spec: ModelSpec) -> FeaturizerHead:
    return _resnet("resnet18")(spec)


@MODELS.register("resnet50")
def resnet50(spec: ModelSpec) -> FeaturizerHead:
    return _resnet("resnet50")(spec)


@MODELS.register("densenet121")
def densenet121(spec: ModelSpec) -> FeaturizerHead:
    return _densenet("densenet121")(spec)
