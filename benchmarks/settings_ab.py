"""The trainer under two values of one speed setting, side by side on a CPU: by default contiguous convolution
weights against channels-last ones (`memory_format`); `--setting optimizer_impl --values foreach,fused` compares
PyTorch's optimiser implementations the same way.

Both sides run the same config through `Trainer.fit` (same seed, model, batches, evaluation of the four labeled
evaluation splits every epoch); only the setting differs. Runs alternate (first value, second value, ...) so
drift hits both alike. Printed per algorithm: the median and minimum seconds of each side, their ratio
(second / first, below 1 is faster) and the largest difference of any best-epoch metric the two reached. One
forward pass or update differs only by float rounding (another summation order), but training carries such
differences forward as it carries any change of summation order, so after hundreds of steps the two runs differ
as two close runs do: each value is deterministic, neither reproduces the other bit for bit.

    .venv/bin/python benchmarks/settings_ab.py [--setting memory_format] [--values contiguous,channels_last]
        [--algorithms erm,dann] [--repeats 5] [--steps 150] [--epochs 2]
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


def timed_fit(dataset, values: dict) -> tuple[float, dict[str, float]]:
    started = time.perf_counter()
    result = Trainer(TrainConfig.from_flat(values), dataset=dataset).fit()
    return time.perf_counter() - started, result.best_metrics


def base_config(algorithm: str, args: argparse.Namespace) -> dict:
    return {"algorithm": algorithm, "model": "lenet", "device": "cpu", "epochs": args.epochs,
            "max_steps_per_epoch": args.steps, "patience": None}


def compare(dataset, algorithm: str, args: argparse.Namespace) -> str:
    base, (first, second) = base_config(algorithm, args), args.values
    for value in args.values:  # warm-up: first-call costs (oneDNN kernels, imports) hit neither side's timings
        timed_fit(dataset, {**base, args.setting: value, "epochs": 1, "max_steps_per_epoch": 2})
    seconds: dict[str, list[float]] = {value: [] for value in args.values}
    metrics: dict[str, dict[str, float]] = {}
    for _ in range(args.repeats):
        for value in args.values:
            took, metrics[value] = timed_fit(dataset, {**base, args.setting: value})
            seconds[value].append(took)
    medians = {value: statistics.median(seconds[value]) for value in args.values}
    minima = {value: min(seconds[value]) for value in args.values}
    gap = max(abs(metrics[second][name] - value) for name, value in metrics[first].items())
    return (f"| {algorithm} | {medians[first]:.3f} | {medians[second]:.3f} | {medians[second] / medians[first]:.3f} | "
            f"{minima[second] / minima[first]:.3f} | {gap:.2e} |")


def two_values(text: str) -> tuple[str, str]:
    values = tuple(v.strip() for v in text.split(","))
    if len(values) != 2 or not all(values):
        raise argparse.ArgumentTypeError(f"expected two comma-separated values, got {text!r}")
    return values  # type: ignore[return-value]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--setting", default="memory_format", help="the trainer setting compared (default memory_format)")
    parser.add_argument("--values", type=two_values, default=("contiguous", "channels_last"),
                        help="its two values, comma-separated (default contiguous,channels_last)")
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
    for algorithm in algorithms:  # a refused algorithm or value: one line, nothing timed yet
        for value in args.values:
            try:
                TrainConfig.from_flat({**base_config(algorithm, args), args.setting: value}).resolve(dataset)
            except ConfigError as err:
                parser.error(f"--algorithms {algorithm} with {args.setting}={value}: {err.key}: {err.detail}")
    print(f"# {platform.processor() or platform.machine()}, torch {torch.__version__}, "
          f"{torch.get_num_threads()} intra-op threads; {args.repeats} alternating repeats, "
          f"{args.epochs} epochs of up to {args.steps} steps, LeNet on digits-shift; {args.setting}")
    first, second = args.values
    print(f"| algorithm | {first} s (median) | {second} s (median) | ratio of medians | ratio of minima | "
          "largest metric gap |")
    print("|---|---|---|---|---|---|")
    for algorithm in algorithms:
        print(compare(dataset, algorithm, args), flush=True)


if __name__ == "__main__":
    main()
