"""spoken-digits: the documented plan, disjoint splits, declared domains, determinism, the cache, the install
hint, distinct voices, and inputs the DABS transformer and the trainer take.

Synthesis runs espeak-ng once per utterance, so the tests build SMALL_PLAN (the same domains and splits, one
utterance per digit and domain, 100 utterances) once per session; what only the full plan decides (its sizes,
its dealing) is checked without synthesis.
"""
from __future__ import annotations

import os
import shutil
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers.cli import run_cli
from helpers.system_packages import require_system_package

from raybench.data import LABELED_SPLITS, UNLABELED_SPLITS, ShiftDataset
from raybench.data import spoken_digits as sd
from raybench.models import ModelSpec, build_model
from raybench.trainer import TrainConfig, Trainer


@pytest.fixture(scope="module")
def espeak_ng() -> None:
    """Synthesis needs Debian's espeak-ng: without it these tests fail naming the install line."""
    require_system_package(shutil.which("espeak-ng") is not None, "espeak-ng", "spoken-digits' speech synthesis")

SOURCE = [s.name for s in sd.SOURCE_SPEAKERS]
VAL = [s.name for s in sd.VAL_SPEAKERS]
TEST = [s.name for s in sd.TEST_SPEAKERS]
EXTRA = [s.name for s in sd.EXTRA_SPEAKERS]
# One utterance per digit and domain, every split present, each OOD split in one of its own voices.
SMALL_PLAN = {
    "train": {SOURCE[0]: 1, SOURCE[3]: 1}, "id_val": {SOURCE[0]: 1}, "id_test": {SOURCE[3]: 1},
    "val": {VAL[0]: 1}, "test": {TEST[0]: 1}, "train_unlabeled": {SOURCE[0]: 1},
    "val_unlabeled": {VAL[1]: 1}, "test_unlabeled": {TEST[1]: 1}, "extra_unlabeled": {EXTRA[0]: 1},
}
TINY_PLAN = {"train": {SOURCE[1]: 1}, "test": {TEST[0]: 1}}


@pytest.fixture(scope="module")
def small(espeak_ng: None, shared_data_dir: Path) -> ShiftDataset:
    return sd.load_spoken_digits(shared_data_dir, 0, SMALL_PLAN)


# ---------------------------------------------------------------- sizes and domains


def test_the_full_plan_has_the_documented_sizes_and_every_split():
    sizes = {split: sd.split_size(sd.SPLIT_PLAN, split) for split in sd.SPLIT_PLAN}
    assert sizes == {"train": 1_000, "id_val": 200, "id_test": 200, "val": 200, "test": 200, "train_unlabeled": 500,
                     "val_unlabeled": 200, "test_unlabeled": 300, "extra_unlabeled": 300}
    assert set(sd.SPLIT_PLAN) == set(LABELED_SPLITS) | set(UNLABELED_SPLITS)
    shapes, _ = sd.expected_layout()
    assert shapes["train.x"] == (1_000, 32, 64) and shapes["test_unlabeled.x"] == (300, 32, 64)


def test_the_full_plan_declares_id_voices_for_id_splits_and_held_out_voices_for_ood_splits():
    for split in ("train", "id_val", "id_test", "train_unlabeled"):
        assert set(sd.SPLIT_PLAN[split]) == set(SOURCE), split
    assert set(sd.SPLIT_PLAN["val"]) == set(sd.SPLIT_PLAN["val_unlabeled"]) == set(VAL)
    assert set(sd.SPLIT_PLAN["test"]) == set(sd.SPLIT_PLAN["test_unlabeled"]) == set(TEST)
    assert set(sd.SPLIT_PLAN["extra_unlabeled"]) == set(EXTRA)
    voices = [s.voice for s in sd.SPEAKERS]
    assert len(set(voices)) == len(voices) and len(set(sd.DOMAIN_NAMES)) == len(sd.DOMAIN_NAMES)


def test_a_built_dataset_has_the_planned_sizes_kinds_and_shapes(small: ShiftDataset):
    assert small.name == "spoken-digits" and small.task.n_outputs == 10 and small.input_shape == (32, 64)
    for split, counts in SMALL_PLAN.items():
        part = small.splits[split]
        assert len(part) == 10 * sum(counts.values()), split
        assert part.labeled == (split in LABELED_SPLITS), split
        assert part.x.dtype == torch.uint8 and tuple(part.x.shape[1:]) == (32, 64), split
        if part.labeled:  # balanced by digit
            assert Counter(part.y.tolist()) == {d: sum(counts.values()) for d in range(10)}, split


def test_every_split_holds_exactly_its_declared_domains(small: ShiftDataset):
    for split, counts in SMALL_PLAN.items():
        names = Counter(small.domain_names[d] for d in small.splits[split].domain.tolist())
        assert names == {name: 10 * n for name, n in counts.items()}, split
        assert torch.equal(small.splits[split].group, small.splits[split].domain), split


# ---------------------------------------------------------------- disjointness


def test_no_utterance_is_dealt_to_two_splits_of_the_full_plan():
    dealt = sd.deal_utterances(sd.SPLIT_PLAN, seed=0)
    everything = [u for us in dealt.values() for u in us]
    assert len(everything) == sum(sd.split_size(sd.SPLIT_PLAN, s) for s in sd.SPLIT_PLAN) == 3_100
    assert len(set(everything)) == len(everything)
    assert Counter(u.digit for u in dealt["train"]) == {d: 100 for d in range(10)}


def test_a_build_holds_the_dealt_utterances_and_no_spectrogram_twice(small: ShiftDataset, shared_data_dir: Path):
    """Unlabeled splits keep no digit, so the build is matched to the dealing, whose utterances are unique."""
    arrays = sd.load_or_generate(sd.cache_path(shared_data_dir, 0, SMALL_PLAN), 0, SMALL_PLAN)
    dealt = sd.deal_utterances(SMALL_PLAN, seed=0)
    for split, utterances in dealt.items():
        built = list(zip(arrays[f"{split}.domain"].tolist(), arrays[f"{split}.pitch"].tolist(),
                         arrays[f"{split}.speed"].tolist()))
        assert built == [(sd.DOMAIN_NAMES.index(u.domain), u.pitch, u.speed) for u in utterances], split
        if split in LABELED_SPLITS:
            assert arrays[f"{split}.y"].tolist() == [u.digit for u in utterances], split
    everything = [u for us in dealt.values() for u in us]
    assert len(set(everything)) == len(everything)
    rows = [x.tobytes() for split in small.splits.values() for x in split.x.numpy()]
    assert len(set(rows)) == len(rows)


def test_a_domain_too_small_for_its_plan_is_refused():
    too_many = len(sd.PITCHES) * len(sd.SPEEDS) + 1
    with pytest.raises(ValueError, match=f"needs {too_many} utterances per digit"):
        sd.deal_utterances({"train": {SOURCE[0]: too_many}}, seed=0)


# ---------------------------------------------------------------- determinism and the cache


def test_the_same_seed_gives_the_same_bytes_and_another_seed_other_ones(espeak_ng: None):
    first, second = sd.generate(0, TINY_PLAN), sd.generate(0, TINY_PLAN)
    assert first.keys() == second.keys()
    assert all(np.array_equal(first[k], second[k]) for k in first)
    other = sd.deal_utterances(TINY_PLAN, seed=1)
    assert [(u.pitch, u.speed) for u in other["train"]] != list(zip(first["train.pitch"], first["train.speed"]))


def test_the_cache_is_reused_without_espeak_ng(small: ShiftDataset, shared_data_dir: Path,
                                                monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv(sd.ESPEAK_ENV, "/nonexistent/espeak-ng")
    cached = sd.load_spoken_digits(shared_data_dir, 0, SMALL_PLAN)
    assert all(torch.equal(cached.splits[s].x, small.splits[s].x) for s in SMALL_PLAN)


def test_the_plan_and_seed_name_the_cache_file(tmp_path: Path):
    assert sd.cache_path(tmp_path, 0) != sd.cache_path(tmp_path, 1)
    assert sd.cache_path(tmp_path, 0) != sd.cache_path(tmp_path, 0, SMALL_PLAN)
    assert sd.cache_path(tmp_path, 0).parent == tmp_path / "spoken-digits"


# ---------------------------------------------------------------- espeak-ng


def test_a_missing_espeak_ng_is_one_line_with_the_install_hint(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    missing = tmp_path / "bin" / "espeak-ng"
    monkeypatch.setenv(sd.ESPEAK_ENV, str(missing))
    with pytest.raises(sd.MissingSourceError) as caught:
        sd.load_spoken_digits(tmp_path / "data", 0, TINY_PLAN)
    message = str(caught.value)
    assert "\n" not in message and str(missing) in message and "apt-get install espeak-ng" in message
    assert not sd.cache_path(tmp_path / "data", 0, TINY_PLAN).exists()


def test_the_command_line_prints_the_install_hint_as_one_line_and_exits_2(tmp_path: Path):
    env = {**os.environ, sd.ESPEAK_ENV: str(tmp_path / "absent" / "espeak-ng"), "RAYBENCH_DATA_DIR": str(tmp_path)}
    proc = run_cli(["train", "--dataset", "spoken-digits", "--algorithm", "erm", "--epochs", "1"], env, tmp_path)
    assert proc.returncode == 2
    (line,) = proc.stderr.strip().splitlines()
    assert line.startswith("raybench: error: --dataset: spoken-digits needs") and "apt-get install espeak-ng" in line


def test_every_domain_is_a_voice_of_its_own(espeak_ng: None):
    """espeak-ng says an ignored or unknown variant in a default voice without a word: two domains would then
    be one voice."""
    binary = sd.espeak_binary()
    waves = [sd.synthesise(sd.Utterance(s.name, s.voice, 0, 50, 180), binary) for s in sd.SPEAKERS]
    sounds = {w.tobytes() for w in waves}
    assert len(sounds) == len(sd.SPEAKERS)


def test_streamed_wavs_are_read_to_their_end():
    header = (b"RIFF" + (0x7FFFFFFF).to_bytes(4, "little") + b"WAVEfmt " + (16).to_bytes(4, "little")
              + (1).to_bytes(2, "little") + (1).to_bytes(2, "little") + sd.SAMPLE_RATE.to_bytes(4, "little")
              + (2 * sd.SAMPLE_RATE).to_bytes(4, "little") + (2).to_bytes(2, "little") + (16).to_bytes(2, "little")
              + b"data" + (0x7FFFFFFF).to_bytes(4, "little"))
    samples = np.array([0, 16384, -32768, 5], dtype="<i2")
    assert np.array_equal(sd.parse_wav(header + samples.tobytes()), samples / 32768.0)
    with pytest.raises(sd.SynthesisError, match="16-bit mono PCM"):
        sd.parse_wav(header.replace(sd.SAMPLE_RATE.to_bytes(4, "little"), (16_000).to_bytes(4, "little"), 1))


# ---------------------------------------------------------------- the model and the trainer


def test_inputs_and_views_fit_dabs_transformer_small(small: ShiftDataset):
    model = build_model("dabs_transformer_small", ModelSpec(small.input_shape, small.task.n_outputs))
    embedding = model.featurizer.embeddings["signal"]
    assert embedding.max_tokens == 64 and embedding.frame == 1  # one token per time frame
    batch = small.splits["train"].x[:8]
    for view in (small.views.plain, small.views.weak, small.views.strong):
        x = view(batch)
        assert x.shape == (8, 32, 64) and x.dtype == torch.float32 and -1.0 <= x.min() and x.max() <= 1.0
        assert model(x).shape == (8, 10)
    assert not torch.equal(small.views.strong(batch), small.views.plain(batch))


def test_erm_trains_and_evaluates_every_split_on_a_build(small: ShiftDataset):
    config = TrainConfig.from_flat({"dataset": "spoken-digits", "algorithm": "erm", "model": "dabs_transformer_small",
                                    "epochs": 1, "device": "cpu", "batch_size": 16,
                                    "max_steps_per_epoch": 2})
    result = Trainer(config, dataset=small).fit()
    for split in ("id_val", "val", "test", "id_test"):
        assert 0.0 <= result.final_metrics[f"{split}/acc"] <= 1.0, split


def test_dabs_pretext_methods_accept_the_dataset(small: ShiftDataset):
    import raybench.algorithms.emix  # noqa: F401  (registers emix)

    config = TrainConfig.from_flat({"dataset": "spoken-digits", "algorithm": "emix", "model": "dabs_transformer_small"})
    assert config.resolve(small).unlabeled_split == "test_unlabeled"
