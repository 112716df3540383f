"""A LeNet-style CNN sized for the embedded 16x16 / 28x28 RGB datasets; trains in seconds on a CPU."""
from __future__ import annotations

from torch import nn

from raybench.models.base import FeaturizerHead, load_local_weights
from raybench.models.registry import MODELS, ModelSpec


def conv_block(c_in: int, c_out: int) -> nn.Sequential:
    return nn.Sequential(nn.Conv2d(c_in, c_out, 3, padding=1), nn.BatchNorm2d(c_out), nn.ReLU(inplace=True), nn.MaxPool2d(2))


@MODELS.register("lenet")
def build_lenet(spec: ModelSpec) -> FeaturizerHead:
    channels, height, width = spec.input_shape
    featurizer = nn.Sequential(
        conv_block(channels, 32),
        conv_block(32, 64),
        nn.Flatten(),
        nn.Linear(64 * (height // 4) * (width // 4), 128),
        nn.ReLU(inplace=True),
    )
    load_local_weights(featurizer, spec.weights)  # a featurizer state dict, as for every other model
    return FeaturizerHead(featurizer, n_features=128, n_outputs=spec.n_outputs)
