"""SpuCoMNIST (spuco-digits, spuco-fashion): spurious pixels, group sizes, noise, metrics, pools, caching."""
from __future__ import annotations

from itertools import combinations
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from helpers.system_packages import require_system_package

from raybench.data import DATASETS, ShiftDataset, TaskKind, load_dataset, spuco
from raybench.data.base import MIN_GROUP_EXAMPLES, warn_small_groups

# Sizes the module docstring promises; written out so a change to the constants is noticed.
DOCUMENTED_SIZES = {"train": 50_000, "val": 12_500, "test": 2_500}
# spuco-fashion: all 70,000 Fashion-MNIST images, each rendered once (train file 80/20 into train/val).
FASHION_SIZES = {"train": 48_000, "val": 12_000, "test": 10_000}
# Per class in train and val: (majority, each of the 4 minority groups); val is group-balanced; test: every group.
FASHION_GROUPS = {"train": (9_552, 12), "val": (480, 480)}
FASHION_TEST_PER_GROUP = 400
# Before the whole-file sizes (6,000 / 1,000 / 200): a cache written with them must not be reused.
OLD_FASHION_SIZES = spuco.SpuCoSizes(train_per_class=6_000, val_per_class=1_000, test_per_group=200)
# Small enough to render in well under a second, large enough that default strength fills every group
# (round(1000 x 0.005) = 5 and round(800 x 0.005) = 4 minority examples per class).
SMALL = spuco.SpuCoSizes(train_per_class=1_000, val_per_class=800, test_per_group=8)
# Patch sides promised by the docstring: (N side or N, box side) per preset and image size.
MAGNITUDE_SIDES = {16: {"large": 16, "medium": 2, "small": 1}, 28: {"large": 28, "medium": 4, "small": 2}}
VARIANCE_N = {16: 16, 28: 49}
VARIANCE_BOXES = {16: {"low": 4, "medium": 8, "high": 16}, 28: {"low": 7, "medium": 14, "high": 28}}


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("spuco-data")


@pytest.fixture(scope="module")
def dataset(data_dir: Path) -> ShiftDataset:
    return load_dataset("spuco-digits", data_dir=data_dir, seed=0)


def small(settings: spuco.SpuCoSettings, seed: int = 0, base: str = "spuco-digits") -> dict[str, np.ndarray]:
    return spuco.generate(base, settings, SMALL, seed)


def non_grey(x: np.ndarray) -> np.ndarray:
    """(n, S, S) True where a pixel's channels differ: only spurious pixels can be coloured (the core is white)."""
    return (x.max(axis=1) != x.min(axis=1))


def test_registry_has_every_variant_for_both_bases() -> None:
    suffixes = ["", "-magnitude-large", "-magnitude-medium", "-magnitude-small", "-variance-low", "-variance-medium",
                "-variance-high", "-label-noise-0.1pct", "-label-noise-1pct", "-feature-noise-10pct",
                "-feature-noise-20pct"]
    for base in ("spuco-digits", "spuco-fashion"):
        for suffix in suffixes:
            assert base + suffix in DATASETS, base + suffix
            assert DATASETS.get(base + suffix).__doc__.startswith("SpuCoMNIST over ")


def test_default_dataset_has_documented_sizes_groups_and_declarations(dataset: ShiftDataset) -> None:
    assert dataset.name == "spuco-digits"
    assert dataset.task.kind == TaskKind.CLASSIFICATION and dataset.task.n_outputs == 5
    assert set(dataset.splits) == set(DOCUMENTED_SIZES) and dataset.eval_splits == ["val", "test"]
    assert dataset.input_shape == (3, 16, 16) and dataset.selection_metric == "val/worst_group_acc"
    assert dataset.domain_names == ("red", "green", "blue", "yellow", "magenta")
    assert dataset.n_groups == 25 and dataset.group_names[0] == "0-1/red" and dataset.group_names[24] == "8-9/magenta"
    assert dataset.defaults.model == "lenet5" and dataset.defaults.optimizer == "sgd"
    for name, n in DOCUMENTED_SIZES.items():
        split = dataset.split(name)
        assert split.x.shape == (n, 3, 16, 16) and split.x.dtype == torch.uint8, name
        assert split.y.dtype == torch.int64 and torch.equal(split.group, split.y * 5 + split.domain), name
        assert dataset.info[name] == str(n)
    counts = {name: torch.bincount(dataset.split(name).group, minlength=25).view(5, 5) for name in DOCUMENTED_SIZES}
    # Majority 99.5% of each class, round(n x 0.005) minority examples spread evenly, remainder first.
    for k in range(5):
        assert counts["train"][k, k] == 9_950
        assert [int(counts["train"][k, c]) for c in range(5) if c != k] == [13, 13, 12, 12]
    # SpuCoMNIST's val: group-balanced, 500 of every group (its own about 480), stated in the build's info.
    assert torch.equal(counts["val"], torch.full((5, 5), 500))
    assert torch.equal(counts["test"], torch.full((5, 5), 100))
    assert dataset.info["groups"] == "train 25 groups of 12 to 9,950; val 25 groups of 500; test 25 groups of 100"
    views = dataset.views.weak(dataset.split("test").x[:4])
    assert views.shape == (4, 3, 16, 16) and views.dtype == torch.float32


def test_correlated_counts_allocate_minorities_and_refuse_empty_groups() -> None:
    assert spuco.correlated_counts(4_000, 0.995, "train") == [3_980, 5, 5, 5, 5]
    assert spuco.correlated_counts(1_000, 0.995, "train") == [995, 2, 1, 1, 1]
    assert spuco.correlated_counts(100, 0.9, "val") == [90, 3, 3, 2, 2]
    with pytest.raises(ValueError, match=r"strength: 0\.995 .* = 2 minority examples .* split 'val'"):
        spuco.correlated_counts(400, 0.995, "val")
    with pytest.raises(ValueError, match="strength"):
        spuco.build_spuco("spuco-digits", spuco.SpuCoSettings(strength=1.0), Path("/nonexistent"), 0, sizes=SMALL)


@pytest.mark.parametrize("kwargs, message", [
    ({"magnitude": "huge"}, "magnitude: expected one of large, medium, small, got 'huge'"),
    ({"variance": "wild"}, "variance: expected None or one of low, medium, high, got 'wild'"),
    ({"strength": 0.0}, "strength: expected a share in (0, 1], got 0.0"),
    ({"label_noise": 1.5}, "label_noise: expected a fraction in [0, 1], got 1.5"),
])
def test_bad_settings_are_refused_by_name(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError) as err:
        spuco.SpuCoSettings(**kwargs)
    assert str(err.value) == message


@pytest.mark.parametrize("size", [16, 28])
@pytest.mark.parametrize("magnitude", ["large", "medium", "small"])
def test_magnitude_is_a_solid_fixed_top_left_patch(size: int, magnitude: str) -> None:
    side = MAGNITUDE_SIDES[size][magnitude]
    masks = spuco.spurious_masks(spuco.SpuCoSettings(magnitude=magnitude), 6, size, torch.Generator().manual_seed(0))
    assert masks.shape == (6, size, size) and masks.dtype == torch.bool
    assert masks.sum(dim=(1, 2)).tolist() == [side * side] * 6
    assert masks[:, :side, :side].all()
    # Rendering a blank core leaves exactly the spurious pixels coloured and everything else black.
    colours = torch.arange(6) % 5
    image = spuco.render(torch.zeros(6, size, size), colours, masks)
    palette = torch.tensor(list(spuco.COLOURS.values()), dtype=torch.uint8)
    expected = torch.where(masks.unsqueeze(1), palette[colours].view(6, 3, 1, 1), torch.zeros((), dtype=torch.uint8))
    assert torch.equal(image, expected)


@pytest.mark.parametrize("size", [16, 28])
@pytest.mark.parametrize("variance", ["low", "medium", "high"])
def test_variance_draws_n_pixels_inside_its_box(size: int, variance: str) -> None:
    box, n_pixels = VARIANCE_BOXES[size][variance], VARIANCE_N[size]
    settings = spuco.SpuCoSettings(magnitude="small", variance=variance)  # variance overrides the magnitude
    masks = spuco.spurious_masks(settings, 500, size, torch.Generator().manual_seed(0))
    assert masks.sum(dim=(1, 2)).tolist() == [n_pixels] * 500
    assert not masks[:, box:, :].any() and not masks[:, :, box:].any()
    varies = not (masks == masks[0]).all()
    assert varies == (variance != "low")
    if variance == "high":  # every pixel of the image is used by some image
        assert masks.any(dim=0).all()


def test_rendered_colour_stays_inside_the_spurious_pixels() -> None:
    small_patch = small(spuco.SpuCoSettings(magnitude="small", strength=0.9))
    coloured = non_grey(small_patch["train.x"])
    assert coloured.any() and not coloured[:, 1:, :].any() and not coloured[:, :, 1:].any()  # 1 px at S=16
    high = small(spuco.SpuCoSettings(variance="high", strength=0.9))
    assert (non_grey(high["test.x"]).sum(axis=(1, 2)) <= 16).all()
    large = small(spuco.SpuCoSettings(strength=0.9))
    x, colour = large["train.x"], large["train.domain"]
    palette = np.array(list(spuco.COLOURS.values()), dtype=np.uint8)
    # The whole background is coloured, so a colour's full channels stay at 255 under the white core.
    full_channels = np.broadcast_to((palette[colour] == 255)[:, :, None, None], x.shape)
    assert (x[full_channels] == 255).all()


def test_label_and_feature_noise_hit_exact_counts_of_train_only() -> None:
    clean = small(spuco.SpuCoSettings())
    noisy = small(spuco.SpuCoSettings(label_noise=0.1, feature_noise=0.2))
    n = len(noisy["train.y"])
    label_noisy, feature_noisy = noisy["train.label_noisy"], noisy["train.feature_noisy"]
    assert label_noisy.sum() == round(0.1 * n) and feature_noisy.sum() == round(0.2 * n)
    assert ((noisy["train.y"] != noisy["train.clean_y"]) == label_noisy).all()
    assert (noisy["train.clean_y"] == clean["train.y"]).all() and (noisy["train.domain"] == clean["train.domain"]).all()
    # The colour was chosen before the label flipped: mislabelled majority examples sit in minority groups.
    majority = noisy["train.clean_y"] == noisy["train.domain"]
    assert (noisy["train.y"][label_noisy & majority] != noisy["train.domain"][label_noisy & majority]).all()
    # Only the corrupted cores changed; the rest of the images are the noise-free ones byte for byte.
    changed = (noisy["train.x"] != clean["train.x"]).reshape(n, -1).any(axis=1)
    assert (changed == feature_noisy).all()
    for split in ("val", "test"):
        assert not noisy[f"{split}.label_noisy"].any() and not noisy[f"{split}.feature_noisy"].any()
        assert (noisy[f"{split}.x"] == clean[f"{split}.x"]).all()


def test_noisy_groups_use_the_noisy_label(tmp_path: Path) -> None:
    ds = spuco.build_spuco("spuco-digits", spuco.SpuCoSettings(label_noise=0.05), tmp_path, 0, sizes=SMALL)
    train = ds.split("train")
    assert torch.equal(train.group, train.y * 5 + train.domain)
    assert (torch.bincount(train.group, minlength=25) > 0).all()
    for name in ("val", "test"):
        assert (torch.bincount(ds.split(name).group, minlength=25) > 0).all()


def test_feature_noise_erases_stroke_and_adds_specks() -> None:
    cores = torch.zeros(200, 16, 16)
    cores[:, 4:12, 6:10] = 1.0  # 32 foreground pixels, 224 background
    out = spuco.corrupt_cores(cores, torch.Generator().manual_seed(0))
    erased = ((cores == 1) & (out == 0)).sum(dim=(1, 2)).float()
    specks = ((cores == 0) & (out == 1)).sum(dim=(1, 2)).float()
    assert abs(erased.mean() - 32 * spuco.ERASE_PROB) < 1.0
    assert abs(specks.mean() - 224 * spuco.SPECK_PROB) < 1.0


def test_same_seed_same_bytes_other_seed_other_data_and_cache_hit(tmp_path: Path, monkeypatch) -> None:
    settings = spuco.SpuCoSettings(variance="medium")
    first = spuco.build_spuco("spuco-digits", settings, tmp_path / "a", 3, sizes=SMALL)
    again = spuco.build_spuco("spuco-digits", settings, tmp_path / "b", 3, sizes=SMALL)
    other = spuco.build_spuco("spuco-digits", settings, tmp_path / "c", 4, sizes=SMALL)
    for name in spuco.SPLITS:
        a, b, c = first.split(name), again.split(name), other.split(name)
        assert torch.equal(a.x, b.x) and torch.equal(a.y, b.y) and torch.equal(a.group, b.group), name
        assert not torch.equal(a.x, c.x), name
    path = spuco.cache_path(tmp_path / "a", "spuco-digits", settings, SMALL, 3)
    assert path.exists() and path.parent.name == "spuco-digits"
    assert spuco.cache_path(tmp_path / "a", "spuco-digits", spuco.SpuCoSettings(), SMALL, 3) != path

    def refuse(*args, **kwargs):
        raise AssertionError("a cache hit must not regenerate")

    monkeypatch.setattr(spuco, "generate", refuse)
    cached = spuco.build_spuco("spuco-digits", settings, tmp_path / "a", 3, sizes=SMALL)
    assert torch.equal(cached.split("train").x, first.split("train").x)


def test_generation_ignores_and_preserves_global_rng() -> None:
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    first = small(spuco.SpuCoSettings(variance="high", feature_noise=0.1), seed=1)
    assert torch.equal(torch.rand(3), expected)
    torch.manual_seed(999)
    second = small(spuco.SpuCoSettings(variance="high", feature_noise=0.1), seed=1)
    assert all((first[k] == second[k]).all() for k in first)


def test_avg_acc_weights_groups_by_train_shares() -> None:
    # Train: group 0 three times, group 6 once -> shares 0.75 and 0.25.
    metric = spuco.AverageAccuracy.from_train_groups(torch.tensor([0, 0, 0, 6]), 25)
    group = torch.tensor([0, 0, 6, 6, 6])
    y = torch.tensor([0, 0, 1, 1, 1])
    pred = torch.tensor([0, 3, 1, 1, 4])  # group 0: 1/2 correct, group 6: 2/3 correct
    outputs = F.one_hot(pred, 5).float()
    assert metric(outputs, y, group) == pytest.approx(0.75 * 0.5 + 0.25 * 2 / 3)
    # A group the train split lacks weighs nothing; the present weights are renormalised.
    assert metric(outputs[2:], y[2:], group[2:]) == pytest.approx(2 / 3)
    group_acc = spuco.GroupAccuracy(spuco.GROUP_NAMES)(outputs, y, group)
    assert group_acc == {"0-1_red": 0.5, "2-3_green": pytest.approx(2 / 3)}


def test_evaluate_logs_every_group_under_mlflow_safe_names(dataset: ShiftDataset) -> None:
    test = dataset.split("test")
    scores = dataset.evaluate("test", F.one_hot(test.y, 5).float(), test)
    group_keys = {k for k in scores if k.startswith("test/group_acc/")}
    assert group_keys == {f"test/group_acc/{name.replace('/', '_')}" for name in dataset.group_names}
    assert all("/" not in k.removeprefix("test/group_acc/") for k in group_keys)
    assert scores["test/acc"] == scores["test/worst_group_acc"] == scores["test/avg_acc"] == 1.0
    # A colour-only classifier: right on every majority group, wrong elsewhere (SpuCo's ERM at large magnitude).
    colour_only = F.one_hot(test.domain, 5).float()
    scores = dataset.evaluate("test", colour_only, test)
    assert scores["test/worst_group_acc"] == 0.0 and scores["test/acc"] == pytest.approx(0.2)
    assert scores["test/avg_acc"] == pytest.approx(0.995)


def test_base_pools_are_disjoint_and_stratified(dataset: ShiftDataset) -> None:
    arrays = small(spuco.SpuCoSettings())
    used = {name: set(arrays[f"{name}.base_index"].tolist()) for name in spuco.SPLITS}
    for a, b in combinations(used, 2):
        assert not used[a] & used[b], f"{a} and {b} share a base image"
    base = spuco.load_digits_base()
    pools = spuco.partition_pools(base, spuco.BASES["spuco-digits"].pool_plan, 0, "spuco-digits")
    members = [set(p.tolist()) for p in pools.values()]
    assert not any(a & b for a, b in combinations(members, 2)) and set().union(*members) == set(range(len(base.labels)))
    for name, pool in pools.items():
        assert set(base.labels[pool].tolist()) == set(range(10)), name
        assert used[name] <= set(pool.tolist()), name
    # Rendered labels match their base images' labels (clean labels: class = digit // 2).
    for name in spuco.SPLITS:
        assert (arrays[f"{name}.clean_y"] == base.labels.numpy()[arrays[f"{name}.base_index"]] // 2).all()


def fashion_available() -> bool:
    folder = spuco.fashion_dir()
    return all((folder / f).exists() for pair in spuco.FASHION_FILES.values() for f in pair)


def require_fashion() -> None:
    """spuco-fashion reads Debian's Fashion-MNIST files: without them the test fails naming the install line."""
    require_system_package(fashion_available(), "dataset-fashion-mnist", f"spuco-fashion (Fashion-MNIST at {spuco.fashion_dir()})")


def test_spuco_fashion_uses_all_of_fashion_mnist_with_documented_groups(tmp_path: Path) -> None:
    require_fashion()
    ds = load_dataset("spuco-fashion", data_dir=tmp_path, seed=0)
    assert {name: len(s) for name, s in ds.splits.items()} == FASHION_SIZES
    for name, (majority, minority) in FASHION_GROUPS.items():
        counts = torch.bincount(ds.split(name).group, minlength=25).view(5, 5)
        for k in range(5):
            assert counts[k, k] == majority, (name, k)
            assert [int(counts[k, c]) for c in range(5) if c != k] == [minority] * 4, (name, k)
    assert torch.equal(torch.bincount(ds.split("test").group, minlength=25), torch.full((25,), FASHION_TEST_PER_GROUP))
    # Every image of both files is rendered exactly once: train/val from the train file, test from the test file.
    arrays = np.load(spuco.cache_path(tmp_path, "spuco-fashion", spuco.SpuCoSettings(),
                                      spuco.BASES["spuco-fashion"].sizes, 0))
    base = spuco.load_fashion_base()
    used = {name: arrays[f"{name}.base_index"] for name in spuco.SPLITS}
    assert np.array_equal(np.sort(np.concatenate(list(used.values()))), np.arange(70_000))
    assert set(used["test"].tolist()) == set(base.parts["test"].tolist())
    assert len(used["val"]) == len(base.parts["train"]) // 5


def test_spuco_fashion_cache_key_differs_from_the_old_sizes(tmp_path: Path) -> None:
    new = spuco.cache_path(tmp_path, "spuco-fashion", spuco.SpuCoSettings(), spuco.BASES["spuco-fashion"].sizes, 0)
    old = spuco.cache_path(tmp_path, "spuco-fashion", spuco.SpuCoSettings(), OLD_FASHION_SIZES, 0)
    assert new != old


def test_spuco_fashion_renders_from_the_debian_files(tmp_path: Path) -> None:
    require_fashion()
    sizes = spuco.SpuCoSizes(train_per_class=800, val_per_class=800, test_per_group=4)
    ds = spuco.build_spuco("spuco-fashion", spuco.SpuCoSettings(magnitude="medium"), tmp_path, 0, sizes=sizes)
    assert ds.input_shape == (3, 28, 28) and ds.name == "spuco-fashion"
    assert {name: len(s) for name, s in ds.splits.items()} == {"train": 4_000, "val": 4_000, "test": 100}
    assert non_grey(ds.split("train").x.numpy())[:, 4:, :].sum() == 0  # colour only in the 4x4 patch
    arrays = np.load(spuco.cache_path(tmp_path, "spuco-fashion", spuco.SpuCoSettings(magnitude="medium"), sizes, 0))
    base = spuco.load_fashion_base()
    assert len(base.parts["train"]) + len(base.parts["test"]) == len(base.labels) <= 70_000
    test_part = set(base.parts["test"].tolist())
    assert set(arrays["test.base_index"].tolist()) <= test_part
    assert not (set(arrays["train.base_index"].tolist()) | set(arrays["val.base_index"].tolist())) & test_part
    assert not set(arrays["train.base_index"].tolist()) & set(arrays["val.base_index"].tolist())


def test_missing_fashion_files_name_the_path_and_the_apt_package(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv(spuco.FASHION_DIR_ENV, str(tmp_path / "empty"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError) as err:
        load_dataset("spuco-fashion", data_dir=tmp_path / "data", seed=0)
    message = str(err.value)
    assert "apt-get install dataset-fashion-mnist" in message
    assert str(tmp_path / "empty" / "train-images-idx3-ubyte.gz") in message
    cache = tmp_path / "data" / "spuco-fashion"
    assert not cache.exists() or not any(cache.iterdir())


def test_small_validation_groups_are_named_in_one_warning_line(tmp_path: Path, capsys) -> None:
    # SMALL, val correlated: round(800 x 0.005) = 4 validation minority examples per class, one per minority group.
    correlated = spuco.SpuCoSettings(val_strength=spuco.DEFAULT_STRENGTH)
    ds = spuco.build_spuco("spuco-digits", correlated, tmp_path, 0, sizes=SMALL, name="tiny-spuco")
    lines = [line for line in capsys.readouterr().err.splitlines() if "warning" in line]
    assert len(lines) == 1
    line = lines[0]
    assert "'tiny-spuco'" in line and "split 'val'" in line and f"fewer than {MIN_GROUP_EXAMPLES} examples" in line
    assert "20 group(s)" in line and "0-1/green 1" in line and "(+15 more)" in line
    # The helper returns the same line, for any split and minimum; a split without small groups says nothing.
    assert warn_small_groups(ds, "val") == line
    assert warn_small_groups(ds, "val", minimum=1) is None
    assert warn_small_groups(ds, "test", minimum=8) is None and warn_small_groups(ds, "test", minimum=9) is not None
    assert warn_small_groups(ds, "id_val") is None


def test_big_enough_validation_groups_build_silently(tmp_path: Path, capsys) -> None:
    # round(8,000 x 0.005) = 40 validation minority examples per class: exactly 10 per minority group.
    sizes = spuco.SpuCoSizes(train_per_class=1_000, val_per_class=8_000, test_per_group=8)
    correlated = spuco.SpuCoSettings(val_strength=spuco.DEFAULT_STRENGTH)
    ds = spuco.build_spuco("spuco-digits", correlated, tmp_path, 0, sizes=sizes)
    assert int(torch.bincount(ds.split("val").group).min()) == MIN_GROUP_EXAMPLES
    assert "warning" not in capsys.readouterr().err


def test_a_truncated_cache_is_rebuilt_with_one_line(tmp_path: Path, capsys) -> None:
    settings = spuco.SpuCoSettings(variance="medium")
    first = spuco.build_spuco("spuco-digits", settings, tmp_path, 0, sizes=SMALL)
    path = spuco.cache_path(tmp_path, "spuco-digits", settings, SMALL, 0)
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    capsys.readouterr()
    rebuilt = spuco.build_spuco("spuco-digits", settings, tmp_path, 0, sizes=SMALL)
    lines = [line for line in capsys.readouterr().err.splitlines() if "cache" in line]
    assert len(lines) == 1 and str(path) in lines[0]
    for name in spuco.SPLITS:
        assert torch.equal(rebuilt.split(name).x, first.split(name).x), name
    with np.load(path) as archive:  # the file was replaced by a sound one
        assert np.array_equal(archive["train.x"], first.split("train").x.numpy())
