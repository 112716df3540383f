"""The eight WILDS 2.0 datasets as `ShiftDataset`s, read through the `wilds` package's own loaders.

`wilds.get_dataset(name, root_dir=..., download=False)` (and `unlabeled=True`) does the reading; this
module only maps its subsets onto raybench's split names, turns metadata into domain ids, reads
examples on demand (a thread pool decodes images), and scores predictions with the dataset's own
`eval`, so every number matches the WILDS leaderboard's definition. Everything per dataset comes from
datasets.yaml; what differs between input kinds (images, 8-band arrays, text, graphs, detection) is
one `InputKind` record each.

With `decoding_on(device)` (image_decoding=device) iWildCam's host threads only read each JPEG's bytes; the
batch is decoded and resized where the model runs (`EncodedImages.to`), so 16 host cores keep a GPU fed at 448 px.

Data lives under the WILDS root: `$RAYBENCH_WILDS_ROOT`, else `<data dir>/wilds` (`--set data_dir=...`).
"""
from __future__ import annotations

import dataclasses
import os
import re
import warnings
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from raybench.data.augment import ImageViews, cutout, random_flip, random_shift_crop
from raybench.data.base import (
    LABELED_SPLITS,
    UNLABELED_SPLITS,
    InputReadError,
    Records,
    ShiftDataset,
    Split,
    Task,
    TaskKind,
    Views,
)
from raybench.data.wilds import compat
from raybench.data.wilds.spec import WildsSpec, load_specs

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
ROOT_ENV = "RAYBENCH_WILDS_ROOT"


def wilds_root(data_dir: Path | None) -> Path:
    """Where the WILDS folders (`camelyon17_v1.0`, ...) live: `$RAYBENCH_WILDS_ROOT`, else `<data dir>/wilds`."""
    if os.environ.get(ROOT_ENV):
        return Path(os.environ[ROOT_ENV]).expanduser()
    from raybench.data import default_data_dir
    return Path(data_dir or default_data_dir()) / "wilds"


# ----- input kinds ------------------------------------------------------------------------------
def _identity(x: Any) -> Any:
    return x


IDENTITY_VIEWS = Views(plain=_identity, weak=_identity, strong=_identity)


def _read_image(size: tuple[int, int], raw: Any) -> Tensor:
    """A PIL image as uint8 (3, H, W) at the dataset's resolution (WILDS resizes iWildCam to 448 x 448)."""
    from torchvision.transforms.v2 import functional as TF

    image = raw.convert("RGB")
    if image.size != (size[1], size[0]):
        image = image.resize((size[1], size[0]))
    return TF.pil_to_tensor(image)


def _resize_array(x: Tensor, size: tuple[int, ...]) -> Tensor:
    """An 8-band (C, H, W) array at the model's size (only when `input_size` asks for another one)."""
    if tuple(x.shape[1:]) == tuple(size):
        return x
    return torch.nn.functional.interpolate(x[None], size=tuple(size), mode="bilinear", antialias=True)[0]


def _read_detection_image(raw: Any) -> Tensor:
    """A PIL image as float (3, H, W) in [0, 1]; Faster R-CNN resizes and normalises it itself."""
    from torchvision.transforms.v2 import functional as TF

    return TF.to_dtype(TF.pil_to_tensor(raw.convert("RGB")), torch.float32, scale=True)


def _normalize_images(images: list[Tensor]) -> list[Tensor]:
    """ImageNet statistics per image, as WILDS' GlobalWheat transform (the detector itself does not normalise)."""
    mean = torch.tensor(IMAGENET_MEAN).view(3, 1, 1)
    std = torch.tensor(IMAGENET_STD).view(3, 1, 1)
    return [(image - mean.to(image.device)) / std.to(image.device) for image in images]


# WILDS 2.0 trains GlobalWheat without augmentation, so all three views are the plain one.
DETECTION_VIEWS = Views(plain=_normalize_images, weak=_normalize_images, strong=_normalize_images)


def _collate_graphs(graphs: list[Any]) -> Any:
    from torch_geometric.data import Batch as GraphBatch

    return GraphBatch.from_data_list(graphs)


class MultispectralViews:
    """Views for 8-band satellite arrays (already normalised floats): flips and shifts; strong adds Cutout
    and a per-example brightness/contrast jitter of the RGB bands, as WILDS' PovertyMap augmentation."""

    def __init__(self, crop_pad: int, cutout_size: int) -> None:
        self.crop_pad, self.cutout_size = crop_pad, cutout_size

    def weak(self, x: Tensor) -> Tensor:
        return random_flip(random_shift_crop(x, self.crop_pad))

    def strong(self, x: Tensor) -> Tensor:
        x = self.weak(x).clone()
        n = x.shape[0]
        brightness = (torch.rand(n, 1, 1, 1, device=x.device) - 0.5) * 1.6
        contrast = 0.25 + torch.rand(n, 1, 1, 1, device=x.device) * 1.5
        rgb = x[:, :3]
        mean = rgb.mean(dim=(1, 2, 3), keepdim=True)
        x[:, :3] = (rgb - mean) * contrast + mean + brightness
        return cutout(x, self.cutout_size)

    def as_views(self) -> Views:
        return Views(plain=_identity, weak=self.weak, strong=self.strong)


@dataclass(frozen=True)
class InputKind:
    """How one kind of example is read, batched and augmented, and what that lets algorithms rely on."""

    read: Callable[[WildsSpec, Any], Any]
    collate: Callable[[list[Any]], Any]
    views: Callable[[WildsSpec], Views]
    capabilities: frozenset[str]


INPUT_KINDS: dict[str, InputKind] = {
    "image": InputKind(
        read=lambda spec, raw: _read_image(spec.input_shape[1:], raw), collate=torch.stack,
        views=lambda spec: ImageViews(IMAGENET_MEAN, IMAGENET_STD, spec.crop_pad, True, spec.cutout).as_views(),
        capabilities=frozenset({"strong_augmentation", "features"})),
    "multispectral": InputKind(
        read=lambda spec, raw: _resize_array(raw.float(), spec.input_shape[1:]), collate=torch.stack,
        views=lambda spec: MultispectralViews(spec.crop_pad, spec.cutout).as_views(),
        capabilities=frozenset({"strong_augmentation", "features"})),
    "text": InputKind(read=lambda spec, raw: str(raw), collate=list, views=lambda spec: IDENTITY_VIEWS,
                      capabilities=frozenset({"features", "text"})),
    "graph": InputKind(read=lambda spec, raw: raw, collate=_collate_graphs, views=lambda spec: IDENTITY_VIEWS,
                       capabilities=frozenset({"features"})),
    "detection": InputKind(read=lambda spec, raw: _read_detection_image(raw), collate=list,
                           views=lambda spec: DETECTION_VIEWS, capabilities=frozenset()),
}

# What `eval` of the wilds package expects as y_pred, from raybench's model outputs.
PREDICTIONS: dict[TaskKind, Callable[[Any], Any]] = {
    TaskKind.CLASSIFICATION: lambda outputs: outputs.argmax(dim=-1),
    TaskKind.REGRESSION: lambda outputs: outputs.view(len(outputs), -1),
    TaskKind.MULTILABEL: _identity,  # ogb's evaluator takes logits
    TaskKind.DETECTION: _identity,   # a list of {boxes, labels, scores}
}


def _file_of(err: BaseException, raw: Any) -> str:
    """The file a failed read was about: the decoded image's own name, PIL's `filename`, else the path-like
    local of the dataset's `get_input` frame that names an existing file (wilds opens and converts inside
    it), else "an unnamed file"."""
    for name in (getattr(raw, "filename", None), getattr(err, "filename", None)):
        if name:
            return str(name)
    tb = err.__traceback__
    while tb is not None:
        if tb.tb_frame.f_code.co_name == "get_input":
            for value in tb.tb_frame.f_locals.values():
                if isinstance(value, (str, os.PathLike)) and os.path.isfile(value):
                    return str(value)
        tb = tb.tb_next
    return "an unnamed file"


def _one_line(err: BaseException) -> str:
    return " ".join(str(err).split()) or type(err).__name__


class WildsInputs:
    """The inputs of one wilds subset, read on demand: `inputs[ids]` is the collated batch."""

    def __init__(self, dataset: Any, indices: np.ndarray, spec: WildsSpec, workers: int = 8,
                 encoded_in: str | None = None) -> None:
        self.dataset, self.indices, self.spec = dataset, indices, spec
        self.kind = INPUT_KINDS[spec.inputs]
        # The folder under the wilds dataset's `data_dir` holding its `_input_array` files, when batches are the
        # files' bytes (`EncodedImages`) to decode on the device; None: decoded here, by PIL.
        self.encoded_in = encoded_in
        self.workers = max(1, min(workers, os.cpu_count() or 1))
        self._pool: ThreadPoolExecutor | None = None

    def __len__(self) -> int:
        return len(self.indices)

    def __getitem__(self, index: Tensor | slice) -> Any:
        ids = self.indices[index] if isinstance(index, slice) else self.indices[np.asarray(index, dtype=np.int64)]
        if self.encoded_in is not None:
            return self._encoded(ids)
        examples = list(self._executor().map(self._read, ids))
        return self.kind.collate(examples)

    def _encoded(self, ids: np.ndarray) -> EncodedImages:
        files = [self.dataset.data_dir / self.encoded_in / self.dataset._input_array[int(i)] for i in ids]
        data = list(self._executor().map(self._read_bytes, ids, files))
        return EncodedImages(data, tuple(self.spec.input_shape[1:]), [str(f) for f in files],
                             [int(i) for i in ids], self.spec.name)

    def _read_bytes(self, idx: Any, path: Path) -> Tensor:
        """One file's bytes, undecoded (numpy reads them without holding the GIL)."""
        try:
            return torch.from_numpy(np.fromfile(path, dtype=np.uint8))
        except OSError as err:
            raise InputReadError(f"{self.spec.name} example {int(idx)}: cannot read {path}: {_one_line(err)}") from err

    def _read(self, idx: Any) -> Any:
        """One example, decoded; a file that cannot be read or decoded is an InputReadError naming it."""
        try:
            raw = self.dataset.get_input(int(idx))
            return self.kind.read(self.spec, raw)
        except (OSError, ValueError, SyntaxError) as err:  # what PIL and numpy raise on a bad file
            raise InputReadError(f"{self.spec.name} example {int(idx)}: cannot read "
                                 f"{_file_of(err, locals().get('raw'))}: {_one_line(err)}") from err

    def _executor(self) -> ThreadPoolExecutor:
        """Decoding overlaps across threads (PIL and numpy release the GIL); created lazily per process."""
        if self._pool is None:
            self._pool = ThreadPoolExecutor(self.workers, thread_name_prefix=f"raybench-{self.spec.name}")
        return self._pool

    def close(self) -> None:
        """Join the decode threads; the next read starts a new pool."""
        pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)

    def resized(self, shape: tuple[int, ...]) -> WildsInputs:
        return WildsInputs(self.dataset, self.indices, dataclasses.replace(self.spec, input_shape=shape), self.workers,
                           self.encoded_in)

    def encoded(self, folder: str) -> WildsInputs:
        """The same inputs, read as undecoded file bytes from `folder` under the dataset's `data_dir`."""
        return WildsInputs(self.dataset, self.indices, self.spec, self.workers, folder)

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_pool": None}


# ----- JPEG files decoded where the model runs (image_decoding=device) -----------------------------
# How each WILDS image dataset stores its examples, from the `get_input` of its wilds 2.0 classes.
STORED_AS: dict[str, str] = {"iwildcam": "JPEG", "camelyon17": "PNG", "fmow": "PNG", "globalwheat": "PNG"}
# Where iWildCam's `get_input` opens `data_dir / folder / _input_array[idx]`: (labeled, unlabeled) folder
# (wilds/datasets/iwildcam_dataset.py: 'train', one folder for every split; unlabeled/...: 'images').
JPEG_FOLDERS: dict[str, tuple[str, str]] = {"iwildcam": ("train", "images")}
NEEDS = "image_decoding=device needs a WILDS image dataset stored as JPEG (iwildcam)"


def jpeg_folders(name: str, inputs: str) -> tuple[str, str]:
    """(labeled, unlabeled) folders of a JPEG dataset's files; any other dataset is a one-line ValueError."""
    if name in JPEG_FOLDERS:
        return JPEG_FOLDERS[name]
    if name in STORED_AS:
        raise ValueError(f"dataset {name!r} stores its images as {STORED_AS[name]} files: {NEEDS}")
    raise ValueError(f"dataset {name!r} reads {inputs} inputs, not encoded image files: {NEEDS}")


def _check_decoder(device: torch.device) -> None:
    """decode_jpeg decodes on the CPU (libjpeg-turbo) or a CUDA GPU (nvJPEG), nowhere else."""
    if device.type not in ("cpu", "cuda"):
        raise ValueError(f"JPEG decoding runs on cpu or cuda, not {device.type!r}: image_decoding=device needs one")


# torchvision 0.29 deprecates its image codecs for TorchCodec, which is not a dependency; the batched nvJPEG
# decode is what this path exists for, so the notice is silenced for that one message.
warnings.filterwarnings("ignore", message="The image decoding and encoding capabilities of TorchVision",
                        category=DeprecationWarning)
_DECODER_LOCATION = re.compile(r"^\w+, \S+:\d+, ")  # "decode_jpeg, /src/.../decode_jpeg.cpp:171, "


@dataclass(frozen=True)
class EncodedImages:
    """A batch of undecoded JPEG files: `.to(device)` (what `move_to` calls) decodes them there in one
    `decode_jpeg` call and resizes them to `size` as PIL would, giving the uint8 (N, 3, H, W) batch the views take.

    Why bytes: PIL decoding and resizing camera frames to 448 px is the host's work per image (benchmarks/
    jpeg_decoding.py: ~19 images/s for 768 x 1024 frames on 2 shared cores); nvJPEG decodes a batch in one
    call, so the host threads only read files. On the CPU this path is slower than PIL (~12 images/s there:
    one decode thread, float resize): it is for a GPU, and exists on the CPU to be tested. The byte tensors stay in pageable memory
    (`pinned` passes this record through): decode_jpeg takes CPU tensors and nvJPEG parses the bitstream on
    the host itself, so pinning them would add a copy and buy nothing.

    Indexing (`batch[rows]`) gives the rows as another EncodedImages, so a batch can serve as a split's inputs.
    """

    data: list[Tensor]
    size: tuple[int, int]
    files: list[str]
    examples: list[int]
    dataset: str

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, index: Tensor | slice) -> EncodedImages:
        rows = range(len(self))[index] if isinstance(index, slice) else torch.as_tensor(index).reshape(-1).tolist()
        return EncodedImages([self.data[i] for i in rows], self.size, [self.files[i] for i in rows],
                             [self.examples[i] for i in rows], self.dataset)

    def to(self, device: torch.device | str, non_blocking: bool = False) -> Tensor:
        return decode_resized(self, torch.device(device))


def decode_resized(images: EncodedImages, device: torch.device) -> Tensor:
    """The batch decoded on `device` as RGB, each image resized to `images.size` (kept when already that size)."""
    from torchvision.io import ImageReadMode, decode_jpeg

    height, width = images.size
    if not len(images):
        return torch.empty((0, 3, height, width), dtype=torch.uint8, device=device)
    try:
        decoded = decode_jpeg(list(images.data), mode=ImageReadMode.RGB, device=device)
    except (RuntimeError, ValueError) as err:
        raise _undecodable(images, err) from err
    by_shape: dict[tuple[int, ...], list[int]] = {}
    for row, image in enumerate(decoded):
        by_shape.setdefault(tuple(image.shape), []).append(row)
    if len(by_shape) == 1:
        return resize_like_pil(torch.stack(decoded), images.size)
    batch = torch.empty((len(decoded), 3, height, width), dtype=torch.uint8, device=device)
    for rows in by_shape.values():
        batch[rows] = resize_like_pil(torch.stack([decoded[r] for r in rows]), images.size)
    return batch


def resize_like_pil(batch: Tensor, size: tuple[int, int]) -> Tensor:
    """uint8 (N, 3, h, w) images at `size` as PIL's `Image.resize` gives them (its default filter, bicubic).

    PIL resamples width, then height, each pass antialiased (the kernel widened by the scale when shrinking)
    and rounded to uint8 in between; torch's antialiased bicubic uses PIL's kernel (a = -0.5), so the same two
    rounded passes match it. Measured against the host path (PIL decode + resize), in intensity levels: the
    iWildCam fixture's 64 x 48 JPEGs at 448 x 448 max 1, mean 7.5e-5, at 32 x 32 max 1, mean 2.6e-3; sharp
    4-pixel blocks at iWildCam's frame sizes (1536 x 2048, 1080 x 1920) to 448 x 448 max 1 and 2, mean 1.1e-3
    (one float pass instead: max 13 at 448, where bicubic overshoots at block edges). Pillow 13 does the height
    pass first for some other shapes (e.g. 51 x 51 to 27 x 36); there this order can be up to ~14 levels off on
    such blocks. The decode itself is bit-identical to PIL's on the CPU (both libjpeg-turbo); nvJPEG's IDCT
    may differ by a level.
    """
    height, width = size
    if tuple(batch.shape[-2:]) == (height, width):
        return batch
    x = batch.float()
    if x.shape[-1] != width:
        x = _bicubic(x, (x.shape[-2], width))
    if x.shape[-2] != height:
        x = _bicubic(x, (height, width))
    return x.to(torch.uint8)


def _bicubic(x: Tensor, size: tuple[int, int]) -> Tensor:
    out = torch.nn.functional.interpolate(x, size=size, mode="bicubic", antialias=True, align_corners=False)
    return out.round_().clamp_(0, 255)


def _undecodable(images: EncodedImages, err: BaseException) -> InputReadError:
    """The batch's first file that does not decode on its own, named; a batched GPU decode says no more."""
    from torchvision.io import ImageReadMode, decode_jpeg

    for data, file, example in zip(images.data, images.files, images.examples):
        try:
            decode_jpeg(data, mode=ImageReadMode.RGB)
        except (RuntimeError, ValueError) as one:
            return InputReadError(f"{images.dataset} example {example}: cannot decode {file}: {_decoder_message(one)}")
    return InputReadError(f"{images.dataset}: cannot decode the batch of {len(images)} files starting at "
                          f"{images.files[0]}: {_decoder_message(err)}")


def _decoder_message(err: BaseException) -> str:
    return _DECODER_LOCATION.sub("", _one_line(err))


# ----- the dataset ------------------------------------------------------------------------------
@dataclass
class _EvalData:
    """What the dataset's own `eval` needs for one split besides the predictions."""

    targets: Any
    metadata: Tensor


@dataclass
class WildsShiftDataset(ShiftDataset):
    """A ShiftDataset scored by the wilds dataset's own `eval` on the original targets and metadata.

    `metrics` stays empty (eval needs each split's metadata, which a per-split metric function does not
    get); `headline_metrics` names the keys of eval's results that selection and tables use.
    """

    wilds_dataset: Any = None
    eval_data: dict[str, _EvalData] = field(default_factory=dict)
    headline_metrics: tuple[str, ...] = ()

    @property
    def metric_names(self) -> tuple[str, ...]:
        return self.headline_metrics

    def at_input_size(self, size: int) -> WildsShiftDataset:
        """Images read and models built at `size` x `size` (e.g. globalwheat below 1024 px for a quick look)."""
        if len(self.input_shape) != 3:
            raise ValueError(f"dataset {self.name!r} has no image size to change (input {self.input_shape})")
        shape = (self.input_shape[0], size, size)
        splits = {name: dataclasses.replace(split, x=split.x.resized(shape)) for name, split in self.splits.items()}
        return dataclasses.replace(self, input_shape=shape, splits=splits)

    def decoding_on(self, device: torch.device) -> WildsShiftDataset:
        """A copy whose image splits give `EncodedImages` (file bytes read by the host threads), decoded and
        resized on `device` by `move_to`; a dataset not stored as JPEG is a one-line ValueError naming its files."""
        folders = jpeg_folders(self.name, SPECS[self.name].inputs if self.name in SPECS else "unknown")
        _check_decoder(torch.device(device))
        splits = {name: dataclasses.replace(split, x=split.x.encoded(folders[name in UNLABELED_SPLITS]))
                  for name, split in self.splits.items()}
        info = {**self.info, "image_decoding": f"JPEG bytes read on the host, decoded on {torch.device(device)}"}
        return dataclasses.replace(self, splits=splits, info=info)

    def evaluate(self, split_name: str, outputs: Any, split: Split) -> dict[str, float]:
        data = self.eval_data[split_name]
        predictions = PREDICTIONS[self.task.kind](outputs)
        results, _ = self.wilds_dataset.eval(predictions, data.targets, data.metadata)
        return {f"{split_name}/{key}": float(value) for key, value in results.items() if _is_number(value)}


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float, np.number)) or (isinstance(value, Tensor) and value.numel() == 1)


def load_wilds(name: str, root: Path, unlabeled: bool) -> Any:
    """The wilds dataset object, never downloading; missing files raise FileNotFoundError naming them."""
    compat.apply()
    import wilds

    if not root.is_dir():
        raise compat.MissingDataError(f"WILDS root {str(root)!r} does not exist (set {ROOT_ENV} or data_dir)")
    return wilds.get_dataset(name, unlabeled=unlabeled, root_dir=str(root), download=False)


def domain_ids(datasets: list[Any], fields: tuple[str, ...]) -> tuple[list[Tensor], tuple[str, ...]]:
    """Joint domain ids over the labeled and unlabeled datasets: each distinct combination of `fields`.

    A field an unlabeled dataset lacks (CivilComments' `y`) counts as the value -1 there.
    """
    columns = []
    for dataset in datasets:
        meta = dataset.metadata_array
        cols = [meta[:, dataset.metadata_fields.index(f)].long() if f in dataset.metadata_fields
                else torch.full((len(meta),), -1, dtype=torch.long) for f in fields]
        columns.append(torch.stack(cols, dim=1))
    combos, inverse = torch.unique(torch.cat(columns), dim=0, return_inverse=True)
    names = tuple(",".join(f"{f}={int(v)}" for f, v in zip(fields, row)) for row in combos)
    return list(torch.split(inverse, [len(c) for c in columns])), names


def _targets(dataset: Any, indices: np.ndarray, task: TaskKind) -> tuple[Any, Any]:
    """(training targets, eval targets) of a subset: regression trains on a flat vector."""
    y = dataset.y_array
    if isinstance(y, list):
        items = [y[int(i)] for i in indices]
        return Records(items), items
    original = y[torch.as_tensor(indices)]
    return (original.view(-1).float() if task is TaskKind.REGRESSION else original), original


def build_wilds(spec: WildsSpec, data_dir: Path, seed: int) -> WildsShiftDataset:
    root = wilds_root(data_dir)
    labeled = load_wilds(spec.name, root, unlabeled=False)
    info = {"root": str(root)}
    try:
        unlabeled = load_wilds(spec.name, root, unlabeled=True)
    except FileNotFoundError as err:  # ERM and friends need no unlabeled data; say why it is absent
        unlabeled, info["unlabeled"] = None, f"not loaded: {err}"
    sources = [labeled] + ([unlabeled] if unlabeled is not None else [])
    domains, domain_names = domain_ids(sources, spec.domain_fields)
    splits: dict[str, Split] = {}
    eval_data: dict[str, _EvalData] = {}
    for dataset, domain, names in ((labeled, domains[0], LABELED_SPLITS),
                                   (unlabeled, domains[-1], UNLABELED_SPLITS)):
        if dataset is None:
            continue
        for split in (s for s in names if s in dataset.split_dict):
            indices = np.flatnonzero(np.asarray(dataset.split_array) == dataset.split_dict[split])
            if len(indices) == 0:
                continue
            d = domain[torch.as_tensor(indices)]
            y = None
            if split in LABELED_SPLITS:
                y, eval_targets = _targets(dataset, indices, spec.task)
                eval_data[split] = _EvalData(eval_targets, dataset.metadata_array[torch.as_tensor(indices)])
            splits[split] = Split(split, WildsInputs(dataset, indices, spec), y, d, d.clone())
    kind = INPUT_KINDS[spec.inputs]
    return WildsShiftDataset(
        name=spec.name, task=Task(spec.task, spec.n_outputs), splits=splits,
        metrics={}, headline_metrics=tuple(dict.fromkeys((*spec.metrics, spec.selection))),
        selection_metric=f"val/{spec.selection}", defaults=spec.defaults,
        views=kind.views(spec), domain_names=domain_names, input_shape=spec.input_shape,
        description=f"WILDS {spec.name} (wilds {_wilds_version()}), read from {root}", info=info,
        capabilities=kind.capabilities, wilds_dataset=labeled, eval_data=eval_data,
    )


def _wilds_version() -> str:
    import wilds
    return str(wilds.__version__)


SPECS: dict[str, WildsSpec] = load_specs()


def register_all() -> None:
    from raybench.data import DATASETS

    for name, spec in SPECS.items():
        builder = partial(build_wilds, spec)
        builder.__doc__ = f"WILDS {name} ({spec.inputs} {spec.task.value}, selected on {spec.selection}); the real data"
        DATASETS.register(name)(builder)
