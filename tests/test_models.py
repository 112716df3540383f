"""Every registered model builds on CPU, splits into featurizer + head, and loads local weights only."""
from __future__ import annotations

import pytest
import torch

from raybench.models import MODELS, FeaturizerHead, ModelSpec, build_model

# The image classifiers; the text, graph and detection models have their own tests (test_wilds_models.py).
INPUTS = {"lenet": (3, 16, 16), "lenet5": (3, 28, 28), "resnet18": (3, 32, 32), "resnet50": (3, 32, 32),
          "densenet121": (3, 32, 32), "dabs_transformer": (3, 32, 32), "dabs_transformer_small": (3, 16, 16),
          "dabs_transformer_small_cls": (3, 16, 16)}
NON_IMAGE = {"distilbert", "gin_virtual", "fasterrcnn"}


def test_every_registered_model_is_tested():
    assert set(MODELS.names()) == set(INPUTS) | NON_IMAGE


@pytest.mark.parametrize("name", sorted(INPUTS))
def test_model_is_featurizer_plus_head(name):
    shape = INPUTS[name]
    model = build_model(name, ModelSpec(shape, 5))
    assert isinstance(model, FeaturizerHead)
    model.eval()
    x = torch.randn(2, *shape)
    with torch.no_grad():
        features = model.featurizer(x)
        assert features.shape == (2, model.n_features)
        torch.testing.assert_close(model(x), model.head(features))


def test_local_weights_are_loaded_and_classifier_keys_ignored(tmp_path):
    source = build_model("resnet18", ModelSpec((3, 32, 32), 3))
    state = {**source.featurizer.state_dict(), "fc.weight": torch.zeros(1000, 512), "fc.bias": torch.zeros(1000)}
    path = tmp_path / "resnet18.pt"
    torch.save(state, path)
    loaded = build_model("resnet18", ModelSpec((3, 32, 32), 3, weights=path))
    for key, value in source.featurizer.state_dict().items():
        torch.testing.assert_close(loaded.featurizer.state_dict()[key], value)


def test_missing_weights_file_is_named(tmp_path):
    with pytest.raises(FileNotFoundError, match="nothing.pt"):
        build_model("resnet18", ModelSpec((3, 32, 32), 3, weights=tmp_path / "nothing.pt"))


def test_multispectral_input_channels():
    model = build_model("resnet18", ModelSpec((8, 32, 32), 1))
    assert model(torch.randn(2, 8, 32, 32)).shape == (2, 1)
