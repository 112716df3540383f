"""Continued masked-LM pre-training of the text model on unlabeled target text, then ERM fine-tuning (WILDS 2.0)."""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from raybench.algorithms.base import Algorithm, AlgorithmContext, RoundContext, StepOutput
from raybench.algorithms.pretext import PretrainHparams, PretrainThenTransfer, pretrain_stage, transfer_featurizer
from raybench.algorithms.registry import register
from raybench.data.base import Batch, TaskKind
from raybench.models.base import FeaturizerHead
from raybench.models.text import prepared_attention_mask
from raybench.settings import AT_LEAST_ONE, OPEN_FRACTION, POSITIVE, setting


@dataclass
class MLMHparams(PretrainHparams):
    """Fine-tuning is plain ERM (text has no augmentation); the rest configures the pre-training stage.

    Defaults are scaled for CPU runs on text-shift; civilcomments and amazon set WILDS's in datasets.yaml.
    """

    pretrain_lr: float = setting(1e-4, allowed=POSITIVE, per_dataset=True, help="the masked-LM pre-training lr")
    pretrain_batch_size: int = setting(32, allowed=AT_LEAST_ONE, per_dataset=True, help="the pre-training batch")
    pretrain_steps: int | None = setting(20, allowed=AT_LEAST_ONE, per_dataset=True,
                                            help="batches per pre-training epoch (WILDS: 1,000 optimiser steps)")
    pretrain_grad_accum: int = setting(1, allowed=AT_LEAST_ONE, per_dataset=True,
                                       help="WILDS: 8,192 sequences per step (civilcomments 32 x 256, amazon 16 x 512)")
    mlm_probability: float = setting(0.15, allowed=OPEN_FRACTION, help="share of tokens masked")


def masked_lm_for(featurizer: nn.Module) -> nn.Module:
    """`AutoModelForMaskedLM` of the featurizer's own folder, its encoder replaced by the featurizer's encoder,
    so the pretext task trains exactly the weights fine-tuning will start from. The decoder is tied to the
    input embeddings; an MLM head the folder lacks (a sentence-embedding MiniLM) starts fresh."""
    from transformers import AutoModelForMaskedLM

    encoder = featurizer.encoder
    # float32 as the featurizer (models/text.py): a half-precision checkpoint would give a half-precision head
    mlm = AutoModelForMaskedLM.from_pretrained(encoder.config._name_or_path, local_files_only=True,
                                               dtype=torch.float32)
    setattr(mlm, mlm.base_model_prefix, encoder)
    mlm.tie_weights()
    return mlm


def masking_collator(tokenizer: Any, probability: float) -> Any:
    """BERT's masking: `probability` of the non-special tokens are predicted; of those 80 % become [MASK],
    10 % a random token, 10 % stay; every other label is -100 (ignored by the loss)."""
    from transformers import DataCollatorForLanguageModeling

    return DataCollatorForLanguageModeling(tokenizer=tokenizer, mlm=True, mlm_probability=probability)


def masked_batch(texts: Sequence[str], tokenizer: Any, collator: Any, max_length: int) -> dict[str, Tensor]:
    encoded = tokenizer(list(texts), truncation=True, max_length=max_length)
    rows = [{k: encoded[k][i] for k in ("input_ids", "attention_mask")} for i in range(len(texts))]
    return collator(rows)


def masked_lm_loss(mlm: nn.Module, batch: dict[str, Tensor]) -> tuple[Tensor, Tensor]:
    """(mean cross-entropy over the masked positions, accuracy of the predicted masked tokens)."""
    device = mlm.get_input_embeddings().weight.device
    attention = prepared_attention_mask(mlm, batch["attention_mask"])  # from the host copy (see there)
    batch = {k: v.to(device) for k, v in batch.items()}
    out = mlm(**{**batch, "attention_mask": attention})
    masked = batch["labels"] != -100
    hits = (out.logits.detach().argmax(-1) == batch["labels"]) & masked  # a masked mean: no wait for the count
    accuracy = hits.float().sum() / masked.sum()
    return out.loss, accuracy


@register("mlm")
class MaskedLM(PretrainThenTransfer, Algorithm):
    """Masked-LM continued pre-training (Devlin et al., 2019) as WILDS 2.0 used it (App. B), then ERM.

    Pretext phase (a stage, one pass over the unlabeled split per epoch, no labels): with M a random 15 %
    of the non-special tokens of x and x~ the corrupted sequence,
        L_MLM = -E_x sum_{i in M} log p(x_i | x~)       (transformers' DataCollatorForLanguageModeling)
    Fine-tuning phase (the trial): the adapted encoder is the featurizer, the head starts fresh, and
        loss = E_(x,y)~labeled [ CE(h(x), y) ].
    WILDS found no gain on civilcomments or amazon: a null result to reproduce, not beat.
    """

    Hparams = MLMHparams
    supported_tasks = frozenset({TaskKind.CLASSIFICATION})
    dataset_settings = "its masked-LM learning rate, batch, accumulation and steps"

    def __init__(self, model: FeaturizerHead, hparams: MLMHparams, context: AlgorithmContext) -> None:
        super().__init__(model, hparams, context)
        if hparams.phase == "pretext":
            self.masked_lm = masked_lm_for(model.featurizer)
            self.collator = masking_collator(model.featurizer.tokenizer, hparams.mlm_probability)

    @classmethod
    def inapplicable_reason(cls, hparams: Hparams, task: TaskKind, capabilities: frozenset[str]) -> str | None:
        if "text" not in capabilities:
            return "masked-LM pre-training needs raw text and a BERT-family text model (civilcomments, amazon, text-shift)"
        return super().inapplicable_reason(hparams, task, capabilities)

    def objective(self, labeled: Batch | None, unlabeled: Batch | None, step: int) -> StepOutput:
        if self.hparams.phase == "pretext":
            assert unlabeled is not None, "the masked-LM pretext phase trains on unlabeled batches"
            featurizer = self.model.featurizer
            batch = masked_batch(unlabeled.x, featurizer.tokenizer, self.collator, featurizer.max_length)
            loss, accuracy = masked_lm_loss(self.masked_lm, batch)
            masked = (batch["labels"] != -100).float().sum() / batch["attention_mask"].float().sum()
            return StepOutput(loss, {"loss/mlm": loss.detach(), "mlm/masked_token_acc": accuracy,
                                     "mlm/masked_fraction": masked})
        assert labeled is not None
        loss = self.supervised_loss(self.model(labeled.x), labeled.y)
        return StepOutput(loss, {"loss/supervised": loss.detach()})

    def begin_round(self, context: RoundContext) -> dict[str, str]:
        if self.hparams.phase == "pretext":
            return {}
        h = self.hparams
        stage = pretrain_stage(context, h, self.name, {
            "optimizer": "adamw", "weight_decay": 0.0, "scheduler": None, "grad_accum": h.pretrain_grad_accum,
            "mlm_probability": h.mlm_probability, "pretrain_steps": h.pretrain_steps,
        })
        transfer_featurizer(stage.model, self.model)
        return {"pretrained_featurizer": stage.key, "pretrain_cached": str(stage.cached)}
