"""Per-step overhead on a CPU: microseconds a training step of raybench's loop costs over a bare hand-written loop,
for ERM, DANN and FixMatch, optionally for two checkouts side by side.

The bare loop is trainer_overhead.py's (same model, batches, augmentation calls, forward/backward; fused
`torch.optim.Adam`); raybench's side is `Trainer.fit` on the same config. Only the training steps are timed on both
sides (the Trainer's own `train_s`; the bare loop's epochs without their evaluation), divided by the steps taken.
The model is LeNet on digits-shift with a small batch, so a step's arithmetic is small and the loop's own
per-step work shows.

`--against DIR` runs a second checkout's raybench (PYTHONPATH=DIR, the same venv, this script's bare loop) in the
same invocation: each round starts one worker process per checkout, alternating which goes first, and every worker
alternates bare and raybench runs of each algorithm. Printed per checkout and algorithm: the median and minimum
microseconds a step of bare and raybench, and their difference (of the medians, and of the minima); with
`--against`, raybench's step time of this tree minus the other's.

    git archive 39e1df6 | tar -x -C /tmp/raybench-before     # the commit to compare against, as files
    .venv/bin/python benchmarks/step_overhead.py --against /tmp/raybench-before [--rounds 3] [--steps 60]
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ALGORITHMS = ("erm", "dann", "fixmatch")


def worker(steps: int, batch_size: int, repeats: int, threads: int) -> None:
    """One process's runs (raybench imported from PYTHONPATH): JSON {algorithm: {"bare": [s/step], "raybench": [...]}}."""
    import torch

    torch.set_num_threads(threads)
    sys.path.insert(0, str(HERE))
    from trainer_overhead import run_bare

    from raybench.data import load_dataset
    from raybench.trainer import TrainConfig, Trainer

    dataset = load_dataset("digits-shift")
    out: dict[str, dict[str, list[float]]] = {}
    for algorithm in ALGORITHMS:
        values = {"algorithm": algorithm, "model": "lenet", "device": "cpu", "epochs": 1, "batch_size": batch_size,
                  "max_steps_per_epoch": steps, "patience": None, **({"augment": False} if algorithm == "erm" else {})}
        config = TrainConfig.from_flat(values)
        warm = TrainConfig.from_flat({**values, "max_steps_per_epoch": 3})
        run_bare(dataset, warm, algorithm)  # first calls: oneDNN primitives, lazy imports, allocator
        Trainer(warm, dataset=dataset).fit()
        sides: dict[str, list[float]] = {"bare": [], "raybench": []}
        for _ in range(repeats):
            bare = run_bare(dataset, config, algorithm)
            sides["bare"].append(bare.train_s / bare.steps)
            trainer = Trainer(config, dataset=dataset)
            trainer.fit()
            sides["raybench"].append(trainer.train_s / trainer.progress.spent.steps)
        out[algorithm] = sides
    import raybench

    print("RESULT " + json.dumps({"raybench": raybench.__file__, "runs": out}))


def run_worker(checkout: Path, args: argparse.Namespace) -> dict[str, dict[str, list[float]]]:
    env = {**os.environ, "PYTHONPATH": str(checkout)}
    command = [sys.executable, str(Path(__file__).resolve()), "--worker", "--steps", str(args.steps),
               "--batch-size", str(args.batch_size), "--repeats", str(args.repeats), "--threads", str(args.threads)]
    proc = subprocess.run(command, env=env, cwd=checkout, capture_output=True, text=True, timeout=1800)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    if proc.returncode != 0 or not lines:
        raise SystemExit(f"step_overhead: the worker for {checkout} failed:\n{proc.stderr[-3000:]}")
    result = json.loads(lines[-1].removeprefix("RESULT "))
    if not Path(result["raybench"]).resolve().is_relative_to(checkout):
        raise SystemExit(f"step_overhead: the worker for {checkout} imported raybench from {result['raybench']}")
    return result["runs"]


def git_state(checkout: Path) -> str:
    try:
        head = subprocess.run(["git", "-C", str(checkout), "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(checkout), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "files (no git)"
    return f"{head}{' + uncommitted changes' if dirty else ''}"


def us(seconds: float) -> float:
    return seconds * 1e6


def report(label: str, runs: dict[str, dict[str, list[float]]]) -> None:
    for algorithm in ALGORITHMS:
        bare, ours = runs[algorithm]["bare"], runs[algorithm]["raybench"]
        b, o = statistics.median(bare), statistics.median(ours)
        print(f"{label:10s} {algorithm:9s} {us(b):12.1f} {us(o):14.1f} {us(o - b):+15.1f} {us(min(bare)):12.1f} "
              f"{us(min(ours)):14.1f} {us(min(ours) - min(bare)):+15.1f} {len(bare):4d}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--against", type=Path, default=None, help="another checkout to run side by side")
    parser.add_argument("--rounds", type=int, default=3, help="worker processes per checkout, alternating")
    parser.add_argument("--repeats", type=int, default=2, help="bare/raybench pairs per algorithm in each worker")
    parser.add_argument("--steps", type=int, default=60, help="training steps of each run")
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads (a 1-CPU trial runs 1)")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args.steps, args.batch_size, args.repeats, args.threads)
        return
    checkouts = {"this tree": HERE.parent, **({"against": args.against.resolve()} if args.against else {})}
    runs: dict[str, dict[str, dict[str, list[float]]]] = {k: {a: {"bare": [], "raybench": []} for a in ALGORITHMS}
                                                          for k in checkouts}
    for r in range(args.rounds):
        order = list(checkouts) if r % 2 == 0 else list(reversed(checkouts))
        for label in order:
            for algorithm, sides in run_worker(checkouts[label], args).items():
                for side, values in sides.items():
                    runs[label][algorithm][side].extend(values)
    import torch

    print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, {args.threads} torch "
          f"thread(s), torch {torch.__version__}; LeNet on digits-shift, batch {args.batch_size}, {args.steps} steps "
          f"a run, {args.rounds} rounds x {args.repeats} runs a side")
    for label, path in checkouts.items():
        print(f"{label}: {path} ({git_state(path)})")
    print(f"{'checkout':10s} {'algorithm':9s} {'bare us med':>12s} {'raybench us med':>14s} {'overhead med':>15s} "
          f"{'bare us min':>12s} {'raybench us min':>14s} {'overhead min':>15s} {'runs':>4s}")
    for label in checkouts:
        report(label, runs[label])
    if args.against:
        print("raybench's step, this tree minus against (us, medians / minima):")
        for algorithm in ALGORITHMS:
            now, before = runs["this tree"][algorithm]["raybench"], runs["against"][algorithm]["raybench"]
            print(f"  {algorithm:9s} {us(statistics.median(now) - statistics.median(before)):+10.1f} "
                  f"{us(min(now) - min(before)):+10.1f}   ratio of medians "
                  f"{statistics.median(now) / statistics.median(before):.3f}")


if __name__ == "__main__":
    main()
