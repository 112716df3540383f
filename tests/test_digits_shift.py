"""digits-shift: documented sizes, disjoint splits, determinism, caching, and the domain layout."""
from __future__ import annotations

import hashlib
from itertools import combinations
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from raybench.data import LABELED_SPLITS, UNLABELED_SPLITS, ShiftDataset, TaskKind, load_dataset
from raybench.data import digits_shift as ds

# The sizes the module docstring promises; written out so a change to the constants is noticed.
DOCUMENTED_SIZES = {
    "train": 5_000, "id_val": 1_000, "id_test": 1_000, "val": 1_000, "test": 1_000,
    "train_unlabeled": 5_000, "val_unlabeled": 2_000, "test_unlabeled": 3_000, "extra_unlabeled": 3_000,
}
SOURCE = {s.name for s in ds.SOURCE_STYLES}
EXTRA = {s.name for s in ds.EXTRA_STYLES}
INTENDED_DOMAINS = {
    "train": SOURCE, "id_val": SOURCE, "id_test": SOURCE, "train_unlabeled": SOURCE,
    "val": {ds.VAL_STYLE.name}, "val_unlabeled": {ds.VAL_STYLE.name},
    "test": {ds.TEST_STYLE.name}, "test_unlabeled": {ds.TEST_STYLE.name},
    "extra_unlabeled": EXTRA,
}


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("data")


@pytest.fixture(scope="module")
def dataset(cache_dir: Path) -> ShiftDataset:
    return load_dataset("digits-shift", data_dir=cache_dir, seed=0)


def cache_file(data_dir: Path, seed: int) -> Path:
    return data_dir / "digits-shift" / f"{ds.cache_key(seed)}.npz"


def row_hashes(x: torch.Tensor) -> set[bytes]:
    return {hashlib.blake2b(row.tobytes(), digest_size=16).digest() for row in x.reshape(len(x), -1).numpy()}


def assert_same_splits(a: ShiftDataset, b: ShiftDataset) -> None:
    assert a.splits.keys() == b.splits.keys()
    for name, split in a.splits.items():
        other = b.splits[name]
        assert torch.equal(split.x, other.x), name
        assert torch.equal(split.domain, other.domain) and torch.equal(split.group, other.group), name
        assert (split.y is None and other.y is None) or torch.equal(split.y, other.y), name


def test_every_split_has_documented_size_shape_and_dtypes(dataset: ShiftDataset) -> None:
    assert set(dataset.splits) == set(LABELED_SPLITS) | set(UNLABELED_SPLITS)
    for name, split in dataset.splits.items():
        n = DOCUMENTED_SIZES[name]
        assert split.x.shape == (n, 3, 16, 16) and split.x.dtype == torch.uint8, name
        assert split.domain.shape == (n,) and split.domain.dtype == torch.int64, name
        assert torch.equal(split.group, split.domain), name
        if name in LABELED_SPLITS:
            assert split.y is not None and split.y.dtype == torch.int64 and split.y.shape == (n,), name
        else:
            assert split.y is None, name
    assert dataset.info == {name: str(n) for name, n in DOCUMENTED_SIZES.items()}


def test_dataset_declares_task_metrics_and_defaults(dataset: ShiftDataset) -> None:
    assert dataset.name == "digits-shift"
    assert dataset.task.kind == TaskKind.CLASSIFICATION and dataset.task.n_outputs == 10
    assert dataset.input_shape == (3, 16, 16)
    assert dataset.selection_metric == "val/acc"
    assert dataset.defaults.model == "lenet" and dataset.defaults.unlabeled_split == "test_unlabeled"
    test = dataset.split("test")
    perfect = F.one_hot(test.y, 10).float()
    assert dataset.evaluate("test", perfect, test) == {"test/acc": 1.0, "test/macro_f1": 1.0}
    views = dataset.views.weak(test.x[:8])
    assert views.shape == (8, 3, 16, 16) and views.dtype == torch.float32


def test_no_image_is_shared_between_splits(dataset: ShiftDataset) -> None:
    hashes = {name: row_hashes(split.x) for name, split in dataset.splits.items()}
    for a, b in combinations(hashes, 2):
        assert not hashes[a] & hashes[b], f"{a} and {b} share an image"
    labeled = set().union(*(hashes[s] for s in LABELED_SPLITS))
    unlabeled = set().union(*(hashes[s] for s in UNLABELED_SPLITS))
    assert not labeled & unlabeled


def test_base_digit_pools_are_disjoint_stratified_and_complete() -> None:
    _, labels = ds.load_base_digits()
    pools = ds.partition_pools(labels, seed=0)
    members = [set(p.tolist()) for p in pools.values()]
    for a, b in combinations(members, 2):
        assert not a & b
    assert set().union(*members) == set(range(len(labels)))
    for pool in pools.values():
        assert set(labels[pool].tolist()) == set(range(10))


def test_same_seed_same_bytes_other_seed_other_images(dataset: ShiftDataset, tmp_path: Path) -> None:
    again = load_dataset("digits-shift", data_dir=tmp_path / "again", seed=0)
    assert_same_splits(dataset, again)
    other = load_dataset("digits-shift", data_dir=tmp_path / "other", seed=1)
    assert not torch.equal(dataset.split("train").x, other.split("train").x)
    assert not row_hashes(dataset.split("test").x) & row_hashes(other.split("test").x)


def test_generation_ignores_and_preserves_global_rng(tmp_path: Path) -> None:
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    first = ds.generate(seed=5)
    assert torch.equal(torch.rand(3), expected)
    torch.manual_seed(999)
    second = ds.generate(seed=5)
    assert first.keys() == second.keys()
    assert all((first[k] == second[k]).all() for k in first)


def test_cache_hit_reads_the_file_and_does_not_regenerate(
    dataset: ShiftDataset, cache_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = cache_file(cache_dir, 0)
    assert path.exists()
    assert [p.name for p in path.parent.iterdir()] == [path.name]  # no temp file left behind
    mtime = path.stat().st_mtime_ns

    def fail(seed: int) -> None:
        raise AssertionError("cache hit regenerated the data")

    monkeypatch.setattr(ds, "generate", fail)
    cached = load_dataset("digits-shift", data_dir=cache_dir, seed=0)
    assert_same_splits(dataset, cached)
    assert path.stat().st_mtime_ns == mtime


def test_cache_key_changes_with_seed_and_parameters(monkeypatch: pytest.MonkeyPatch) -> None:
    key = ds.cache_key(0)
    assert ds.cache_key(1) != key
    monkeypatch.setattr(ds, "FORMAT_VERSION", ds.FORMAT_VERSION + 1)
    assert ds.cache_key(0) != key


def test_domains_match_the_documented_layout(dataset: ShiftDataset) -> None:
    names = dataset.domain_names
    assert len(set(names)) == len(names) == dataset.n_domains
    assert len(SOURCE) >= 5 and len(EXTRA) >= 2
    assert SOURCE | EXTRA | {ds.VAL_STYLE.name, ds.TEST_STYLE.name} == set(names)
    for name, split in dataset.splits.items():
        used = {names[i] for i in split.domain.unique().tolist()}
        assert used == INTENDED_DOMAINS[name], name


def test_every_labeled_split_has_all_classes(dataset: ShiftDataset) -> None:
    for name in LABELED_SPLITS:
        assert set(dataset.split(name).y.unique().tolist()) == set(range(10)), name
