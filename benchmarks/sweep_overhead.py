"""What running trials on Ray costs: a 10-trial sweep beside the same 10 configs run by the bare trainer.

For each executor (Ray Train TorchTrainer per trial, and the opt-in plain Tune function trial) it runs
one search of `--trials` trials (no replicates) on `digits-shift`, then runs the very same trainer
configs one after another in this process. It prints

- the useful-work fraction: sum of the trials' time inside the raybench trainer, divided by
  (sweep wall time x concurrent slots). Goal: >= 0.90;
- the overhead per trial: (wall time x slots - time inside the trainer) / trials, i.e. start-up, idle
  slots and Tune/MLflow bookkeeping;
- the ratio of the two wall times (bare sequential / sweep).

    .venv/bin/python benchmarks/sweep_overhead.py [--space erm] [--trials 10] [--executors train,function]
"""
from __future__ import annotations

import argparse
import os
import platform
import tempfile
import time
from pathlib import Path

import torch


def run_sweep_once(space: str, trials: int, executor: str, concurrent: int, root: Path) -> tuple[dict, float]:
    from raybench.sweep.runner import SweepOptions, prepare, run_sweep

    options = SweepOptions(space=space, trials=trials, replicates=0, max_concurrent=concurrent, executor=executor,
                           storage=str(root / "runs"), tracking_uri=f"sqlite:///{root}/mlflow.db", name=f"bench-{executor}")
    start = time.perf_counter()
    summary = run_sweep(prepare(options))
    return summary, time.perf_counter() - start


def run_bare(summary: dict, space_name: str) -> float:
    """The same configs, one after another, through the raybench trainer in this process (no Ray)."""
    from raybench.data import load_dataset
    from raybench.sweep.runner import SweepOptions, prepare
    from raybench.trainer import TrainConfig, Trainer

    prepared = prepare(SweepOptions(space=space_name, resume=True))  # resume: only resolving, nothing is run
    dataset = load_dataset("digits-shift")
    start = time.perf_counter()
    for trial in summary["trials"]:
        Trainer(TrainConfig.from_flat(prepared.space.materialize(trial["sampled"])), dataset=dataset).fit()
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--space", default="erm")
    parser.add_argument("--trials", type=int, default=10)
    parser.add_argument("--concurrent", type=int, default=2)
    parser.add_argument("--executors", default="train,function")
    args = parser.parse_args()
    from raybench.sweep import ray_backend

    print(f"machine: {platform.machine()}, {os.cpu_count()} cores, torch {torch.__version__}, ray {ray_backend.ray.__version__}")
    bare_wall = None
    for executor in args.executors.split(","):
        with tempfile.TemporaryDirectory() as tmp:
            summary, wall = run_sweep_once(args.space, args.trials, executor, args.concurrent, Path(tmp))
            ray_backend.shutdown()
        work = [t["metrics"].get("time/trial_s", 0.0) for t in summary["trials"]]
        useful = sum(work) / (wall * args.concurrent)
        print(f"[{executor}] {len(work)} trials, sweep wall {wall:.0f} s, time in trainer {sum(work):.0f} s, "
              f"useful-work fraction {useful:.3f}, overhead {(wall * args.concurrent - sum(work)) / len(work):.1f} s per trial",
              flush=True)
        if bare_wall is None:
            bare_wall = run_bare(summary, args.space)
            print(f"[bare] the same {len(work)} configs sequentially in one process: {bare_wall:.0f} s", flush=True)
        print(f"[{executor}] wall-time ratio bare / sweep = {bare_wall / wall:.2f} "
              f"(sweep uses {args.concurrent} slots, bare one process)", flush=True)


if __name__ == "__main__":
    main()
