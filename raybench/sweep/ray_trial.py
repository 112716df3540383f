"""The half of the Ray backend that runs inside each Tune trial's process: the two trainables (the Train
executor's trial driver, the function executor's trial) and everything they call.

Tune pickles a trainable in the sweep's process and unpickles it in every trial actor it starts (a fresh
process, unless an actor is reused), importing by name the module of every function and class it
references. When the trainables were closures in ray_backend.py, each trial process imported the driver's
whole backend, Optuna, SQLite and Tune's searchers included (benchmarks/trial_imports.py measures the
difference; torch, Ray Data and pandas stay, since Ray Tune itself imports them). The trainables here are
module-level functions bound by `functools.partial` to a `TrialSpec` (plain values and this module's types),
so unpickling one imports this module, Ray Tune's and Ray Train's trial-side API, ray_worker.py and the raybench
trainer, and nothing of the driver's (tests/test_trial_imports.py): none of ray_cluster.py, ray_search.py,
ray_callbacks.py, ray_collect.py. ray_search.py (which imports this) builds each trainable and its resource request;
those modules keep all that runs in the sweep's own process (ray_backend.py says which does what).

A finished trial's completed record (`_finish`) is the one source of its TrialRecord (ray_collect.py): its last
report whole, as Tune was sent it (the Train executor's with every worker's CPU-seconds summed in, ReportRelay),
the path its checkpoint was persisted at, its timing, and whether a scheduler stopped it early.
"""
from __future__ import annotations

import json
import os
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# Read by Ray in the trial's process, which a cluster at --address did not start from the sweep's environment:
# Ray Train passes the first on to each run's controller (ray_cluster sets them too, before it imports Ray).
os.environ.setdefault("RAY_TRAIN_ENABLE_PREEMPTION_WATCHER", "0")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")

import ray
import ray.train
import ray.train.torch
from ray import tune
from ray.train.v2._internal.callbacks.datasets import DatasetsCallback
from ray.train.v2.api.data_parallel_trainer import DataParallelTrainer
from ray.util.queue import Empty as QueueEmpty
from ray.util.queue import Queue as RayQueue
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from raybench.paths import write_text_atomically
from raybench.report_keys import GPU_S, TIME_PREFIX, WALL_S
from raybench.sweep.atomic_storage import atomic_local_filesystem
from raybench.sweep.ray_worker import (
    CHECKPOINT_PATH_KEY,
    EPOCHS_DONE,
    FAILURE_KEY,
    REPORTED_AT,
    TRAINER_STARTED_AT,
    TrainReporter,
    TrialClock,
    WorkersReportCallback,
    deterministic_failure,
    fit,
    flat_report,
    train_worker_loop,
)
from raybench.sweep.space import ResolvedSpace, RunIdentity
from raybench.trainer import EpochReport

TIMING_REPORT = "trial_timing"  # marks a finished run's record (reported again only when a resume replays it)
STOPPED_KEY = "stopped_early"  # in a finished run's record: an early-stopping scheduler ended it


# ----- what a trial is told: plain values, pickled into every trial -------------------------------------------
@dataclass(frozen=True)
class TrainPath:
    """How each Train-executor trial starts and ends. The defaults are the measured savings; each can be
    switched back so benchmarks/sweep_overhead.py --ablate measures it on its own.

    - reuse_driver: Tune keeps each trial's driver process (and its imports of torch, Ray Train and
      raybench) for the next trial instead of starting a new one.
    - health_check_interval_s: Train's controller polls its workers this often (Ray's default 2 s); the end
      of every run waits for a poll, and a report queued behind an untaken one waits too. But every poll
      costs CPU in the controller and the worker for as long as the run lasts, which on a real dataset is
      hours: 0.5 s keeps most of the teardown saving for a fraction of 0.1 s's polling cost (both measured).
    - process_group_for_one_worker: a TorchTrainer always builds a gloo/NCCL process group, even for one
      worker that talks to no one; without it a one-worker trial is a DataParallelTrainer (the same Train
      run, controller, worker, checkpoints and retries, minus the torch backend's set-up).
    - train_extras: Ray Train's own metrics and its chdir into the trial folder, which raybench never reads.
    - dataset_manager: Ray Train starts a DatasetManager actor (a fresh process importing Ray Train) for
      every run, to shard Ray Datasets; raybench's trainer reads its own data and passes none. (The run's
      other helper, the detached PlacementGroupCleaner, stays: it frees the run's CPUs if the controller
      dies ungracefully, which Ray itself did not do while the job lived.)
    """

    reuse_driver: bool = True
    health_check_interval_s: float = 0.5
    process_group_for_one_worker: bool = False
    train_extras: bool = False
    dataset_manager: bool = False

    def env(self) -> dict[str, str]:
        """Settings Ray Train reads from the driver's environment when a run starts (and passes on)."""
        env = {"RAY_TRAIN_HEALTH_CHECK_INTERVAL_S": f"{self.health_check_interval_s:g}"}
        flag = "1" if self.train_extras else "0"
        env.update({"RAY_TRAIN_METRICS_ENABLED": flag, "RAY_CHDIR_TO_TRIAL_DIR": flag})
        return env


@dataclass(frozen=True)
class Resources:
    """What each trial asks of the cluster. `custom` adds custom resources to every worker's request (name,
    amount): `(("raybench_worker", 1.0),)` places each worker on a node that offers it, such as the worker
    nodes cluster/local-up.sh adds."""

    workers: int = 1
    cpus_per_worker: float = 1.0
    gpus_per_worker: float = 0.0
    max_failures: int = 2
    custom: tuple[tuple[str, float], ...] = ()
    per_trial: tuple[tuple[str, float], ...] = ()  # held once by each trial, whatever its workers: a queue's slot

    def per_worker(self) -> dict[str, float]:
        """One worker's request in Ray's resource names."""
        return {"CPU": self.cpus_per_worker, "GPU": self.gpus_per_worker, **dict(self.custom)}


@dataclass(frozen=True)
class EarlyStopping:
    """ASHA (asynchronous successive halving, Li et al. 2020) over a search: at rungs of `grace_period`
    x `reduction_factor`^k epochs, a trial whose best selection value so far (OOD validation by default)
    is under the rung's top 1/`reduction_factor` is stopped. `max_epochs` is a run's length."""

    grace_period: int
    reduction_factor: float
    max_epochs: int


class CompletedRuns:
    """Final results of finished runs, one JSON file per run key, written atomically.

    Tune saves its experiment state only every so often, so a sweep killed just after a trial finished
    may restore that trial as unfinished. Its driver then finds the record here and reports it again
    (marked `replayed`) instead of training again: finished work is never repeated.
    """

    def __init__(self, directory: Path) -> None:
        self.directory = directory

    def _path(self, key: str) -> Path:
        return self.directory / f"{key}.json"

    def load(self, key: str) -> dict[str, Any] | None:
        path = self._path(key)
        return json.loads(path.read_text()) if path.is_file() else None

    def save(self, key: str, metrics: dict[str, Any]) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        write_text_atomically(self._path(key), json.dumps(metrics, default=str))


class StopRequests:
    """An early-stopping scheduler's decisions, one empty file per stopped Tune trial under the sweep's storage
    (which every node of a multi-node cluster shares, as Ray Train's checkpoints require).

    Tune's own stop kills the trial's driver in the middle of its Ray Train run, which leaves the run's
    workers and placement group behind. Instead the trial reads its file after each epoch's report and ends
    there as a finished run: its best epoch so far is its result, its curve so far stays in MLflow."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory

    def path(self, trial_id: str) -> Path:
        return self.directory / trial_id

    def ask(self, trial_id: str) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        self.path(trial_id).touch()

    def asked(self, trial_id: str) -> bool:
        return self.path(trial_id).exists()


@dataclass(frozen=True)
class TrialSpec:
    """Everything a trial of one stage runs with, made once per stage by ray_search.make_trainable and pickled
    into each trial: the space its sampled config is completed from, where its records and Train's checkpoints
    go, its resources and how its Train run starts."""

    space: ResolvedSpace
    stage: str
    completed: CompletedRuns
    stop_requests: StopRequests
    train_storage: Path  # Ray Train's runs of the stage, one folder each
    resources: Resources
    train_path: TrainPath
    early_stopping: EarlyStopping | None = None  # None: every trial runs all of its epochs
    plugins: tuple[str, ...] = ()  # the plug-ins' module names, imported where the trainer runs

    def identity(self, sampled: dict[str, Any]) -> RunIdentity:
        return RunIdentity.of(self.space, sampled, self.stage)

    def stop_file(self, tune_trial_id: str) -> str | None:
        """The file whose existence ends the trial after its epoch, when a scheduler may ask for that."""
        return str(self.stop_requests.path(tune_trial_id)) if self.early_stopping else None

    def stopped_early(self, tune_trial_id: str, last: dict[str, Any]) -> bool:
        """Whether the scheduler asked this trial to stop and it ended before its last epoch because of it."""
        rule = self.early_stopping
        return bool(rule and self.stop_requests.asked(tune_trial_id)
                    and int(last.get(EPOCHS_DONE, 0)) < rule.max_epochs)


class TrialFailed(RuntimeError):
    """A trial that ended without a result (diverged or crashed past its retries); the reason is the message."""


# ----- the Train executor's run, shaped (TrainPath) ----------------------------------------------------------
def shaped_callbacks(callbacks: list[Any], path: TrainPath) -> list[Any]:
    """Ray Train's default callbacks for one run, without the DatasetsCallback (which starts the
    DatasetManager actor) unless `path` asks for it."""
    return [c for c in callbacks if path.dataset_manager or not isinstance(c, DatasetsCallback)]


class ShapedRun:
    """Mixin for Ray Train's trainers: the run's default callbacks pass through `shaped_callbacks`.
    `_create_default_callbacks` is Ray Train 2.60's own hook for them (private: tests/test_train_path.py
    checks against the installed Ray that the callbacks it shapes are still there)."""

    def __init__(self, *args: Any, train_path: TrainPath, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.train_path = train_path

    def _create_default_callbacks(self) -> list[Any]:
        return shaped_callbacks(super()._create_default_callbacks(), self.train_path)


class ShapedDataParallelTrainer(ShapedRun, DataParallelTrainer):
    """A one-worker run without a process group (see TrainPath.process_group_for_one_worker)."""


class ShapedTorchTrainer(ShapedRun, ray.train.torch.TorchTrainer):
    """A data-parallel run with torch's process group (gloo on CPU, NCCL on GPU)."""


# ----- reporting from inside a trial -------------------------------------------------------------------------
def trial_timing(started: float, last: dict[str, Any], gpus: float) -> dict[str, float]:
    """The run's wall seconds (`started`: the driver's start, by the wall clock) split into start-up, time in
    the trainer (`time/trial_s`) and teardown, and the GPU-seconds it held (`gpus` for all of its wall time)."""
    now = time.time()
    wall = now - started
    return {WALL_S: wall, f"{TIME_PREFIX}startup_s": float(last.get(TRAINER_STARTED_AT, now)) - started,
            f"{TIME_PREFIX}teardown_s": now - float(last.get(REPORTED_AT, now)), GPU_S: wall * gpus}


def _finish(completed: CompletedRuns, key: str, last: dict[str, Any], started: float, gpus: float,
            stopped: bool) -> None:
    """Record the finished run, atomically: its last report as Tune was sent it (with the path its checkpoint was
    persisted at), its timing, and whether a scheduler stopped it early. Tune has had every report already
    (ReportRelay), unless a signal stopped its loop first; the sweep's callbacks and `collect` read this record,
    the one source of the run's TrialRecord, which also lets a resumed sweep replay the run instead of training
    it again."""
    completed.save(key, {**last, **trial_timing(started, last, gpus), STOPPED_KEY: stopped, TIMING_REPORT: True})


class TuneReporter(TrainReporter):
    """In a plain Tune function trial: the same reports through `tune.report`; keeps the last one and where Tune
    persisted its checkpoint (`tune.get_checkpoint` is the reported checkpoint once it was persisted), which the
    run's record names as a Train run's names its own."""

    def __init__(self, stop_file: str | None = None) -> None:
        self.facts = {}
        self.stages = []
        self.last: dict[str, Any] = {}
        self.checkpoint_path: str | None = None
        self.clock = TrialClock()
        self.stop_file = stop_file

    def on_epoch_end(self, report: EpochReport) -> None:
        self.last = flat_report(report, self.facts, self.clock, self.stages)
        with tempfile.TemporaryDirectory() as tmp:
            report.write_checkpoint(Path(tmp))
            self.clock.report(lambda: tune.report(self.last, checkpoint=tune.Checkpoint.from_directory(tmp)))
        persisted = tune.get_checkpoint()
        self.checkpoint_path = persisted.path if persisted is not None else None

    def recorded(self) -> dict[str, Any]:
        """The run's last report as its record keeps it: what Tune was sent, and its checkpoint's path."""
        return {**_keep(self.last), CHECKPOINT_PATH_KEY: self.checkpoint_path}


def _raise_if_failed(metrics: dict[str, Any] | None) -> None:
    if metrics and FAILURE_KEY in metrics:
        raise TrialFailed(metrics[FAILURE_KEY])


def _replay_if_done(completed: CompletedRuns, key: str) -> bool:
    record = completed.load(key)
    if record is None:
        return False
    tune.report({**record, "replayed": True})
    return True


def _keep(metrics: dict[str, Any] | None) -> dict[str, Any]:
    return {k: v for k, v in (metrics or {}).items() if isinstance(v, (int, float, str, bool)) or v is None}


class ReportRelay:
    """Passes a Ray Train run's reports to Tune from the trial driver's own thread, while `fit()` runs in a
    second thread: every report, the last one included, reaches Tune before the driver function returns and
    Tune's end-of-trial marker follows it (see ray_worker.WorkersReportCallback for the deadlock it avoids).

    It keeps the last report it relayed (`last`), which the run's record holds: Train's own Result has rank 0's
    metrics alone, without the CPU-seconds of the other workers that the relayed report sums in."""

    POLL_S = 0.5  # how long one wait on the queue lasts before the fit thread is looked at again

    def __init__(self) -> None:
        # On the driver's own node, as Ray Train places the run's controller: a queue that landed on another
        # node would die with it and fail the trial, where the run itself is retried from its checkpoint.
        here = NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=False)
        self.queue = RayQueue(actor_options={"num_cpus": 0, "scheduling_strategy": here})
        self.last: dict[str, Any] = {}

    def callback(self) -> WorkersReportCallback:
        return WorkersReportCallback(self.queue)

    def fit(self, trainer: Any) -> Any:
        outcome: dict[str, Any] = {}

        def run() -> None:
            try:
                outcome["result"] = trainer.fit()
            except BaseException as err:  # noqa: BLE001  re-raised in the driver thread, after the reports it left
                outcome["error"] = err

        thread = threading.Thread(target=run, name="raybench-train-fit", daemon=True)
        thread.start()
        while thread.is_alive() or not self.queue.empty():  # a report is queued before fit() can return
            try:
                self.last = self.queue.get(timeout=self.POLL_S)
            except QueueEmpty:
                continue
            tune.report(self.last)
        thread.join()
        if "error" in outcome:
            raise outcome["error"]
        return outcome["result"]


# ----- the trainables: ray_search.make_trainable binds each to its stage's TrialSpec --------------------------
def train_driver(trial: TrialSpec, sampled: dict[str, Any]) -> None:
    """The Train executor's trial: a driver that fits one Ray Train run of the sampled config, relays its
    reports to Tune and records it as finished (or replays the record a resumed sweep already has)."""
    started = time.time()
    run = trial.identity(sampled)
    if _replay_if_done(trial.completed, run.key):
        return
    os.environ.update(trial.train_path.env())  # read by Train when the run starts, in this process and passed on
    tune_trial_id = tune.get_context().get_trial_id()
    relay = ReportRelay()
    result = relay.fit(_train_run(trial, run, tune_trial_id, relay))
    _raise_if_failed(result.metrics)
    last = {**_keep(relay.last), CHECKPOINT_PATH_KEY: result.checkpoint.path if result.checkpoint else None}
    resources = trial.resources
    _finish(trial.completed, run.key, last, started, resources.gpus_per_worker * resources.workers,
            trial.stopped_early(tune_trial_id, last))


def _train_run(trial: TrialSpec, run: RunIdentity, tune_trial_id: str, relay: ReportRelay) -> ShapedRun:
    """The trial's Ray Train run: named by its key and Tune trial, checkpoints kept by Train, retried by Train."""
    resources, path = trial.resources, trial.train_path
    with_process_group = resources.workers > 1 or path.process_group_for_one_worker
    trainer_class = ShapedTorchTrainer if with_process_group else ShapedDataParallelTrainer
    return trainer_class(
        train_worker_loop,
        train_loop_config={"config": run.config, "threads": resources.cpus_per_worker,
                           "stop_file": trial.stop_file(tune_trial_id), "plugins": trial.plugins},
        scaling_config=ray.train.ScalingConfig(
            num_workers=resources.workers, use_gpu=resources.gpus_per_worker > 0,
            resources_per_worker=resources.per_worker(),
        ),
        run_config=ray.train.RunConfig(
            name=f"{run.key}-{tune_trial_id}", storage_path=str(trial.train_storage),
            storage_filesystem=atomic_local_filesystem(),  # Train's checkpoints whole or not at all
            callbacks=[relay.callback()],
            checkpoint_config=ray.train.CheckpointConfig(num_to_keep=1),
            failure_config=ray.train.FailureConfig(max_failures=resources.max_failures,
                                                   controller_failure_limit=resources.max_failures),
        ),
        train_path=path,
    )


def function_trial(trial: TrialSpec, sampled: dict[str, Any]) -> None:
    """The function executor's trial: the raybench trainer in the trial's own process, reporting to Tune."""
    started = time.time()
    run = trial.identity(sampled)
    if _replay_if_done(trial.completed, run.key):
        return
    tune_trial_id = tune.get_context().get_trial_id()
    reporter = TuneReporter(trial.stop_file(tune_trial_id))
    try:
        fit(run.config, reporter, tune.get_checkpoint(), int(trial.resources.cpus_per_worker), trial.plugins)
    except Exception as err:
        failure = deterministic_failure(err)  # a retry (FailureConfig) would meet it again
        if failure is None:
            raise
        trial.completed.save(run.key, failure)
        tune.report(failure)
        return
    last = reporter.recorded()
    _finish(trial.completed, run.key, last, started, trial.resources.gpus_per_worker,
            trial.stopped_early(tune_trial_id, last))

