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

import hashlib
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from raybench.algorithms.base import Algorithm, AlgorithmContext, Hparams, RoundContext
from raybench.checkpoints import STAGE_MODEL_FILE, check_fits, model_file
from raybench.errors import ConfigError
from raybench.models.base import FeaturizerHead, read_state_dict
from raybench.settings import Allowed, setting

RANDOM = "random"
FEATURIZER_PREFIX = "featurizer."
FEATURE_MEMO_BYTES = 1 << 30  # features kept per run; past this, new inputs are encoded but not kept


@dataclass
class FrozenHparams(Hparams):
    features_from: str = setting(RANDOM, allowed=Allowed(pattern=r"(?s).*\S.*", words=f"{RANDOM!r} or a checkpoint "
                                                                                       "path"),
                                 help="random (the model's own seeded initialisation) or a local checkpoint file "
                                      "or folder")


def checkpoint_file(path: Path) -> Path:
    """The file a checkpoint setting names: the file itself, or in a folder its `best_model.pt` (a trial's
    checkpoint) or, when it has none, its `model.pt` (a stage-cache entry, e.g. a SwAV pre-training)."""
    path = Path(path)
    if path.is_dir() and not model_file(path).is_file() and (path / STAGE_MODEL_FILE).is_file():
        return path / STAGE_MODEL_FILE
    return model_file(path)


def featurizer_part(state: Mapping[str, Tensor]) -> dict[str, Tensor]:
    """The featurizer's weights of a saved `FeaturizerHead`, named as the featurizer module names them."""
    return {k[len(FEATURIZER_PREFIX):]: v for k, v in state.items() if k.startswith(FEATURIZER_PREFIX)}


def load_featurizer(model: FeaturizerHead, path: Path) -> Path:
    """Load only the featurizer weights of a raybench model checkpoint into `model`; returns the file read.

    A missing file is a FileNotFoundError, an unreadable, unsafe or foreign one an UnreadableWeightsError
    (a ValueError); each message is one line naming the file.
    """
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
        raise ConfigError("features_from", str(err)) from None


def content_keys(x: Any) -> list[Hashable] | None:
    """One key per input row that only its content determines: a tensor row's bytes hashed by BLAKE2b (128
    bits), a text itself. None for inputs of other kinds (graphs, lists of images), which are not memoised."""
    if isinstance(x, Tensor):
        rows = x.detach().cpu().contiguous()
        if rows.dim() == 0 or rows.dtype in (torch.bfloat16,):
            return None
        return [hashlib.blake2b(row.numpy().tobytes(), digest_size=16).digest() for row in rows]
    if isinstance(x, Sequence) and not isinstance(x, str) and all(isinstance(item, str) for item in x):
        return list(x)
    return None


def train_keys(ids: Tensor) -> list[Hashable]:
    """One key per row of a train-split batch, from its example ids: a host tensor (`Batch.to` leaves `index` on
    the host), so reading it does not wait for the device."""
    return [("train", i) for i in ids.tolist()]


def take_rows(x: Any, rows: list[int]) -> Any:
    return x[torch.tensor(rows, dtype=torch.long, device=x.device)] if isinstance(x, Tensor) else [x[i] for i in rows]


class FeatureMemo:
    """The features of every input a frozen featurizer has encoded in this run, by the input's content.

    Linear evaluation trains only a head, for many epochs (DABS: 100), and re-encoding the train split and the
    evaluation splits every epoch would be nearly all of its cost. Remembering the features is exact, not an
    approximation: the featurizer takes no gradient and stays in eval mode, and the plain view has no
    randomness, so an input's features cannot change until the featurizer is replaced, which `clear`s the memo.
    A training batch's rows are keyed by their train-split example ids (`Batch.index`, which stays on the host),
    so a training step never reads its device tensors back; evaluation passes inputs without ids, keyed by
    content (see `content_keys`), once per epoch. The two key kinds never collide, so neither can be mistaken.
    """

    def __init__(self, max_bytes: int = FEATURE_MEMO_BYTES) -> None:
        self.max_bytes = max_bytes
        self.kept_bytes = 0
        self.features: dict[Hashable, Tensor] = {}
        self.encoded_rows = 0  # rows the featurizer actually ran on, over the run

    def clear(self) -> None:
        self.features.clear()
        self.kept_bytes = 0

    def __call__(self, x: Any, encode: Callable[[Any], Tensor], train_ids: Tensor | None = None) -> Tensor:
        """encode(x), reading the rows seen before from the memo and encoding only the others; `train_ids` are
        the rows' example ids when x is a batch of the train split."""
        keys = content_keys(x) if train_ids is None else train_keys(train_ids)
        if keys is None:
            return self.encoded(x, encode)
        first_rows: dict[Hashable, int] = {}  # an unseen key's first row: a repeated input is encoded once
        for i, key in enumerate(keys):
            if key not in self.features:
                first_rows.setdefault(key, i)
        fresh: dict[Hashable, Tensor] = {}
        if first_rows:
            missing = list(first_rows.values())
            z = self.encoded(take_rows(x, missing) if len(missing) < len(keys) else x, encode)
            fresh = dict(zip(first_rows, z))
            self.keep(fresh)
        return torch.stack([fresh[key] if key in fresh else self.features[key] for key in keys])

    def encoded(self, x: Any, encode: Callable[[Any], Tensor]) -> Tensor:
        z = encode(x)
        self.encoded_rows += int(z.shape[0])
        return z

    def keep(self, fresh: Mapping[Hashable, Tensor]) -> None:
        for key, row in fresh.items():
            size = row.numel() * row.element_size()
            if self.kept_bytes + size > self.max_bytes:
                return
            self.features[key] = row
            self.kept_bytes += size


class RememberedFeatures(nn.Module):
    """`model`'s outputs, its frozen featurizer's features read through `memo`: what the trainer scores a
    frozen-featurizer algorithm with. Not a parent of `model` (the algorithm owns it and keeps its featurizer in
    eval mode), so the trainer's eval()/train() around scoring do not reach the featurizer."""

    def __init__(self, model: FeaturizerHead, memo: FeatureMemo) -> None:
        super().__init__()
        self.parts = (model, memo)  # a tuple, so nn.Module does not adopt the model as a submodule

    def train(self, mode: bool = True) -> RememberedFeatures:
        self.training = mode
        return self

    def forward(self, x: Any) -> Tensor:
        model, memo = self.parts
        return model.head(memo(x, model.featurizer))


class FrozenFeaturizer(Algorithm):
    """Base of the transfer evaluations: a frozen featurizer (see the module docstring) and a head on top."""

    Hparams = FrozenHparams

    def __init__(self, model: FeaturizerHead, hparams: FrozenHparams, context: AlgorithmContext) -> None:
        super().__init__(model, hparams, context)
        model.featurizer.requires_grad_(False)
        model.featurizer.eval()
        self.feature_memo = FeatureMemo()

    def train(self, mode: bool = True) -> FrozenFeaturizer:
        super().train(mode)
        self.model.featurizer.eval()  # the trainer's train() must not switch on batch-norm updates or dropout
        return self

    def param_groups(self, lr: float) -> list[dict[str, Any]]:
        """Only the head's trainable parameters reach the optimiser."""
        return [{"params": [p for p in self.model.head.parameters() if p.requires_grad], "lr": lr}]

    def take_featurizer(self, context: RoundContext) -> dict[str, str]:
        """Install the featurizer `features_from` names; the fact saying where it came from."""
        self.feature_memo.clear()
        return {"features_from": featurizer_source(self.model, self.hparams.features_from, context.seed)}

    @torch.no_grad()
    def features(self, x: Any, train_ids: Tensor | None = None) -> Tensor:
        """Frozen features of the plain (unaugmented) view: NeWT and DABS evaluate without augmentation;
        `train_ids` as `FeatureMemo` takes them."""
        return self.feature_memo(self.view(x, False), self.model.featurizer, train_ids)

    def scoring_model(self) -> nn.Module:
        return RememberedFeatures(self.model, self.feature_memo)
