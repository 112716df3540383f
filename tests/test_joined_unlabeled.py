"""Joined unlabeled splits ("a+b", all_unlabeled): WILDS's SwAV pre-training reads every unlabeled split of
`--splits` as one dataset, the parts' rows in order (p-lambda/wilds examples/pretraining/swav/src/
multicropdataset.py lines 43-60). Checked on the real digits-shift data and on fake lazy inputs."""
from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from raybench.data import UNLABELED_SPLITS, ShiftDataset, load_dataset
from raybench.data.base import ALL_UNLABELED, JoinedInputs, Records, join_inputs
from raybench.trainer.config import ConfigError, TrainConfig


@pytest.fixture(scope="module")
def digits(shared_data_dir: Path) -> ShiftDataset:
    """digits-shift from $RAYBENCH_DATA_DIR when set (a cache built already), else the session's shared dir."""
    return load_dataset("digits-shift", Path(os.environ.get("RAYBENCH_DATA_DIR") or shared_data_dir), 0)


def expected_rows(dataset: ShiftDataset, parts: tuple[str, ...], index: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """x, domain and group of joined row `index`, read from the parts directly."""
    xs, domains, groups = [], [], []
    for i in index.tolist():
        for name in parts:
            n = len(dataset.splits[name])
            if i < n:
                batch = dataset.splits[name].take(torch.tensor([i]))
                xs.append(batch.x), domains.append(batch.domain), groups.append(batch.group)
                break
            i -= n
        else:
            raise AssertionError(f"row {i} past the parts")
    return torch.cat(xs), torch.cat(domains), torch.cat(groups)


def boundaries(dataset: ShiftDataset, parts: tuple[str, ...]) -> torch.Tensor:
    """The first and last row of every part, in joined numbering."""
    rows, start = [], 0
    for name in parts:
        n = len(dataset.splits[name])
        rows += [start, start + 1, start + n - 1]
        start += n
    return torch.tensor(rows)


def assert_rows(dataset: ShiftDataset, name: str, parts: tuple[str, ...], index: torch.Tensor) -> None:
    batch = dataset.split(name).take(index)
    x, domain, group = expected_rows(dataset, parts, index)
    assert torch.equal(batch.x, x) and torch.equal(batch.domain, domain) and torch.equal(batch.group, group)


def test_all_unlabeled_is_every_unlabeled_split_in_order(digits):
    parts = tuple(s for s in UNLABELED_SPLITS if s in digits.splits)
    assert len(parts) == 4  # digits-shift has all four, so the join is a real one
    assert digits.unlabeled_split_names(ALL_UNLABELED) == parts
    joined = digits.split(ALL_UNLABELED)
    assert joined.name == ALL_UNLABELED and not joined.labeled
    assert len(joined) == sum(len(digits.splits[s]) for s in parts)
    assert len(joined.domain) == len(joined.group) == len(joined)
    assert_rows(digits, ALL_UNLABELED, parts, boundaries(digits, parts))
    # the whole of it, not only sampled rows: the parts back to back
    assert torch.equal(joined.x, torch.cat([digits.splits[s].x for s in parts]))
    assert torch.equal(joined.domain, torch.cat([digits.splits[s].domain for s in parts]))
    assert digits.split(ALL_UNLABELED) is joined  # built once and kept
    assert digits.has_split(ALL_UNLABELED)


def test_plus_joined_name_keeps_the_written_order(digits):
    parts = ("test_unlabeled", "train_unlabeled")  # not UNLABELED_SPLITS order: the order written wins
    name = "+".join(parts)
    assert digits.unlabeled_split_names(name) == parts and digits.has_split(name)
    joined = digits.split(name)
    assert joined.name == name
    assert len(joined) == len(digits.splits["test_unlabeled"]) + len(digits.splits["train_unlabeled"])
    assert_rows(digits, name, parts, boundaries(digits, parts))
    n_test = len(digits.splits["test_unlabeled"])
    assert torch.equal(joined.x[:n_test], digits.splits["test_unlabeled"].x)
    assert torch.equal(joined.x[n_test:], digits.splits["train_unlabeled"].x)


def test_random_index_gathers_the_parts_rows(digits):
    parts = tuple(s for s in UNLABELED_SPLITS if s in digits.splits)
    joined = digits.split(ALL_UNLABELED)
    index = torch.randperm(len(joined), generator=torch.Generator().manual_seed(0))[:257]
    assert_rows(digits, ALL_UNLABELED, parts, index)


def test_single_real_split_is_unchanged(digits):
    assert digits.split("test_unlabeled") is digits.splits["test_unlabeled"]
    assert digits.unlabeled_split_names("test_unlabeled") == ("test_unlabeled",)
    assert digits.has_split("train") and digits.has_split("test_unlabeled")


@pytest.mark.parametrize("name, bad, why", [
    ("train+test_unlabeled", "'train'", "labeled"),
    ("test_unlabeled+nope_unlabeled", "'nope_unlabeled'", "not a split"),
    ("test_unlabeled+val_unlabeled+test_unlabeled", "'test_unlabeled'", "twice"),
    ("test_unlabeled+", "''", "not a split"),
    ("all_unlabeled+test_unlabeled", "'all_unlabeled'", "not a split"),
])
def test_bad_parts_raise_one_line_key_errors(digits, name, bad, why):
    assert not digits.has_split(name)
    for call in (digits.split, digits.unlabeled_split_names):
        with pytest.raises(KeyError) as err:
            call(name)
        message = err.value.args[0]
        assert "\n" not in message and bad in message and why in message
        assert all(s in message for s in UNLABELED_SPLITS)  # names the dataset's unlabeled splits
    assert name not in digits._joined


def test_all_unlabeled_without_unlabeled_splits(digits):
    import dataclasses

    labeled_only = dataclasses.replace(digits, splits={k: v for k, v in digits.splits.items() if v.labeled})
    assert not labeled_only.has_split(ALL_UNLABELED)
    with pytest.raises(KeyError, match="no unlabeled split"):
        labeled_only.split(ALL_UNLABELED)


def test_config_accepts_joined_names_and_refuses_labeled_parts(digits):
    resolved = TrainConfig.from_flat({"algorithm": "pseudolabel", "unlabeled_split": ALL_UNLABELED}).resolve(digits)
    assert resolved.unlabeled_split == ALL_UNLABELED
    TrainConfig.from_flat({"algorithm": "pseudolabel", "unlabeled_split": "val_unlabeled+test_unlabeled"}).resolve(digits)
    with pytest.raises(ConfigError) as err:
        TrainConfig.from_flat({"algorithm": "pseudolabel", "unlabeled_split": "train+test_unlabeled"}).resolve(digits)
    assert err.value.key == "unlabeled_split"
    assert "train+test_unlabeled" in str(err.value) and "all_unlabeled" in str(err.value) and "+" in err.value.detail


# ----- JoinedInputs over lazy inputs -----------------------------------------------------------------------
class FakeLazy:
    """Lazy inputs that log every read: row i is the value base + i, in a (n, 2) tensor."""

    def __init__(self, n: int, base: int) -> None:
        self.n, self.base, self.reads = n, base, []

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, index):
        ids = torch.tensor(range(self.n)[index]) if isinstance(index, slice) else torch.as_tensor(index).reshape(-1)
        self.reads.append(ids.tolist())
        return torch.stack([ids + self.base, -(ids + self.base)], dim=1)


class FakeTexts(FakeLazy):
    def __getitem__(self, index):
        return [f"row{int(v)}" for v in super().__getitem__(index)[:, 0]]


def expected(values: list[int]) -> torch.Tensor:
    v = torch.tensor(values)
    return torch.stack([v, -v], dim=1)


def test_joined_inputs_keep_requested_order_for_a_shuffled_index():
    a, b = FakeLazy(5, 100), FakeLazy(3, 200)
    joined = join_inputs([a, b])
    assert isinstance(joined, JoinedInputs) and len(joined) == 8
    index = torch.tensor([6, 0, 4, 5, 1, 7, 3, 2])
    flat = [100, 101, 102, 103, 104, 200, 201, 202]
    assert torch.equal(joined[index], expected([flat[i] for i in index]))
    assert len(a.reads) == len(b.reads) == 1  # one read per part, not one per row
    assert torch.equal(joined[torch.tensor([-1, 0])], expected([202, 100]))
    assert joined[torch.tensor([], dtype=torch.long)].shape == (0, 2)
    with pytest.raises(IndexError):
        joined[torch.tensor([8])]


def test_joined_inputs_slices():
    joined = JoinedInputs([FakeLazy(5, 100), FakeLazy(3, 200)])
    flat = [100, 101, 102, 103, 104, 200, 201, 202]
    assert torch.equal(joined[3:7], expected(flat[3:7]))  # across the boundary
    assert torch.equal(joined[5:8], expected(flat[5:8]))  # the second part only
    assert torch.equal(joined[::-3], expected(flat[::-3]))  # backwards across parts
    assert torch.equal(joined[:], expected(flat))


def test_joined_inputs_of_lists_reorder_the_list():
    joined = JoinedInputs([FakeTexts(2, 0), FakeTexts(2, 10), FakeTexts(1, 20)])
    assert joined[torch.tensor([4, 1, 2, 0])] == ["row20", "row1", "row10", "row0"]
    assert joined[1:4] == ["row1", "row10", "row11"]


def test_join_inputs_keeps_tensors_and_records_concrete():
    assert torch.equal(join_inputs([torch.arange(2), torch.arange(3)]), torch.tensor([0, 1, 0, 1, 2]))
    records = join_inputs([Records(["a", "b"]), Records(["c"])])
    assert isinstance(records, Records) and records.items == ["a", "b", "c"]
