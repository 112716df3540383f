"""What DABS's two pre-training objectives (e-Mix, ShED) share: settings, the model check, and linear transfer.

Both are pre-train-then-transfer methods in the sense of raybench/algorithms/pretext.py: one registered
algorithm with a pretext phase (a cached stage on every unlabeled split, AdamW, weight decay 1e-4, constant lr,
no clipping, as in DABS) and a fine-tuning phase, here DABS's linear transfer: the pre-trained featurizer is frozen (its
parameters never reach the optimiser, and it stays in eval mode so dropout does not perturb the features) and
a fresh linear head is trained on the labeled data (DABS: AdamW lr 1e-4, weight decay 1e-4, constant lr,
conf/transfer.yaml; the search space sets them).

The objectives act on the token embeddings between `featurizer.embed` and `featurizer.encode`, so they need a
DABS transformer (raybench/models/dabs.py); any other model is refused when the algorithm is built.
"""
from __future__ import annotations

from abc import abstractmethod
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from torch import Tensor, nn

from raybench.algorithms.base import Algorithm, AlgorithmContext, RoundContext, StepOutput
from raybench.algorithms.frozen import FeatureMemo, RememberedFeatures
from raybench.algorithms.pretext import (
    PretrainHparams,
    PretrainThenTransfer,
    is_pretext_phase,
    pretrain_stage,
    transfer_featurizer,
)
from raybench.data.base import ALL_UNLABELED, Batch, TaskKind
from raybench.errors import ConfigError
from raybench.models.base import FeaturizerHead
from raybench.models.dabs import is_dabs_model
from raybench.settings import AT_LEAST_ONE, NON_NEGATIVE, POSITIVE, setting

DABS_MODELS = ("dabs_transformer", "dabs_transformer_small", "dabs_transformer_small_cls")


@dataclass
class DabsHparams(PretrainHparams):
    """Linear transfer has no settings of its own (the lr is the trainer's); every field configures pre-training.

    DABS trains 100k AdamW steps at lr 1e-4, batch 64-256, on a GPU, at a constant lr with no clipping
    (alextamkin/dabs conf/pretrain.yaml: max_steps 100_000, gradient_clip_val 0, no scheduler; base_system.py
    configure_optimizers). The defaults are scaled to CPU budgets: 5 passes over every unlabeled split (1,020
    steps on digits-shift's 13,000 unlabeled images, 625 on text-shift's 8,000 texts, 105 on spoken-digits'
    1,300 utterances; benchmarks/dabs_check.py asks for about 1,000 steps on each), and the lr rises tenfold
    with the hundredfold cut in steps. Pre-training reads every unlabeled split by default, as WILDS's SwAV
    reads every split it is given (`pretrain_splits`; raybench/data/base.py `ShiftDataset.split`).
    """

    pretrain_lr: float = setting(1e-3, allowed=POSITIVE, help="the pre-training AdamW lr (DABS: 1e-4 for 100k steps)")
    pretrain_weight_decay: float = setting(1e-4, allowed=NON_NEGATIVE, help="the pre-training AdamW weight decay")
    pretrain_batch_size: int = setting(64, allowed=AT_LEAST_ONE, help="the pre-training batch")
    pretrain_epochs: int = setting(5, allowed=AT_LEAST_ONE, help="passes over the unlabeled splits")
    pretrain_splits: str = setting(ALL_UNLABELED, help="the unlabeled splits pre-training reads, joined by '+'; "
                                                       "all_unlabeled: every one the dataset has")


def refuse_other_models(model: FeaturizerHead, algorithm: str) -> None:
    """A ConfigError on `model` unless it is a DABS transformer: the objectives edit its token embeddings."""
    if is_dabs_model(model):
        return
    raise ConfigError("model", f"algorithm {algorithm!r} needs a DABS transformer ({' or '.join(DABS_MODELS)}), "
                               f"whose token embeddings it edits; got a {type(model.featurizer).__name__} featurizer")


class DabsPretext(PretrainThenTransfer, Algorithm):
    """Base of e-Mix and ShED: subclasses add their pretext modules and `pretext_objective`, and name the
    settings that define their pre-training (`objective_settings`)."""

    Hparams: ClassVar[type[Hparams]] = DabsHparams
    models = frozenset(DABS_MODELS)

    def __init__(self, model: FeaturizerHead, hparams: DabsHparams, context: AlgorithmContext) -> None:
        super().__init__(model, hparams, context)
        refuse_other_models(model, self.name)
        self.linear_transfer = not is_pretext_phase(hparams)
        if self.linear_transfer:  # before the trainer builds the optimiser, so it receives the head alone
            self.model.featurizer.requires_grad_(False)
        self.feature_memo = FeatureMemo()

    @classmethod
    def inapplicable_reason(cls, hparams: Hparams, task: TaskKind, capabilities: frozenset[str]) -> str | None:
        if not capabilities & {"strong_augmentation", "text"}:  # image datasets offer the first, text the second
            return ("DABS's embedding modules read images, raw text or 1-D signals (not graphs or detection boxes), "
                    "and its objectives need a dabs_transformer model")
        return super().inapplicable_reason(hparams, task, capabilities)

    def train(self, mode: bool = True) -> DabsPretext:
        """In linear transfer the frozen featurizer stays in eval mode: its features are fixed, no dropout."""
        super().train(mode)
        if self.linear_transfer:
            self.model.featurizer.eval()
        return self

    def objective(self, labeled: Batch | None, unlabeled: Batch | None, step: int) -> StepOutput:
        if not self.linear_transfer:
            assert unlabeled is not None, f"the {self.name} pretext phase trains on unlabeled batches"
            return self.pretext_objective(self.context.views.plain(unlabeled.x))
        assert labeled is not None
        loss = self.supervised_loss(self.model.head(self.frozen_features(labeled.x, labeled.index)), labeled.y)
        return StepOutput(loss, {"loss/supervised": loss.detach()})

    @torch.no_grad()
    def frozen_features(self, x: Any, train_ids: Tensor) -> Tensor:
        """The transferred featurizer's features of the plain view of train rows, each encoded once (FeatureMemo)."""
        return self.feature_memo(self.context.views.plain(x), self.model.featurizer, train_ids)

    def scoring_model(self) -> nn.Module:
        return RememberedFeatures(self.model, self.feature_memo) if self.linear_transfer else self.model

    @abstractmethod
    def pretext_objective(self, x: Any) -> StepOutput:
        """The pretext loss on a batch of (plain-view) unlabeled inputs."""

    def objective_settings(self) -> dict[str, Any]:
        """The hyperparameters of the pretext objective, which the pre-training stage must carry."""
        return {}

    def begin_round(self, context: RoundContext) -> dict[str, str]:
        if not self.linear_transfer:
            return {}
        h = self.hparams
        assert isinstance(h, DabsHparams)
        # DABS pre-trains at a constant lr with no clipping (conf/pretrain.yaml: no scheduler, gradient_clip_val
        # 0), whatever the dataset's defaults (text-shift: linear decay, clip 1.0): both are named, not left unset
        stage = pretrain_stage(context, h, self.name, {
            "optimizer": "adamw", "weight_decay": h.pretrain_weight_decay, "scheduler": "constant", "grad_clip": 0.0,
            "unlabeled_split": h.pretrain_splits,
            "pretrain_weight_decay": h.pretrain_weight_decay, **self.objective_settings(),
        })
        transfer_featurizer(stage.model, self.model)
        self.feature_memo.clear()
        return {"pretrained_featurizer": stage.key, "pretrain_cached": str(stage.cached)}


def masked_mean(values: Tensor, keep: Tensor) -> Tensor:
    """Mean of `values` where `keep` is True (0 when nothing is kept, rather than NaN)."""
    keep = keep.to(values.dtype)
    return (values * keep).sum() / keep.sum().clamp(min=1)
