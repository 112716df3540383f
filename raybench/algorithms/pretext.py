"""What pre-train-then-fine-tune methods (SwAV, masked LM) share: the pretext stage and the featurizer hand-over.

Such a method is one registered algorithm with two phases. The trial runs `phase="finetune"`: at its start
it asks the trainer for the stage "pretrain", a run of the same algorithm with `phase="pretext"`, which the
trainer trains in pretext mode (an epoch is one pass over the unlabeled split; no labeled batch is drawn;
the final weights are kept, as WILDS did, not a best-validation checkpoint). The stage is cached by the
hash of its own config (raybench/trainer/stages.py), so the ten trials of a sweep, which differ only in
fine-tuning settings, train it once. Its seed is `pretrain_seed` (fixed by default, so replicates share it
too); `pretrain_seed=None` pre-trains once per replicate seed instead.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from raybench.algorithms.base import Hparams, RoundContext, StageModel
from raybench.models.base import FeaturizerHead
from raybench.settings import AT_LEAST_ONE, POSITIVE, SEED, Allowed, setting

PHASES = ("finetune", "pretext")
PRETRAIN_STAGE = "pretrain"


@dataclass
class PretrainHparams(Hparams):
    """The pre-training budget is `per_dataset`: SwAV and masked LM take it from the dataset (`algorithm_hparams`),
    so a search space leaves it to the dataset; DABS's methods redeclare it with their own fixed defaults."""

    phase: str = setting("finetune", allowed=Allowed(choices=PHASES),
                         help="set to pretext only by the stage this method asks for")
    pretrain_epochs: int = setting(1, allowed=AT_LEAST_ONE, per_dataset=True, help="passes over the unlabeled split")
    pretrain_batch_size: int = setting(64, allowed=AT_LEAST_ONE, per_dataset=True, help="the pre-training batch")
    pretrain_lr: float = setting(0.075, allowed=POSITIVE, per_dataset=True,
                                 help="the pre-training lr (SwAV: 4.8 x batch / 4096)")
    pretrain_steps: int | None = setting(None, allowed=AT_LEAST_ONE,
                                            help="at most this many steps per pre-training epoch; none: the whole "
                                                 "split")
    pretrain_seed: int | None = setting(0, allowed=SEED, help="fixed: replicates share one pre-training; none: one per "
                                                   "replicate seed")
    pretrain_from: str | None = setting(None, help="starting weights: none = the model's own (random for CNNs), "
                                                      "or a local file")


def is_pretext_phase(hparams: Hparams) -> bool:
    return getattr(hparams, "phase", "finetune") == "pretext"


class PretrainThenTransfer:
    """Mixed in before `Algorithm` by such methods (swav, mlm, emix, shed): the two stages, and the trainer
    told to run the pretext phase in pretext mode."""

    stages: tuple[str, ...] = (PRETRAIN_STAGE, "train")

    @classmethod
    def is_pretext(cls, hparams: Hparams) -> bool:
        return is_pretext_phase(hparams)


def pretrain_stage(context: RoundContext, hparams: PretrainHparams, algorithm: str,
                   overrides: dict[str, Any]) -> StageModel:
    """The pre-trained model of this method on this dataset: trained once, then read from the stage cache."""
    assert context.train_stage is not None, "pre-training needs the trainer's stage service"
    seed = context.seed if hparams.pretrain_seed is None else hparams.pretrain_seed
    stage: dict[str, Any] = {
        "algorithm": algorithm, "phase": "pretext", "epochs": hparams.pretrain_epochs,
        "batch_size": hparams.pretrain_batch_size, "lr": hparams.pretrain_lr, "seed": seed, **overrides,
    }
    if hparams.pretrain_steps is not None:
        stage["max_steps_per_epoch"] = hparams.pretrain_steps
    if hparams.pretrain_from is not None:
        stage["model_weights"] = hparams.pretrain_from
    return context.train_stage(PRETRAIN_STAGE, stage, identity={"pretext": algorithm}, use_final=True)


def transfer_featurizer(source: FeaturizerHead, target: FeaturizerHead) -> None:
    """Only the featurizer carries over; the target's head keeps its fresh initialisation."""
    target.featurizer.load_state_dict(source.featurizer.state_dict())
