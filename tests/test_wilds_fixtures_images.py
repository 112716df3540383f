"""camelyon17, iwildcam, fmow and poverty load through the real wilds 2.0.0 classes from tiny fixtures.

There is no internet here, so the fixtures (tests/wilds_fixtures/) are written in the exact on-disk
format the wilds loaders read with download=False; these tests prove that by loading them through
`wilds.get_dataset`, drawing batches with wilds' own loaders and scoring with `dataset.eval`. They also
pin `raybench.data.wilds.layouts.*.missing_files`, which `raybench data check` relies on: it must be
empty on a complete copy and name exactly the file a loader would fail on.
"""
from __future__ import annotations

import builtins
import dataclasses
import hashlib
import importlib
import os
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import torch
import torch.nn.functional as F

from raybench.data.wilds import compat

compat.apply()

import wilds
from torchvision.transforms.functional import to_tensor
from wilds.common.data_loaders import get_train_loader
from wilds.common.grouper import CombinatorialGrouper

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # tests/wilds_fixtures is imported as a package from the repository root
    sys.path.insert(0, str(REPO))


@dataclasses.dataclass(frozen=True)
class Case:
    """What the official split scheme and the WILDS 2.0 paper promise for one dataset."""
    name: str
    splits: frozenset[str]  # labeled splits of the official scheme
    unlabeled_splits: frozenset[str]  # what the unlabeled class defines
    paper_unlabeled_split: str
    domain: str  # the field the paper's group methods group by
    eval_split: str
    selection_metric: str
    input_shape: tuple[int, ...]
    metadata_csv: str  # relative to the fixture root
    unlabeled_metadata_csv: str
    release: str
    unlabeled_release: str | None  # None: the unlabeled class does not look for one
    images_are_pil: bool = True

    @property
    def fixture(self) -> ModuleType:
        return importlib.import_module(f"tests.wilds_fixtures.{self.name}")

    @property
    def layout(self) -> ModuleType:
        return importlib.import_module(f"raybench.data.wilds.layouts.{self.name}")


ALL_FIVE = frozenset({"train", "id_val", "id_test", "val", "test"})
THREE_UNLABELED = frozenset({"train_unlabeled", "val_unlabeled", "test_unlabeled"})
CASES = [
    Case("camelyon17", frozenset({"train", "id_val", "val", "test"}), THREE_UNLABELED, "test_unlabeled",
         "hospital", "test", "acc_avg", (3, 96, 96),
         "camelyon17_v1.0/metadata.csv", "camelyon17_unlabeled_v1.0/metadata.csv",
         "camelyon17_v1.0/RELEASE_v1.0.txt", "camelyon17_unlabeled_v1.0/RELEASE_v1.0.txt"),
    Case("iwildcam", ALL_FIVE, frozenset({"extra_unlabeled"}), "extra_unlabeled",
         "location", "test", "F1-macro_all", (3, 48, 64),
         "iwildcam_v2.0/metadata.csv", "iwildcam_unlabeled_v1.0/metadata.csv",
         "iwildcam_v2.0/RELEASE_v2.0.txt", "iwildcam_unlabeled_v1.0/RELEASE_v1.0.txt"),
    Case("fmow", ALL_FIVE, THREE_UNLABELED, "test_unlabeled",
         "year", "test", "acc_worst_region", (3, 224, 224),
         "fmow_v1.1/rgb_metadata.csv", "fmow_v1.1/rgb_metadata.csv", "fmow_v1.1/RELEASE_v1.1.txt", None),
    Case("poverty", ALL_FIVE, THREE_UNLABELED, "test_unlabeled",
         "country", "test", "r_wg", (8, 224, 224),
         "poverty_v1.1/dhs_metadata.csv", "poverty_unlabeled_v1.0/unlabeled_metadata.csv",
         "poverty_v1.1/RELEASE_v1.1.txt", "poverty_unlabeled_v1.0/RELEASE_v1.0.txt", images_are_pil=False),
]
BY_NAME = {case.name: case for case in CASES}
cases = pytest.mark.parametrize("case", CASES, ids=lambda case: case.name)


# ----- fixtures ----------------------------------------------------------------------------------
@pytest.fixture(scope="module", autouse=True)
def camelyon_unlabeled_loads() -> Iterator[None]:
    """Route get_dataset("camelyon17", unlabeled=True) to the fixture class (see its module)."""
    with pytest.MonkeyPatch.context() as monkeypatch:
        BY_NAME["camelyon17"].fixture.patched_unlabeled_class(monkeypatch)
        yield


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """All four fixtures side by side, as in a real WILDS root_dir."""
    path = tmp_path_factory.mktemp("wilds-images")
    for case in CASES:
        case.fixture.write(path)
    return path


@pytest.fixture(scope="module")
def loaded(root: Path) -> Callable[[str, bool], Any]:
    """Each dataset loaded once for the read-only tests."""
    cache: dict[tuple[str, bool], Any] = {}

    def get(name: str, unlabeled: bool) -> Any:
        if (name, unlabeled) not in cache:
            cache[name, unlabeled] = load(name, root, unlabeled)
        return cache[name, unlabeled]
    return get


def load(name: str, root: Path, unlabeled: bool) -> Any:
    return wilds.get_dataset(name, unlabeled=unlabeled, root_dir=str(root), download=False)


def transform(case: Case) -> Callable | None:
    """PIL images become tensors so the default collate can batch them; poverty already yields tensors."""
    return to_tensor if case.images_are_pil else None


def first_batch(loader: Any) -> Any:
    return next(iter(loader))


# ----- loading, splits, loaders ------------------------------------------------------------------
@cases
def test_every_official_and_unlabeled_split_has_examples(case: Case, loaded: Callable) -> None:
    labeled, unlabeled = loaded(case.name, False), loaded(case.name, True)
    assert set(labeled.split_dict) == case.splits
    assert set(unlabeled.split_dict) == case.unlabeled_splits
    assert case.paper_unlabeled_split in unlabeled.split_dict
    sizes = {split: len(labeled.get_subset(split)) for split in case.splits}
    sizes |= {split: len(unlabeled.get_subset(split)) for split in case.unlabeled_splits}
    assert min(sizes.values()) > 0, sizes


@cases
def test_standard_group_and_unlabeled_loaders_give_batches(case: Case, loaded: Callable) -> None:
    labeled, unlabeled = loaded(case.name, False), loaded(case.name, True)
    train = labeled.get_subset("train", transform=transform(case))
    n_fields = len(labeled.metadata_fields)

    x, y, metadata = first_batch(get_train_loader("standard", train, batch_size=4))
    assert x.shape == (4, *case.input_shape) and len(y) == 4 and metadata.shape == (4, n_fields)

    grouper = CombinatorialGrouper(labeled, [case.domain])
    group_loader = get_train_loader("group", train, grouper=grouper, n_groups_per_batch=2, batch_size=4)
    x, y, metadata = first_batch(group_loader)
    assert x.shape == (4, *case.input_shape)
    assert len(grouper.metadata_to_group(metadata).unique()) == 2  # two domains, two examples each

    pool = unlabeled.get_subset(case.paper_unlabeled_split, transform=transform(case))
    x, metadata = first_batch(get_train_loader("standard", pool, batch_size=4))
    assert x.shape == (4, *case.input_shape) and metadata.shape == (4, len(unlabeled.metadata_fields))


# ----- evaluation --------------------------------------------------------------------------------
def model_outputs(labeled: Any, y_true: torch.Tensor, shift: int) -> torch.Tensor:
    """What a model emits: logits over all classes (argmax = y + shift), or a (n, 1) regression output."""
    if labeled.is_classification:
        return F.one_hot((y_true + shift) % labeled.n_classes, labeled.n_classes).float() * 5.0
    return y_true.clone().float() * (-1.0 if shift else 1.0)


def selection_metric(case: Case, labeled: Any, y_pred: torch.Tensor, subset: Any) -> float:
    kwargs = {"prediction_fn": lambda logits: logits.argmax(dim=1)} if labeled.is_classification else {}
    results, _ = labeled.eval(y_pred, subset.y_array, subset.metadata_array, **kwargs)
    return results[case.selection_metric]


@cases
def test_eval_selection_metric_is_best_only_for_right_predictions(case: Case, loaded: Callable) -> None:
    labeled = loaded(case.name, False)
    subset = labeled.get_subset(case.eval_split)
    perfect = selection_metric(case, labeled, model_outputs(labeled, subset.y_array, 0), subset)
    wrong = selection_metric(case, labeled, model_outputs(labeled, subset.y_array, 1), subset)
    assert perfect == pytest.approx(1.0)
    assert wrong <= 0.0  # every prediction wrong: accuracy/F1 0; negated wealth: r = -1


# ----- missing_files -----------------------------------------------------------------------------
@cases
def test_missing_files_is_empty_on_a_complete_copy(case: Case, root: Path) -> None:
    assert case.layout.missing_files(root, unlabeled=False) == []
    assert case.layout.missing_files(root, unlabeled=True) == []


def file_read_for(dataset: Any, index: int) -> Path:
    """The one file the loader opens to produce example `index` (recorded, not predicted)."""
    opened: list[Path] = []
    real_open = builtins.open

    def recording_open(file: Any, *args: Any, **kwargs: Any) -> Any:
        opened.append(Path(os.fspath(file)))
        return real_open(file, *args, **kwargs)
    with pytest.MonkeyPatch.context() as monkeypatch:
        monkeypatch.setattr(builtins, "open", recording_open)
        dataset[index]
    (path,) = set(opened)
    return path


def sample_indices(dataset: Any) -> set[int]:
    """First and last example of every split and of the whole dataset (rows outside every split too)."""
    indices = {0, len(dataset) - 1}
    for split in dataset.split_dict:
        subset_indices = dataset.get_subset(split).indices
        indices |= {int(subset_indices[0]), int(subset_indices[-1])}
    return indices


def delete_input_files(data_dir: Path) -> None:
    for path in [*data_dir.rglob("*.png"), *data_dir.rglob("*.jpg"), *data_dir.rglob("*.npz")]:
        path.unlink()


def check_release_file(case: Case, unlabeled: bool, root: Path) -> None:
    """Without its RELEASE file wilds tries to download (refused offline): named exactly where it is needed.

    The labeled copy's RELEASE goes too, which an unlabeled copy must not need (fmow's unlabeled class
    reads the labeled folder but only checks that the folder exists)."""
    needed = case.unlabeled_release if unlabeled else case.release
    removed = {path: (root / path).read_bytes() for path in {case.release, needed} - {None}}
    for path in removed:
        (root / path).unlink()
    if needed is None:
        assert case.layout.missing_files(root, unlabeled) == []
        load(case.name, root, unlabeled)
    else:
        assert case.layout.missing_files(root, unlabeled) == [needed]
        with pytest.raises(FileNotFoundError):
            load(case.name, root, unlabeled)
    for path, content in removed.items():
        (root / path).write_bytes(content)


@cases
@pytest.mark.parametrize("unlabeled", [False, True], ids=["labeled", "unlabeled"])
def test_missing_files_names_exactly_what_the_loader_would_fail_on(
        case: Case, unlabeled: bool, tmp_path: Path) -> None:
    case.fixture.write(tmp_path)
    check_release_file(case, unlabeled, tmp_path)
    dataset = load(case.name, tmp_path, unlabeled)
    relative = {index: file_read_for(dataset, index).relative_to(tmp_path).as_posix()
                for index in sample_indices(dataset)}
    index = int(dataset.get_subset(case.paper_unlabeled_split if unlabeled else "train").indices[0])

    (tmp_path / relative[index]).unlink()  # one image: exactly that path
    assert case.layout.missing_files(tmp_path, unlabeled) == [relative[index]]
    with pytest.raises(FileNotFoundError):
        dataset[index]

    delete_input_files(Path(dataset.data_dir))  # every image: one path per example, the loader's names
    missing = case.layout.missing_files(tmp_path, unlabeled)
    assert len(missing) == len(set(missing)) == len(dataset)
    assert set(relative.values()) <= set(missing)

    metadata = case.unlabeled_metadata_csv if unlabeled else case.metadata_csv
    (tmp_path / metadata).unlink()  # no metadata: it is named, and the images cannot be listed
    assert case.layout.missing_files(tmp_path, unlabeled) == [metadata]
    with pytest.raises(FileNotFoundError):
        load(case.name, tmp_path, unlabeled)


# ----- the fixtures themselves -------------------------------------------------------------------
def tree_digest(root: Path) -> dict[str, str]:
    return {path.relative_to(root).as_posix(): hashlib.sha1(path.read_bytes()).hexdigest()
            for path in sorted(root.rglob("*")) if path.is_file()}


@cases
def test_fixture_is_deterministic(case: Case, tmp_path: Path) -> None:
    case.fixture.write(tmp_path / "a")
    case.fixture.write(tmp_path / "b")
    assert tree_digest(tmp_path / "a") == tree_digest(tmp_path / "b")


def test_camelyon_unlabeled_fixture_class_differs_from_the_real_one_only_by_the_size_asserts(root: Path) -> None:
    fixture = BY_NAME["camelyon17"].fixture
    fixture_class = fixture.unlabeled_class()
    real_class = fixture_class.__bases__[0]
    with pytest.raises(AssertionError):  # the full-size row counts: why the fixture class exists
        real_class(root_dir=str(root), download=False)

    dataset = load("camelyon17", root, unlabeled=True)
    assert type(dataset) is fixture_class and isinstance(dataset, real_class)
    centers = dataset.metadata_array[:, dataset.metadata_fields.index("hospital")]
    expected_split = torch.where(centers == 1, 11, torch.where(centers == 2, 12, 10))
    assert torch.equal(torch.as_tensor(dataset.split_array), expected_split)
    assert (dataset.metadata_array[:, dataset.metadata_fields.index("y")] == -100).all()  # 100 x tumor (-1)
