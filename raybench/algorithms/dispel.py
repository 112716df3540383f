"""Dispel: DFR on embeddings of group-unlabeled training data mixed towards group-balanced validation ones."""
from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np

from raybench.algorithms.base import RoundContext
from raybench.algorithms.dfr import DFR, DFRHparams, LinearHead, fit_l1_logistic
from raybench.algorithms.groups import parse_grid
from raybench.algorithms.registry import register
from raybench.settings import AT_LEAST_ONE, setting


@dataclass
class DispelHparams(DFRHparams):
    s_grid: str = setting("1.0,0.9,0.8,0.7", help="mixing weights tried (comma-separated, each in [0, 1]; SpuCo "
                                                  "App. B), chosen with C on the held-out half")
    n_mixed: int = setting(1000, allowed=AT_LEAST_ONE, help="training embeddings mixed per ensemble member")
    n_ensemble: int = setting(20, allowed=AT_LEAST_ONE, help="heads averaged in the final head (SpuCo: 20)")

    def __post_init__(self) -> None:
        super().__post_init__()
        if any(not 0 <= s <= 1 for s in parse_grid(self.s_grid, "s_grid")):
            raise ValueError(f"s_grid: expected mixing weights in [0, 1], got {self.s_grid!r}")


def mix_embeddings(z_pool: np.ndarray, y_pool: np.ndarray, z_balanced: np.ndarray, y_balanced: np.ndarray,
                   s: float, rng: np.random.Generator) -> np.ndarray:
    """s z' + (1 - s) z, z' a random group-balanced embedding of the same class as z (Xue et al., 2023)."""
    partners = np.empty(len(z_pool), dtype=np.int64)
    for c in np.unique(y_pool):
        rows = np.flatnonzero(y_pool == c)
        partners[rows] = rng.choice(np.flatnonzero(y_balanced == c), len(rows))
    return s * z_balanced[partners] + (1 - s) * z_pool


@register("dispel")
class Dispel(DFR):
    """Dispel (Xue et al., 2023; SpuCo Sec. 3.1.3): DFR on training embeddings mixed toward balanced ones.

    Stages:
      1. reference: ERM, as DFR;
      2. last_layer: each ensemble member takes a group-balanced validation subsample B and `n_mixed`
         training embeddings z (their group labels unused), mixes every z with a same-class z' from B into
         s z' + (1 - s) z, and fits an l1 logistic regression on the mixed embeddings with the labels of z.
         C and s are chosen together, each pair scored by one member fit on the validation fit part and
         scored on the held-out rest; the chosen pair is refit on all of val and the head averages
         `n_ensemble` members (SpuCo last_layer_retrain/dispel.py: one model per (s, C) in
         `hyperparam_selection`, then `train_multiple_model` with n_lin_models = 20 on all labeled data).
    """

    Hparams = DispelHparams

    def prepare(self, context: RoundContext, train_z: np.ndarray) -> None:
        assert context.train is not None and context.train.y is not None
        self.pool_z, self.pool_y = train_z, context.train.y.numpy()

    def settings(self) -> list[dict[str, float]]:
        grid = itertools.product(parse_grid(self.hparams.c_grid, "c_grid"), parse_grid(self.hparams.s_grid, "s_grid"))
        return [{"c": c, "s": s} for c, s in grid]

    def members_see_the_same_rows(self, group: np.ndarray) -> bool:
        return False  # each member mixes its own draw of training embeddings

    def fit_member(self, z: np.ndarray, y: np.ndarray, setting: dict[str, float], rng: np.random.Generator,
                   seed: int) -> LinearHead:
        rows = rng.choice(len(self.pool_z), min(self.hparams.n_mixed, len(self.pool_z)), replace=False)
        mixed = mix_embeddings(self.pool_z[rows], self.pool_y[rows], z, y, setting["s"], rng)
        return fit_l1_logistic(mixed, self.pool_y[rows], setting["c"], self.context.task.n_outputs, seed)
