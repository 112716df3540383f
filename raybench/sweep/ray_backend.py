"""The Ray backend: with its halves ray_trial.py and ray_worker.py, the only code that imports Ray Tune and Ray
Train (their APIs move between releases).

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

What runs inside each Tune trial's process (the two trainables, the trial's reporter and records) lives in
ray_trial.py, which imports neither Optuna nor Tune's searchers and schedulers: Tune unpickles it in every trial
process. This module builds each trainable (`make_trainable`: its TrialSpec and resource request) and keeps what
runs in the sweep's own process: connecting, the searcher and scheduler, the callbacks and `collect`.
What runs inside Ray Train's own controller and worker processes (the worker loop, its reporter, the report
callback) lives in ray_worker.py, which imports neither Tune's searchers nor torch: Train unpickles it in
every process it starts.

`--scheduler asha` stops unpromising search trials early with Tune's ASHA, but cooperatively
(`CooperativeASHA`, `StopRequests`): the trial ends itself after the epoch it reported, as a finished run.

Every trial reports what it used: its wall seconds split into start-up (driver start to the raybench
trainer's start), time in the trainer and teardown (last report to the driver's return), its workers'
CPU-seconds and the GPU-seconds it held. Its completed record carries them (CompletedRuns).
"""
from __future__ import annotations

import atexit
import contextlib
import dataclasses
import functools
import json
import logging
import math
import os
import re
import signal
import socket
import sys
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

os.environ.setdefault("RAY_TRAIN_ENABLE_PREEMPTION_WATCHER", "0")
os.environ.setdefault("TUNE_WARN_EXCESSIVE_EXPERIMENT_CHECKPOINT_SYNC_THRESHOLD_S", "0")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
# The console is raybench's (one line per finished trial): Tune's experiment boxes, result paths and
# TensorBoard hints stay out of it (verbose=0 alone still prints them with the new output engine).
os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")

import optuna
import ray
from ray import tune
from ray._common.utils import get_default_ray_temp_dir
from ray.tune.result import AUTO_RESULT_KEYS
from ray.tune.schedulers import AsyncHyperBandScheduler, TrialScheduler
from ray.tune.search import BasicVariantGenerator, ConcurrencyLimiter, SearchAlgorithm, SearchGenerator
from ray.tune.search.optuna import OptunaSearch

from raybench.budget import BUDGET_PREFIX
from raybench.paths import StorageFull, disk_full_errno_in, inside
from raybench.records import TrialRecord, TrialStatus
from raybench.report_keys import (
    BEST_PREFIX,
    BLIND_INFO,
    CLOCK_STAMPS,
    COLLAPSE_INFO,
    CONVERGENCE_INFO,
    NODE,
    NOTE_INFO,
    PSEUDO_INFO,
    SELECTION_BEST,
    TIME_PREFIX,
)
from raybench.sweep import state_seal
from raybench.sweep.atomic_storage import atomic_local_filesystem
from raybench.sweep.errors import ClusterError
from raybench.sweep.leftovers import forget_driver, record_driver, stop_dead_drivers_leftovers
from raybench.sweep.options import shown_address
from raybench.sweep.progress import StageProgress
from raybench.sweep.progress import current as progress_display
from raybench.sweep.ray_trial import (  # the types a trial is made of are the driver's too
    STOPPED_KEY,
    TIMING_REPORT,
    CompletedRuns,
    EarlyStopping,
    Resources,
    StopRequests,
    TrainPath,
    TrialSpec,
    function_trial,
    train_driver,
)
from raybench.sweep.ray_worker import EPOCHS_DONE, FAILURE_KEY, STAGES_KEY
from raybench.sweep.sampling import SAMPLERS, first_unseen, optuna_distribution
from raybench.sweep.space import ResolvedSpace, RunIdentity
from raybench.sweep.trial_slots import TrialSlots


def _no_colour_reset_at_exit() -> None:
    """Ray's CLI logger calls `colorama.init(strip=False)` when Ray is imported (ray/autoscaler/_private/
    cli_logger.py), which registers an exit hook that writes ESC[0m to a terminal after the sweep's last line
    (shown raw by anything that records the terminal). raybench prints no colour codes to reset: the hook goes."""
    initialise = getattr(sys.modules.get("colorama"), "initialise", None)
    if initialise is not None:
        atexit.unregister(initialise.reset_all)


_no_colour_reset_at_exit()

# Tune's "`process_trial_result` took 0.8 s, which may be a performance bottleneck" (the MLflow callback's
# sqlite commit on a busy 2-core machine): timing hints for Tune's developers, not the user's console.
logging.getLogger("ray.tune.utils.util").setLevel(logging.ERROR)

DRIVER_RESOURCE = "trial_driver"


@dataclass(frozen=True)
class RunSpec:
    """One Tune experiment: where it lives, how many trials, how they run and whom to tell."""

    name: str
    storage: Path
    stage: str
    executor: str
    resources: Resources
    max_concurrent: int
    callbacks: tuple[Any, ...] = ()
    train_path: TrainPath = dataclasses.field(default_factory=lambda: DEFAULT_TRAIN_PATH)
    early_stopping: EarlyStopping | None = None  # None: every trial runs all of its epochs (FIFO)
    trial_slots: Path | None = None  # a benchmark's trial queue on a cluster at --address (QueuedSearch)
    plugins: tuple[str, ...] = ()  # module names every trial imports before it builds anything

    @property
    def stop_requests(self) -> StopRequests:
        return StopRequests(self.storage / self.name / "stop_requests")

    @cached_property
    def completed(self) -> CompletedRuns:
        """The stage's completed-run records, the one store its trials write and its callbacks and `collect`
        read (a frozen dataclass without slots keeps a cached_property's value in its __dict__)."""
        return CompletedRuns(self.storage / self.name / "completed")

    def with_callbacks(self, *callbacks: Any) -> RunSpec:
        """The same stage told to `callbacks`, which read its records and so are made after it: its completed-run
        store is the one they were given, not a copy."""
        spec = dataclasses.replace(self, callbacks=callbacks)
        spec.__dict__["completed"] = self.completed
        return spec


DEFAULT_TRAIN_PATH = TrainPath()


# ----- connecting -----------------------------------------------------------------------------------
def connect(address: str | None, driver_slots: int, queues: dict[str, int] | None = None,
            py_modules: list[str] | None = None) -> bool:
    """Join a cluster (`address`) or start a private local one; make sure trial drivers can be placed.

    Returns whether this call connected (so the caller disconnects again); False when Ray was already up.
    `queues` adds custom resources to a private Ray's node: a benchmark's trial queue (Resources.per_trial).
    `py_modules`, the plug-ins' code, goes to every node with the job's runtime_env (`plugin_runtime_env`).
    First the processes that dead drivers' private Rays left on this host are stopped (leftovers.py); a private
    Ray started here is recorded for the same reason. The caller's SIGTERM handler survives ray.init.
    """
    if ray.is_initialized():
        return False
    stop_dead_drivers_leftovers(Path(get_default_ray_temp_dir()))  # where a private Ray keeps its sessions
    if address:
        temp_dir = node_temp_dir()
        probe_address(address)
        with callers_sigterm_kept():
            ray.init(address=address, log_to_driver=False, _temp_dir=temp_dir,
                     runtime_env=plugin_runtime_env(py_modules or []))
        if ray.cluster_resources().get(DRIVER_RESOURCE, 0) < 1:
            ray.shutdown()
            raise ClusterError(
                f"the Ray cluster at {shown_address(address)} has no '{DRIVER_RESOURCE}' resource for trial drivers; start the head "
                f"with --resources='{{\"{DRIVER_RESOURCE}\": 8}}' (cluster/local-up.sh does) or use --executor function"
            )
        watch_own_node()
        return True
    # Ray >= 2.59 turns token auth on for a local cluster and warns that it did, once per sweep: not news.
    logging.getLogger("ray._private.authentication.authentication_token_setup").setLevel(logging.ERROR)
    with callers_sigterm_kept():
        ray.init(resources={DRIVER_RESOURCE: max(driver_slots, 1), **(queues or {})},
                 include_dashboard=False, log_to_driver=False,
                 configure_logging=False, runtime_env=plugin_runtime_env(py_modules or []))
    node = ray._private.worker._global_node  # the Ray this process just started: its session and processes
    record_driver(Path(node.get_session_dir_path()),
                  [info.process.pid for infos in node.all_processes.values() for info in infos])
    return True


def capacity_words() -> str:
    """What the joined cluster offers trials, as the sweep's phase line says it: ` (2 CPUs, 0 GPUs)`; nothing
    when this process holds no Ray (a caller that connected it its own way)."""
    if not ray.is_initialized():
        return ""
    resources = ray.cluster_resources()
    return f" ({resources.get('CPU', 0):g} CPUs, {resources.get('GPU', 0):g} GPUs)"


JOB_CONFIG_VARIABLE = "RAY_JOB_CONFIG_JSON_ENV_VAR"  # a submitted job's config, which its driver's ray.init merges


def plugin_runtime_env(py_modules: list[str]) -> dict[str, Any] | None:
    """The runtime_env that ships the plug-ins' code to every worker of this driver's job, on every node: their
    trial processes and Train workers import the plug-ins by module name (TrialSpec.plugins).

    Inside a submitted job whose own runtime_env already has `py_modules`, Ray refuses to merge a second list
    ("Specifying the same runtime_env fields ... is not allowed"): the job's own list then carries the plug-ins,
    as `ray job submit --runtime-env-json` or JobSubmissionClient(runtime_env=...) gave it."""
    if not py_modules:
        return None
    job = json.loads(os.environ.get(JOB_CONFIG_VARIABLE) or "{}").get("runtime_env") or {}
    if job.get("py_modules"):
        return None
    return {"py_modules": list(py_modules)}


NODE_WATCH_INTERVAL_S = 5.0
NODE_WATCH_STOP_S = 30.0  # at most this long for a question in flight (a GCS that is away) before Ray is let go


class NodeWatch:
    """Stop the sweep (as SIGTERM does: runs KILLED, a resume line) once the GCS reports this driver's own node dead.

    A driver lives on a node and reaches the cluster through its raylet. When the head restarts (GCS fault
    tolerance, cluster/local-up.sh --restart-head) a driver that ran on the old head keeps its process but has
    lost its raylet: Tune then waited for results that could never come, forever (measured: 3 minutes with
    no progress before it was stopped by hand). The restarted GCS reloads the old node from Redis and marks
    it dead once its health checks fail; this thread sees that and hands the sweep to the same path as a
    SIGTERM, which needs no raylet. While the GCS itself is down the question fails and is asked again: Ray's
    own reconnect timeout (RAY_gcs_rpc_server_reconnect_timeout_s) ends the driver if the GCS never returns.

    The watch ends before Ray is let go (`shutdown` calls `stop`): a call into Ray while `ray.shutdown` runs on
    another thread ends the whole driver inside Ray's core worker ("The core worker has already been shutdown
    ... The process will exit", exit status 1), which no `except` can catch (runner.RaySession.stop_in_background)."""

    def __init__(self, node_id: str, interval_s: float) -> None:
        self.node_id, self.interval_s = node_id, interval_s
        self._stopping = threading.Event()
        self._asking = threading.Lock()  # held while a question is with Ray
        self.thread = threading.Thread(target=self._watch, name="raybench-node-watch", daemon=True)

    def _watch(self) -> None:
        while not self._stopping.wait(self.interval_s):
            with self._asking:
                if self._stopping.is_set() or not ray.is_initialized():
                    return
                try:
                    alive = {node["NodeID"]: node["Alive"] for node in ray.nodes()}
                except Exception:  # noqa: BLE001,S112  the GCS is away (restarting): ask again
                    continue
            if alive.get(self.node_id) is False:
                print(f"raybench: the Ray node this driver joined ({self.node_id[:12]}) is gone (its raylet died, as "
                      f"in a head restart); stopping the sweep so that it can be resumed", file=sys.stderr, flush=True)
                os.kill(os.getpid(), signal.SIGTERM)
                return

    def stop(self, timeout_s: float = NODE_WATCH_STOP_S) -> None:
        """Ask nothing more of Ray, once the question in flight (if any) has its answer."""
        self._stopping.set()
        if self._asking.acquire(timeout=timeout_s):
            self._asking.release()


_node_watches: list[NodeWatch] = []  # the watches `shutdown` stops first


def watch_own_node(interval_s: float = NODE_WATCH_INTERVAL_S) -> NodeWatch:
    """Start a NodeWatch of the node this driver joined; `shutdown` stops it before letting Ray go."""
    watch = NodeWatch(ray.get_runtime_context().get_node_id(), interval_s)
    _node_watches.append(watch)
    watch.thread.start()
    return watch


def node_temp_dir() -> str | None:
    """The temp dir of the node this driver joins (RAYBENCH_NODE_TEMP_DIR), or None for Ray's choice.

    With several nodes on one machine, Ray attaches a driver to the head's node. A driver that must outlive
    the head (GCS fault tolerance: cluster/local-up.sh --restart-head) joins a worker node instead, named by
    its temp dir as `ray.init(_temp_dir=...)` selects it; on separate machines Ray's choice is already local."""
    value = os.environ.get("RAYBENCH_NODE_TEMP_DIR", "")
    if not value:
        return None
    if not os.path.isdir(value):
        raise ClusterError(f"RAYBENCH_NODE_TEMP_DIR={value} is not a folder; give the temp dir of a running Ray node")
    return value


@contextlib.contextmanager
def callers_sigterm_kept() -> Any:
    """Put the caller's SIGTERM handler back after `ray.init`, which replaces it twice: in Python with one that
    calls sys.exit(15) (worker.py's `init`), and in C, when the core worker starts, with its failure-signal
    handler, which prints `*** SIGTERM received ...` before passing the signal on. A sweep stopped by SIGTERM
    (`ray job stop`, Kubernetes or Slurm preemption) then died mid-search with its runs FAILED and no resume
    line. `signal.signal` installs the C handler too, so putting the Python handler back undoes both. A caller
    without a handler of its own keeps Ray's (which exits, and shuts Ray down on the way)."""
    previous = signal.getsignal(signal.SIGTERM)
    keep = callable(previous) and threading.current_thread() is threading.main_thread()
    try:
        yield
    finally:
        if keep:
            signal.signal(signal.SIGTERM, previous)


def start_shared_cluster(driver_slots: int, queues: dict[str, int]) -> str:
    """A private local Ray for a whole benchmark, started by this process; its sweeps, each a process of
    its own, join it at the returned GCS address, so their trials share its CPUs, and the slots of its
    `queues`, through Ray's scheduler."""
    connect(None, driver_slots, queues)
    return str(ray.get_runtime_context().gcs_address)


def probe_address(address: str, timeout_s: float = 5.0) -> None:
    """Fail within `timeout_s` when nothing listens at a host:port address: ray.init would otherwise retry
    for minutes, deaf to SIGTERM. 'auto' and other non host:port forms are left to Ray."""
    host, sep, port = address.removeprefix("ray://").rpartition(":")
    if not sep or not port.isdigit() or not host:
        return
    try:
        with socket.create_connection((host, int(port)), timeout=timeout_s):
            pass
    except OSError as err:
        raise ClusterError(f"no Ray cluster answers at {shown_address(address)} ({err.strerror or err}); start one "
                           f"(cluster/local-up.sh) or leave --address out for a private local Ray") from None
    if not speaks_grpc(host, int(port), timeout_s):
        raise ClusterError(f"{shown_address(address)} accepts connections but is not a Ray cluster (no gRPC answer within "
                           f"{timeout_s:g} s); give the head's GCS address (host:6379 by default) or a ray:// "
                           f"client address")


def speaks_grpc(host: str, port: int, timeout_s: float) -> bool:
    """Whether a gRPC server (Ray's GCS and its client server both are) completes a connection at host:port
    within `timeout_s`: any other listening port (a web server, a database) accepts TCP, and ray.init would
    then retry for minutes. With Ray's TLS on (RAY_USE_TLS) an insecure channel cannot tell, so it is assumed."""
    if os.environ.get("RAY_USE_TLS", "0").lower() in ("1", "true"):
        return True
    import grpc

    channel = grpc.insecure_channel(f"{host}:{port}")
    try:
        grpc.channel_ready_future(channel).result(timeout=timeout_s)
        return True
    except grpc.FutureTimeoutError:
        return False
    finally:
        channel.close()


def check_resources(resources: Resources, executor: str, autoscaling: bool) -> None:
    """Refuse, before any trial starts, a request that no node of the cluster can ever satisfy: Tune would
    otherwise wait forever (function executor) or fail every trial after minutes (Train executor).
    An autoscaling cluster may grow into the request, so `autoscaling` skips the check."""
    if autoscaling:
        return
    nodes = [node.get("Resources", {}) for node in ray.nodes() if node.get("Alive")]
    for name, amount in resources.per_trial:
        if max((node.get(name, 0.0) for node in nodes), default=0.0) + 1e-9 < amount:
            raise ClusterError(f"each trial holds {amount:g} {name}, but no node of the cluster offers it; a "
                               f"benchmark's private Ray declares its trial queue, a cluster at --address does not")
    need = {**resources.per_worker(), **(dict(resources.per_trial) if executor == "function" else {})}
    fits = sum(_bundles_on(node, need) for node in nodes)
    workers = resources.workers if executor == "train" else 1
    if fits >= workers:
        return
    custom = "".join(f" and {amount:g} {name}" for name, amount in resources.custom)
    have = ", ".join(f"{int(n.get('CPU', 0))} CPU/{int(n.get('GPU', 0))} GPU"
                     + "".join(f"/{n.get(name, 0):g} {name}" for name, _ in resources.custom) for n in nodes)
    raise ClusterError(
        f"each trial asks for {workers} worker(s) of {need['CPU']:g} CPU and {need['GPU']:g} GPU{custom}, but the "
        f"cluster's nodes have {have or 'no alive node'}; lower --workers-per-trial/--cpus-per-worker/"
        f"--gpus-per-worker, change --worker-resource, or pass --autoscaling if the cluster adds nodes on demand")


def _bundles_on(node: dict[str, float], need: dict[str, float]) -> int:
    counts = [math.floor(node.get(kind, 0.0) / amount + 1e-9) for kind, amount in need.items() if amount > 0]
    return min(counts) if counts else 0


def shutdown() -> None:
    """Disconnect; a private local Ray this process started stops, and its driver record goes with it."""
    while _node_watches:  # no question may reach Ray while it shuts down
        _node_watches.pop().stop()
    if ray.is_initialized():
        node = ray._private.worker._global_node
        session = Path(node.get_session_dir_path()) if node is not None else None
        ray.shutdown()
        if session is not None:
            forget_driver(session)


# ----- early stopping: Tune's ASHA decides, the trial itself stops (StopRequests) -----------------------------
class CooperativeASHA(AsyncHyperBandScheduler):
    """Tune's ASHA, counting rungs in epochs on the best selection value so far, whose STOP becomes a stop
    request (StopRequests) the trial honours after its epoch rather than a kill."""

    def __init__(self, rule: EarlyStopping, requests: StopRequests) -> None:
        super().__init__(time_attr=EPOCHS_DONE, metric=SELECTION_BEST, mode="max", max_t=rule.max_epochs,
                         grace_period=rule.grace_period, reduction_factor=rule.reduction_factor, stop_last_trials=False)
        self.rule, self.requests = rule, requests

    def on_trial_result(self, tune_controller: Any, trial: Any, result: dict) -> str:
        if result.get(TIMING_REPORT) or result.get("replayed") or FAILURE_KEY in result:
            return TrialScheduler.CONTINUE  # not an epoch: the run's closing report, a record, a failure
        decision = super().on_trial_result(tune_controller, trial, result)
        if decision == TrialScheduler.STOP and int(result[EPOCHS_DONE]) < self.rule.max_epochs:
            self.requests.ask(trial.trial_id)
        return TrialScheduler.CONTINUE


# ----- the trials: what ray_trial.py runs, built here ----------------------------------------------------------
def trial_spec(space: ResolvedSpace, spec: RunSpec) -> TrialSpec:
    """What each trial of the stage is told: values and ray_trial's types only, so that Tune's pickle of the
    trainable names nothing of this module (a trial process would import it, Optuna and all, to unpickle it)."""
    return TrialSpec(space, spec.stage, spec.completed, spec.stop_requests, spec.storage / spec.name / "train",
                     spec.resources, spec.train_path, spec.early_stopping, spec.plugins)


def make_trainable(space: ResolvedSpace, spec: RunSpec) -> Any:
    """The Tune trainable for `spec.executor`, with its resource request: ray_trial's trainable bound to the
    stage's TrialSpec. Tune names the trainable (its trial folders, and what `Tuner.restore` checks) by the
    function's name, `train_driver` or `function_trial`, as when they were closures here."""
    resources = spec.resources
    trial = trial_spec(space, spec)
    if spec.executor == "train":
        return tune.with_resources(functools.partial(train_driver, trial),
                                   {"cpu": 0, DRIVER_RESOURCE: 1, **dict(resources.per_trial)})
    if resources.workers != 1:
        raise ValueError("--executor function runs single-worker trials; use --executor train for several workers")
    return tune.with_resources(functools.partial(function_trial, trial),
                               {"cpu": resources.cpus_per_worker, "gpu": resources.gpus_per_worker,
                                **dict(resources.custom), **dict(resources.per_trial)})


MAX_RUN_NAME = 120


def readable_run_name(stage: str, key: str, sampled: dict[str, Any], seed: int) -> str:
    """What the MLflow runs table shows: `search 04b9f357: lr=0.00196, penalty=1.31` or `replicate 04b9f357:
    seed 2871`. The full id stays in the run's tags (raybench.key, trial_id), which is what raybench looks up."""
    short = key.split("-seed")[0][:8]
    if stage == "replicate":
        return f"replicate {short}: seed {seed}"
    values = ", ".join(f"{k}={v:.3g}" if isinstance(v, float) else f"{k}={v}" for k, v in sorted(sampled.items()))
    name = f"{stage} {short}: {values}" if values else f"{stage} {short}"
    return name if len(name) <= MAX_RUN_NAME else name[:MAX_RUN_NAME - 1] + "…"


# ----- search spaces -> Optuna ----------------------------------------------------------------------------
class DistinctOptunaSearch(OptunaSearch):
    """Tune's OptunaSearch that does not hand out the same config twice.

    On a discrete space (SpuCo's lr x weight-decay grid) a random sampler repeats itself, and a repeat
    is a trial spent learning nothing new. A repeated draw is told to Optuna as pruned and drawn again,
    up to MAX_REDRAWS times; only when the space seems exhausted does the repeat run (a finished one is
    then replayed from its record, not retrained). The set of configs handed out is part of the
    searcher's saved state (OptunaSearch pickles its __dict__), so a resumed sweep keeps it.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._handed_out: set[str] = set()

    def suggest(self, trial_id: str) -> dict | None:
        def reject() -> None:
            self._ot_study.tell(self._ot_trials.pop(trial_id), state=optuna.trial.TrialState.PRUNED)

        return first_unseen(lambda: super(DistinctOptunaSearch, self).suggest(trial_id), reject, self._handed_out)


# ----- experiments -------------------------------------------------------------------------------------------
def _run_config(spec: RunSpec) -> tune.RunConfig:
    return tune.RunConfig(
        name=spec.name, storage_path=str(spec.storage), callbacks=[*spec.callbacks, StorageWatch(spec.storage)],
        storage_filesystem=atomic_local_filesystem(),  # Tune's state and checkpoints whole or not at all
        failure_config=tune.FailureConfig(max_failures=spec.resources.max_failures if spec.executor == "function" else 0),
        verbose=0,
    )


def _reuse_actors(spec: RunSpec) -> bool:
    return spec.executor == "function" or spec.train_path.reuse_driver


def _scheduler(spec: RunSpec) -> TrialScheduler | None:
    """ASHA when the search stops trials early; None is Tune's FIFO (every trial runs to its end)."""
    return CooperativeASHA(spec.early_stopping, spec.stop_requests) if spec.early_stopping else None


@dataclass(frozen=True)
class StageResult:
    """A stage's Tune experiment as it ended: Tune's results, and whether a stop signal ended it."""

    grid: tune.ResultGrid
    signalled: bool  # Tune caught a stop signal during fit (SIGINT, or a SIGTERM raybench.exits.Signals made one)


def _fit_or_resume(spec: RunSpec, trainable: Any, make_tuner: Callable[[], tune.Tuner], resume: bool) -> StageResult:
    """Fit a new or restored experiment. Tune turns a Ctrl-C into a normal return and leaves its own SIGINT
    handler installed when no signal came: whose handler is installed after fit tells whether one came, and the
    caller's is put back either way, so a Ctrl-C between stages is not swallowed."""
    path = str(spec.storage / spec.name)
    slots = TrialSlots.of_this_process(spec.trial_slots) if spec.trial_slots is not None else None
    try:
        if resume:
            state_seal.require_sealed(Path(path))  # checked by the driver already; again just before Tune reads it
        if resume and tune.Tuner.can_restore(path, storage_filesystem=atomic_local_filesystem()):
            if slots is not None:
                slots.take_for_restored(restored_trial_ids(path))
            tuner = tune.Tuner.restore(path, trainable=trainable, resume_unfinished=True, resume_errored=False,
                                       storage_filesystem=atomic_local_filesystem(), restart_errored=False)
        else:
            tuner = make_tuner()
        with sigint_watched_for_the_fit() as handler:
            try:
                grid = tuner.fit()
                signalled = tune_caught_a_signal(handler)
            except Exception as err:
                full = FULL_STORAGE.pop(str(spec.storage), None)
                if full is not None:  # Tune tripped over what the full folder did to it
                    raise full from err
                raise
    finally:
        if slots is not None:
            slots.give_back_all()
    full = FULL_STORAGE.pop(str(spec.storage), None)
    if full is not None:  # StorageWatch stopped the experiment: its unfinished trials resume from their checkpoints
        raise full
    return StageResult(grid, signalled)


def restored_trial_ids(path: str) -> list[str]:
    """The trials a resume starts again without asking the search for them: every one neither finished nor
    errored (restored with resume_unfinished=True, resume_errored=False: tune_controller._requeue_restored_trials)."""
    trials = tune.ExperimentAnalysis(path, storage_filesystem=atomic_local_filesystem()).trials
    return [trial.trial_id for trial in trials if trial.status not in ("TERMINATED", "ERROR")]


_SIGINT_HANDLER_BEFORE_FIT: list[Any] = []  # this process's running fit's (one at a time), for QueuedSearch


@contextlib.contextmanager
def sigint_watched_for_the_fit() -> Iterator[Any]:
    """The SIGINT handler in place before a fit, put back after it. While the fit runs, QueuedSearch reads it to
    tell whether Tune's handler has caught a stop signal, whenever that came: before the search's first request
    for a trial as well as during its wait for a slot."""
    handler = signal.getsignal(signal.SIGINT)
    _SIGINT_HANDLER_BEFORE_FIT.append(handler)
    try:
        yield handler
    finally:
        _SIGINT_HANDLER_BEFORE_FIT.remove(handler)
        signal.signal(signal.SIGINT, handler)


def tune_caught_a_signal(handler_before_fit: Any) -> bool:
    """Whether Tune's fit was ended by a stop signal. Tune installs its own SIGINT handler for the fit and
    puts back the one it found only when that handler runs (ray/tune/tune.py, `_setup_signal_catching`); with
    TUNE_DISABLE_SIGINT_HANDLER it installs none, and a Ctrl-C is a KeyboardInterrupt instead of a return.

    Trials alone cannot tell: a trial whose actor Tune had just started when the signal came is ended by
    Tune's clean-up as terminated or errored, without a report or a completed record."""
    if int(os.getenv("TUNE_DISABLE_SIGINT_HANDLER", "0")):
        return False
    return signal.getsignal(signal.SIGINT) is handler_before_fit


def run_search(space: ResolvedSpace, spec: RunSpec, trials: int, sampler: str, seed: int, resume: bool) -> StageResult:
    """Random (or TPE) search with Optuna through Tune's OptunaSearch; trials select on `selection/best`.
    A space whose every searched setting was fixed (`--set`) has one config: it runs once, unsearched."""
    trainable = make_trainable(space, spec)
    optuna.logging.set_verbosity(optuna.logging.WARNING)  # not "A new study created in memory" on the console
    searcher = DistinctOptunaSearch(
        space={name: optuna_distribution(p) for name, p in space.search.items()},
        metric=SELECTION_BEST, mode="max", sampler=SAMPLERS[sampler](seed),
    ) if space.search else None

    def make_tuner() -> tune.Tuner:
        search, limit = _search_algorithm(searcher, spec)
        return tune.Tuner(
            trainable,
            tune_config=tune.TuneConfig(search_alg=search, num_samples=trials if searcher else 1,
                                        max_concurrent_trials=limit, scheduler=_scheduler(spec),
                                        reuse_actors=_reuse_actors(spec)),
            run_config=_run_config(spec),
        )

    return _fit_or_resume(spec, trainable, make_tuner, resume)


def run_replicates(space: ResolvedSpace, spec: RunSpec, sampled: dict[str, Any], seeds: list[int],
                   resume: bool) -> StageResult:
    """The selected sampled config once per seed, each seed its own trial."""
    trainable = make_trainable(space, spec)

    def make_tuner() -> tune.Tuner:
        search, limit = _search_algorithm(None, spec)
        return tune.Tuner(
            trainable,
            param_space={**sampled, "seed": tune.grid_search(seeds)},
            tune_config=tune.TuneConfig(search_alg=search, max_concurrent_trials=limit,
                                        reuse_actors=_reuse_actors(spec)),
            run_config=_run_config(spec),
        )

    return _fit_or_resume(spec, trainable, make_tuner, resume)


def _search_algorithm(searcher: Any, spec: RunSpec) -> tuple[Any, int | None]:
    """What creates a stage's trials, and the `max_concurrent_trials` Tune is given with it. Without a trial queue:
    the searcher (None: Tune's grid and random variants) and the stage's own limit, which Tune applies. In a
    benchmark's queue at --address, Tune would ignore that limit beside a search algorithm that is not a bare
    Searcher, so the same limit is applied inside QueuedSearch's wrapped algorithm and Tune is given none."""
    if spec.trial_slots is None:
        return searcher, spec.max_concurrent
    inner = (SearchGenerator(ConcurrencyLimiter(searcher, max_concurrent=spec.max_concurrent)) if searcher is not None
             else BasicVariantGenerator(max_concurrent=spec.max_concurrent))
    return QueuedSearch(inner, TrialSlots.of_this_process(spec.trial_slots)), None


class QueuedSearch(SearchAlgorithm):
    """A stage's search algorithm (Optuna's, or the grid of replicate seeds) behind a benchmark's trial queue
    (trial_slots.py): Tune gets a new trial only while this driver holds a free slot for it, and the slot is
    freed when Tune ends the trial however it ends (finished, stopped, errored, removed), so the running
    trials of all the benchmark's sweeps never exceed its cap, and a slot one sweep leaves idle is another's.

    Tune asks for new trials on every step of its loop; a sweep with no trial of its own left to run asks once
    a second, for up to 10 minutes, inside one step (TuneController._update_trial_queue), so that is where a
    sweep whose slots others hold waits. Tune checks for a stop signal only between steps: once its handler
    has caught one (it then puts back the handler it found, as `tune_caught_a_signal` reads), this search says
    it is finished, which ends that wait at once, and the stage ends as interrupted, resumable.
    The trials Tune restores on a `--resume` were created before, and Tune starts them without asking: the sweep
    takes their slots before it restores them (`_fit_or_resume`, TrialSlots.take_for_restored), and this search,
    unpickled from the experiment state as the same process's slots, frees each when Tune ends its trial."""

    PENDING = "(next trial)"

    def __init__(self, inner: SearchAlgorithm, slots: TrialSlots) -> None:
        super().__init__()
        self.inner, self.slots = inner, slots

    def next_trial(self) -> Any:
        if not self.slots.take(self.PENDING):
            return None
        trial = self.inner.next_trial()
        if trial is None:
            self.slots.give_back(self.PENDING)
        else:
            self.slots.hand_over(self.PENDING, trial.trial_id)
        return trial

    def on_trial_complete(self, trial_id: str, result: dict | None = None, error: bool = False) -> None:
        try:
            self.inner.on_trial_complete(trial_id, result=result, error=error)
        finally:
            self.slots.give_back(trial_id)

    def on_trial_result(self, trial_id: str, result: dict) -> None:
        self.inner.on_trial_result(trial_id, result)

    # Everything else is the wrapped algorithm's own.
    @property
    def searcher(self) -> Any:
        """The wrapped Searcher, where Tune looks for the ConcurrencyLimiter that sizes how many trials it lets
        wait for resources at once (tune_controller._get_max_pending_trials); none for the grid: one at a time."""
        return getattr(self.inner, "searcher", None)

    @property
    def metric(self) -> Any:
        return self.inner.metric

    @property
    def total_samples(self) -> int:
        return self.inner.total_samples

    def set_search_properties(self, metric: str | None, mode: str | None, config: dict, **spec: Any) -> bool:
        return self.inner.set_search_properties(metric, mode, config, **spec)

    def add_configurations(self, experiments: Any) -> None:
        self.inner.add_configurations(experiments)

    def is_finished(self) -> bool:
        return self.inner.is_finished() or self._stop_signalled()

    @staticmethod
    def _stop_signalled() -> bool:
        """Whether the running fit's Tune handler has caught a stop signal (it then puts back the handler found
        before the fit). Tune installs its handler before it first asks for a trial; a signal that came before
        this search's first request is seen too (reading the handler at that request instead missed it, and
        the sweep waited out Tune's 10 minutes: a test's Ctrl-C under a loaded machine)."""
        return bool(_SIGINT_HANDLER_BEFORE_FIT) and tune_caught_a_signal(_SIGINT_HANDLER_BEFORE_FIT[-1])

    def set_finished(self) -> None:
        self.inner.set_finished()

    def has_checkpoint(self, dirpath: str) -> bool:
        return self.inner.has_checkpoint(dirpath)

    def save_to_dir(self, dirpath: str, **kwargs: Any) -> None:
        self.inner.save_to_dir(dirpath, **kwargs)

    def restore_from_dir(self, dirpath: str) -> None:
        self.inner.restore_from_dir(dirpath)


# ----- MLflow: a Tune callback in the sweep's own process --------------------------------------------------
class RunRecords:
    """The runs of one stage as the sweep's callbacks see them: each Tune trial's RunIdentity, made at its first
    event and shared by the callbacks that hold these records, and its completed-run record (CompletedRuns: its
    timing and whether it was stopped early), read when the trial completes.

    Tune pickles the callbacks, and these records with them: the identities are rebuilt, not saved."""

    def __init__(self, completed: CompletedRuns, space: ResolvedSpace, stage: str) -> None:
        self.completed, self.space, self.stage = completed, space, stage
        self._identities: dict[str, RunIdentity] = {}

    def __getstate__(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if k != "_identities"}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update({**state, "_identities": {}})

    def identity(self, trial: Any) -> RunIdentity:
        """The run the Tune trial stands for (its config and key)."""
        if trial.trial_id not in self._identities:
            self._identities[trial.trial_id] = RunIdentity.of(self.space, trial.config, self.stage)
        return self._identities[trial.trial_id]

    def for_trial(self, trial: Any) -> dict[str, Any]:
        return self.completed.load(self.identity(trial).key) or {}


TUNE_BOOKKEEPING = frozenset(AUTO_RESULT_KEYS)  # what Tune adds to every result: its counters, clock, pid, host


def science(result: dict[str, Any]) -> dict[str, Any]:
    """A result without Tune's bookkeeping and the trial's wall-clock stamps: what a run's MLflow metrics hold."""
    return {k: v for k, v in result.items() if k not in TUNE_BOOKKEEPING and k not in CLOCK_STAMPS}


class TrackingCallback(tune.Callback):
    """Mirrors every trial into a nested MLflow run through raybench.tracking (one log_batch per epoch).

    It lives in the process that runs the sweep, so workers never need to reach MLflow. It only hands its
    writes to the stage's TrialRunWriter, which writes them in order beside Tune's loop and journals them on
    --storage. Runs are named by a key (trial id, plus seed for replicates): a sweep that is not resuming
    creates its runs without asking the store for earlier ones; a resumed sweep, and a copy of this callback
    that Tune restores from its experiment state, finds them again and reuses them.
    """

    def __init__(self, tracker: Any, space: ResolvedSpace, stage: str, tags: dict[str, str],
                 records: RunRecords, journal: Path, resuming: bool) -> None:
        self.space, self.stage, self.tags, self.records = space, stage, tags, records
        self.uri, self.parent_id, self.journal, self.resuming = tracker.uri, tracker.parent_id, journal, resuming
        self.__dict__.update(self._fresh_state())

    def __getstate__(self) -> dict[str, Any]:
        """Tune pickles callbacks into its experiment state and hands the copy back on restore: keep the
        tracking URI, parent run id and journal, and reconnect lazily."""
        return {**self.__dict__, **self._fresh_state()}

    def __setstate__(self, state: dict[str, Any]) -> None:
        """A restored copy resumes: it looks its runs up. A sweep started by an older raybench pickled fewer
        fields: the per-process ones start empty."""
        self.__dict__.update({"journal": None, **state, **self._fresh_state(), "resuming": True})

    @staticmethod
    def _fresh_state() -> dict[str, Any]:
        """What a restored copy rebuilds in its own process: the writer and the per-trial maps."""
        return {"_writer": None, "runs": {}, "stages_logged": set(), "nodes": {}}

    @property
    def writer(self) -> Any:
        if self._writer is None:
            from raybench.tracking import TRIAL_JOURNAL, TrialRunWriter

            journal = self.journal or self.records.completed.directory.parent / TRIAL_JOURNAL
            self._writer = TrialRunWriter.for_stage(self.uri, self.parent_id, journal, self.resuming)
        return self._writer

    def _submit(self, kind: str, key: str, **fields: Any) -> None:
        from raybench.tracking import RunWrite, WriteKind, now_ms

        self.writer.submit(RunWrite(WriteKind(kind), key, timestamp_ms=now_ms(), **fields))

    def _run(self, trial: Any) -> str:
        """The key of the trial's run, opened (handed to the writer) at the trial's first event."""
        if trial.trial_id not in self.runs:
            run = self.records.identity(trial)
            seed = run.config["seed"]
            tags = {**self.tags, "stage": self.stage, "trial_id": run.trial_id, "seed": str(seed),
                    "tune_trial_id": trial.trial_id}
            name = readable_run_name(self.stage, run.key,
                                     {k: v for k, v in trial.config.items() if k in self.space.search}, seed)
            self._submit("open", run.key, run_name=name, params=run.config, tags=tags)
            self.runs[trial.trial_id] = run.key
        return self.runs[trial.trial_id]

    def on_trial_start(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        self._run(trial)

    def on_trial_result(self, iteration: int, trials: list, trial: Any, result: dict, **info: Any) -> None:
        """An epoch's metrics (the writer skips one its run already has); a failure's or a replayed record's
        result only moves the node tags."""
        key = self._run(trial)
        tags = self._node_tags(trial, result.get(NODE))
        if FAILURE_KEY not in result and not result.get("replayed"):
            from raybench.tracking import numeric_metrics

            self._submit("epoch", key, metrics=numeric_metrics(science(result)), step=int(result.get("epoch", iteration)),
                         tags=tags)
        elif tags:
            self._submit("tags", key, tags=tags)
        self._log_stages(trial, key, result)

    def _node_tags(self, trial: Any, node: str | None) -> dict[str, str]:
        """The run's `raybench.nodes` tag (the nodes it ran on, in order: `worker-1,head` after a node was lost)
        when this result moved it, sent with the epoch's metrics in the same request."""
        seen = self.nodes.setdefault(trial.trial_id, [])
        if not node or (seen and seen[-1] == node):
            return {}
        seen.append(node)
        return {"raybench.nodes": ",".join(seen)}

    def _log_stages(self, trial: Any, key: str, result: dict) -> None:
        """Each earlier stage of a multi-stage method becomes a run nested in the trial's run, once."""
        for stage in json.loads(result.get(STAGES_KEY) or "[]"):
            if (trial.trial_id, stage["name"]) not in self.stages_logged:
                self._submit("stage", key, stage=stage)
                self.stages_logged.add((trial.trial_id, stage["name"]))

    def on_trial_complete(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        key = self._run(trial)
        last, record = trial.last_result or {}, self.records.for_trial(trial)
        reason = last.get(FAILURE_KEY)  # a diverged Train run ends without an exception
        tags = {"raybench.selection_blind": str(last[BLIND_INFO])} if last.get(BLIND_INFO) else {}
        if record.get(STOPPED_KEY):
            tags["raybench.stopped_early"] = f"after epoch {int(record[EPOCHS_DONE]) - 1}"
        timing = {}
        if record and not last.get("replayed"):  # what the run used, from its record
            from raybench.tracking import numeric_metrics

            timing = numeric_metrics(science({k: v for k, v in record.items() if k.startswith(TIME_PREFIX)}))
        self._submit("end", key, metrics=timing, step=int(record.get("epoch", iteration)) if timing else 0, tags=tags,
                     status="FAILED" if reason else "FINISHED", reason=reason)

    def on_trial_error(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        self._submit("end", self._run(trial), status="FAILED", reason=error_reason(trial))


class ProgressCallback(tune.Callback):
    """A stage's progress (raybench/sweep/progress.py), shown by the process's display as Tune's loop runs:
    `0/N` when the stage begins, each trial as it starts and reports epochs, a line per finished trial.
    Tune pickles callbacks into its experiment state: a restored copy keeps its counts, restarts its clock and
    shows on the display of the process that restored it."""

    def __init__(self, progress: StageProgress, records: RunRecords) -> None:
        self.progress, self.records = progress, records

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self.progress.restart()

    def setup(self, stop: Any = None, num_samples: Any = None, total_num_samples: Any = None, **info: Any) -> None:
        progress_display().stage_began(self.progress)

    def on_trial_start(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        run = self.records.identity(trial)
        label = f"seed {run.config['seed']}" if self.records.stage == "replicate" else f"trial {run.trial_id}"
        epochs = run.config.get("epochs")
        self.progress.trial_started(trial.trial_id, label, int(epochs) if isinstance(epochs, (int, float)) else None)
        progress_display().moved(self.progress)

    def on_trial_result(self, iteration: int, trials: list, trial: Any, result: dict, **info: Any) -> None:
        if FAILURE_KEY in result or result.get("replayed"):
            return
        self.progress.epoch_reported(trial.trial_id, int(result.get(EPOCHS_DONE, 0)), result.get(SELECTION_BEST))
        progress_display().moved(self.progress)

    def on_step_end(self, iteration: int, trials: list, **info: Any) -> None:
        progress_display().tick(self.progress)

    def on_trial_complete(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        last = trial.last_result or {}
        line = self.progress.finished(last.get(SELECTION_BEST), failed=FAILURE_KEY in last,
                                      replayed=bool(last.get("replayed")),
                                      stopped=bool(self.records.for_trial(trial).get(STOPPED_KEY)), key=trial.trial_id)
        progress_display().trial_finished(self.progress, line)

    def on_trial_error(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        progress_display().trial_finished(self.progress, self.progress.finished(None, failed=True, key=trial.trial_id))

    def on_experiment_end(self, trials: list, **info: Any) -> None:
        progress_display().stage_ended(self.progress)


# ----- a full --storage: stop as on Ctrl-C, so that --resume continues exactly ------------------------------
FULL_STORAGE: dict[str, StorageFull] = {}  # per --storage folder: what filled it, for _fit_or_resume to raise


class StorageWatch(tune.Callback):
    """Stops the experiment when a trial failed because a folder filled up (ENOSPC) or a quota ran out
    (EDQUOT): every later checkpoint would fail the same way, and a trial that used up its retries on it would
    stay failed for good. Tune is stopped as on Ctrl-C, so a trial that was about to be retried stays unfinished
    in Tune's saved state and `--resume` continues it from its last checkpoint once space is freed;
    `_fit_or_resume` then raises the StorageFull recorded here. A trial with no retry left (`--max-failures 0`,
    or a Train-executor trial, which Ray Train retried already) has been marked failed by Tune before this sees it."""

    def __init__(self, storage: Path) -> None:
        self.storage = Path(storage)

    def on_trial_recover(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        self._check(trial)

    def on_trial_error(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        self._check(trial)

    def _check(self, trial: Any) -> None:
        text = _error_text(trial)
        code = disk_full_errno_in(text)
        if code is None or str(self.storage) in FULL_STORAGE:
            return
        FULL_STORAGE[str(self.storage)] = _storage_full(self.storage, trial, text, code)
        _stop_tune()


def _storage_full(storage: Path, trial: Any, text: str, code: int) -> StorageFull:
    """What filled up, in words: --storage (Ray's uploads name no file; raybench's own records name one inside
    it) unless the error names a file elsewhere, such as the local temporary folder a checkpoint is staged in."""
    named = re.search(r"\[Errno \d+\][^'\n]*'(/[^'\n]+)'", text)
    if named and not inside(storage, Path(named.group(1))):
        return StorageFull(Path(named.group(1)).parent, f"trial {trial.trial_id}'s files", code, flag="")
    folder = getattr(trial, "path", None)
    where = f" ({os.path.relpath(folder, storage)})" if folder and inside(storage, Path(folder)) else ""
    return StorageFull(storage, f"a checkpoint or record of trial {trial.trial_id}{where}", code)


def _error_text(trial: Any) -> str:
    path = trial.error_file
    return Path(path).read_text(errors="replace") if path and Path(path).is_file() else ""


def _stop_tune() -> None:
    """End the running Tune loop as Ctrl-C would, through the SIGUSR1 handler Tune installs while it runs in
    the main thread: unfinished trials keep their saved state and checkpoints. Without that handler (Tune run
    from another thread) the loop goes on, and the StorageFull is raised when it ends. Tune's handler runs within
    raise_signal; its "Stop signal received (e.g. via SIGINT/Ctrl+C)" would blame a Ctrl-C nobody pressed."""
    if threading.current_thread() is not threading.main_thread() or not callable(signal.getsignal(signal.SIGUSR1)):
        return
    tune_log = logging.getLogger("ray.tune.tune")
    level = tune_log.level
    tune_log.setLevel(logging.ERROR)
    try:
        signal.raise_signal(signal.SIGUSR1)
    finally:
        tune_log.setLevel(level)


def error_reason(trial: Any) -> str:
    """The last line of a failed trial's error (the exception message), not the whole remote traceback."""
    path = trial.error_file
    if path and Path(path).is_file():
        lines = [line for line in Path(path).read_text().splitlines() if line.strip()]
        return lines[-1].strip() if lines else "unknown error"
    return "unknown error"


# ----- results back to typed records --------------------------------------------------------------------------
def _order(result: Any, metrics: dict[str, Any], fallback: int) -> int:
    """The trial's creation index, which Tune writes into its folder name: <trainable>_<id>_<index>_<params>."""
    tune_id = str(metrics.get("trial_id", ""))
    found = re.search(rf"{re.escape(tune_id)}_(\d+)", Path(result.path).name) if tune_id and result.path else None
    return int(found.group(1)) if found else fallback




def _reason(result: Any, metrics: dict[str, Any], finished: bool) -> str | None:
    if FAILURE_KEY in metrics:
        return str(metrics[FAILURE_KEY])
    if result.error is not None:
        lines = [line.strip() for line in str(result.error).splitlines() if line.strip()]
        return lines[-1] if lines else type(result.error).__name__
    if not finished:
        return None
    if SELECTION_BEST not in metrics:
        return "no epoch finished"
    return None


def _checkpoint_path(result: Any, metrics: dict[str, Any]) -> str | None:
    if metrics.get("checkpoint_path"):
        return str(metrics["checkpoint_path"])
    return result.checkpoint.path if result.checkpoint is not None else None


def _status(reason: str | None, record: dict[str, Any] | None) -> TrialStatus:
    if reason:
        return TrialStatus.FAILED
    if record is None:
        return TrialStatus.INTERRUPTED
    return TrialStatus.STOPPED if record.get(STOPPED_KEY) else TrialStatus.OK


def _with_record(reported: dict[str, Any], record: dict[str, Any] | None) -> dict[str, Any]:
    """What Tune received, over the run's completed record, with the record's timing on top. The record holds
    the run's last report: a run that finished after a signal stopped Tune's loop (its reports never reached
    Tune) is still read whole from it, not taken for one that finished no epoch."""
    record = record or {}
    return {**record, **reported, **{k: v for k, v in record.items() if k.startswith(TIME_PREFIX)}}


def cut_short(stage: StageResult) -> bool:
    """A signal (Ctrl-C, SIGTERM) stopped the stage, or Tune ended its loop with trials it had not finished:
    interrupted, even when every run it started wrote its completed record before `collect` looked."""
    grid = stage.grid
    return stage.signalled or grid.num_terminated + grid.num_errors < len(grid)


def collect(grid: tune.ResultGrid, space: ResolvedSpace, spec: RunSpec) -> list[TrialRecord]:
    """One record per trial: identity, sampled config, status and reason, metrics at its best epoch.

    A trial counts as finished only when its driver wrote its completed record: one that Tune stopped
    on an interrupt has reported some epochs but is `interrupted`, never `ok`."""
    records = []
    for index, result in enumerate(grid):
        metrics = dict(result.metrics or {})
        sampled = {k: v for k, v in (result.config or {}).items()}
        run = RunIdentity.of(space, sampled, spec.stage)
        record = spec.completed.load(run.key)
        metrics = _with_record(metrics, record)
        reason = _reason(result, metrics, record is not None)
        status = _status(reason, record)
        records.append(TrialRecord(
            order=_order(result, metrics, index),
            trial_id=run.trial_id,
            seed=run.config.get("seed", 0),
            sampled=sampled,
            status=status,
            failure_reason=reason,
            selection_value=metrics.get(SELECTION_BEST) if status.selectable else None,
            best_epoch=metrics.get("best_epoch"),
            selection_blind=bool(metrics.get(BLIND_INFO)),
            selection_note=metrics.get(NOTE_INFO),
            metrics={k: v for k, v in metrics.items() if k.startswith((BEST_PREFIX, TIME_PREFIX, BUDGET_PREFIX)) and isinstance(v, (int, float))},
            checkpoint=_checkpoint_path(result, metrics),
            node=(record or metrics).get(NODE),
            epochs_run=metrics.get(EPOCHS_DONE),
            not_converged=metrics.get(CONVERGENCE_INFO) or None,
            pseudo_labels=metrics.get(PSEUDO_INFO) or None,
            pseudo_labels_collapsed=metrics.get(COLLAPSE_INFO) or None,
        ))
    return sorted(records, key=lambda r: r.order)
