"""`model_weights` is never silently ignored: every builder reads it, safely, or fails naming the file."""
from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from raybench.models import MODELS, ModelSpec, build_model
from raybench.models.base import UnreadableWeightsError
from raybench.trainer import ConfigError, TrainConfig

# An input shape each builder accepts; a builder missing here is built at the image shape.
INPUT_SHAPES = {"lenet": (3, 16, 16), "lenet5": (3, 16, 16), "gin_virtual": (9,), "distilbert": (32,),
                "fasterrcnn": (3, 64, 64)}


@pytest.mark.parametrize("name", MODELS.names())
def test_every_model_refuses_a_missing_weights_file(name, tmp_path):
    missing = tmp_path / f"{name}_weights.pt"
    with pytest.raises((OSError, ValueError), match=missing.name):
        build_model(name, ModelSpec(INPUT_SHAPES.get(name, (3, 32, 32)), 3, weights=missing))


@pytest.mark.parametrize("name", ["lenet", "lenet5"])
def test_lenet_featurizer_weights_are_loaded(name, tmp_path):
    source = build_model(name, ModelSpec((3, 16, 16), 4))
    path = tmp_path / "featurizer.pt"
    torch.save(source.featurizer.state_dict(), path)
    loaded = build_model(name, ModelSpec((3, 16, 16), 4, weights=path))
    for key, value in source.featurizer.state_dict().items():
        torch.testing.assert_close(loaded.featurizer.state_dict()[key], value, rtol=0, atol=0)


class Payload:
    def __init__(self, marker: Path) -> None:
        self.marker = str(marker)

    def __reduce__(self):
        return os.mkdir, (self.marker,)


def test_unreadable_or_unsafe_weights_are_one_line_naming_the_file(tmp_path):
    text = tmp_path / "notes.txt"
    text.write_text("weights? no\n")
    with pytest.raises(UnreadableWeightsError, match="notes.txt' is not a readable torch file") as caught:
        build_model("lenet", ModelSpec((3, 16, 16), 4, weights=text))
    assert "\n" not in str(caught.value)
    evil = tmp_path / "evil.pt"
    torch.save({"0.0.weight": Payload(tmp_path / "ran")}, evil)
    with pytest.raises(UnreadableWeightsError, match="evil.pt' was refused"):
        build_model("lenet", ModelSpec((3, 16, 16), 4, weights=evil))
    assert not (tmp_path / "ran").exists()


def test_the_config_check_turns_bad_weights_into_a_config_error(tiny_dataset, tmp_path):
    text = tmp_path / "notes.txt"
    text.write_text("weights? no\n")
    for weights in (tmp_path / "absent.pt", text):
        config = TrainConfig.from_flat({"model": "lenet", "model_weights": str(weights)})
        with pytest.raises(ConfigError, match=weights.name) as caught:
            config.check_model_builds(tiny_dataset)
        assert caught.value.key == "model_weights"
