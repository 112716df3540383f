"""DABS: the transformer's embedding modules and padding, e-Mix and ShED losses, and linear transfer."""
from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

import raybench.algorithms.emix
import raybench.algorithms.shed
import raybench.models.dabs  # noqa: F401  (registers the dabs_transformer models)
from raybench.algorithms import AlgorithmContext, build_algorithm
from raybench.algorithms.emix import EMix, emix_loss, mix_embeddings
from raybench.algorithms.shed import ShED, binary_entropy, shuffle_count, shuffle_sources
from raybench.checkpoints import load_state_dict_into
from raybench.models import ModelSpec, build_model
from raybench.models.dabs import (
    DabsFeaturizer,
    EncoderSize,
    FrameEmbedding,
    PatchEmbedding,
    SpectrogramEmbedding,
    TokenEmbedding,
)
from raybench.trainer import ConfigError, TrainConfig, Trainer
from raybench.trainer.callbacks import Callback
from raybench.trainer.stages import StageCache

SMALL = "dabs_transformer_small"
TINY = EncoderSize(layers=2, width=32, heads=4, mlp=64, dropout=0.0)


def context_for(dataset) -> AlgorithmContext:
    return AlgorithmContext(dataset.task, dataset.views, dataset.n_domains, 100, dataset.n_groups)


def small_model(dataset):
    return build_model(SMALL, ModelSpec(dataset.input_shape, dataset.task.n_outputs))


# ----- the transformer -------------------------------------------------------------------------------

def test_every_embedding_module_feeds_the_one_encoder_at_its_width():
    d = 32
    featurizer = DabsFeaturizer([PatchEmbedding(3, 16, 16, d), FrameEmbedding(2, 40, d), TokenEmbedding(12, d)], TINY)
    featurizer.eval()
    inputs = {"image": torch.randn(3, 3, 16, 16), "signal": torch.randn(3, 2, 40),
              "text": ["a bird in the forest", "fish", "a dog that lives in a house"]}
    for modality, x in inputs.items():
        tokens, padding = featurizer.embed(x)
        assert tokens.shape[0] == 3 and tokens.shape[-1] == d and padding.shape == tokens.shape[:2], modality
        assert featurizer.encode(tokens, padding).shape == (3, tokens.shape[1] + 1, d), modality
        assert featurizer(x).shape == (3, d), modality
    assert featurizer.embed(inputs["image"])[0].shape[1] == 16  # 4-px patches of a 16-px image
    assert featurizer.embed(inputs["text"])[1].any()  # the shorter strings are padded


def test_the_model_follows_the_input_shape_and_refuses_other_inputs():
    image = build_model(SMALL, ModelSpec((3, 16, 16), 5))
    text = build_model(SMALL, ModelSpec((16,), 5))
    assert set(image.featurizer.embeddings) == {"image"} and set(text.featurizer.embeddings) == {"text"}
    assert image.n_features == image.featurizer.n_features == 64
    with pytest.raises(ValueError, match="embeds image, got a batch of text"):
        image(["some text"])
    with pytest.raises(ValueError, match="lists of strings"):
        text(torch.zeros(2, 16, dtype=torch.long))


def test_the_default_size_is_dabs():
    model = build_model("dabs_transformer", ModelSpec((3, 16, 16), 5))
    layers = model.featurizer.encoder.layers
    assert len(layers) == 12 and model.n_features == 256
    assert layers[0].self_attn.num_heads == 8 and layers[0].linear1.out_features == 512
    assert layers[0].dropout.p == 0.1


def test_position_and_cls_start_as_large_as_the_tokens_they_tag():
    """DABS starts both at N(0, 1) (transformer.py lines 120-121); at N(0, 0.02^2) position was 2-3 % of a
    token and ShED could not see where a token belonged."""
    torch.manual_seed(0)
    for shape in ((3, 16, 16), (64,)):
        featurizer = build_model(SMALL, ModelSpec(shape, 5)).featurizer
        tokens, padding = featurizer.embed(torch.rand(8, *shape) if len(shape) == 3 else ["a bird in a tree"] * 8)
        position_std = featurizer.position.std().item()
        assert 0.9 < position_std < 1.1 and 0.8 < featurizer.cls.std().item() < 1.2, shape
        token_norm = tokens[~padding].norm(dim=-1).mean().item()
        position_norm = featurizer.position[0, 1:].norm(dim=-1).mean().item()
        assert position_norm > 0.5 * token_norm, (shape, position_norm, token_norm)


def test_the_readout_is_the_mean_of_the_final_states_without_a_final_norm():
    torch.manual_seed(0)
    model = build_model(SMALL, ModelSpec((32,), 3))
    model.eval()
    featurizer = model.featurizer
    assert featurizer.encoder.norm is None  # DABS's stack ends on a residual sum
    texts = ["a small bird", "a much longer string that pads the first one"]
    tokens, padding = featurizer.embed(texts)
    states = featurizer.encode(tokens, padding)
    real = 1 + (~padding).sum(1)  # CLS and the real tokens
    expected = torch.stack([states[i, :real[i]].mean(0) for i in range(2)])
    torch.testing.assert_close(featurizer(texts), expected)
    assert not torch.allclose(featurizer(texts), states[:, 0])
    cls_model = build_model("dabs_transformer_small_cls", ModelSpec((32,), 3))
    cls_model.eval()
    assert isinstance(cls_model.featurizer.encoder.norm, torch.nn.LayerNorm)
    cls_states = cls_model.featurizer.encode(*cls_model.featurizer.embed(texts))
    torch.testing.assert_close(cls_model.featurizer(texts), cls_states[:, 0])


def test_spectrogram_patches_tile_the_input_exactly():
    torch.manual_seed(0)
    embedding = SpectrogramEmbedding(32, 64, 16, patch=(8, 8))
    assert embedding.max_tokens == 32
    x = torch.randn(2, 32, 64)
    tokens, padding = embedding(x)
    assert tokens.shape == (2, 32, 16) and not padding.any()
    weight, bias = embedding.project.weight, embedding.project.bias
    for token in (0, 5, 7, 8, 31):  # token k is band block k // 8, frame block k % 8, read row by row
        bands, frames = divmod(token, 8)
        patch = x[:, bands * 8:(bands + 1) * 8, frames * 8:(frames + 1) * 8].reshape(2, 64)
        torch.testing.assert_close(tokens[:, token], patch @ weight.T + bias)
    covered = torch.zeros(32, 64)  # every cell of the spectrogram is in exactly one patch
    for token in range(32):
        bands, frames = divmod(token, 8)
        covered[bands * 8:(bands + 1) * 8, frames * 8:(frames + 1) * 8] += 1
    assert torch.equal(covered, torch.ones(32, 64))
    model = build_model(SMALL, ModelSpec((32, 64), 10, layout="spectrogram"))
    assert isinstance(model.featurizer.embeddings["signal"], SpectrogramEmbedding)
    assert isinstance(build_model(SMALL, ModelSpec((32, 64), 10)).featurizer.embeddings["signal"], FrameEmbedding)
    with pytest.raises(ValueError, match="8 x 8 patches"):
        SpectrogramEmbedding(30, 64, 16)


def test_the_readout_does_not_depend_on_padding():
    torch.manual_seed(0)
    model = build_model(SMALL, ModelSpec((32,), 3))
    model.eval()
    alone = model.featurizer(["a small bird"])
    padded = model.featurizer(["a small bird", "a much longer string that forces the first one to be padded a lot"])
    assert model.featurizer.embed(["a small bird", "a much longer string"])[1][0].any()
    torch.testing.assert_close(padded[0], alone[0], atol=1e-5, rtol=1e-5)


# ----- e-Mix -----------------------------------------------------------------------------------------

def test_emix_with_lambda_one_is_infonce():
    torch.manual_seed(0)
    b, tau = 8, 0.2
    z_mixed, z_clean = F.normalize(torch.randn(b, 16), dim=1), F.normalize(torch.randn(b, 16), dim=1)
    partner = torch.randperm(b)
    sims = torch.exp(z_mixed @ z_clean.T / tau)
    infonce = -torch.log(sims.diagonal() / sims.sum(1)).mean()
    loss = emix_loss(z_mixed, z_clean, torch.ones(b), partner, tau)
    assert loss.item() == pytest.approx(infonce.item(), rel=1e-5)
    lam = torch.full((b,), 0.7)  # and the mixed targets weigh the partner's column by 1 - lambda
    by_hand = -(0.7 * torch.log(sims.diagonal() / sims.sum(1)) + 0.3 * torch.log(sims[torch.arange(b), partner] / sims.sum(1)))
    assert emix_loss(z_mixed, z_clean, lam, partner, tau).item() == pytest.approx(by_hand.mean().item(), rel=1e-5)


def test_mixing_stops_the_gradient_at_the_partner():
    tokens = torch.randn(4, 5, 8, requires_grad=True)
    padding = torch.zeros(4, 5, dtype=torch.bool)
    padding[1, 3:] = True
    padding[2, 2:] = True
    lam, partner = torch.tensor([0.9, 0.6, 0.5, 1.0]), torch.tensor([1, 2, 0, 3])
    mixed, mixed_padding = mix_embeddings(tokens, padding, lam, partner)
    torch.testing.assert_close(mixed[0], 0.9 * tokens[0] + 0.1 * tokens[1])
    mixed.sum().backward()
    torch.testing.assert_close(tokens.grad, lam.view(4, 1, 1).expand_as(tokens))  # no (1 - lambda) from partners
    assert mixed_padding[1, 3:].all() and not mixed_padding[1, 2] and not mixed_padding[2].any()


def test_emix_loss_at_initialisation_is_about_ln_b(tiny_dataset):
    torch.manual_seed(0)
    algorithm = build_algorithm("emix", small_model(tiny_dataset), {"phase": "pretext"}, context_for(tiny_dataset))
    assert isinstance(algorithm, EMix)
    x = tiny_dataset.split("test_unlabeled").take(torch.arange(64)).x
    loss = algorithm.pretext_objective(tiny_dataset.views.plain(x)).loss.item()
    assert abs(loss - math.log(64)) < 0.15 * math.log(64), loss


# ----- ShED ------------------------------------------------------------------------------------------

def test_shed_moves_ceil_15_percent_of_real_positions_and_none_stays():
    torch.manual_seed(0)
    lengths = [20, 14, 40, 7]
    padding = torch.arange(40).expand(4, 40) >= torch.tensor(lengths).view(4, 1)
    for _ in range(20):
        sources = shuffle_sources(padding, 0.15)
        for row, length in enumerate(lengths):
            chosen = (sources[row] != torch.arange(40)).nonzero().flatten()
            assert len(chosen) == max(2, math.ceil(0.15 * length)) == shuffle_count(length, 0.15)
            assert (chosen < length).all(), "a padding position moved"
            assert sorted(sources[row, chosen].tolist()) == chosen.tolist(), "not a shift among the chosen positions"
        assert (sources >= 0).all() and (sources < 40).all()


def ramps(n: int, generator: torch.Generator, length: int = 16) -> torch.Tensor:
    """Synthetic 1-D signals (n, 1, length) that rise at a random slope from a random start: every frame's value
    says where in the sequence it belongs, so a moved frame is out of place only to an encoder that sees order."""
    start = 4 * torch.rand(n, 1, generator=generator)
    slope = 0.5 + torch.rand(n, 1, generator=generator)
    return (start + 4 * slope * torch.arange(length) / length).unsqueeze(1)


def test_shed_learns_an_order_task_only_when_position_is_visible():
    """A shuffle keeps the set of frames, so detecting moved ones needs position. With DABS's N(0, 1) position
    embeddings the loss falls far below "never moved" in 250 steps (0.11 against 0.48 at this seed); with
    N(0, 0.02^2) ones it stays near it (0.48)."""
    from raybench.algorithms.shed import shed_loss, shuffle_embeddings

    torch.manual_seed(1)
    torch.set_num_threads(1)
    featurizer = DabsFeaturizer([FrameEmbedding(1, 16, 32)], TINY)
    detector = torch.nn.Linear(32, 2)
    optimizer = torch.optim.AdamW([*featurizer.parameters(), *detector.parameters()], lr=1e-3, weight_decay=1e-4)
    generator = torch.Generator().manual_seed(0)
    losses = []
    for _ in range(250):
        tokens, padding = featurizer.embed(ramps(32, generator))
        sources = shuffle_sources(padding, 0.15)
        moved = sources != torch.arange(sources.shape[1])
        loss = shed_loss(detector(featurizer.encode(shuffle_embeddings(tokens, sources), padding)[:, 1:]), moved, padding)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    baseline = binary_entropy(3 / 16)  # ceil(0.15 * 16) = 3 frames moved
    assert baseline == pytest.approx(0.4826, abs=1e-4)
    assert sum(losses[-20:]) / 20 < 0.7 * baseline, losses[-20:]


def test_shed_pretext_objective_on_the_small_model(tiny_dataset):
    torch.manual_seed(0)
    algorithm = build_algorithm("shed", small_model(tiny_dataset), {"phase": "pretext"}, context_for(tiny_dataset))
    assert isinstance(algorithm, ShED)
    x = tiny_dataset.views.plain(tiny_dataset.split("test_unlabeled").take(torch.arange(16)).x)
    out = algorithm.pretext_objective(x)
    assert out.logs["shed/moved_fraction"].item() == pytest.approx(3 / 16)  # ceil(0.15 * 16 patches) = 3
    assert torch.isfinite(out.loss)


# ----- applicability and linear transfer ---------------------------------------------------------------

def test_other_models_are_refused_when_the_algorithm_is_built(tiny_dataset):
    lenet = build_model("lenet", ModelSpec(tiny_dataset.input_shape, 4))
    with pytest.raises(ConfigError, match="model: algorithm 'emix' needs a DABS transformer"):
        build_algorithm("emix", lenet, {}, context_for(tiny_dataset))


def test_graphs_are_refused_by_applicability():
    from raybench.data.base import TaskKind

    assert ShED.inapplicable_reason(ShED.Hparams(), TaskKind.MULTILABEL, frozenset({"features"}))
    assert ShED.inapplicable_reason(ShED.Hparams(), TaskKind.CLASSIFICATION, frozenset({"text", "features"})) is None


class Stages(Callback):
    def __init__(self) -> None:
        self.reports = []

    def on_stage(self, report) -> None:
        self.reports.append(report)


def emix_config(tmp_path, **settings) -> TrainConfig:
    return TrainConfig.from_flat({"dataset": "tiny", "algorithm": "emix", "model": SMALL, "epochs": 1, "device": "cpu",
                                  "stage_cache": str(tmp_path), "pretrain_epochs": 2, "pretrain_batch_size": 32,
                                  "optimizer": "adam", "lr": 1e-3, **settings})


def test_only_the_featurizer_transfers_and_stays_frozen(tiny_dataset, tmp_path):
    config = emix_config(tmp_path)
    stages = Stages()
    trainer = Trainer(config, callbacks=[stages], dataset=tiny_dataset)
    torch.manual_seed(123)
    algorithm = build_algorithm("emix", small_model(tiny_dataset), config.resolve(tiny_dataset).hparams,
                                context_for(tiny_dataset))
    fresh_head = {k: v.clone() for k, v in algorithm.model.head.state_dict().items()}
    facts = algorithm.begin_round(trainer._round_context(0))
    (report,) = stages.reports
    assert report.name == "pretrain" and facts["pretrained_featurizer"] == report.key
    cached = StageCache(tmp_path).get_or_make(report.key, lambda: pytest.fail("the stage was not cached"))
    pretrained = load_state_dict_into(small_model(tiny_dataset), cached.state)
    for name, value in algorithm.model.featurizer.state_dict().items():
        assert torch.equal(value, pretrained.featurizer.state_dict()[name]), f"featurizer {name} differs from the cache"
    for name, value in algorithm.model.head.state_dict().items():
        assert torch.equal(value, fresh_head[name]), "the head did not start fresh"

    (group,) = algorithm.param_groups(1e-3)
    head_params = {id(p) for p in algorithm.model.head.parameters()}
    assert {id(p) for p in group["params"]} == head_params, "the optimiser gets more than the head"
    optimizer = torch.optim.Adam(algorithm.param_groups(1e-2))
    before = {k: v.clone() for k, v in algorithm.model.state_dict().items()}
    algorithm.train()
    assert not algorithm.model.featurizer.training, "the frozen featurizer runs with dropout"
    out = algorithm(tiny_dataset.split("train").take(torch.arange(16)), None, 0)
    out.loss.backward()
    optimizer.step()
    after = algorithm.model.state_dict()
    assert all(torch.equal(after[k], v) for k, v in before.items() if k.startswith("featurizer."))
    assert any(not torch.equal(after[k], v) for k, v in before.items() if k.startswith("head."))


def test_emix_end_to_end_pretrains_then_fine_tunes(tiny_dataset, tmp_path):
    torch.set_num_threads(1)
    stages = Stages()
    result = Trainer(emix_config(tmp_path), callbacks=[stages], dataset=tiny_dataset).fit()
    (report,) = stages.reports
    assert not report.cached and len(report.history) == 2  # two passes over the unlabeled split
    assert all(math.isfinite(epoch["train/loss/emix"]) for epoch in report.history)
    assert "val/acc" in result.final_metrics and "train/loss/supervised" in result.final_metrics
    cached = StageCache(tmp_path).get_or_make(report.key, lambda: pytest.fail("the stage was not cached"))
    pretrained = load_state_dict_into(small_model(tiny_dataset), cached.state)
    torch.manual_seed(0)
    untrained = small_model(tiny_dataset)
    assert any(not torch.equal(v, untrained.featurizer.state_dict()[k])
               for k, v in pretrained.featurizer.state_dict().items()), "the pretext stage changed nothing"
    for name, value in result.final_state.items():  # fine-tuning kept the pre-trained featurizer as it was
        if name.startswith("featurizer."):
            assert torch.equal(value, pretrained.state_dict()[name]), name


def test_linear_transfer_encodes_each_input_once_with_the_transferred_featurizer(tiny_dataset, tmp_path):
    """Features remembered before the pre-trained featurizer arrives are dropped, so the head reads the new
    featurizer's features; after that an input is encoded once however often it is predicted, and a training row once
    however often it is trained on."""
    config = emix_config(tmp_path)
    algorithm = build_algorithm("emix", small_model(tiny_dataset), config.resolve(tiny_dataset).hparams,
                                context_for(tiny_dataset))
    x = tiny_dataset.split("val").x
    algorithm.eval()
    algorithm.predict(x)  # the random initialisation's features, remembered
    algorithm.begin_round(Trainer(config, dataset=tiny_dataset)._round_context(0))
    encoded: list[int] = []
    hook = algorithm.model.featurizer.register_forward_hook(lambda module, args, out: encoded.append(len(out)))
    logits = algorithm.predict(x)
    assert torch.equal(algorithm.predict(x), logits) and encoded == [len(x)]
    algorithm.train()
    rows = tiny_dataset.split("train").take(torch.arange(8))  # a training batch is remembered by its example ids
    algorithm(rows, None, 0)
    algorithm(rows, None, 1)  # trained on before: not re-encoded
    hook.remove()
    assert encoded == [len(x), len(rows)]
    with torch.no_grad():
        expected = algorithm.model(tiny_dataset.views.plain(x))
    torch.testing.assert_close(logits, expected, rtol=0, atol=1e-5)


def test_emix_projects_the_mean_pooled_state_through_layernorm_and_linear(tiny_dataset):
    """DABS's e-Mix head is its model's mlp_head, LayerNorm then Linear(d, 128), on the pooled state
    (transformer.py lines 125-128, 144-149)."""
    torch.manual_seed(0)
    algorithm = build_algorithm("emix", small_model(tiny_dataset), {"phase": "pretext"}, context_for(tiny_dataset))
    norm, linear = algorithm.projection
    assert isinstance(norm, torch.nn.LayerNorm) and isinstance(linear, torch.nn.Linear) and linear.out_features == 128
    algorithm.eval()
    x = tiny_dataset.views.plain(tiny_dataset.split("test_unlabeled").take(torch.arange(8)).x)
    featurizer = algorithm.model.featurizer
    with torch.no_grad():
        z = algorithm.project(*featurizer.embed(x))
        expected = F.normalize(linear(norm(featurizer(x))), dim=1)
    torch.testing.assert_close(z, expected)


class ScheduleSpy:
    """Every schedule the trainer builds and every gradient clip it applies, in order."""

    def __init__(self, monkeypatch) -> None:
        from raybench.trainer import loop

        self.schedules: list = []
        self.clips: list[float] = []
        build = loop.build_schedule
        monkeypatch.setattr(loop, "build_schedule", lambda name, *a: self.schedules.append(name) or build(name, *a))
        clip = torch.nn.utils.clip_grad_norm_
        monkeypatch.setattr(torch.nn.utils, "clip_grad_norm_", lambda p, c, *a, **k: self.clips.append(c) or clip(p, c))


@pytest.mark.parametrize("algorithm", ["emix", "shed"])
def test_a_pretraining_that_asks_for_no_schedule_and_no_clipping_gets_neither(algorithm, tiny_dataset, tmp_path,
                                                                             monkeypatch):
    """DABS pre-trains at a constant lr with no clipping; a dataset's default decay and clip (text-shift's:
    linear, 1.0) must not fill them in. The fine-tuning trial, which names neither, still gets the dataset's."""
    import dataclasses

    decaying = dataclasses.replace(tiny_dataset, defaults=dataclasses.replace(
        tiny_dataset.defaults, scheduler="linear", grad_clip=1.0))
    spy = ScheduleSpy(monkeypatch)
    lrs: list[float] = []

    class Lr(Callback):
        def on_stage(self, report) -> None:
            lrs.extend(epoch["lr"] for epoch in report.history)

    flat = {"dataset": "tiny", "algorithm": algorithm, "model": SMALL, "epochs": 1, "device": "cpu",
            "stage_cache": str(tmp_path), "pretrain_epochs": 2, "pretrain_batch_size": 64, "max_steps_per_epoch": 2}
    Trainer(TrainConfig.from_flat(flat), callbacks=[Lr()], dataset=decaying).fit()
    assert spy.schedules == ["constant", "linear"], spy.schedules  # the stage's, then the trial's
    assert len(lrs) == 2 and set(lrs) == {1e-3}, lrs  # both pre-training epochs at DABS's constant lr
    assert spy.clips and all(c == 1.0 for c in spy.clips)  # only the trial clips
    assert len(spy.clips) == 2  # its two steps; the stage's steps never reached the clip


def test_pretraining_reads_every_unlabeled_split(tiny_dataset, tmp_path, monkeypatch):
    """DABS's stage pre-trains on the union of the dataset's unlabeled splits (`pretrain_splits`, default
    all_unlabeled): one pass covers every unlabeled row once."""
    seen: list[int] = []
    original = ShED.pretext_objective
    monkeypatch.setattr(ShED, "pretext_objective", lambda self, x: seen.append(len(x)) or original(self, x))
    flat = {"dataset": "tiny", "algorithm": "shed", "model": SMALL, "epochs": 1, "device": "cpu",
            "stage_cache": str(tmp_path), "pretrain_epochs": 1, "pretrain_batch_size": 128}
    Trainer(TrainConfig.from_flat(flat), dataset=tiny_dataset).fit()
    unlabeled = [name for name, split in tiny_dataset.splits.items() if not split.labeled]
    assert len(unlabeled) >= 2
    assert sum(seen) == sum(len(tiny_dataset.split(name)) for name in unlabeled), (seen, unlabeled)


def datasets_with_a_default_scheduler(data_dir) -> dict:
    """Every dataset whose defaults name a scheduler, by name: text-shift (linear, clip 1.0) and the WILDS
    datasets' specs (fmow and poverty: step; civilcomments and amazon: linear, clip 1.0)."""
    from raybench.data import load_dataset
    from raybench.data.wilds.spec import load_specs

    defaults = {name: spec.defaults for name, spec in load_specs().items() if spec.defaults.scheduler is not None}
    defaults["text-shift"] = load_dataset("text-shift", data_dir, 0).defaults
    return defaults


@pytest.mark.parametrize("algorithm", ["emix", "shed"])
def test_the_pretraining_stage_resolves_to_a_constant_lr_and_no_clipping_on_every_dataset_with_a_schedule(
        algorithm, tiny_dataset, shared_data_dir, tmp_path):
    """The stage's own config, resolved against each such dataset's defaults, keeps "constant" and 0: the
    dataset fills only what the stage leaves unset."""
    import dataclasses

    every = datasets_with_a_default_scheduler(shared_data_dir)
    assert {"text-shift", "fmow", "civilcomments"} <= set(every)
    config = emix_config(tmp_path, algorithm=algorithm)
    trainer = Trainer(config, dataset=tiny_dataset)
    asked: list[dict] = []

    class Asked(Exception):
        """Stops the round once the stage's settings are known: only they are under test."""

    def capture(name, overrides, **kwargs):
        asked.append(dict(overrides))
        raise Asked

    trainer.train_stage = capture
    method = build_algorithm(algorithm, small_model(tiny_dataset), config.resolve(tiny_dataset).hparams,
                             context_for(tiny_dataset))
    with pytest.raises(Asked):
        method.begin_round(trainer._round_context(0))
    (overrides,) = asked
    for name, defaults in every.items():
        dataset = dataclasses.replace(tiny_dataset, defaults=dataclasses.replace(defaults, model="lenet",
                                                                                 model_weights=None))
        stage = TrainConfig.from_flat({"dataset": "tiny", "model": SMALL, **overrides}).resolve(dataset)
        assert (stage.scheduler, stage.grad_clip) == ("constant", 0.0), name
        assert defaults.scheduler is not None  # what the stage would have got had it left them unset
