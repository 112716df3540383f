"""What running trials on Ray costs: a 10-trial sweep beside the same 10 configs run by the bare trainer.

For each executor (Ray Train TorchTrainer per trial, and the opt-in plain Tune function trial) it runs
one search of `--trials` trials (no replicates) on `digits-shift`, then runs the very same trainer
configs one after another in this process. It prints

- the useful-work fraction: sum of the trials' training time (time inside the raybench trainer, less
  the time its reports waited for Ray to take them), divided by (sweep wall time x concurrent slots).
  Goal: >= 0.92 for the function executor, >= 0.80 for the Train executor;
- the overhead per trial: (wall time x slots - time inside the trainer) / trials, i.e. start-up, idle
  slots and Tune/MLflow bookkeeping;
- the ratio of the two wall times (bare sequential / sweep);
- per trial, from the timing every run reports: start-up (driver start to the trainer's start) and
  teardown (last report to the driver's return), mean and range;
- once per sweep: the seconds before the first trainer started and after the last report, and the
  CPU-seconds of the sweep process itself (Tune, the searcher, MLflow);
- how many Ray worker processes the sweep's local Ray started (each a fresh Python importing Ray).

`--ablate` measures the Train executor's start-up savings (raybench.sweep.ray_trial.TrainPath) each on its
own: one short sweep (`--ablate-trials` trials of `--ablate-epochs` epochs, one at a time so the other slot
does not compete) with Ray's defaults, then one per saving switched on alone, then all of them; and, in
fresh interpreters, what importing the sweep backend costs with and without torchvision and scikit-learn
(which raybench now imports only where they are used).

    .venv/bin/python benchmarks/sweep_overhead.py [--space erm] [--trials 10] [--executors train,function]
    .venv/bin/python benchmarks/sweep_overhead.py --ablate [--ablate-trials 4] [--ablate-epochs 3]
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from raybench.records import SweepSummary

USEFUL_WORK_GOALS = {"train": 0.80, "function": 0.92}  # the useful-work fraction each executor should reach


def run_sweep_once(space: str, trials: int, executor: str, concurrent: int, root: Path,
                   fixed: dict | None = None) -> tuple[SweepSummary, float]:
    from raybench.report.record import SWEEP_RECORD
    from raybench.sweep.runner import SweepOptions, prepare, run_sweep

    options = SweepOptions(space=space, trials=trials, replicates=0, max_concurrent=concurrent, executor=executor,
                           storage=str(root / "runs"), tracking_uri=f"sqlite:///{root}/mlflow.db", name=f"bench-{executor}",
                           extra_fixed=dict(fixed or {}))
    global LAST_SWEEP
    started, cpu, start = time.time(), time.process_time(), time.perf_counter()
    summary = run_sweep(prepare(options), SWEEP_RECORD)
    wall = time.perf_counter() - start
    LAST_SWEEP = SweepClock(started, time.time(), time.process_time() - cpu)
    return summary, wall


@dataclasses.dataclass(frozen=True)
class SweepClock:
    """When the last sweep started and ended (wall clock, which its trials' reports share on one node) and
    the CPU-seconds of this process meanwhile: Tune's driver loop, the searcher, MLflow logging."""

    started: float
    ended: float
    cpu_s: float

    def phases(self, summary: SweepSummary) -> tuple[float, float]:
        """Seconds before the first trainer started (Ray's and Tune's start, MLflow's set-up) and after the
        last report (the sweep's summary, tables and figures): paid once per sweep, not per trial."""
        metrics = [t.metrics for t in summary.trials]
        first = min(m.get("time/trainer_started_at", self.ended) for m in metrics)
        last = max(m.get("time/reported_at", self.started) for m in metrics)
        return first - self.started, self.ended - last


LAST_SWEEP: SweepClock | None = None


def run_bare(summary: SweepSummary, space_name: str) -> float:
    """The same configs, one after another, through the raybench trainer in this process (no Ray)."""
    from raybench.data import load_dataset
    from raybench.sweep.runner import SweepOptions, prepare
    from raybench.trainer import TrainConfig, Trainer

    with tempfile.TemporaryDirectory() as tmp:  # only resolving the space as the sweep did: nothing runs there
        prepared = prepare(SweepOptions(space=space_name, storage=tmp, tracking_uri=f"sqlite:///{tmp}/unused.db"))
    dataset = load_dataset("digits-shift")
    start = time.perf_counter()
    for trial in summary.trials:
        Trainer(TrainConfig.from_flat(prepared.space.materialize(trial.sampled)), dataset=dataset).fit()
    return time.perf_counter() - start


def ray_processes_started() -> int:
    """Worker processes the last local Ray session started (each writes its own core-worker log): every
    Ray Train run starts several, each a fresh Python importing Ray."""
    logs = Path(os.environ.get("RAY_TMPDIR", tempfile.gettempdir())) / "ray" / "session_latest" / "logs"
    return len(list(logs.glob("python-core-worker-*.log")))


def span(values: list[float]) -> str:
    return f"{statistics.mean(values):.1f} s ({min(values):.1f}-{max(values):.1f})"


def training_seconds(metrics: dict) -> float:
    """Time inside the trainer less the time its reports waited to be taken by Ray."""
    return metrics.get("time/trial_s", 0.0) - metrics.get("time/report_wait_s", 0.0)


def per_trial_timing(summary: SweepSummary) -> tuple[list[float], list[float], list[float]]:
    """Each trial's start-up, report waits and teardown seconds, as its driver and worker reported them."""
    metrics = [t.metrics for t in summary.trials if "time/startup_s" in t.metrics]
    return ([m["time/startup_s"] for m in metrics], [m["time/report_wait_s"] for m in metrics],
            [m["time/teardown_s"] for m in metrics])


def import_seconds(statement: str, repeats: int = 3) -> float:
    """Median wall seconds of a fresh interpreter running `statement` (what every new Ray process pays)."""
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        subprocess.run([sys.executable, "-c", statement], check=True)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def ablate(args: argparse.Namespace) -> None:
    from raybench.sweep import ray_backend, ray_search

    rays_defaults = ray_backend.TrainPath(reuse_driver=False, health_check_interval_s=2.0,
                                          process_group_for_one_worker=True, train_extras=True,
                                          dataset_manager=True)
    ours = ray_backend.TrainPath()
    variants = [("Ray's defaults", rays_defaults)]
    for field in dataclasses.fields(ray_backend.TrainPath):
        variants.append((f"only {field.name}={getattr(ours, field.name)}",
                         dataclasses.replace(rays_defaults, **{field.name: getattr(ours, field.name)})))
    variants.append(("all (raybench's default)", ours))
    fixed = {"epochs": args.ablate_epochs, "patience": None}
    rows = []
    for label, path in variants:
        ray_search.DEFAULT_TRAIN_PATH = path  # what a RunSpec's train_path defaults to
        with tempfile.TemporaryDirectory() as tmp:
            summary, wall = run_sweep_once(args.space, args.ablate_trials, "train", 1, Path(tmp), fixed)
        startup, waits, teardown = per_trial_timing(summary)
        training = sum(training_seconds(t.metrics) for t in summary.trials)
        per_trial = (wall - training) / len(summary.trials)  # one slot: all the rest is overhead
        rows.append((label, startup, waits, teardown, per_trial, wall))
        print(f"[ablate] {label}: start-up {span(startup)}, report waits {span(waits)}, teardown {span(teardown)}, "
              f"sweep wall {wall:.1f} s, training {training:.1f} s, overhead per trial {per_trial:.2f} s", flush=True)
    base = rows[0][4]
    print("\nOverhead per trial = (sweep wall - training) / trials: start-up, report waits and teardown, plus what the "
          "per-run timing cannot see (starting each driver process, Tune's and MLflow's bookkeeping, Ray's start).")
    print("\n| change | start-up (driver to trainer) | report waits | teardown | overhead per trial | saving |")
    print("|---|---|---|---|---|---|")
    for label, startup, waits, teardown, per_trial, _ in rows:
        print(f"| {label} | {span(startup)} | {span(waits)} | {span(teardown)} | {per_trial:.2f} s | "
              f"{base - per_trial:.2f} s |")
    lean = import_seconds("import raybench.sweep.ray_backend")
    eager = import_seconds("import torchvision.transforms.v2, torchvision.models, sklearn.linear_model, sklearn.svm, "
                           "sklearn.model_selection, sklearn.cluster; import raybench.sweep.ray_backend")
    print(f"\nimporting the sweep backend in a fresh interpreter (median of 3): {lean:.2f} s; with torchvision and "
          f"scikit-learn imported as before: {eager:.2f} s; saved per new process: {eager - lean:.2f} s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--space", default="erm")
    parser.add_argument("--trials", type=int, default=10)
    parser.add_argument("--concurrent", type=int, default=2)
    parser.add_argument("--executors", default="train,function")
    parser.add_argument("--ablate", action="store_true", help="measure each Train start-up saving on its own")
    parser.add_argument("--ablate-trials", type=int, default=4)
    parser.add_argument("--ablate-epochs", type=int, default=3)
    args = parser.parse_args()
    from raybench.sweep import ray_backend, ray_cluster

    if args.ablate:
        print(f"machine: {platform.machine()}, {os.cpu_count()} cores, torch {torch.__version__}, "
              f"ray {ray_cluster.ray.__version__}", flush=True)
        ablate(args)
        return

    print(f"machine: {platform.machine()}, {os.cpu_count()} cores, torch {torch.__version__}, ray {ray_cluster.ray.__version__}")
    bare_wall = None
    for executor in args.executors.split(","):
        with tempfile.TemporaryDirectory() as tmp:
            summary, wall = run_sweep_once(args.space, args.trials, executor, args.concurrent, Path(tmp))
            ray_backend.shutdown()
        work = [training_seconds(t.metrics) for t in summary.trials]
        useful = sum(work) / (wall * args.concurrent)
        goal = USEFUL_WORK_GOALS[executor]
        print(f"[{executor}] {len(work)} trials, sweep wall {wall:.1f} s, training {sum(work):.1f} s, useful-work fraction "
              f"{useful:.3f} (goal >= {goal:.2f}, judged unrounded: {'met' if useful >= goal else 'missed'}), overhead "
              f"{(wall * args.concurrent - sum(work)) / len(work):.2f} s per trial", flush=True)
        if bare_wall is None:
            bare_wall = run_bare(summary, args.space)
            print(f"[bare] the same {len(work)} configs sequentially in one process: {bare_wall:.0f} s", flush=True)
        print(f"[{executor}] wall-time ratio bare / sweep = {bare_wall / wall:.2f} "
              f"(sweep uses {args.concurrent} slots, bare one process)", flush=True)
        startup, waits, teardown = per_trial_timing(summary)
        print(f"[{executor}] per trial: start-up {span(startup)}, report waits {span(waits)}, teardown {span(teardown)}",
              flush=True)
        before, after = LAST_SWEEP.phases(summary)
        print(f"[{executor}] once per sweep: {before:.1f} s before the first trainer started, {after:.1f} s after the "
              f"last report; the sweep process itself (Tune, searcher, MLflow) used {LAST_SWEEP.cpu_s:.1f} CPU-seconds",
              flush=True)
        processes = ray_processes_started()
        print(f"[{executor}] Ray worker processes started: {processes} ({processes / len(work):.1f} per trial)", flush=True)


if __name__ == "__main__":
    main()
