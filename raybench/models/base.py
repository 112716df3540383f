"""A model is a featurizer f and a head g, h = g∘f (WILDS 2.0 App. B).

Keeping the two apart is what lets CORAL and DANN act on features, Noisy Student insert dropout
before the head, and DFR-style methods retrain only the head.
"""
from __future__ import annotations

import pickle
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn


class FeaturizerHead(nn.Module):
    """`featurizer` maps inputs to `n_features`-dim vectors; `head` maps those to outputs."""

    def __init__(self, featurizer: nn.Module, n_features: int, n_outputs: int, head: nn.Module | None = None) -> None:
        super().__init__()
        self.featurizer = featurizer
        self.n_features = n_features
        self.head = head if head is not None else nn.Linear(n_features, n_outputs)

    def forward(self, x: Tensor) -> Tensor:
        return self.head(self.featurizer(x))

    def compile_parts(self) -> list[nn.Module]:
        """What the `compile` setting hands to torch.compile: the featurizer's own choice where it makes one (a text
        featurizer names its encoder, leaving out the tokenizer, which works on Python strings), else the whole
        featurizer; and the head."""
        own = getattr(self.featurizer, "compile_parts", None)
        return [*(own() if callable(own) else [self.featurizer]), self.head]

    def fit_loss(self, x: object, y: object, criterion: Callable[[Tensor, Tensor], Tensor]) -> Tensor:
        """The training loss on inputs `x` with targets `y`.

        Most models are scored from their outputs by the task's criterion; a detector overrides this with
        its own losses (Faster R-CNN's RPN and box losses need the targets inside the forward pass).
        """
        return criterion(self(x), y)  # type: ignore[arg-type]


class UnreadableWeightsError(ValueError):
    """A weights or checkpoint file that exists but cannot be read safely; the message names the file and why."""


def read_weights_only(path: Path, what: str) -> Any:
    """`torch.load(path, weights_only=True)`, with one line naming the file when that fails.

    Why weights_only: unpickling arbitrary objects runs whatever code the file names, and checkpoints,
    teachers and pretrained weights all come from outside this process. A missing file is a
    FileNotFoundError; a truncated file, another format, or one holding pickled objects beyond tensors
    and plain data is an `UnreadableWeightsError` (a ValueError).
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{what} {str(path)!r} does not exist (or is not a file)")
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # noqa: BLE001  torch reports a truncated or foreign file as RuntimeError, KeyError, EOFError...
        reason = _weights_only_reason(err)
        if isinstance(err, pickle.UnpicklingError) and "global" in reason.lower():  # names objects to build: code
            raise UnreadableWeightsError(f"{what} {str(path)!r} was refused: it holds pickled Python objects, not "
                                         f"only tensors and plain data ({reason}); raybench loads files with "
                                         f"weights_only=True only") from None
        raise UnreadableWeightsError(f"{what} {str(path)!r} is not a readable torch file (truncated, or another "
                                     f"format): {type(err).__name__}{': ' + reason if reason else ''}") from None


def _weights_only_reason(err: Exception) -> str:
    """The one informative line of torch's (multi-paragraph) load error."""
    lines = [line.strip() for line in str(err).splitlines() if line.strip()]
    if isinstance(err, pickle.UnpicklingError) and lines and lines[0].lower().startswith("weights only load failed"):
        lines = [line for line in lines[1:] if "unsupported" in line.lower() or "global" in line.lower()] or lines
    return lines[0].split(". ")[0].rstrip(".") if lines else ""


# A raybench model checkpoint (`best_model.pt`) is {CHECKPOINT_FORMAT: version, "record": ..., "weights": state dict};
# raybench.checkpoints writes and describes it. Its weights read wherever a bare state dict reads.
CHECKPOINT_FORMAT = "raybench_model"
CHECKPOINT_WEIGHTS = "weights"


def is_model_checkpoint(loaded: Any) -> bool:
    """Whether a loaded file is a raybench model checkpoint (weights with their record), not a bare state dict:
    a state dict's values are tensors, so the format key's whole-number version cannot be one of its entries."""
    return isinstance(loaded, Mapping) and isinstance(loaded.get(CHECKPOINT_FORMAT), int)


def read_state_dict(path: Path, what: str) -> dict[str, Tensor]:
    """A file saved with `torch.save(module.state_dict())`, or the weights of a raybench model checkpoint: a
    mapping of names to tensors, read safely. Both read alike, so every reader of weights (pretrained
    `model_weights`, `features_from`, `teacher_checkpoint`) takes files from before and after checkpoints
    carried their record."""
    return as_state_dict(read_weights_only(path, what), path, what)


def as_state_dict(loaded: Any, path: Path, what: str) -> dict[str, Tensor]:
    """The state dict a loaded file holds (itself, or a raybench model checkpoint's weights); anything else is an
    UnreadableWeightsError naming `path`."""
    state = loaded.get(CHECKPOINT_WEIGHTS) if is_model_checkpoint(loaded) else loaded
    if not isinstance(state, Mapping) or not all(isinstance(k, str) and isinstance(v, Tensor) for k, v in state.items()):
        raise UnreadableWeightsError(f"{what} {str(path)!r} is not a state dict (a mapping of names to tensors), "
                                     f"it holds a {type(state).__name__}")
    return dict(state)


def load_local_weights(module: nn.Module, path: Path | None, resizable: tuple[str, ...] = (),
                       expected: str = "") -> None:
    """Load a state dict saved with torch.save from a local file; raybench never downloads weights.

    Keys of a classifier head that the featurizer no longer has (e.g. torchvision's `fc.*`) are ignored,
    so an ImageNet checkpoint loads into the headless featurizer. Keys under a `resizable` prefix whose
    shape differs (a COCO detector's 91-class box predictor) keep their fresh initialisation; any other
    missing key or shape mismatch is an error, `expected` saying what the file should have been. A
    missing file is a FileNotFoundError, any other unusable file a ValueError, both naming the path.
    """
    if path is None:
        return
    path = Path(path)
    hint = f" ({expected})" if expected else ""
    state = read_state_dict(path, "model weights")
    own = module.state_dict()
    missing = [k for k in own if k not in state]
    if missing:
        raise ValueError(f"weights {str(path)!r} lack {len(missing)} keys of the model, e.g. {missing[:3]}{hint}")
    resized = [k for k in own if state[k].shape != own[k].shape]
    wrong = [k for k in resized if not k.startswith(resizable)]
    if wrong:
        raise ValueError(f"weights {str(path)!r} have other shapes than the model for {wrong[:3]}{hint}")
    module.load_state_dict({k: state[k] for k in own if k not in resized}, strict=not resized)
