"""ShED: shuffled-embedding detection (DABS, Tamkin et al., 2021), then linear transfer."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from raybench.algorithms.base import AlgorithmContext, StepOutput
from raybench.algorithms.dabs_objectives import DabsHparams, DabsPretext, masked_mean
from raybench.algorithms.registry import register
from raybench.models.base import FeaturizerHead
from raybench.settings import OPEN_FRACTION, setting


@dataclass
class ShEDHparams(DabsHparams):
    shuffle_fraction: float = setting(0.15, allowed=OPEN_FRACTION, help="share of an example's real tokens whose "
                                                                       "embeddings are shuffled among themselves")


def shuffle_count(length: int, fraction: float) -> int:
    """k = ceil(fraction * L) positions of an L-token example; at least 2, since one embedding cannot move
    (k = 1 would be left in place), and none for an example of fewer than 2 tokens."""
    if length < 2:
        return 0
    return min(length, max(2, math.ceil(fraction * length)))


def shuffle_sources(padding: Tensor, fraction: float, generator: torch.Generator | None = None) -> Tensor:
    """For each example and position, the position whose embedding lands there (B, L).

    Per example, k random real (non-padding) positions p_1..p_k take the embeddings of p_k, p_1, ..., p_(k-1):
    a cyclic shift among themselves (DABS App. B), so every chosen position receives another's embedding.
    All rows at once, on the device (`generator`, if given, is on it): the real positions in a random order (padding
    last), the first k = `shuffle_count` of them chosen; nothing waits for a row's length on the host.
    """
    b, length = padding.shape
    ranks = torch.arange(length, device=padding.device).expand(b, length)
    n_real = (~padding).sum(1, keepdim=True)
    k = torch.where(n_real < 2, 0, (n_real.double() * fraction).ceil().long().clamp(min=2).minimum(n_real))
    order = torch.rand(b, length, generator=generator, device=padding.device).masked_fill(padding, 2.0).argsort(1)
    previous = order.gather(1, (ranks - 1) % k.clamp(min=1))  # the r-th chosen takes the (r-1)-th's, the first the k-th's
    return ranks.scatter(1, order, torch.where(ranks < k, previous, order))


def shuffle_embeddings(tokens: Tensor, sources: Tensor) -> Tensor:
    """tokens[b, sources[b, j]] at (b, j); gradients flow to the original positions."""
    return tokens.gather(1, sources.unsqueeze(-1).expand_as(tokens))


def shed_loss(logits: Tensor, moved: Tensor, padding: Tensor) -> Tensor:
    """Mean cross-entropy of the per-token moved/not-moved logits (B, L, 2) over the real (non-padding) tokens."""
    per_token = F.cross_entropy(logits.flatten(0, 1), moved.flatten().long(), reduction="none").view(moved.shape)
    return masked_mean(per_token, ~padding)


def binary_entropy(p: float) -> float:
    """The loss of always predicting the base rate p of moved tokens: what ShED must beat (0.42 nats at 15 %)."""
    if p <= 0 or p >= 1:
        return 0.0
    return -(p * math.log(p) + (1 - p) * math.log(1 - p))


@register("shed")
class ShED(DabsPretext):
    """ShED (DABS, Tamkin et al., 2021, Sec. 5.2.2, App. B): an ELECTRA-style detection task on embeddings.

    Pretext phase (a cached stage, one pass over the unlabeled split per epoch, no labels): per example, pick
    k = ceil(0.15 L) of its L real token positions (never CLS or padding) and shift their embeddings cyclically
    among themselves, so none stays in place; positions are added afterwards, inside the encoder. A per-token
    Linear(d, 2) head on the encoder's states predicts which tokens moved:
        L = mean over real tokens j of CE(head(T(shuffled e)_j), moved_j).
    Always answering "not moved" scores 85 % and about 0.42 nats (the binary entropy of the moved fraction).
    Fine-tuning phase (the trial): DABS's linear transfer, a fresh linear head on the frozen featurizer,
        loss = E_(x,y)~labeled [ CE(g(f(x)), y) ].
    """

    Hparams = ShEDHparams

    def __init__(self, model: FeaturizerHead, hparams: ShEDHparams, context: AlgorithmContext) -> None:
        super().__init__(model, hparams, context)
        if not self.linear_transfer:
            self.detector = nn.Linear(model.n_features, 2)

    def pretext_objective(self, x: Any) -> StepOutput:
        h = self.hparams
        assert isinstance(h, ShEDHparams)
        tokens, padding = self.model.featurizer.embed(x)
        sources = shuffle_sources(padding, h.shuffle_fraction)
        moved = sources != torch.arange(sources.shape[1], device=sources.device)
        states = self.model.featurizer.encode(shuffle_embeddings(tokens, sources), padding)[:, 1:]
        logits = self.detector(states)
        loss = shed_loss(logits, moved, padding)
        real = ~padding
        fraction = masked_mean(moved.float(), real)
        correct = (logits.detach().argmax(-1) == moved.long()).float()
        p = fraction.double()  # binary_entropy(fraction) on the device: xlogy(0, 0) = 0 at either end
        return StepOutput(loss, {"loss/shed": loss.detach(), "shed/token_acc": masked_mean(correct, real),
                                 "shed/moved_fraction": fraction,
                                 "shed/never_moved_nats": -(torch.xlogy(p, p) + torch.xlogy(1 - p, 1 - p))})

    def objective_settings(self) -> dict[str, Any]:
        return {"shuffle_fraction": self.hparams.shuffle_fraction}
