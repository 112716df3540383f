"""The trainer with contiguous convolution weights against channels-last ones (the `memory_format` setting), side
by side on a CPU.

Both sides run the same config through `Trainer.fit` (same seed, model, batches, evaluation of the four labeled
evaluation splits every epoch); only `memory_format` differs. Runs alternate (contiguous, channels_last, ...) so
drift hits both alike. Printed per algorithm: the median and minimum seconds of each side, their ratio
(channels_last / contiguous, below 1 is faster) and the largest difference of any best-epoch metric the two
reached. One forward pass differs only by float rounding (the convolutions sum in another order), but training
carries such differences forward as it carries any change of summation order, so after hundreds of steps the
two runs differ as two close runs do: each layout is deterministic, neither reproduces the other bit for bit.

    .venv/bin/python benchmarks/memory_format.py [--algorithms erm,dann] [--repeats 5] [--steps 150] [--epochs 2]
                                                [--threads N]  (torch's intra-op threads; a 1-CPU trial runs 1)
"""
from __future__ import annotations

import argparse
import platform
import statistics
import time

import torch

from raybench.algorithms import ALGORITHMS
from raybench.data import load_dataset
from raybench.flag_types import positive_int
from raybench.trainer import ConfigError, TrainConfig, Trainer

LAYOUTS = ("contiguous", "channels_last")


def timed_fit(dataset, values: dict) -> tuple[float, dict[str, float]]:
    started = time.perf_counter()
    result = Trainer(TrainConfig.from_flat(values), dataset=dataset).fit()
    return time.perf_counter() - started, result.best_metrics


def base_config(algorithm: str, args: argparse.Namespace) -> dict:
    return {"algorithm": algorithm, "model": "lenet", "device": "cpu", "epochs": args.epochs,
            "max_steps_per_epoch": args.steps, "patience": None}


def compare(dataset, algorithm: str, args: argparse.Namespace) -> str:
    base = base_config(algorithm, args)
    timed_fit(dataset, {**base, "memory_format": "contiguous", "epochs": 1, "max_steps_per_epoch": 2})  # warm-up
    seconds: dict[str, list[float]] = {layout: [] for layout in LAYOUTS}
    metrics: dict[str, dict[str, float]] = {}
    for _ in range(args.repeats):
        for layout in LAYOUTS:
            took, metrics[layout] = timed_fit(dataset, {**base, "memory_format": layout})
            seconds[layout].append(took)
    medians = {layout: statistics.median(seconds[layout]) for layout in LAYOUTS}
    minima = {layout: min(seconds[layout]) for layout in LAYOUTS}
    gap = max(abs(metrics["channels_last"][name] - value) for name, value in metrics["contiguous"].items())
    return (f"| {algorithm} | {medians['contiguous']:.3f} | {medians['channels_last']:.3f} | "
            f"{medians['channels_last'] / medians['contiguous']:.3f} | "
            f"{minima['channels_last'] / minima['contiguous']:.3f} | {gap:.2e} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--algorithms", default="erm,dann", help="comma-separated algorithms (default erm,dann)")
    parser.add_argument("--repeats", type=positive_int, default=5)
    parser.add_argument("--steps", type=positive_int, default=150, help="steps per epoch")
    parser.add_argument("--epochs", type=positive_int, default=2)
    parser.add_argument("--threads", type=positive_int, default=None,
                        help="torch's intra-op threads (default: torch's own)")
    args = parser.parse_args()
    algorithms = [name.strip() for name in args.algorithms.split(",")]
    unknown = [name for name in algorithms if name not in ALGORITHMS]
    if unknown:  # one line before any training, not a traceback after the first algorithm's runs
        parser.error(f"--algorithms: {ALGORITHMS.unknown(unknown[0])}")
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    dataset = load_dataset("digits-shift")
    for algorithm in algorithms:  # an algorithm that refuses LeNet on digits-shift: one line, nothing timed yet
        try:
            TrainConfig.from_flat(base_config(algorithm, args)).resolve(dataset)
        except ConfigError as err:
            parser.error(f"--algorithms {algorithm}: {err.key}: {err.detail}")
    print(f"# {platform.processor() or platform.machine()}, torch {torch.__version__}, "
          f"{torch.get_num_threads()} intra-op threads; {args.repeats} alternating repeats, "
          f"{args.epochs} epochs of up to {args.steps} steps, LeNet on digits-shift")
    print("| algorithm | contiguous s (median) | channels_last s (median) | ratio of medians | ratio of minima | "
          "largest metric gap |")
    print("|---|---|---|---|---|---|")
    for algorithm in algorithms:
        print(compare(dataset, algorithm, args), flush=True)


if __name__ == "__main__":
    main()
