"""e-Mix: contrastive learning with mixup of token embeddings (DABS, Tamkin et al., 2021), then linear transfer."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from raybench.algorithms.base import AlgorithmContext, StepOutput
from raybench.algorithms.dabs_objectives import DabsHparams, DabsPretext
from raybench.algorithms.registry import register
from raybench.models.base import FeaturizerHead
from raybench.settings import AT_LEAST_ONE, POSITIVE, PROBABILITY, setting


@dataclass
class EMixHparams(DabsHparams):
    temperature: float = setting(0.2, allowed=POSITIVE, help="tau, DABS's code")
    projection_dim: int = setting(128, allowed=AT_LEAST_ONE, help="width of the contrastive projection")
    min_lambda: float = setting(0.5, allowed=PROBABILITY, help="mixing weights lambda_i ~ U(min_lambda, 1)")


def mix_embeddings(tokens: Tensor, padding: Tensor, lam: Tensor, partner: Tensor) -> tuple[Tensor, Tensor]:
    """e~_i = lam_i e_i + (1 - lam_i) stopgrad(e_pi(i)), token by token; a mixed position is padding only where
    both examples are padding (padding embeddings are zero, so a longer partner's tokens come through scaled)."""
    weight = lam.view(-1, 1, 1)
    mixed = weight * tokens + (1 - weight) * tokens[partner].detach()
    return mixed, padding & padding[partner]


def emix_loss(z_mixed: Tensor, z_clean: Tensor, lam: Tensor, partner: Tensor, temperature: float) -> Tensor:
    """mean_i [lam_i CE(l_i, i) + (1 - lam_i) CE(l_i, pi(i))] with l_ik = z~_i . z_k / tau (mixed rows, clean
    columns; z unit vectors). With lam = 1 this is InfoNCE between the two views."""
    logits = z_mixed @ z_clean.T / temperature
    own = F.cross_entropy(logits, torch.arange(len(logits), device=logits.device), reduction="none")
    other = F.cross_entropy(logits, partner, reduction="none")
    return (lam * own + (1 - lam) * other).mean()


def either_source_found(z_mixed: Tensor, z_clean: Tensor, partner: Tensor) -> Tensor:
    """Fraction of mixed examples whose nearest clean example is one of the two they were mixed from."""
    nearest = (z_mixed @ z_clean.T).argmax(1)
    rows = torch.arange(len(nearest), device=nearest.device)
    return ((nearest == rows) | (nearest == partner)).float().mean()


@register("emix")
class EMix(DabsPretext):
    """e-Mix (DABS, Tamkin et al., 2021, Sec. 5.2.1): i-Mix applied to the embedding modules' outputs.

    Pretext phase (a cached stage, one pass over the unlabeled split per epoch, no labels): for a batch of B
    token-embedding sequences e_i, a random permutation pi and lambda_i ~ U(0.5, 1),
        e~_i = lambda_i e_i + (1 - lambda_i) stopgrad(e_pi(i)),     z = normalize(Linear_128(LN(pool(T(e))))),
        l_ik = z~_i^T z_k / tau (tau = 0.2),     L = mean_i [lambda_i CE(l_i, i) + (1 - lambda_i) CE(l_i, pi(i))].
    Rows are the mixed examples and columns the clean ones, as in DABS's code; the paper's Eq. 1 puts the clean
    examples on the rows. Gradients flow through both branches except the stop-gradient partner.
    pool is the featurizer's readout, the representation linear transfer reads (DABS: the mean of the final
    states); the projection is DABS's `mlp_head`, LayerNorm then Linear(d, 128) (alextamkin/dabs src/models/
    pytorch/transformer.py lines 125-128 and 144-149; src/systems/pytorch/emix.py lines 76-78 encode with
    prehead=False, so the loss reads the head's output).
    Fine-tuning phase (the trial): DABS's linear transfer, a fresh linear head on the frozen featurizer,
        loss = E_(x,y)~labeled [ CE(g(f(x)), y) ].
    """

    Hparams = EMixHparams

    def __init__(self, model: FeaturizerHead, hparams: EMixHparams, context: AlgorithmContext) -> None:
        super().__init__(model, hparams, context)
        if not self.linear_transfer:
            self.projection = nn.Sequential(nn.LayerNorm(model.n_features),
                                            nn.Linear(model.n_features, hparams.projection_dim))

    def project(self, tokens: Tensor, padding: Tensor) -> Tensor:
        """z = normalize(Linear(LayerNorm(pool(states)))) for one batch of token embeddings."""
        featurizer = self.model.featurizer
        return F.normalize(self.projection(featurizer.pool(featurizer.encode(tokens, padding), padding)), dim=1)

    def pretext_objective(self, x: Any) -> StepOutput:
        h = self.hparams
        assert isinstance(h, EMixHparams)
        tokens, padding = self.model.featurizer.embed(x)
        b = tokens.shape[0]
        lam = torch.empty(b, device=tokens.device).uniform_(h.min_lambda, 1.0)
        partner = torch.randperm(b, device=tokens.device)
        mixed, mixed_padding = mix_embeddings(tokens, padding, lam, partner)
        z_clean, z_mixed = self.project(tokens, padding), self.project(mixed, mixed_padding)
        loss = emix_loss(z_mixed, z_clean, lam, partner, h.temperature)
        return StepOutput(loss, {"loss/emix": loss.detach(), "emix/ln_B": torch.tensor(math.log(b)),
                                 "emix/source_found": either_source_found(z_mixed.detach(), z_clean.detach(), partner)})

    def objective_settings(self) -> dict[str, Any]:
        h = self.hparams
        return {"temperature": h.temperature, "projection_dim": h.projection_dim, "min_lambda": h.min_lambda}
