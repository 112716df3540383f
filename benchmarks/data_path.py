"""Decode-bound data path, for the trainer's read-ahead: raybench's trainer reading ahead, reading on demand, and
a plain DataLoader.

The data is iWildCam in the exact on-disk format the wilds package reads (tests/wilds_fixtures/iwildcam.py),
written at the paper's 448 x 448 px as JPEG, with enough training images for `--steps` steps. The models are
small so that decoding, not compute, is the work:

    tiny  a strided 2-layer CNN (8x8/8 conv to 8 channels, 3x3 conv, pool, linear): decoding dominates
    fits  the same with 48 channels in the second conv: a step takes about as long as decoding a batch

Side by side, in one process and one run, per model:

    raybench prefetch=0   the Trainer reading each batch when the step asks for it (the old data path)
    raybench prefetch=2   the Trainer reading two batches ahead on a thread (the default)
    DataLoader            the same model, optimizer and view in a plain loop fed by
                          torch.utils.data.DataLoader(num_workers=2, prefetch_factor=2) over wilds' own subset

It prints images/s over the training steps and the fraction of that time spent waiting for data: the median of
`--repeats` runs per side, the sides taking turns. Compute
runs on `--threads` torch threads (default 1), leaving the other core to decode on a 2-core machine. The
WILDS reference `examples/run_expt.py` is not run: it is not part of the `wilds` package on PyPI.

    .venv/bin/python benchmarks/data_path.py                    # 100 steps of 16 images at 448 px
    .venv/bin/python benchmarks/data_path.py --steps 5 --size 64   # a dry run of the script itself
"""
from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from raybench.data import load_dataset
from raybench.data.wilds.adapter import _read_image
from raybench.models import MODELS, FeaturizerHead, ModelSpec, build_model
from raybench.trainer import TrainConfig, Trainer
from raybench.trainer.loop import channels_last_for
from tests.wilds_fixtures import iwildcam

MODEL_WIDTHS = {"tiny": 8, "fits": 48}
LR = 1e-3


def strided_cnn(width: int) -> Callable[[ModelSpec], FeaturizerHead]:
    def build(spec: ModelSpec) -> FeaturizerHead:
        featurizer = nn.Sequential(
            nn.Conv2d(spec.input_shape[0], 8, kernel_size=8, stride=8), nn.ReLU(inplace=True),
            nn.Conv2d(8, width, kernel_size=3, padding=1), nn.ReLU(inplace=True),
            nn.AdaptiveAvgPool2d(1), nn.Flatten(),
        )
        return FeaturizerHead(featurizer, n_features=width, n_outputs=spec.n_outputs)
    return build


for _name, _width in MODEL_WIDTHS.items():
    MODELS.register(f"data_path_{_name}")(strided_cnn(_width))


@dataclass(frozen=True)
class Measured:
    images: int
    train_s: float
    wait_s: float

    @property
    def images_per_s(self) -> float:
        return self.images / self.train_s

    @property
    def wait_fraction(self) -> float:
        return self.wait_s / self.train_s


def write_images(root: Path, n_train: int, size: int) -> None:
    """The iwildcam fixture format with `n_train` training images of size x size px (JPEG quality 80)."""
    iwildcam.IMAGE_SIZE = (size, size)
    iwildcam.SPLITS = {**iwildcam.SPLITS, "train": (n_train, (0, 1, 2))}
    iwildcam.write(root)


def raybench_run(model: str, args: argparse.Namespace, prefetch: int) -> Measured:
    config = TrainConfig.from_flat({
        "dataset": "iwildcam", "algorithm": "erm", "model": model, "batch_size": args.batch_size, "epochs": 1,
        "max_steps_per_epoch": args.steps, "device": "cpu", "lr": LR, "prefetch": prefetch, "eval_batch_size": 64,
        "input_size": args.size,
    })
    trainer = Trainer(config)
    trainer.fit()
    return Measured(args.steps * args.batch_size, trainer.train_s, trainer.data_wait_s)


def dataloader_run(model_name: str, args: argparse.Namespace) -> Measured:
    """The same model, Adam, view and loss, fed by DataLoader worker processes over wilds' own train subset."""
    dataset = load_dataset("iwildcam").at_input_size(args.size)
    wilds_train = dataset.wilds_dataset.get_subset("train", transform=ReadImage((args.size, args.size)))
    loader = torch.utils.data.DataLoader(wilds_train, batch_size=args.batch_size, shuffle=True, drop_last=True,
                                         num_workers=args.workers, prefetch_factor=2,
                                         generator=torch.Generator().manual_seed(0))
    model = build_model(model_name, ModelSpec(dataset.input_shape, dataset.task.n_outputs, layout=dataset.input_layout))
    if channels_last_for("auto", torch.device("cpu")):  # the layout the raybench side trains in
        model = model.to(memory_format=torch.channels_last)
    optimizer = torch.optim.Adam(model.parameters(), lr=LR)
    view = dataset.views.plain
    wait = 0.0
    started = time.perf_counter()
    batches = iter(loader)
    for _ in range(args.steps):
        before = time.perf_counter()
        x, y, _metadata = next(batches)
        wait += time.perf_counter() - before
        loss = nn.functional.cross_entropy(model(view(x)), y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    train_s = time.perf_counter() - started
    del batches  # joins the worker processes
    return Measured(args.steps * args.batch_size, train_s, wait)


class ReadImage:
    """raybench's own image read (RGB, resized to the model's size, uint8 tensor), picklable for the workers."""

    def __init__(self, size: tuple[int, int]) -> None:
        self.size = size

    def __call__(self, image: Any) -> torch.Tensor:
        return _read_image(self.size, image)


def median_run(runs: list[Measured]) -> Measured:
    """The run of median throughput (its own wait fraction with it)."""
    return sorted(runs, key=lambda run: run.images_per_s)[len(runs) // 2]


def print_row(model: str, side: str, measured: Measured, baseline: Measured) -> None:
    print(f"{model:5s} {side:20s} {measured.images_per_s:9.1f} img/s   data wait {measured.wait_fraction:6.1%}   "
          f"x DataLoader {measured.images_per_s / baseline.images_per_s:.3f}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--size", type=int, default=448)
    parser.add_argument("--threads", type=int, default=1, help="torch compute threads")
    parser.add_argument("--workers", type=int, default=2, help="DataLoader worker processes")
    parser.add_argument("--models", default="tiny,fits")
    parser.add_argument("--repeats", type=int, default=3, help="runs per side; the median run is printed")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    root = Path(tempfile.mkdtemp(prefix="raybench-data-path-"))
    try:
        write_images(root, args.steps * args.batch_size, args.size)
        os.environ["RAYBENCH_WILDS_ROOT"] = str(root)
        print(f"{os.cpu_count()} cores, torch threads {args.threads}, {args.steps} steps x {args.batch_size} images "
              f"at {args.size} px JPEG (iwildcam format); DataLoader num_workers={args.workers}, prefetch_factor=2")
        for name in args.models.split(","):
            model = f"data_path_{name}"
            raybench_run(model, argparse.Namespace(**{**vars(args), "steps": 3}), 2)  # warm-up: imports, page cache
            sides: dict[str, Callable[[], Measured]] = {
                "DataLoader": lambda model=model: dataloader_run(model, args),
                "raybench prefetch=0": lambda model=model: raybench_run(model, args, prefetch=0),
                "raybench prefetch=2": lambda model=model: raybench_run(model, args, prefetch=2),
            }
            runs: dict[str, list[Measured]] = {side: [] for side in sides}
            for repeat in range(args.repeats):  # rotate the order, so no side always runs first or last
                order = list(sides)[repeat % len(sides):] + list(sides)[:repeat % len(sides)]
                for side in order:
                    runs[side].append(sides[side]())
            medians = {side: median_run(measured) for side, measured in runs.items()}
            for side, measured in medians.items():
                print_row(name, side, measured, medians["DataLoader"])
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
