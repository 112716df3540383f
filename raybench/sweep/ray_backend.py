"""The Ray backend's face: the names the sweep's runner (raybench/sweep/runner.py), the benchmark
(raybench/commands/benchmark.py) and the sweep process (raybench/commands/sweep.py) use, each imported from the
module of the backend that does its job. The backend's modules, `raybench/sweep/ray_*.py`, are the only code that
imports Ray Tune and Ray Train (their APIs move between releases):

- ray_cluster.py: the cluster's lifecycle. `already_connected`, `connect` (join a cluster or start a private one, with the
  `trial_driver` resource), `start_shared_cluster` (a benchmark's private Ray), `probe_address`,
  `check_resources`, the `NodeWatch` of the driver's node, `node_temp_dir`, `capacity_words`, `shutdown`; the
  settings Ray reads from the environment, and the removal of Ray's colour reset at exit.
- ray_search.py: a stage's Tune experiment. `RunSpec`, `make_trainable`, the searchers (`DistinctOptunaSearch`,
  `QueuedSearch` behind a benchmark's trial queue), the scheduler (`CooperativeASHA`), `run_search`,
  `run_replicates`, `run_extension` (a finished search made larger), `_fit_or_resume` into a `StageResult`, `cut_short`, the restored trials' ids.
- ray_callbacks.py: the Tune callbacks in the sweep's process. `TrackingCallback` (MLflow), `ProgressCallback`,
  `StorageWatch` (a full --storage), `science` (a result without Tune's bookkeeping), the runs' names.
- ray_collect.py: results back to typed records. `collect` makes each trial's TrialRecord from one source, its
  completed record (Tune's last result only where a trial by design left none); `RunRecords`, `error_reason`.
- ray_trial.py: what runs inside each Tune trial's process: the two trainables, their reporters and records
  (`CompletedRuns`, `StopRequests`) and the values a trial is told (`TrialSpec`, `Resources`, `TrainPath`,
  `EarlyStopping`). It imports none of the modules above, nor Optuna and Tune's searchers: Tune unpickles it in
  every trial process.
- ray_worker.py: what runs inside Ray Train's controller and worker processes (the worker loop, its reporter, the
  report callback), free of Tune, Optuna and torch so that those processes start fast.

Two executors run the very same raybench `Trainer`:
- `train` (default): each Tune trial is a small driver function that fits a Ray Train `TorchTrainer`
  (Train V2 inside Tune: Ray 2.60 refuses `Tuner(TorchTrainer(...))`). Workers report every epoch with a checkpoint; the same
  trial scales from one CPU worker to multi-GPU DDP by `ScalingConfig` alone. The driver holds no CPU:
  it asks for the custom `trial_driver` resource on the head node.
- `function`: a plain Tune function trainable for single-worker trials. It skips Train's per-trial
  start-up (worker group, process group) and reuses actors; it is an explicit opt-in, measured beside
  the Train path in benchmarks/sweep_overhead.py.

How a Train-executor trial starts and ends is `TrainPath`: each of its settings is a measured saving of
per-trial start-up or teardown (benchmarks/README.md, "Sweep overhead").

`--scheduler asha` stops unpromising search trials early with Tune's ASHA, but cooperatively
(`CooperativeASHA`, `StopRequests`): the trial ends itself after the epoch it reported, as a finished run.

Every trial reports what it used: its wall seconds split into start-up (driver start to the raybench
trainer's start), time in the trainer and teardown (last report to the driver's return), its workers'
CPU-seconds and the GPU-seconds it held. Its completed record carries them (CompletedRuns).

Tune pickles the searcher, the scheduler and the callbacks into its experiment state by module and name. Those
saved before the backend was split name this module: each class Tune pickles is still exposed here under its
name, so such an experiment resumes (tests/test_trial_imports.py).
"""
from __future__ import annotations

# First: ray_cluster sets what Ray and Tune read from the environment before it imports Ray.
from raybench.sweep.ray_cluster import (  # isort: skip
    already_connected,
    capacity_words,
    check_resources,
    connect,
    node_temp_dir,
    probe_address,
    shutdown,
    start_shared_cluster,
)
from raybench.sweep.ray_callbacks import ProgressCallback, StorageWatch, TrackingCallback
from raybench.sweep.ray_collect import RunRecords, collect
from raybench.sweep.ray_search import (
    CooperativeASHA,
    DistinctOptunaSearch,
    QueuedSearch,
    RunSpec,
    cut_short,
    make_trainable,
    run_extension,
    run_replicates,
    run_search,
)
from raybench.sweep.ray_trial import EarlyStopping, Resources, TrainPath

__all__ = [  # what the runner, the benchmark, the sweep process and benchmarks/ use; and the classes Tune pickles
    "CooperativeASHA",
    "DistinctOptunaSearch",
    "EarlyStopping",
    "ProgressCallback",
    "QueuedSearch",
    "Resources",
    "RunRecords",
    "RunSpec",
    "StorageWatch",
    "TrackingCallback",
    "TrainPath",
    "already_connected",
    "capacity_words",
    "check_resources",
    "collect",
    "connect",
    "cut_short",
    "make_trainable",
    "node_temp_dir",
    "probe_address",
    "run_extension",
    "run_replicates",
    "run_search",
    "shutdown",
    "start_shared_cluster",
]
