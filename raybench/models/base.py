"""A model is a featurizer f and a head g, h = g∘f (WILDS 2.0 App. B).

Keeping the two apart is what lets CORAL and DANN act on features, Noisy Student insert dropout
before the head, and DFR-style methods retrain only the head.
"""
from __future__ import annotations

from pathlib import Path
from typing import Callable, Optional

import torch
from torch import Tensor, nn


class FeaturizerHead(nn.Module):
    """`featurizer` maps inputs to `n_features`-dim vectors; `head` maps those to outputs."""

    def __init__(self, featurizer: nn.Module, n_features: int, n_outputs: int, head: Optional[nn.Module] = None) -> None:
        super().__init__()
        self.featurizer = featurizer
        self.n_features = n_features
        self.head = head if head is not None else nn.Linear(n_features, n_outputs)

    def forward(self, x: Tensor) -> Tensor:
        return self.head(self.featurizer(x))

    def fit_loss(self, x: object, y: object, criterion: Callable[[Tensor, Tensor], Tensor]) -> Tensor:
        """The training loss on inputs `x` with targets `y`.

        Most models are scored from their outputs by the task's criterion; a detector overrides this with
        its own losses (Faster R-CNN's RPN and box losses need the targets inside the forward pass).
        """
        return criterion(self(x), y)  # type: ignore[arg-type]


def load_local_weights(module: nn.Module, path: Optional[Path], resizable: tuple[str, ...] = (),
                       expected: str = "") -> None:
    """Load a state dict saved with torch.save from a local file; raybench never downloads weights.

    Keys of a classifier head that the featurizer no longer has (e.g. torchvision's `fc.*`) are ignored,
    so an ImageNet checkpoint loads into the headless featurizer. Keys under a `resizable` prefix whose
    shape differs (a COCO detector's 91-class box predictor) keep their fresh initialisation; any other
    missing key or shape mismatch is an error, `expected` saying what the file should have been.
    """
    if path is None:
        return
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"model weights {str(path)!r} do not exist")
    state = torch.load(path, map_location="cpu", weights_only=True)
    own = module.state_dict()
    hint = f" ({expected})" if expected else ""
    missing = [k for k in own if k not in state]
    if missing:
        raise ValueError(f"weights {str(path)!r} lack {len(missing)} keys of the model, e.g. {missing[:3]}{hint}")
    resized = [k for k in own if state[k].shape != own[k].shape]
    wrong = [k for k in resized if not k.startswith(resizable)]
    if wrong:
        raise ValueError(f"weights {str(path)!r} have other shapes than the model for {wrong[:3]}{hint}")
    module.load_state_dict({k: state[k] for k in own if k not in resized}, strict=not resized)
