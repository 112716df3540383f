"""What the frozen-feature transfer evaluations (NeWT's probe, DABS's linear evaluation) share.

Both judge a featurizer by what a linear model can read off its features, so the featurizer must not
move: its parameters take no gradient, and it stays in eval mode even while the trainer trains the rest
(batch-norm statistics and dropout are the frozen network's, as when features are extracted once).

Where the featurizer comes from is the hyperparameter `features_from`:
- "random": the model as the trainer builds it, i.e. its seeded random initialisation (DABS's "None"
  baseline), or the pretrained weights the run's `model_weights` names;
- a local raybench model checkpoint: a `best_model.pt` a trial wrote, a stage-cache `model.pt`, or a
  folder holding one. Only its featurizer weights are read, so a model trained for other classes (a
  different head) still lends its features; the file is read with weights_only=True.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

import torch
from torch import Tensor

from raybench.algorithms.base import Algorithm, AlgorithmContext, Hparams, RoundContext
from raybench.models.base import FeaturizerHead, read_state_dict

RANDOM = "random"
FEATURIZER_PREFIX = "featurizer."


@dataclass
class FrozenHparams(Hparams):
    features_from: str = RANDOM  # "random" (the model's own seeded initialisation) or a local checkpoint file/folder

    def __post_init__(self) -> None:
        if not self.features_from.strip():
            raise ValueError(f"features_from: expected {RANDOM!r} or a checkpoint path, got {self.features_from!r}")


def checkpoint_file(path: Path) -> Path:
    """The file a checkpoint setting names: the file itself, or in a folder its `best_model.pt` (a trial's
    checkpoint) or, when it has none, its `model.pt` (a stage-cache entry, e.g. a SwAV pre-training)."""
    # raybench.trainer imports the algorithms, so its checkpoint helpers are imported when used, not at load.
    from raybench.trainer.checkpoints import model_file
    from raybench.trainer.stages import MODEL_FILE

    path = Path(path)
    if path.is_dir() and not model_file(path).is_file() and (path / MODEL_FILE).is_file():
        return path / MODEL_FILE
    return model_file(path)


def featurizer_part(state: Mapping[str, Tensor]) -> dict[str, Tensor]:
    """The featurizer's weights of a saved `FeaturizerHead`, named as the featurizer module names them."""
    return {k[len(FEATURIZER_PREFIX):]: v for k, v in state.items() if k.startswith(FEATURIZER_PREFIX)}


def load_featurizer(model: FeaturizerHead, path: Path) -> Path:
    """Load only the featurizer weights of a raybench model checkpoint into `model`; returns the file read.

    A missing file is a FileNotFoundError, an unreadable, unsafe or foreign one an UnreadableWeightsError
    (a ValueError); each message is one line naming the file.
    """
    from raybench.trainer.checkpoints import check_fits

    file = checkpoint_file(path)
    state = featurizer_part(read_state_dict(file, "model checkpoint"))
    check_fits(model.featurizer.state_dict(), state, str(file))
    model.featurizer.load_state_dict(state)
    return file


def featurizer_source(model: FeaturizerHead, features_from: str, seed: int) -> str:
    """Put the featurizer `features_from` names into `model`; returns where it came from, in words.

    An unusable checkpoint is a ConfigError on `features_from`, which the command line prints as one line.
    """
    if features_from == RANDOM:
        return f"the model's own initialisation (seed {seed})"
    try:
        return f"checkpoint {load_featurizer(model, Path(features_from))}"
    except (ValueError, OSError) as err:
        from raybench.trainer.config import ConfigError

        raise ConfigError("features_from", str(err)) from None


class FrozenFeaturizer(Algorithm):
    """Base of the transfer evaluations: a frozen featurizer (see the module docstring) and a head on top."""

    Hparams = FrozenHparams

    def __init__(self, model: FeaturizerHead, hparams: FrozenHparams, context: AlgorithmContext) -> None:
        super().__init__(model, hparams, context)
        model.featurizer.requires_grad_(False)
        model.featurizer.eval()

    def train(self, mode: bool = True) -> "FrozenFeaturizer":
        super().train(mode)
        self.model.featurizer.eval()  # the trainer's train() must not switch on batch-norm updates or dropout
        return self

    def param_groups(self, lr: float) -> list[dict[str, Any]]:
        """Only the head's trainable parameters reach the optimiser."""
        return [{"params": [p for p in self.model.head.parameters() if p.requires_grad], "lr": lr}]

    def take_featurizer(self, context: RoundContext) -> dict[str, str]:
        """Install the featurizer `features_from` names; the fact saying where it came from."""
        return {"features_from": featurizer_source(self.model, self.hparams.features_from, context.seed)}

    @torch.no_grad()
    def features(self, x: Any) -> Tensor:
        """Frozen features of the plain (unaugmented) view: NeWT and DABS evaluate without augmentation."""
        return self.model.featurizer(self.view(x, False))
