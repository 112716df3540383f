"""Throughput of the raybench trainer against a bare hand-written PyTorch loop, side by side.

Both sides run the same model (LeNet), the same batches (same sizes, same per-epoch evaluation of
the four labeled evaluation splits), the same augmentation calls and the same forward/backward
passes on `digits-shift` (ERM; DANN with its domain discriminator behind gradient reversal, both batches
augmented; FixMatch); only the bookkeeping differs. Runs alternate (bare, raybench, bare, ...)
so drift hits both sides alike; the throughput ratio (bare time / raybench time) is printed for the
medians and for the minima (the least disturbed run of each side). Goal: ratio >= 0.97.

    .venv/bin/python benchmarks/trainer_overhead.py [--repeats 5] [--steps 150] [--epochs 2]
"""
from __future__ import annotations

import argparse
import dataclasses
import platform
import statistics
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F

from raybench.algorithms.base import pseudo_label_loss
from raybench.algorithms.dann import GradientReversal, domain_discriminator
from raybench.data import ShiftDataset, load_dataset
from raybench.models import ModelSpec, build_model
from raybench.trainer import TrainConfig, Trainer
from raybench.trainer.batches import cycle_batches, epoch_batches
from raybench.trainer.loop import channels_last_for


@dataclasses.dataclass
class BareBatch:
    """One step's inputs as a hand-written loop holds them: labeled inputs, labels and domains, unlabeled
    inputs and domains (None for ERM), and the extra module DANN trains beside the model."""

    x_l: torch.Tensor
    y_l: torch.Tensor
    d_l: torch.Tensor
    x_u: torch.Tensor | None
    d_u: torch.Tensor | None
    discriminator: torch.nn.Module | None


def bare_erm_step(model, views, batch: BareBatch):
    return F.cross_entropy(model(views.plain(batch.x_l)), batch.y_l)


def bare_dann_step(model, views, batch: BareBatch):
    n = len(batch.x_l)
    features = model.featurizer(torch.cat([views.strong(batch.x_l), views.strong(batch.x_u)]))
    supervised = F.cross_entropy(model.head(features[:n]), batch.y_l)
    domain_logits = batch.discriminator(GradientReversal.apply(features, 1.0))
    return supervised + F.cross_entropy(domain_logits, torch.cat([batch.d_l, batch.d_u]))  # penalty: same cost at any value


def bare_fixmatch_step(model, views, batch: BareBatch):
    with torch.no_grad():
        weak = model(views.weak(batch.x_u))
    out = model(torch.cat([views.strong(batch.x_l), views.strong(batch.x_u)]))
    n = len(batch.x_l)
    unsup, _ = pseudo_label_loss(out[n:], weak, 0.7)
    return F.cross_entropy(out[:n], batch.y_l) + unsup


BARE_STEPS: dict[str, Callable] = {"erm": bare_erm_step, "dann": bare_dann_step, "fixmatch": bare_fixmatch_step}


@dataclasses.dataclass
class BareTimes:
    """A bare run's wall seconds, and of those the seconds of its training steps (evaluation left out)."""

    total_s: float
    train_s: float
    steps: int


def run_bare(dataset: ShiftDataset, config: TrainConfig, algorithm: str) -> BareTimes:
    """The loop a researcher would write by hand; returns its wall seconds and its training steps' seconds."""
    cfg = config.resolve(dataset)
    torch.manual_seed(cfg.seed)
    model = build_model(cfg.model, ModelSpec(dataset.input_shape, dataset.task.n_outputs, layout=dataset.input_layout))
    if channels_last_for(cfg.memory_format, torch.device("cpu")):  # the trainer's layout: only bookkeeping differs
        model = model.to(memory_format=torch.channels_last)
    discriminator = domain_discriminator(model.n_features, dataset.n_domains) if algorithm == "dann" else None
    trained = [*model.parameters(), *(discriminator.parameters() if discriminator is not None else [])]
    # fused, as the trainer's optimizer_impl=auto builds it on a CPU: only the bookkeeping differs (a checkout from
    # before that setting, run by step_overhead.py --against, steps a for-loop Adam instead)
    optimizer = torch.optim.Adam(trained, lr=cfg.lr, fused=True)
    uses_unlabeled = algorithm != "erm"
    n_l, n_u = cfg.batch_sizes(uses_unlabeled)
    train, unlabeled = dataset.split("train"), dataset.split(cfg.unlabeled_split)
    g_l, g_u = torch.Generator().manual_seed(0), torch.Generator().manual_seed(1)
    step_fn = BARE_STEPS[algorithm]
    steps = min(len(train) // n_l, cfg.max_steps_per_epoch)
    start, train_s = time.perf_counter(), 0.0
    for _ in range(cfg.epochs):
        epoch_started = time.perf_counter()
        model.train()
        if discriminator is not None:
            discriminator.train()
        labeled_batches = epoch_batches(len(train), n_l, g_l)
        unlabeled_batches = cycle_batches(len(unlabeled), n_u, g_u) if uses_unlabeled else None
        for _ in range(steps):
            idx = next(labeled_batches)
            u_idx = next(unlabeled_batches) if unlabeled_batches else None
            batch = BareBatch(train.x[idx], train.y[idx], train.domain[idx],
                              unlabeled.x[u_idx] if u_idx is not None else None,
                              unlabeled.domain[u_idx] if u_idx is not None else None, discriminator)
            loss = step_fn(model, dataset.views, batch)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        train_s += time.perf_counter() - epoch_started
        model.eval()
        with torch.no_grad():
            for name in dataset.eval_splits:
                split = dataset.split(name)
                for s in range(0, len(split), cfg.eval_batch_size):
                    model(dataset.views.plain(split.x[s:s + cfg.eval_batch_size])).argmax(1)
    return BareTimes(time.perf_counter() - start, train_s, steps * cfg.epochs)


def run_raybench(dataset: ShiftDataset, config: TrainConfig) -> float:
    start = time.perf_counter()
    Trainer(config, dataset=dataset).fit()
    return time.perf_counter() - start


def measure(dataset: ShiftDataset, algorithm: str, steps: int, epochs: int, repeats: int) -> tuple[list[float], list[float]]:
    hparams = {"augment": False} if algorithm == "erm" else {}
    config = TrainConfig.from_flat({"algorithm": algorithm, "epochs": epochs, "max_steps_per_epoch": steps, **hparams})
    bare, ours = [], []
    for _ in range(repeats):
        bare.append(run_bare(dataset, config, algorithm).total_s)
        ours.append(run_raybench(dataset, config))
    return bare, ours


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--steps", type=int, default=150, help="training steps per epoch")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    dataset = load_dataset("digits-shift")
    print(f"machine: {platform.processor() or platform.machine()}, {torch.get_num_threads()} torch threads, "
          f"torch {torch.__version__}")
    print(f"{'algorithm':10s} {'bare s (median)':>16s} {'raybench s (median)':>20s} {'ratio of medians':>17s} "
          f"{'ratio of minima':>16s}")
    for algorithm in BARE_STEPS:
        bare, ours = measure(dataset, algorithm, args.steps, args.epochs, args.repeats)
        b, o = statistics.median(bare), statistics.median(ours)
        print(f"{algorithm:10s} {b:16.2f} {o:20.2f} {b / o:17.3f} {min(bare) / min(ours):16.3f}", flush=True)


if __name__ == "__main__":
    main()
