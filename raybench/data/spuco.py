"""spuco-digits and spuco-fashion: SpuCoMNIST (Joshi et al., 2023, Sec. 5 and App. C) over any grayscale base set.

Why it exists: group-robustness methods (GroupDRO, JTT, group balancing) need a dataset whose spurious
feature can be dialled from trivially easy to barely learnable, with label and core-feature noise, and
whose group labels are known. SpuCoMNIST is that dataset; here its generator is a function of any base
set of grayscale images with labels 0..9, so it runs without a download on scikit-learn's digits and on
Fashion-MNIST from the Debian package `dataset-fashion-mnist`.

The task: 5 classes made of consecutive labels ([0,1], [2,3], [4,5], [6,7], [8,9]); the spurious feature
is one of 5 saturated colours (`COLOURS`) painted on some background pixels. Class c's majority colour is
colour c. group id = class * 5 + colour, domain id = colour; group names read "0-1/red".

Rendering (an S x S image, S = the base's image size): a black RGB canvas whose spurious pixels take the
example's colour, with the grayscale core image (intensity a in [0, 1]) blended on top in white:
out = background * (1 - a) + 255 * a. Which pixels are spurious (`spurious_masks`), scaled from the paper's
28 x 28 by side = round(side_28 * S / 28):
  - magnitude presets (no variance: a solid patch fixed in the top-left corner): large = the whole image,
    medium = a 4 x 4 patch at 28 px, small = 2 x 2 at 28 px (2 x 2 and 1 x 1 at S = 16);
  - variance presets override the magnitude: N = 7 x 7 pixels at 28 px (4 x 4 at 16), drawn per image
    uniformly without replacement inside a top-left box of side m: high = the image, medium = 14 at 28 px
    (8 at 16), low = the patch itself (no variance).

Correlation (`SpuCoSettings.strength`, default 0.995): per class, round(n_class * (1 - strength)) minority
examples are spread as evenly as possible over the 4 other colours (the remainder to the first ones in
colour order); a setting that would leave a minority group empty is refused with a ValueError. SpuCo's
SpuCoMNIST keeps int(strength * n_class) majority examples per class (the same counts at the sizes below)
and colours the rest with the other colours in rotation over randomly placed positions, so its minority
groups of one class differ in size from draw to draw (and can be empty); here they are exact and even.

Noise (train split only, exact counts, each from its own seeded generator):
  - `label_noise`: round(fraction * n) examples get a uniformly random *other* class after their colour was
    chosen, so a mislabelled majority example lands in a minority group of another class (group ids use the
    noisy label, as SpuCo's training data would);
  - `feature_noise`: round(fraction * n) examples get a corrupted core: every foreground pixel (core
    intensity > FOREGROUND_THRESHOLD) is erased to 0 with probability ERASE_PROB, and every other pixel
    becomes a full-intensity speck with probability SPECK_PROB. Only the core is corrupted, never the colour.
    (SpuCo's code adds N(0, 1) noise to the whole image instead, which also blurs the spurious feature.)

Splits (ShiftDataset names; no id_val/id_test, no unlabeled splits):
  - `train`: correlated at `strength`; `val`: group-labeled and group-balanced by default (`val_strength`
    0): every class shows each colour equally often, as SpuCoMNIST colours its val when given no strength,
    which is what SpuCo's own SpuCoMNIST scripts do (their logs show val groups of 450-507 images;
    spuco_mnist.py, `split == VAL_SPLIT and spurious_correlation_strength == 0`); `test`: group-balanced.
    Selection on worst-group accuracy needs every val group large enough for its accuracy to move: with
    a correlated val, 3-8 images a minority group, it stayed 0 at nearly every epoch. The variant
    `<base>-correlated-val` keeps a val correlated like train (`val_strength` = `strength`), as SpuCoAnimals
    and Waterbirds keep theirs; its build warns that worst-group selection on it is coarse or blind.
  - spuco-digits (S = 16): `sklearn.datasets.load_digits`, 1,797 8x8 images (exact duplicates dropped),
    bilinearly upsampled to 16 x 16; train 5 x 10,000 = 50,000 (50 minority examples per class, 12-13 per
    minority group), val 5 x 2,500 = 12,500 (500 per group), test 25 x 100 = 2,500.
  - spuco-fashion (S = 28): all of Fashion-MNIST, as SpuCoMNIST uses all of MNIST: the 60,000 images of its
    train file go 80 / 20 % into the train / val pools (4,800 / 1,200 per label), the 10,000 of its test file
    into the test pool (1,000 per label), read from /usr/share/datasets/fashion-mnist (or
    $RAYBENCH_FASHION_MNIST_DIR). Every pool is rendered whole, each image once: train 5 x 9,600 = 48,000
    (per class 9,552 majority and 48 minority, 12 per minority group), val 5 x 2,400 = 12,000 (480 per
    group; correlated: 2,388 and 12, 3 per minority group), test 25 x 400 = 10,000.
  - every build prints one stderr line with each split's group sizes (also the dataset's info["groups"]);
    validation groups under `MIN_GROUP_EXAMPLES` (raybench.data.base) add a warning line naming them.

Disjointness and expansion: exact-duplicate base images are dropped, then the base images are partitioned
per original label, with a seeded permutation, into disjoint train / val / test pools (`BaseSpec.pool_plan`:
digits 60/20/20 % of all images; Fashion-MNIST: its train file 80/20 % into train/val, its test file into
test). Each split is rendered only from its own pool, so no base image appears in two splits. Digits pools
are small (about 215 / 70 / 70 images per class), so each is rendered many times (about 19, 28 and 7 times),
every rendering with a fresh random affine (rotation +-ROTATION_DEG, scale SCALE_RANGE, shift up to
SHIFT_PX_AT_28 * S / 28 px), sampled bilinearly with batched affine_grid/grid_sample. Fashion-MNIST's files
hold no exact duplicates and its splits are exactly its pools (9,600 / 2,400 / 2,000 images per class), so
each base image is rendered exactly once, with one random affine.

Metrics: `acc`; `worst_group_acc` (min over the groups present); `avg_acc`, SpuCo's "average accuracy":
per-group accuracies weighted by the *train* split's group proportions, i.e. the accuracy expected on the
training distribution, which is why SpuCo reports ERM at 99.5% average with 0% worst-group; and `group_acc`,
one accuracy per group present, logged as `<split>/group_acc/<class>_<colour>` (e.g. `val/group_acc/0-1_red`).
Model selection uses `val/worst_group_acc`.

Registered variants, for each base `spuco-digits` and `spuco-fashion` (`VARIANTS`): the base name itself
(large magnitude, the paper's Table 2 default), `-magnitude-{large,medium,small}`, `-variance-{low,medium,high}`,
`-label-noise-{0.01pct,0.1pct,1pct}` (the paper's 0.01% and 0.1%, plus 1%) and `-feature-noise-{10pct,20pct}`;
noise variants use large magnitude without variance, as in the paper. `build_spuco` builds any other setting.

Calibration (defaults below: SpuCo's LeNet-5 without batch norm (`lenet5`), SGD lr 1e-2, momentum 0.9,
weight decay 1e-2 (SpuCo App. C's large-magnitude value), batch 64, 10 epochs): the measured Table 2
pattern, the magnitude trend and the findings behind these defaults are in docs/reference/spurious-correlations.md
and benchmarks/README.md ("Spurious correlations"), produced by benchmarks/spuco_check.py. In short: the batch-normalised `lenet` goes by the
colour even at small magnitude, where LeNet-5 as SpuCo trains it learns the core first; and without
correlation (strength 0.2) the core of both bases is learnable (Fashion-MNIST's class pairs put shirts,
tops, pullovers and coats in different classes, so it is the harder core).

Determinism: every (split, purpose) stream draws from its own `torch.Generator` seeded from a hash of the
seed, the base and the split, never from global RNG. Purposes are separate (layout, affine jitter, spurious
mask, label noise, feature noise), so variants of one base and seed show the same base images, colours and
jitter and differ only in what their settings change. The arrays are cached as
`data_dir/<base>/<key>.npz`, `key` hashing every generation parameter (sizes included, so resized splits
never reuse an old file), written atomically; a file that is unreadable or whose arrays differ from
`expected_layout` is rebuilt with one stderr line (`raybench.data.cache.load_npz_or_rebuild`).
"""
from __future__ import annotations

import gzip
import hashlib
import json
import math
import os
import sys
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from raybench.data import DATASETS
from raybench.data.augment import ImageViews
from raybench.data.base import ShiftDataset, Split, Task, TaskKind, TrainDefaults, warn_small_groups
from raybench.data.cache import load_npz_or_rebuild
from raybench.data.digits_shift import draw_from_pool, generator_for, load_base_digits
from raybench.labels import GROUP_SPLIT_LABELS
from raybench.metrics import accuracy, per_group_accuracy, worst_group_accuracy

FORMAT_VERSION = 1
PAPER_SIZE = 28  # SpuCoMNIST's image side; patch and box sides below are given at this size
CLASS_LABELS: tuple[tuple[int, int], ...] = ((0, 1), (2, 3), (4, 5), (6, 7), (8, 9))
N_CLASSES = len(CLASS_LABELS)
N_BASE_LABELS = 10
LABEL_TO_CLASS = torch.tensor(  # base label -> SpuCo class
    [k for label in range(N_BASE_LABELS) for k, pair in enumerate(CLASS_LABELS) if label in pair])
COLOURS: dict[str, tuple[int, int, int]] = {
    "red": (255, 0, 0), "green": (0, 255, 0), "blue": (0, 0, 255), "yellow": (255, 255, 0), "magenta": (255, 0, 255),
}
COLOUR_NAMES: tuple[str, ...] = tuple(COLOURS)
N_COLOURS = len(COLOURS)
GROUP_NAMES: tuple[str, ...] = tuple(f"{a}-{b}/{colour}" for a, b in CLASS_LABELS for colour in COLOUR_NAMES)
SPLITS: tuple[str, ...] = ("train", "val", "test")
NOISY_SPLITS: tuple[str, ...] = ("train",)  # label and feature noise corrupt training data only
DIGITS_IMAGE_SIZE = 16

MAGNITUDE_SIDES: dict[str, int] = {"large": 28, "medium": 4, "small": 2}  # solid patch side at 28 px
VARIANCE_PATCH_SIDE = 7  # N = 7 x 7 spurious pixels at 28 px under every variance preset
VARIANCE_BOX_SIDES: dict[str, int] = {"low": 7, "medium": 14, "high": 28}  # box side m at 28 px
DEFAULT_STRENGTH = 0.995
BALANCED = 0.0  # a split's strength for "no correlation": every colour equally often in every class

ROTATION_DEG = 10.0
SCALE_RANGE = (0.9, 1.1)
SHIFT_PX_AT_28 = 2.0
FOREGROUND_THRESHOLD = 0.5
ERASE_PROB = 0.5
SPECK_PROB = 0.05
RENDER_CHUNK = 4096  # images jittered per affine_grid call: bounds memory, not the result

FASHION_DIR_ENV = "RAYBENCH_FASHION_MNIST_DIR"
FASHION_DEFAULT_DIR = Path("/usr/share/datasets/fashion-mnist")
FASHION_FILES: dict[str, tuple[str, str]] = {  # source part -> (images, labels), IDX files as Debian ships them
    "train": ("train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz"),
    "test": ("t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz"),
}
FASHION_APT_HINT = "apt-get install dataset-fashion-mnist"


# ---------------------------------------------------------------- settings


def scaled_side(side_at_28: int, image_size: int) -> int:
    """A side given at SpuCoMNIST's 28 px, scaled to `image_size` (at least one pixel)."""
    return max(1, round(side_at_28 * image_size / PAPER_SIZE))


@dataclass(frozen=True)
class SpuCoSettings:
    """The SpuCoMNIST knobs (App. C); `variance`, when set, overrides the magnitude's patch."""

    magnitude: str = "large"
    variance: str | None = None
    strength: float = DEFAULT_STRENGTH
    label_noise: float = 0.0
    feature_noise: float = 0.0
    val_strength: float = BALANCED


    def __post_init__(self) -> None:
        if self.magnitude not in MAGNITUDE_SIDES:
            raise ValueError(f"magnitude: expected one of {', '.join(MAGNITUDE_SIDES)}, got {self.magnitude!r}")
        if self.variance is not None and self.variance not in VARIANCE_BOX_SIDES:
            options = ", ".join(VARIANCE_BOX_SIDES)
            raise ValueError(f"variance: expected None or one of {options}, got {self.variance!r}")
        if not 0.0 < self.strength <= 1.0:
            raise ValueError(f"strength: expected a share in (0, 1], got {self.strength!r}")
        if not 0.0 <= self.val_strength <= 1.0:
            raise ValueError(f"val_strength: expected 0 (group-balanced) or a share in (0, 1], got {self.val_strength!r}")
        for key in ("label_noise", "feature_noise"):
            if not 0.0 <= getattr(self, key) <= 1.0:
                raise ValueError(f"{key}: expected a fraction in [0, 1], got {getattr(self, key)!r}")

    def patch_geometry(self, image_size: int) -> tuple[int, int]:
        """(N spurious pixels, side m of the top-left box they are drawn from) at `image_size`."""
        if self.variance is None:
            side = scaled_side(MAGNITUDE_SIDES[self.magnitude], image_size)
            return side * side, side
        n_side = scaled_side(VARIANCE_PATCH_SIDE, image_size)
        return n_side * n_side, scaled_side(VARIANCE_BOX_SIDES[self.variance], image_size)

    def strength_of(self, split: str) -> float:
        """The split's correlation strength; BALANCED (0) for a group-balanced split."""
        return {"train": self.strength, "val": self.val_strength}.get(split, BALANCED)

    def describe(self) -> str:
        spurious = f"variance {self.variance}" if self.variance else f"magnitude {self.magnitude}"
        val = "group-balanced val" if self.val_strength == BALANCED else f"val strength {self.val_strength}"
        return (f"{spurious}, strength {self.strength}, {val}, label noise {self.label_noise:g}, "
                f"feature noise {self.feature_noise:g}")


@dataclass(frozen=True)
class SpuCoSizes:
    """Rendered examples: per class in the correlated splits, per group in the balanced test split."""

    train_per_class: int
    val_per_class: int
    test_per_group: int

    def __post_init__(self) -> None:
        for key, value in asdict(self).items():
            if value < 1:
                raise ValueError(f"{key}: expected an integer >= 1, got {value!r}")


# ---------------------------------------------------------------- base sets


@dataclass
class BaseImages:
    """Grayscale uint8 images (n, S, S), original labels 0..9, and the indices of each source part."""

    images: Tensor
    labels: Tensor
    parts: dict[str, Tensor]


def first_occurrences(images: np.ndarray) -> np.ndarray:
    """Sorted indices of the first copy of every distinct image: a duplicate could otherwise straddle two pools."""
    rows = np.ascontiguousarray(images.reshape(len(images), -1))
    keys = rows.view(np.dtype((np.void, rows.shape[1]))).ravel()
    return np.sort(np.unique(keys, return_index=True)[1])


def load_digits_base() -> BaseImages:
    """sklearn's digits (duplicates dropped) upsampled bilinearly from 8x8 to 16x16."""
    images, labels = load_base_digits()
    size = (DIGITS_IMAGE_SIZE, DIGITS_IMAGE_SIZE)
    big = F.interpolate(images.unsqueeze(1), size=size, mode="bilinear", align_corners=False).squeeze(1)
    as_uint8 = (big.clamp(0, 1) * 255).round().to(torch.uint8)
    return BaseImages(as_uint8, labels, {"all": torch.arange(len(labels))})


def fashion_dir() -> Path:
    """Where the Fashion-MNIST IDX files are: $RAYBENCH_FASHION_MNIST_DIR, else where Debian installs them."""
    return Path(os.environ.get(FASHION_DIR_ENV, FASHION_DEFAULT_DIR)).expanduser()


def read_idx(path: Path) -> np.ndarray:
    """An unsigned-byte IDX array (the MNIST file format: magic 0x0000 08 ndim, big-endian dims, data)."""
    data = gzip.decompress(path.read_bytes())
    if data[:2] != b"\x00\x00" or data[2] != 0x08:
        raise ValueError(f"{path}: not an unsigned-byte IDX file (magic {data[:4].hex()})")
    ndim = data[3]
    dims = [int.from_bytes(data[4 + 4 * i: 8 + 4 * i], "big") for i in range(ndim)]
    return np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * ndim).reshape(dims)


def require_fashion_files(folder: Path) -> None:
    """Fail before any work, naming the missing path and the package that provides it."""
    for path in [folder, *(folder / name for pair in FASHION_FILES.values() for name in pair)]:
        if not path.exists():
            raise FileNotFoundError(
                f"Fashion-MNIST: {path} is missing; install it with `{FASHION_APT_HINT}` (files under "
                f"{FASHION_DEFAULT_DIR}) or point ${FASHION_DIR_ENV} at a folder holding "
                f"{', '.join(n for pair in FASHION_FILES.values() for n in pair)}"
            )


def load_fashion_base() -> BaseImages:
    """Fashion-MNIST's train and test files, as parts "train" and "test", exact duplicates dropped."""
    folder = fashion_dir()
    require_fashion_files(folder)
    images, labels, part_of = [], [], []
    for part_id, (image_file, label_file) in enumerate(FASHION_FILES.values()):
        x, y = read_idx(folder / image_file), read_idx(folder / label_file)
        if len(x) != len(y) or x.shape[1:] != (PAPER_SIZE, PAPER_SIZE):
            raise ValueError(f"{folder / image_file}: expected (n, 28, 28) images for {len(y)} labels, got {x.shape}")
        images.append(x)
        labels.append(y)
        part_of.append(np.full(len(y), part_id))
    all_images, all_labels, all_parts = np.concatenate(images), np.concatenate(labels), np.concatenate(part_of)
    keep = first_occurrences(all_images)
    parts = torch.from_numpy(all_parts[keep])
    return BaseImages(
        images=torch.from_numpy(all_images[keep]),
        labels=torch.from_numpy(all_labels[keep].astype(np.int64)),
        parts={name: torch.nonzero(parts == i).flatten() for i, name in enumerate(FASHION_FILES)},
    )


@dataclass(frozen=True)
class BaseSpec:
    """One dataset family: its base images, where each pool comes from, its sizes and how it trains."""

    name: str
    image_size: int
    load: Callable[[], BaseImages]
    pool_plan: Mapping[str, Mapping[str, float]]  # source part -> {pool (= split): fraction of the part}
    sizes: SpuCoSizes
    description: str
    defaults: TrainDefaults
    cutout_size: int = 4


# Calibrated on spuco-digits (module docstring); SGD with momentum as in SpuCo's LeNet runs.
SPUCO_DEFAULTS = TrainDefaults(model="lenet5", optimizer="sgd", lr=1e-2, weight_decay=1e-2, momentum=0.9,
                               batch_size=64, epochs=10)


BASES: dict[str, BaseSpec] = {
    spec.name: spec
    for spec in (
        BaseSpec(
            name="spuco-digits", image_size=DIGITS_IMAGE_SIZE, load=load_digits_base,
            pool_plan={"all": {"train": 0.6, "val": 0.2, "test": 0.2}},
            # val: 500 a group, about SpuCoMNIST's 480 (its 12,000 val images over 25 groups).
            sizes=SpuCoSizes(train_per_class=10_000, val_per_class=2_500, test_per_group=100),
            description="scikit-learn's 8x8 digits upsampled to 16x16", defaults=SPUCO_DEFAULTS,
        ),
        BaseSpec(
            name="spuco-fashion", image_size=PAPER_SIZE, load=load_fashion_base,
            pool_plan={"train": {"train": 0.8, "val": 0.2}, "test": {"test": 1.0}},
            # Every pool rendered once, whole: 2 labels x 4,800 / 1,200 / 1,000 base images per class.
            sizes=SpuCoSizes(train_per_class=9_600, val_per_class=2_400, test_per_group=400),
            description="Fashion-MNIST (Debian's dataset-fashion-mnist)", defaults=SPUCO_DEFAULTS,
            cutout_size=7,
        ),
    )
}


def partition_pools(base: BaseImages, plan: Mapping[str, Mapping[str, float]], seed: int,
                    name: str) -> dict[str, Tensor]:
    """Disjoint pools of base indices: each part is cut per original label, after a seeded permutation."""
    g = generator_for(seed, name, "pools")
    pools: dict[str, list[Tensor]] = {pool: [] for fractions in plan.values() for pool in fractions}
    for part, fractions in plan.items():
        part_members = base.parts[part]
        for label in range(N_BASE_LABELS):
            members = part_members[base.labels[part_members] == label]
            members = members[torch.randperm(len(members), generator=g)]
            cuts = np.cumsum([0] + [round(f * len(members)) for f in fractions.values()])
            cuts[-1] = len(members)
            for i, pool in enumerate(fractions):
                pools[pool].append(members[cuts[i]: cuts[i + 1]])
    return {pool: torch.sort(torch.cat(chunks)).values for pool, chunks in pools.items()}


# ---------------------------------------------------------------- group layout


def correlated_counts(n_class: int, strength: float, split: str) -> list[int]:
    """One class's [majority, minority 1, ..., minority 4] counts; minorities follow the other colours' order.

    round(n_class * (1 - strength)) minority examples are spread as evenly as possible over the 4 other
    colours, the remainder going to the first ones, so no minority group is empty unless there are too few.
    """
    n_minority = round(n_class * (1.0 - strength))
    if n_minority < N_COLOURS - 1:
        raise ValueError(
            f"strength: {strength} leaves round({n_class} x (1 - {strength})) = {n_minority} minority examples per "
            f"class in split {split!r}, fewer than its {N_COLOURS - 1} minority groups, so a group would be empty; "
            f"lower strength or render more examples per class"
        )
    share, extra = divmod(n_minority, N_COLOURS - 1)
    return [n_class - n_minority] + [share + (1 if i < extra else 0) for i in range(N_COLOURS - 1)]


def balanced_counts(n_class: int) -> list[int]:
    """One class's count per colour, in colour order, as SpuCoMNIST colours its uncorrelated splits
    (colour i % 5 of the class's i-th example): n_class // 5 each, the remainder to the first colours."""
    share, extra = divmod(n_class, N_COLOURS)
    return [share + (1 if c < extra else 0) for c in range(N_COLOURS)]


def group_counts(split: str, sizes: SpuCoSizes, settings: SpuCoSettings) -> Tensor:
    """(class, colour) -> number of examples: train correlated at `strength`, val at `val_strength` (BALANCED:
    every colour equally often in each class, SpuCoMNIST's default for val), test `test_per_group` per group."""
    if split == "test":
        return torch.full((N_CLASSES, N_COLOURS), sizes.test_per_group, dtype=torch.long)
    n_class = {"train": sizes.train_per_class, "val": sizes.val_per_class}[split]
    strength = settings.strength_of(split)
    if strength == BALANCED:
        return torch.tensor([balanced_counts(n_class)] * N_CLASSES, dtype=torch.long)
    counts = correlated_counts(n_class, strength, split)
    others = [[c for c in range(N_COLOURS) if c != k] for k in range(N_CLASSES)]
    table = torch.zeros(N_CLASSES, N_COLOURS, dtype=torch.long)
    for k in range(N_CLASSES):
        table[k, k] = counts[0]
        table[k, others[k]] = torch.tensor(counts[1:])
    return table


def describe_counts(counts: Tensor) -> str:
    """A split's group sizes in one phrase: "25 groups of 500" or "25 groups of 3 to 9,950"."""
    low, high = int(counts.min()), int(counts.max())
    size = f"{low:,}" if low == high else f"{low:,} to {high:,}"
    return f"{counts.numel()} groups of {size}"


def draw_layout(counts: Tensor, pool: Tensor, labels: Tensor, g: torch.Generator) -> tuple[Tensor, Tensor, Tensor]:
    """(class, colour, base index) per example: colours shuffled within each class, base images drawn evenly."""
    classes, colours, base_index = [], [], []
    base_class = LABEL_TO_CLASS[labels[pool]]
    for k in range(N_CLASSES):
        per_colour = counts[k]
        n = int(per_colour.sum())
        colour = torch.repeat_interleave(torch.arange(N_COLOURS), per_colour)
        colours.append(colour[torch.randperm(n, generator=g)])
        classes.append(torch.full((n,), k, dtype=torch.long))
        base_index.append(draw_from_pool(pool[base_class == k], n, g))
    return torch.cat(classes), torch.cat(colours), torch.cat(base_index)


def exact_subset(n: int, fraction: float, g: torch.Generator) -> Tensor:
    """A boolean mask over n examples with exactly round(fraction * n) of them set, chosen uniformly."""
    chosen = torch.zeros(n, dtype=torch.bool)
    chosen[torch.randperm(n, generator=g)[: round(fraction * n)]] = True
    return chosen


def flip_labels(y: Tensor, noisy: Tensor, g: torch.Generator) -> Tensor:
    """`y` with every `noisy` example moved to a uniformly random other class."""
    offset = torch.randint(1, N_CLASSES, (int(noisy.sum()),), generator=g)
    out = y.clone()
    out[noisy] = (y[noisy] + offset) % N_CLASSES
    return out


# ---------------------------------------------------------------- rendering


def spurious_masks(settings: SpuCoSettings, n: int, image_size: int, generator: torch.Generator) -> Tensor:
    """Which pixels carry the colour, bool (n, S, S): N pixels of the top-left m x m box, per image.

    When N fills the box (magnitude presets, low variance) the mask is the solid box for every image and
    no randomness is drawn; otherwise each image gets its own uniform N-subset of the box.
    """
    n_pixels, box = settings.patch_geometry(image_size)
    masks = torch.zeros(n, image_size, image_size, dtype=torch.bool)
    if n_pixels == box * box:
        masks[:, :box, :box] = True
        return masks
    chosen = torch.rand(n, box * box, generator=generator).argsort(dim=1)[:, :n_pixels]
    in_box = torch.zeros(n, box * box, dtype=torch.bool).scatter_(1, chosen, True)
    masks[:, :box, :box] = in_box.view(n, box, box)
    return masks


def affine_params(n: int, g: torch.Generator) -> Tensor:
    """Per-image inverse affine maps (n, 2, 3) in normalised coordinates: small rotation, scale and shift.

    A shift of SHIFT_PX_AT_28 * S / 28 pixels is SHIFT_PX_AT_28 / 28 * 2 in [-1, 1] units, whatever S is.
    """
    angle = (torch.rand(n, generator=g) * 2 - 1) * math.radians(ROTATION_DEG)
    scale = torch.rand(n, generator=g) * (SCALE_RANGE[1] - SCALE_RANGE[0]) + SCALE_RANGE[0]
    shift = (torch.rand(n, 2, generator=g) * 2 - 1) * (SHIFT_PX_AT_28 / PAPER_SIZE * 2)
    cos, sin = torch.cos(angle) / scale, torch.sin(angle) / scale
    return torch.stack([torch.stack([cos, -sin, shift[:, 0]], 1), torch.stack([sin, cos, shift[:, 1]], 1)], 1)


def jitter_cores(images: Tensor, theta: Tensor) -> Tensor:
    """Core intensities (n, S, S) in [0, 1]: uint8 base images resampled under `theta`, in chunks."""
    n, size = len(images), images.shape[-1]
    out = torch.empty(n, size, size)
    for start in range(0, n, RENDER_CHUNK):
        block = images[start: start + RENDER_CHUNK].float().div(255).unsqueeze(1)
        grid = F.affine_grid(theta[start: start + RENDER_CHUNK], list(block.shape), align_corners=False)
        out[start: start + RENDER_CHUNK] = F.grid_sample(block, grid, mode="bilinear", padding_mode="zeros",
                                                         align_corners=False).squeeze(1)
    return out.clamp_(0, 1)


def corrupt_cores(cores: Tensor, g: torch.Generator) -> Tensor:
    """Feature noise: erase each foreground pixel with prob ERASE_PROB, add full-intensity specks elsewhere."""
    foreground = cores > FOREGROUND_THRESHOLD
    erase = foreground & (torch.rand(cores.shape, generator=g) < ERASE_PROB)
    speck = ~foreground & (torch.rand(cores.shape, generator=g) < SPECK_PROB)
    return cores.masked_fill(erase, 0.0).masked_fill(speck, 1.0)


def render(cores: Tensor, colours: Tensor, masks: Tensor) -> Tensor:
    """uint8 (n, 3, S, S): coloured spurious pixels on black, the core blended on top in white."""
    palette = torch.tensor(list(COLOURS.values()), dtype=torch.float32)
    background = palette[colours].view(-1, 3, 1, 1) * masks.unsqueeze(1)
    alpha = cores.unsqueeze(1)
    return (background * (1 - alpha) + 255.0 * alpha).round().clamp(0, 255).to(torch.uint8)


# ---------------------------------------------------------------- generation and cache


def render_split(split: str, base: BaseImages, pool: Tensor, spec: BaseSpec, settings: SpuCoSettings,
                 sizes: SpuCoSizes, seed: int) -> dict[str, np.ndarray]:
    """One split's arrays: x, y (possibly noisy), clean_y, domain (colour), base_index and the noise masks."""
    def stream(purpose: str) -> torch.Generator:
        return generator_for(seed, spec.name, split, purpose)

    counts = group_counts(split, sizes, settings)
    y_clean, colour, base_index = draw_layout(counts, pool, base.labels, stream("layout"))
    n, noisy = len(y_clean), split in NOISY_SPLITS
    label_noisy = exact_subset(n, settings.label_noise if noisy else 0.0, stream("label-noise-which"))
    feature_noisy = exact_subset(n, settings.feature_noise if noisy else 0.0, stream("feature-noise-which"))
    y = flip_labels(y_clean, label_noisy, stream("label-noise-class"))
    cores = jitter_cores(base.images[base_index], affine_params(n, stream("affine")))
    cores[feature_noisy] = corrupt_cores(cores[feature_noisy], stream("feature-noise-pixels"))
    masks = spurious_masks(settings, n, spec.image_size, stream("mask"))
    fields = {"x": render(cores, colour, masks), "y": y, "clean_y": y_clean, "domain": colour,
              "base_index": base_index, "label_noisy": label_noisy, "feature_noisy": feature_noisy}
    return {f"{split}.{key}": value.numpy() for key, value in fields.items()}


def generation_params(spec: BaseSpec, settings: SpuCoSettings, sizes: SpuCoSizes, seed: int) -> dict:
    """Everything the bytes depend on; its hash names the cache file, so any change regenerates."""
    return {
        "format": FORMAT_VERSION, "base": spec.name, "image_size": spec.image_size, "seed": seed,
        "pool_plan": spec.pool_plan, "settings": asdict(settings), "sizes": asdict(sizes),
        "classes": CLASS_LABELS, "colours": COLOURS, "magnitudes": MAGNITUDE_SIDES,
        "variance": [VARIANCE_PATCH_SIDE, VARIANCE_BOX_SIDES],
        "affine": [ROTATION_DEG, SCALE_RANGE, SHIFT_PX_AT_28],
        "feature_noise": [FOREGROUND_THRESHOLD, ERASE_PROB, SPECK_PROB],
    }


def cache_key(spec: BaseSpec, settings: SpuCoSettings, sizes: SpuCoSizes, seed: int) -> str:
    params = generation_params(spec, settings, sizes, seed)
    return hashlib.sha256(json.dumps(params, sort_keys=True).encode()).hexdigest()[:16]


def base_spec(base_name: str) -> BaseSpec:
    if base_name not in BASES:
        raise ValueError(f"base: expected one of {', '.join(BASES)}, got {base_name!r}")
    return BASES[base_name]


def generate(base_name: str, settings: SpuCoSettings, sizes: SpuCoSizes, seed: int) -> dict[str, np.ndarray]:
    """All splits as flat arrays named `<split>.<field>`; group-count errors surface before any rendering."""
    spec = base_spec(base_name)
    for split in SPLITS:
        group_counts(split, sizes, settings)
    base = spec.load()
    pools = partition_pools(base, spec.pool_plan, seed, spec.name)
    arrays: dict[str, np.ndarray] = {}
    for split in SPLITS:
        arrays.update(render_split(split, base, pools[split], spec, settings, sizes, seed))
    print(f"raybench: built {spec.name} ({settings.describe()}): {split_counts_line(sizes, settings)}",
          file=sys.stderr, flush=True)
    return arrays


def split_counts_line(sizes: SpuCoSizes, settings: SpuCoSettings) -> str:
    """Every split's group sizes, stated whenever a variant is built and kept in the dataset's info."""
    return "; ".join(f"{split} {describe_counts(group_counts(split, sizes, settings))}" for split in SPLITS)


def cache_path(data_dir: Path, base_name: str, settings: SpuCoSettings, sizes: SpuCoSizes, seed: int) -> Path:
    spec = base_spec(base_name)
    return Path(data_dir) / spec.name / f"{cache_key(spec, settings, sizes, seed)}.npz"


# Every array `render_split` writes per split, with its dtype; images are (n, 3, S, S), the rest (n,).
SPLIT_FIELDS: dict[str, type] = {"x": np.uint8, "y": np.int64, "clean_y": np.int64, "domain": np.int64,
                                 "base_index": np.int64, "label_noisy": np.bool_, "feature_noisy": np.bool_}


def expected_layout(spec: BaseSpec, settings: SpuCoSettings,
                    sizes: SpuCoSizes) -> tuple[dict[str, tuple[int, ...]], dict[str, type]]:
    """The cache's array names, shapes and dtypes: a file holding anything else is rebuilt, not trusted."""
    shapes: dict[str, tuple[int, ...]] = {}
    dtypes: dict[str, type] = {}
    for split in SPLITS:
        n = int(group_counts(split, sizes, settings).sum())
        for name, dtype in SPLIT_FIELDS.items():
            key = f"{split}.{name}"
            shapes[key] = (n, 3, spec.image_size, spec.image_size) if name == "x" else (n,)
            dtypes[key] = dtype
    return shapes, dtypes


def load_or_generate(base_name: str, settings: SpuCoSettings, sizes: SpuCoSizes, data_dir: Path,
                     seed: int) -> dict[str, np.ndarray]:
    """The cached arrays; a missing, truncated or mis-shaped cache file is (re)generated and saved."""
    shapes, dtypes = expected_layout(base_spec(base_name), settings, sizes)
    return load_npz_or_rebuild(cache_path(data_dir, base_name, settings, sizes, seed), shapes,
                               lambda: generate(base_name, settings, sizes, seed), dtypes=dtypes)


def to_split(name: str, arrays: dict[str, np.ndarray]) -> Split:
    y, colour = torch.from_numpy(arrays[f"{name}.y"]), torch.from_numpy(arrays[f"{name}.domain"])
    return Split(name=name, x=torch.from_numpy(arrays[f"{name}.x"]), y=y, domain=colour, group=y * N_COLOURS + colour)


# ---------------------------------------------------------------- metrics


def metric_key(group_name: str) -> str:
    """A group name usable in an MLflow metric name: "0-1/red" -> "0-1_red"."""
    return group_name.replace("/", "_")


def accuracy_metric(outputs: Tensor, y: Tensor, group: Tensor) -> float:
    return accuracy(outputs, y)


@dataclass(frozen=True)
class AverageAccuracy:
    """SpuCo's average accuracy: per-group accuracies weighted by the train split's group proportions.

    It estimates accuracy on the training distribution, so a colour-only classifier scores about the
    majority share (99.5%) even at 0% worst-group accuracy. Weights are renormalised over the groups the
    evaluated split has.
    """

    train_shares: tuple[float, ...]

    @classmethod
    def from_train_groups(cls, group: Tensor, n_groups: int) -> AverageAccuracy:
        counts = torch.bincount(group, minlength=n_groups).double()
        return cls(tuple((counts / counts.sum()).tolist()))

    def __call__(self, outputs: Tensor, y: Tensor, group: Tensor) -> float:
        accs = per_group_accuracy(outputs, y, group)
        weight = sum(self.train_shares[g] for g in accs)
        if weight == 0:
            return float("nan")
        return sum(self.train_shares[g] * acc for g, acc in accs.items()) / weight


@dataclass(frozen=True)
class GroupAccuracy:
    """Accuracy of every group present, keyed by its MLflow-safe name (logged as `<split>/group_acc/<name>`)."""

    names: tuple[str, ...]

    def __call__(self, outputs: Tensor, y: Tensor, group: Tensor) -> dict[str, float]:
        return {metric_key(self.names[g]): acc for g, acc in per_group_accuracy(outputs, y, group).items()}


# ---------------------------------------------------------------- datasets


def build_spuco(base_name: str, settings: SpuCoSettings, data_dir: Path, seed: int,
                sizes: SpuCoSizes | None = None, name: str | None = None) -> ShiftDataset:
    """The SpuCoMNIST dataset over `base_name` with any settings (and sizes, e.g. small ones for tests)."""
    spec = base_spec(base_name)
    sizes = sizes or spec.sizes
    arrays = load_or_generate(base_name, settings, sizes, data_dir, seed)
    splits = {split: to_split(split, arrays) for split in SPLITS}
    size = spec.image_size
    dataset = ShiftDataset(
        name=name or base_name,
        task=Task(TaskKind.CLASSIFICATION, N_CLASSES),
        splits=splits,
        metrics={
            "acc": accuracy_metric,
            "worst_group_acc": worst_group_accuracy,
            "avg_acc": AverageAccuracy.from_train_groups(splits["train"].group, len(GROUP_NAMES)),
            "group_acc": GroupAccuracy(GROUP_NAMES),
        },
        selection_metric="val/worst_group_acc",
        split_labels=dict(GROUP_SPLIT_LABELS),
        report_metrics=("worst_group_acc", "avg_acc"),
        defaults=spec.defaults,
        # No crop: a shift would move the fixed top-left patch and add the variance the presets control.
        views=ImageViews(mean=(0.5,) * 3, std=(0.5,) * 3, crop_pad=0, flip=False, cutout_size=spec.cutout_size,
                         magnitude=5).as_views(),
        domain_names=COLOUR_NAMES,
        input_shape=(3, size, size),
        description=f"SpuCoMNIST over {spec.description}: 5 classes, colour-spurious ({settings.describe()}).",
        info={**{split: str(len(s)) for split, s in splits.items()}, "settings": settings.describe(),
              "groups": split_counts_line(sizes, settings)},
        group_names=GROUP_NAMES,
    )
    warn_small_groups(dataset, "val")
    return dataset


LABEL_NOISE_LEVELS: dict[str, float] = {"0.01pct": 1e-4, "0.1pct": 1e-3, "1pct": 1e-2}  # 0.01%, 0.1%: the paper's
FEATURE_NOISE_LEVELS: dict[str, float] = {"10pct": 0.1, "20pct": 0.2}

# Registered variants per base: name suffix -> settings. Noise variants use large magnitude, no variance (Table 2).
VARIANTS: dict[str, SpuCoSettings] = {
    "": SpuCoSettings(),
    **{f"-magnitude-{m}": SpuCoSettings(magnitude=m) for m in MAGNITUDE_SIDES},
    **{f"-variance-{v}": SpuCoSettings(variance=v) for v in VARIANCE_BOX_SIDES},
    **{f"-label-noise-{k}": SpuCoSettings(label_noise=f) for k, f in LABEL_NOISE_LEVELS.items()},
    **{f"-feature-noise-{k}": SpuCoSettings(feature_noise=f) for k, f in FEATURE_NOISE_LEVELS.items()},
    # The validation split correlated like train, as SpuCoAnimals and Waterbirds keep theirs (few minority examples).
    "-correlated-val": SpuCoSettings(val_strength=DEFAULT_STRENGTH),
}


def register_variant(base_name: str, suffix: str, settings: SpuCoSettings) -> None:
    name = base_name + suffix

    def build(data_dir: Path, seed: int) -> ShiftDataset:
        return build_spuco(base_name, settings, data_dir, seed, name=name)

    build.__doc__ = f"SpuCoMNIST over {BASES[base_name].description}: {settings.describe()}."
    DATASETS.register(name)(build)


for _base in BASES:
    for _suffix, _settings in VARIANTS.items():
        register_variant(_base, _suffix, _settings)
