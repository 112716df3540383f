"""The Ray cluster a sweep runs on: joining one or starting a private one (`connect`, `start_shared_cluster`),
refusing before any trial starts what it can never run (`probe_address`, `check_resources`), watching the node
this driver joined (`NodeWatch`) and letting Ray go (`shutdown`). Part of the Ray backend (ray_backend.py says which
module does what).

The settings Ray and Tune read from this process's environment are set here, before this module imports Ray (the
backend's face, ray_backend.py, imports it first). Ray reads them when it starts and Tune when a stage runs, not
when they are imported; ray_search imports this module, so a stage run without `connect` has them too.
"""
from __future__ import annotations

import atexit
import contextlib
import json
import logging
import math
import os
import signal
import socket
import sys
import threading
from pathlib import Path
from typing import Any

os.environ.setdefault("RAY_TRAIN_ENABLE_PREEMPTION_WATCHER", "0")
os.environ.setdefault("TUNE_WARN_EXCESSIVE_EXPERIMENT_CHECKPOINT_SYNC_THRESHOLD_S", "0")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
# The console is raybench's (one line per finished trial): Tune's experiment boxes, result paths and
# TensorBoard hints stay out of it (verbose=0 alone still prints them with the new output engine).
os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")

import ray
from ray._common.utils import get_default_ray_temp_dir

from raybench.sweep.errors import ClusterError
from raybench.sweep.leftovers import forget_driver, record_driver, stop_dead_drivers_leftovers
from raybench.sweep.options import shown_address
from raybench.sweep.ray_trial import Resources


def _no_colour_reset_at_exit() -> None:
    """Ray's CLI logger calls `colorama.init(strip=False)` when Ray is imported (ray/autoscaler/_private/
    cli_logger.py), which registers an exit hook that writes ESC[0m to a terminal after the sweep's last line
    (shown raw by anything that records the terminal). raybench prints no colour codes to reset: the hook goes."""
    initialise = getattr(sys.modules.get("colorama"), "initialise", None)
    if initialise is not None:
        atexit.unregister(initialise.reset_all)


_no_colour_reset_at_exit()

DRIVER_RESOURCE = "trial_driver"


# ----- connecting -----------------------------------------------------------------------------------
def already_connected() -> bool:
    """Whether this process holds a Ray already: `connect` then joins nothing and leaves it as it found it."""
    return ray.is_initialized()


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
