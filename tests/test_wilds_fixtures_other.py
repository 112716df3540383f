"""globalwheat, ogb-molpcba, civilcomments, amazon: the real wilds 2.0.0 loaders on tiny written fixtures.

There is no network here, so each dataset is proven on a fixture the test writes in the exact on-disk format
(`tests/wilds_fixtures/<dataset>.py`): the labeled and unlabeled classes load with download=False, every
split has examples, wilds' standard, group and unlabeled loaders yield batches, `dataset.eval` gives the
paper's selection metric its best value for perfect predictions and a lower one for wrong predictions, and
the layout modules (`raybench.data.wilds.layouts`) name exactly the file that is missing.
"""
from __future__ import annotations

import filecmp
import importlib.util
import io
import pathlib
from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import numpy as np
import pandas as pd
import pytest
import torch

from raybench.data.wilds import compat

compat.apply()

import wilds
from wilds.common.data_loaders import get_train_loader
from wilds.common.grouper import CombinatorialGrouper

from raybench.data.wilds.layouts import amazon as amazon_layout
from raybench.data.wilds.layouts import civilcomments as civilcomments_layout
from raybench.data.wilds.layouts import globalwheat as globalwheat_layout
from raybench.data.wilds.layouts import ogb_molpcba as ogb_layout

FIXTURES = pathlib.Path(__file__).parent / "wilds_fixtures"
BATCH = 4
GROUPS_PER_BATCH = 2


def fixture_module(name: str) -> ModuleType:
    """Load `tests/wilds_fixtures/<name>.py` by path: that folder is not a package yet."""
    spec = importlib.util.spec_from_file_location(f"_wilds_fixture_{name}", FIXTURES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# ----- what differs per dataset ----------------------------------------------------------------------
def first_val_image(root: pathlib.Path) -> str:
    """A labeled image an OOD validation example needs."""
    name = pd.read_csv(root / "globalwheat_v1.1" / "official_val.csv")["image_name"].iloc[0]
    return f"globalwheat_v1.1/images/{name}"


def first_test_unlabeled_image(root: pathlib.Path) -> str:
    name = pd.read_csv(root / "globalwheat_unlabeled_v1.0" / "official_test_unlabeled.csv")["image_name"].iloc[0]
    return f"globalwheat_unlabeled_v1.0/images/{name}"


def fixed(path: str) -> Callable[[pathlib.Path], str]:
    return lambda root: path


@dataclass(frozen=True)
class Case:
    """One dataset: its wilds name, fixture / layout modules, grouping, paper split and selection metric."""
    name: str
    module: str
    layout: ModuleType
    domain_fields: list[str]
    unlabeled_split: str
    selection_metric: str
    # (file to delete, whether the unlabeled check should report it, whether the labeled one should)
    deletions: list[tuple[Callable[[pathlib.Path], str], bool, bool]]
    empty_unlabeled_splits: tuple[str, ...] = ()
    transform: Callable[[Any], Any] | None = None


def image_to_tensor(image: Any) -> torch.Tensor:
    """PIL image -> float CHW tensor: GlobalWheat's collate stacks x, so it must be a tensor."""
    return torch.from_numpy(np.asarray(image.convert("RGB"), dtype=np.float32) / 255.0).permute(2, 0, 1)


CASES = {
    "globalwheat": Case(
        "globalwheat", "globalwheat", globalwheat_layout, ["session"], "test_unlabeled", "detection_acc_avg_dom",
        deletions=[(first_val_image, False, True), (first_test_unlabeled_image, True, False)],
        transform=image_to_tensor),
    "ogb-molpcba": Case(
        "ogb-molpcba", "ogb_molpcba", ogb_layout, ["scaffold"], "test_unlabeled", "ap",
        deletions=[(fixed("ogbg_molpcba/raw/edge.csv.gz"), False, True),
                   (fixed("molpcba_unlabeled/raw/data.npz"), True, False)],
        empty_unlabeled_splits=("extra_unlabeled",)),  # wilds' molpcba has no extra split
    "civilcomments": Case(
        "civilcomments", "civilcomments", civilcomments_layout, ["black", "y"], "extra_unlabeled", "acc_wg",
        deletions=[(fixed("civilcomments_v1.0/all_data_with_identities.csv"), False, True),
                   (fixed("civilcomments_unlabeled_v1.0/unlabeled_data_with_identities.csv"), True, False)]),
    "amazon": Case(
        "amazon", "amazon", amazon_layout, ["user"], "test_unlabeled", "10th_percentile_acc",
        deletions=[(fixed("amazon_v2.1/reviews.csv"), True, True)]),  # both classes read the one CSV
}


@dataclass
class Loaded:
    case: Case
    root: pathlib.Path
    labeled: Any
    unlabeled: Any


def load(case: Case, root: pathlib.Path, unlabeled: bool) -> Any:
    return wilds.get_dataset(case.name, unlabeled=unlabeled, root_dir=str(root), download=False)


@pytest.fixture(scope="module", params=list(CASES))
def loaded(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Loaded:
    case = CASES[request.param]
    root = tmp_path_factory.mktemp(case.module)
    fixture_module(case.module).write(root)
    return Loaded(case, root, load(case, root, unlabeled=False), load(case, root, unlabeled=True))


# ----- helpers ----------------------------------------------------------------------------------------
def batch_size(x: Any) -> int:
    """Examples in a collated x: a PyG batch, a stacked tensor or a list of strings."""
    if hasattr(x, "num_graphs"):
        return int(x.num_graphs)
    return len(x)


def files_under(folder: pathlib.Path) -> list[pathlib.Path]:
    return sorted(path.relative_to(folder) for path in folder.rglob("*") if path.is_file())


def split_targets(dataset: Any, split: str) -> tuple[Any, torch.Tensor]:
    """(y_true, metadata) of a split as the eval loop gathers them (GlobalWheat's y is a list of dicts)."""
    indices = dataset.get_subset(split).indices
    if isinstance(dataset.y_array, list):
        return [dataset.y_array[i] for i in indices], dataset.metadata_array[indices]
    return dataset.y_array[indices], dataset.metadata_array[indices]


def shifted_boxes(target: dict, by_half_width: bool) -> dict:
    """A detection for one image: the true boxes, or each moved right by half its width (IoU 1/3 < 0.5)."""
    boxes = target["boxes"].float().clone()
    if by_half_width:
        boxes[:, [0, 2]] += ((boxes[:, 2] - boxes[:, 0]) / 2).unsqueeze(1)
    return {"boxes": boxes, "labels": torch.ones(len(boxes), dtype=torch.long), "scores": torch.full((len(boxes),), 0.9)}


def model_predictions(name: str, y_true: Any, wrong: bool) -> Any:
    """Model-shaped predictions that are all right, or mostly wrong."""
    if name == "globalwheat":
        return [shifted_boxes(target, by_half_width=wrong) for target in y_true]
    if name == "ogb-molpcba":
        logits = torch.where(y_true == 1, 4.0, -4.0)
        logits[torch.isnan(y_true)] = 0.0  # unmeasured: ignored by the metric
        return -logits if wrong else logits
    if name == "civilcomments":
        return 1 - y_true if wrong else y_true.clone()
    return (y_true + 1) % 5 if wrong else y_true.clone()  # amazon: star ratings 0..4


# ----- loading ----------------------------------------------------------------------------------------
def test_every_labeled_split_has_examples_from_several_domains(loaded: Loaded) -> None:
    grouper = CombinatorialGrouper(loaded.labeled, loaded.case.domain_fields)
    for split in loaded.labeled.split_dict:
        subset = loaded.labeled.get_subset(split)
        groups = grouper.metadata_to_group(subset.metadata_array).unique()
        assert len(subset) >= 12, split
        assert len(groups) >= 2, f"{split} has one {loaded.case.domain_fields} group"


def test_unlabeled_splits_have_examples(loaded: Loaded) -> None:
    assert len(loaded.unlabeled.get_subset(loaded.case.unlabeled_split)) >= 12
    for split in loaded.unlabeled.split_dict:
        expected_empty = split in loaded.case.empty_unlabeled_splits
        assert (len(loaded.unlabeled.get_subset(split)) == 0) == expected_empty, split


def test_standard_loader_batch(loaded: Loaded) -> None:
    train = loaded.labeled.get_subset("train", transform=loaded.case.transform)
    assert train.collate is loaded.labeled.collate  # get_train_loader passes the subset's own collate_fn
    x, y, metadata = next(iter(get_train_loader("standard", train, batch_size=BATCH)))
    assert batch_size(x) == len(y) == BATCH
    assert metadata.shape == (BATCH, len(loaded.labeled.metadata_fields))


def test_group_loader_batch_has_two_groups(loaded: Loaded) -> None:
    grouper = CombinatorialGrouper(loaded.labeled, loaded.case.domain_fields)
    train = loaded.labeled.get_subset("train", transform=loaded.case.transform)
    loader = get_train_loader("group", train, grouper=grouper, n_groups_per_batch=GROUPS_PER_BATCH,
                              batch_size=BATCH)
    x, y, metadata = next(iter(loader))
    assert batch_size(x) == len(y) == BATCH
    assert len(grouper.metadata_to_group(metadata).unique()) == GROUPS_PER_BATCH


def test_unlabeled_loader_batch(loaded: Loaded) -> None:
    subset = loaded.unlabeled.get_subset(loaded.case.unlabeled_split, transform=loaded.case.transform)
    x, metadata = next(iter(get_train_loader("standard", subset, batch_size=BATCH)))
    assert batch_size(x) == BATCH
    assert metadata.shape == (BATCH, len(loaded.unlabeled.metadata_fields))


# ----- evaluation -------------------------------------------------------------------------------------
@pytest.mark.parametrize("split", ["val", "test"])
def test_selection_metric_is_best_for_perfect_predictions(loaded: Loaded, split: str) -> None:
    y_true, metadata = split_targets(loaded.labeled, split)
    metric = loaded.case.selection_metric
    perfect, _ = loaded.labeled.eval(model_predictions(loaded.case.name, y_true, wrong=False), y_true, metadata)
    wrong, _ = loaded.labeled.eval(model_predictions(loaded.case.name, y_true, wrong=True), y_true, metadata)
    assert float(perfect[metric]) == pytest.approx(1.0)
    assert float(wrong[metric]) < 0.5


def test_civilcomments_has_all_16_eval_groups(tmp_path: pathlib.Path) -> None:
    """acc_wg is a minimum over 8 identities x 2 labels, where an empty group would count as 0."""
    case = CASES["civilcomments"]
    fixture_module(case.module).write(tmp_path)
    dataset = load(case, tmp_path, unlabeled=False)
    for split in ("val", "test"):
        y_true, metadata = split_targets(dataset, split)
        results, _ = dataset.eval(y_true.clone(), y_true, metadata)
        counts = {key: value for key, value in results.items() if key.startswith("count_")}
        assert len(counts) == 16 and min(counts.values()) > 0, (split, counts)


# ----- layouts ----------------------------------------------------------------------------------------
def test_missing_files_is_empty_on_a_loaded_fixture(loaded: Loaded) -> None:
    assert loaded.case.layout.missing_files(loaded.root, unlabeled=False) == []
    assert loaded.case.layout.missing_files(loaded.root, unlabeled=True) == []


@pytest.mark.parametrize("name", list(CASES))
def test_missing_files_names_exactly_the_deleted_file(name: str, tmp_path: pathlib.Path) -> None:
    case = CASES[name]
    fixture_module(case.module).write(tmp_path)
    for unlabeled in (False, True):
        assert case.layout.missing_files(tmp_path, unlabeled=unlabeled) == [], unlabeled
    for path_of, reported_unlabeled, reported_labeled in case.deletions:
        path = path_of(tmp_path)
        (tmp_path / path).rename(tmp_path / (path + ".moved"))
        assert case.layout.missing_files(tmp_path, unlabeled=True) == ([path] if reported_unlabeled else [])
        assert case.layout.missing_files(tmp_path, unlabeled=False) == ([path] if reported_labeled else [])
        assert_load_fails(case, tmp_path, path, unlabeled=reported_unlabeled and not reported_labeled)
        (tmp_path / (path + ".moved")).rename(tmp_path / path)


def assert_load_fails(case: Case, root: pathlib.Path, path: str, unlabeled: bool) -> None:
    """The file the layout names is really needed: loading, or fetching the example that uses it, fails."""
    with pytest.raises(FileNotFoundError):  # compat.MissingDataError is a FileNotFoundError too
        dataset = load(case, root, unlabeled=unlabeled)
        names = list(getattr(dataset, "_image_array", []))
        dataset[names.index(pathlib.PurePosixPath(path).name)]


def test_ogb_layout_needs_processing_inputs_only_until_processed(tmp_path: pathlib.Path) -> None:
    fixture_module("ogb_molpcba").write(tmp_path)
    counts = tmp_path / "ogbg_molpcba" / "raw" / "num-node-list.csv.gz"
    counts.rename(counts.with_suffix(".moved"))
    assert ogb_layout.missing_files(tmp_path, unlabeled=False) == ["ogbg_molpcba/raw/num-node-list.csv.gz"]
    counts.with_suffix(".moved").rename(counts)
    load(CASES["ogb-molpcba"], tmp_path, unlabeled=False)  # writes processed/geometric_data_processed.pt
    counts.unlink()
    assert ogb_layout.missing_files(tmp_path, unlabeled=False) == []
    load(CASES["ogb-molpcba"], tmp_path, unlabeled=False)


# ----- ogb never downloads or prompts -------------------------------------------------------------------
@pytest.mark.parametrize("folder,unlabeled", [("ogbg_molpcba", False), ("molpcba_unlabeled", True)])
def test_ogb_without_release_file_raises_instead_of_prompting(
        folder: str, unlabeled: bool, tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """ogb would ask on stdin whether to delete the folder: a 'y' waiting there must not be read."""
    fixture_module("ogb_molpcba").write(tmp_path)
    (tmp_path / folder / "RELEASE_v1.txt").unlink()
    before = files_under(tmp_path / folder)
    monkeypatch.setattr("sys.stdin", io.StringIO("y\n"))
    with pytest.raises(compat.MissingDataError):
        load(CASES["ogb-molpcba"], tmp_path, unlabeled=unlabeled)
    assert files_under(tmp_path / folder) == before, "ogb deleted the dataset folder"


@pytest.mark.parametrize("unlabeled", [False, True])
def test_ogb_without_folder_raises_instead_of_downloading(unlabeled: bool, tmp_path: pathlib.Path) -> None:
    with pytest.raises(compat.MissingDataError):
        load(CASES["ogb-molpcba"], tmp_path, unlabeled=unlabeled)
    assert not list(tmp_path.rglob("*.zip")) and not list(tmp_path.rglob("*.csv.gz"))


# ----- the fixtures themselves --------------------------------------------------------------------------
@pytest.mark.parametrize("name", list(CASES))
def test_fixture_is_deterministic(name: str, tmp_path: pathlib.Path) -> None:
    writer = fixture_module(CASES[name].module)
    writer.write(tmp_path / "a")
    writer.write(tmp_path / "b")
    files = files_under(tmp_path / "a")
    assert files and files == files_under(tmp_path / "b")
    _, mismatch, errors = filecmp.cmpfiles(tmp_path / "a", tmp_path / "b", [str(f) for f in files], shallow=False)
    assert mismatch == [] and errors == []
