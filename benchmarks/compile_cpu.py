"""Compiled against eager training on a CPU, through the Trainer's `compile` setting (torch.compile, inductor,
mode "default"), for the convolutional family (LeNet) and the transformer family (the DABS transformer), ERM on
digits-shift.

Runs alternate (eager, compiled, eager, compiled, ...) in one process, same seed and batches. Each run trains
warm_up + steps steps; the warm-up (where compiling happens) is timed apart, the steps after it give steps/s.
Printed per model: steps/s of each side (median and best run), each run's warm-up seconds (a compiled run's
warm-up minus an eager one's is its compile time; later compiled runs find Inductor's caches), the ratio
compiled / eager, and the largest difference between the two sides' per-step losses over the run's steps.

    .venv/bin/python benchmarks/compile_cpu.py [--models lenet,dabs_transformer_small] [--steps 40] [--warm-up 5]
"""
from __future__ import annotations

import argparse
import os
import platform
import statistics
import time
from typing import Any

import torch

from raybench.data import load_dataset
from raybench.trainer import TrainConfig, Trainer


def has_compile_setting() -> bool:
    return "compile" in TrainConfig.field_names()


def run(dataset: Any, model: str, mode: str, warm_up: int, steps: int, batch_size: int) -> dict[str, Any]:
    """One Trainer.fit; returns its timed steps' seconds, its warm-up's seconds and every step's loss."""
    values = {"algorithm": "erm", "model": model, "device": "cpu", "epochs": 1, "batch_size": batch_size,
              "max_steps_per_epoch": warm_up + steps, "patience": None, "augment": False}
    if has_compile_setting():
        values["compile"] = mode
    trainer = Trainer(TrainConfig.from_flat(values), dataset=dataset)
    losses: list[float] = []
    marks: dict[str, float] = {}
    record_losses(trainer, losses)
    stamp_steps(trainer, marks, warm_up)
    trainer._evaluate = lambda algorithm: {trainer.config.selection_metric: 0.0}  # type: ignore[method-assign]
    if not has_compile_setting() and mode != "none":
        compile_directly(trainer, mode)
    trainer.fit()
    return {"timed_s": marks["end"] - marks["warm"],
            "warm_up_s": marks["warm"] - marks["start"], "losses": losses, "steps": steps}


def record_losses(trainer: Trainer, losses: list[float]) -> None:
    """Each step's loss as the algorithm's forward returned it (read on the host: a CPU, where that is free)."""
    parallel = trainer._parallel

    def recording(algorithm: Any) -> Any:
        forward = parallel(algorithm)

        def call(*args: Any) -> Any:
            out = forward(*args)
            losses.append(float(out.loss.detach()))
            return out

        return call

    trainer._parallel = recording  # type: ignore[method-assign]


def stamp_steps(trainer: Trainer, marks: dict[str, float], warm_up: int) -> None:
    step, done = trainer._train_step, [0]

    def stamped(*args: Any, **kwargs: Any) -> Any:
        if done[0] == 0:
            marks["start"] = time.perf_counter()
        if done[0] == warm_up:
            marks["warm"] = time.perf_counter()
        result = step(*args, **kwargs)
        done[0] += 1
        marks["end"] = time.perf_counter()
        return result

    trainer._train_step = stamped  # type: ignore[method-assign]


def compile_directly(trainer: Trainer, mode: str) -> None:
    """Without the `compile` setting (an older checkout): torch.compile the model's featurizer and head in place."""
    new_algorithm = trainer._new_algorithm

    def compiled() -> Any:
        algorithm = new_algorithm()
        algorithm.model.featurizer.compile(mode=mode)
        algorithm.model.head.compile(mode=mode)
        return algorithm

    trainer._new_algorithm = compiled  # type: ignore[method-assign]


def compare(dataset: Any, model: str, args: argparse.Namespace) -> None:
    eager, compiled = [], []
    for _ in range(args.repeats):
        eager.append(run(dataset, model, "none", args.warm_up, args.steps, args.batch_size))
        compiled.append(run(dataset, model, "default", args.warm_up, args.steps, args.batch_size))
    rate = {side: [r["steps"] / r["timed_s"] for r in runs] for side, runs in (("eager", eager), ("compiled", compiled))}
    diff = max(abs(a - b) for a, b in zip(eager[0]["losses"], compiled[0]["losses"], strict=True))
    e, c = statistics.median(rate["eager"]), statistics.median(rate["compiled"])
    print(f"{model}: eager {e:.2f} steps/s (best {max(rate['eager']):.2f}), compiled {c:.2f} steps/s (best "
          f"{max(rate['compiled']):.2f}); compiled / eager: medians {c / e:.3f}, best {max(rate['compiled']) / max(rate['eager']):.3f}")
    print(f"  warm-up s ({args.warm_up} steps): eager {[round(r['warm_up_s'], 2) for r in eager]}, compiled "
          f"{[round(r['warm_up_s'], 2) for r in compiled]}")
    print(f"  losses over the first {len(eager[0]['losses'])} steps: largest |eager - compiled| {diff:.3g} "
          f"(first loss {eager[0]['losses'][0]:.4f}, last eager {eager[0]['losses'][-1]:.4f}, "
          f"last compiled {compiled[0]['losses'][-1]:.4f})", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="lenet,dabs_transformer_small")
    parser.add_argument("--steps", type=int, default=40, help="timed steps after the warm-up")
    parser.add_argument("--warm-up", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    how = "the Trainer's `compile` setting" if has_compile_setting() else "torch.compile directly (no `compile` setting)"
    print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, {args.threads} torch "
          f"threads, torch {torch.__version__}; compiled through {how}, inductor, mode default; ERM on digits-shift, "
          f"batch {args.batch_size}, {args.warm_up} warm-up + {args.steps} timed steps, {args.repeats} runs a side")
    dataset = load_dataset("digits-shift")
    for model in args.models.split(","):
        compare(dataset, model, args)


if __name__ == "__main__":
    main()
