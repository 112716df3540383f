"""The half of the Ray backend that runs inside Ray Train's own processes: each worker's loop and reporter,
and the report callback its controller calls.

Ray Train starts a controller and a worker process per run and unpickles these there, importing this
module by name. So it imports Ray Train alone: not Tune's searchers, Optuna or the driver's modules
(ray_search.py and the others ray_backend.py names), nor the trial code of ray_trial.py (they import this), and
the raybench trainer (torch) only inside the worker loop, where it runs. The controller then never imports torch.
Measured in benchmarks/README.md ("Sweep overhead").
"""
from __future__ import annotations

import dataclasses
import json
import os
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import ray.train
from ray.train.v2.api.callback import UserCallback

from raybench.report_keys import (
    BEST_PREFIX,
    CPU_S,
    INFO_PREFIX,
    KEPT_AT_BEST,
    NODE,
    REPORTED_AT,
    SELECTION_BEST,
    TIME_PREFIX,
    TRAINER_STARTED_AT,
)
from raybench.trainer.callbacks import Callback, EpochReport, StageReport

FAILURE_KEY = "failure_reason"
STAGES_KEY = "stages"  # JSON list of the multi-stage method's earlier stages, carried by every report
EPOCHS_DONE = "epochs_done"  # what an early-stopping scheduler counts its rungs in
CHECKPOINT_PATH_KEY = "checkpoint_path"  # where Train persisted a report's checkpoint (as TuneReportCallback names it)
NODE_LABEL = "raybench.node"  # the node label cluster/local-up.sh gives each node (head, worker-1, ...)


def node_name() -> str:
    """The node this process runs on: its `raybench.node` label where the cluster gives one, else the start
    of Ray's node id. Every report carries it, so a trial's record says where it ran, and where it moved
    when a node was lost."""
    context = ray.get_runtime_context()
    labels = context.get_node_labels() or {}
    return str(labels.get(NODE_LABEL) or context.get_node_id()[:12])


@dataclass
class TrialClock:
    """When the raybench trainer started in this process, by the wall clock (which the driver shares on one
    node) and by this process's CPU time (all its threads), and how long its reports waited to be taken.

    `time/trial_s` is the time inside the trainer, reports included; `time/report_wait_s` the part of it
    spent handing earlier epochs' reports to Ray (the last report's wait falls after `time/reported_at`,
    in the teardown). What is left is the training itself."""

    wall: float = dataclasses.field(default_factory=time.time)
    cpu: float = dataclasses.field(default_factory=time.process_time)
    perf: float = dataclasses.field(default_factory=time.perf_counter)
    waited: float = 0.0

    def fields(self) -> dict[str, float]:
        return {f"{TIME_PREFIX}trial_s": time.perf_counter() - self.perf, f"{TIME_PREFIX}report_wait_s": self.waited,
                CPU_S: time.process_time() - self.cpu,
                TRAINER_STARTED_AT: self.wall, REPORTED_AT: time.time()}

    def report(self, send: Callable[[], None]) -> None:
        """Hand a report over, timing the wait."""
        start = time.perf_counter()
        send()
        self.waited += time.perf_counter() - start


def _kept_at_best(key: str) -> bool:
    """A best-epoch metric worth its own `best/` copy: evaluation and stage numbers, not train logs or budgets."""
    return key == KEPT_AT_BEST or ("/" in key and not key.startswith(("train/", "budget/")))


def flat_report(report: EpochReport, facts: dict[str, str], clock: TrialClock,
                stages: list[dict[str, Any]]) -> dict[str, Any]:
    """Every epoch's report as Tune and the sweep read it, one flat dict: the epoch's metrics; `stages`, the
    earlier stages as JSON (STAGES_KEY); the trial's clock (`time/*`, its wall-clock stamps included); each
    metric at the best epoch so far under `best/`; `best_epoch` and `epochs_done`; the run's facts under
    `info/`; and the node it ran on (NODE)."""
    metrics: dict[str, Any] = dict(report.metrics)
    if stages:
        metrics[STAGES_KEY] = json.dumps(stages, default=str)
    metrics.update(clock.fields())
    metrics.update({f"{BEST_PREFIX}{k}": v for k, v in report.best_metrics.items() if _kept_at_best(k)})
    metrics["best_epoch"] = report.metrics["epoch"] - report.metrics["epochs_since_best"]
    metrics[EPOCHS_DONE] = report.metrics["epoch"] + 1
    metrics.update({f"{INFO_PREFIX}{k}": v for k, v in facts.items()})
    metrics[NODE] = node_name()
    return metrics


class WorkersReportCallback(UserCallback):
    """In the run's controller: each report (rank 0's metrics with every worker's CPU-seconds summed in, so a
    data-parallel trial's compute counts all of its workers, and the checkpoint's path) into `queue`, a Ray
    queue the trial driver reads.

    Ray's TuneReportCallback instead has Tune's session take the reports in the trial actor's main thread,
    which deadlocks (Ray 2.60) when the run's last report is still queued as the driver function returns:
    Tune's wrapper then reports its end marker from the driver thread into the same one-slot queue, and the
    main thread blocks forever putting the last report behind it. The trial stays RUNNING with its last epoch
    lost. The driver (ray_trial.ReportRelay) reports from its own thread, so the marker comes last."""

    def __init__(self, queue: Any) -> None:
        self.queue = queue

    def after_report(self, run_context: Any, metrics: list[dict[str, Any]], checkpoint: Any | None) -> None:
        item = dict(with_workers_cpu(metrics)[0])
        if checkpoint is not None:
            item[CHECKPOINT_PATH_KEY] = checkpoint.path
        self.queue.put(item)


def with_workers_cpu(metrics: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The workers' reports (rank 0 first) with rank 0's CPU-seconds replaced by every worker's sum."""
    if len(metrics) < 2:
        return metrics
    total = sum(float(m.get(CPU_S, 0.0)) for m in metrics)
    return [{**metrics[0], CPU_S: total}, *metrics[1:]]


class StopRequestReader(Callback):
    """Ends the run when its stop-request file exists (raybench.sweep.ray_trial.StopRequests): an early-
    stopping scheduler's decision, honoured after the epoch that was reported, so the run ends as finished."""

    stop_file: str | None = None

    def should_stop(self) -> bool:
        return self.stop_file is not None and os.path.exists(self.stop_file)


class TrainReporter(StopRequestReader):
    """On each Ray Train worker: every epoch, `ray.train.report` the metrics; rank 0 attaches the checkpoint."""

    def __init__(self, stop_file: str | None = None) -> None:
        self.facts: dict[str, str] = {}
        self.stages: list[dict[str, Any]] = []
        self.rank = ray.train.get_context().get_world_rank()
        self.clock = TrialClock()
        self.stop_file = stop_file

    def on_info(self, facts: dict[str, str]) -> None:
        self.facts.update(facts)

    def on_stage(self, report: StageReport) -> None:
        self.stages.append(dataclasses.asdict(report))

    def on_epoch_end(self, report: EpochReport) -> None:
        with tempfile.TemporaryDirectory() as tmp:
            checkpoint = None
            if self.rank == 0:
                report.write_checkpoint(Path(tmp))
                checkpoint = ray.train.Checkpoint.from_directory(tmp)
            metrics = flat_report(report, self.facts, self.clock, self.stages)
            self.clock.report(lambda: ray.train.report(metrics, checkpoint=checkpoint))


def fit(config: dict[str, Any], reporter: Callback, checkpoint: Any | None, threads: int,
        plugins: tuple[str, ...] = ()) -> None:
    """Run the raybench trainer, resuming from `checkpoint` if the run was retried or restored. The sweep's
    plug-ins are imported first: this process turns the config's names into a dataset, a model, an algorithm."""
    import torch

    from raybench.plugins import load_modules
    from raybench.trainer import TrainConfig, Trainer

    load_modules(plugins)

    torch.set_num_threads(max(1, threads))
    trainer = Trainer(TrainConfig.from_flat(config), callbacks=[reporter])
    if checkpoint is None:
        trainer.fit()
        return
    with checkpoint.as_directory() as directory:
        trainer.fit(resume_from=Path(directory))


def deterministic_failure(err: Exception) -> dict[str, Any] | None:
    """The last report of a failure a retry would meet again (a divergence, an unreadable input file), or
    None for any other error. Train would otherwise retry it from a checkpoint; the search metric is NaN
    because Tune insists every result carries it. The driver then fails the trial with this reason."""
    from raybench.data.base import InputReadError
    from raybench.trainer import DivergenceError

    for kind, label in ((DivergenceError, "diverged"), (InputReadError, "unreadable input")):
        if isinstance(err, kind):
            return {FAILURE_KEY: f"{label}: {err}", SELECTION_BEST: float("nan")}
    return None


def train_worker_loop(loop_config: dict[str, Any]) -> None:
    """Ray Train's per-worker function: one raybench trainer per worker."""
    try:
        reporter = TrainReporter(loop_config.get("stop_file"))
        fit(loop_config["config"], reporter, ray.train.get_checkpoint(), int(loop_config["threads"]),
            tuple(loop_config.get("plugins", ())))
    except Exception as err:
        failure = deterministic_failure(err)
        if failure is None:
            raise
        report_failure(failure)


def report_failure(metrics: dict[str, Any]) -> None:
    """Report the failure with a (tiny) checkpoint: Train's result only carries checkpointed reports, so
    this is how the driver learns of it and fails the trial instead of recording it as finished."""
    with tempfile.TemporaryDirectory() as tmp:
        checkpoint = None
        if ray.train.get_context().get_world_rank() == 0:
            (Path(tmp) / "failure.json").write_text(json.dumps(metrics))
            checkpoint = ray.train.Checkpoint.from_directory(tmp)
        ray.train.report(metrics, checkpoint=checkpoint)
