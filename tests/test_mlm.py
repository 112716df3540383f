"""Masked LM: the masking collator, the MLM model sharing the featurizer's encoder, and applicability."""
from __future__ import annotations

import pytest
import torch
from helpers.datasets import MINILM_FOLDER as FOLDER
from helpers.datasets import TEXTS, text_model, tiny_text_dataset

from raybench.algorithms import ALGORITHMS, AlgorithmContext, build_algorithm
from raybench.algorithms.mlm import MaskedLM, masked_batch, masking_collator
from raybench.data.base import Task, TaskKind, Views


def context() -> AlgorithmContext:
    same = lambda x: x
    return AlgorithmContext(Task(TaskKind.CLASSIFICATION, 5), Views(same, same, same), 2, 10, 2)


def test_collator_masks_fifteen_percent_of_ordinary_tokens_and_ignores_the_rest():
    torch.manual_seed(0)
    model = text_model()
    tokenizer = model.featurizer.tokenizer
    batch = masked_batch(TEXTS * 4, tokenizer, masking_collator(tokenizer, 0.15), 32)
    original = tokenizer(TEXTS * 4, truncation=True, max_length=32, padding="longest", return_tensors="pt")["input_ids"]
    special = torch.isin(original, torch.tensor(tokenizer.all_special_ids))
    predicted = batch["labels"] != -100
    fraction = predicted.sum() / (~special).sum()
    assert 0.13 <= fraction <= 0.17, float(fraction)
    assert not (predicted & special).any(), "a special token ([CLS], [SEP], padding) was chosen"
    assert torch.equal(batch["labels"][predicted], original[predicted]), "labels are the original tokens"
    assert (batch["labels"][~predicted] == -100).all()
    replaced = batch["input_ids"][predicted] == tokenizer.mask_token_id
    assert 0.7 <= replaced.float().mean() <= 0.9  # 80 % become [MASK]


def test_pretext_trains_the_featurizers_own_encoder():
    """The MLM model's encoder is the featurizer's (one set of weights), its decoder tied to the embeddings,
    and a pretext step moves the featurizer."""
    torch.manual_seed(0)
    model = text_model()
    algorithm = build_algorithm("mlm", model, {"phase": "pretext"}, context())
    assert isinstance(algorithm, MaskedLM)
    mlm = algorithm.masked_lm
    assert getattr(mlm, mlm.base_model_prefix) is model.featurizer.encoder
    assert mlm.get_output_embeddings().weight is model.featurizer.encoder.get_input_embeddings().weight
    before = {k: v.clone() for k, v in model.featurizer.state_dict().items()}
    optimizer = torch.optim.AdamW(algorithm.parameters(), lr=1e-3)
    from raybench.data.base import Batch

    n = 16
    unlabeled = Batch(TEXTS[:n], None, torch.zeros(n, dtype=torch.long), torch.zeros(n, dtype=torch.long), torch.arange(n))
    out = algorithm(None, unlabeled, 0)
    assert torch.isfinite(out.loss) and 0.05 < float(out.logs["mlm/masked_fraction"]) < 0.3
    out.loss.backward()
    optimizer.step()
    after = model.featurizer.state_dict()
    assert any(not torch.equal(before[k], after[k]) for k in before)


@pytest.mark.parametrize("capabilities,task,accepted", [
    ({"features", "text"}, TaskKind.CLASSIFICATION, True),  # civilcomments, amazon (adapter), text-shift
    ({"strong_augmentation", "features"}, TaskKind.CLASSIFICATION, False),  # images
    ({"features"}, TaskKind.MULTILABEL, False),  # ogb-molpcba
    (set(), TaskKind.DETECTION, False),  # globalwheat
])
def test_applicability(capabilities, task, accepted):
    cls = ALGORITHMS.get("mlm")
    reason = cls.inapplicable_reason(cls.Hparams(), task, frozenset(capabilities))
    assert (reason is None) == accepted, reason
    if not accepted:
        assert "text" in reason


def test_wilds_text_datasets_declare_mlm_settings_and_text():
    from raybench.data.wilds.adapter import INPUT_KINDS
    from raybench.data.wilds.spec import load_specs

    assert "text" in INPUT_KINDS["text"].capabilities
    specs = load_specs()
    for name, (batch, accum) in {"civilcomments": (32, 256), "amazon": (16, 512)}.items():
        hparams = ALGORITHMS.get("mlm").Hparams(**specs[name].defaults.algorithm_hparams["mlm"])
        assert hparams.pretrain_lr == 1e-4 and (hparams.pretrain_batch_size, hparams.pretrain_grad_accum) == (batch, accum)
        assert batch * accum == 8192


def test_mlm_pretrains_once_then_fine_tunes_through_the_trainer(tmp_path):
    """The conformance path for mlm on text: the stage trains (pretext mode), the featurizer carries over and the
    head starts fresh, a second trial with another fine-tuning lr loads the same stage from the cache."""
    from raybench.trainer import Callback, TrainConfig, Trainer

    dataset = tiny_text_dataset()
    reports = []

    class Stages(Callback):
        def on_stage(self, report):
            reports.append(report)

    for lr in (1e-4, 3e-5):
        config = TrainConfig.from_flat({"dataset": "tiny-text", "algorithm": "mlm", "device": "cpu", "lr": lr,
                                        "model_weights": str(FOLDER), "stage_cache": str(tmp_path),
                                        "max_steps_per_epoch": 2, "pretrain_steps": 2, "pretrain_batch_size": 8})
        result = Trainer(config, callbacks=[Stages()], dataset=dataset).fit()
        assert "val/acc" in result.final_metrics
    first, second = reports
    assert first.name == second.name == "pretrain" and first.key == second.key
    assert (first.cached, second.cached) == (False, True)
    assert "train/loss/mlm" in first.history[0] and "val/acc" not in first.history[0]


def test_only_datasets_that_declare_mlm_settings_accept_it():
    """WILDS ran masked LM on civilcomments and amazon; raybench adds text-shift. Other text datasets are refused."""
    import dataclasses

    from raybench.data.wilds.spec import load_specs
    from raybench.trainer import ConfigError, TrainConfig

    wilds = {name for name, spec in load_specs().items() if "mlm" in spec.defaults.algorithm_hparams}
    assert wilds == {"civilcomments", "amazon"}
    from raybench.data.text_shift import MLM_PRETRAINING
    assert MLM_PRETRAINING["pretrain_steps"] >= 1
    text = tiny_text_dataset()
    TrainConfig.from_flat({"dataset": "tiny-text", "algorithm": "mlm"}).resolve(text)
    bare = dataclasses.replace(text, defaults=dataclasses.replace(text.defaults, algorithm_hparams={}))
    with pytest.raises(ConfigError) as refused:
        TrainConfig.from_flat({"dataset": "tiny-text", "algorithm": "mlm"}).resolve(bare)
    assert "the dataset declares no mlm settings" in str(refused.value)
