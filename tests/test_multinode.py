"""A real two-node Ray cluster on one machine (cluster/local-up.sh with a worker node): trials placed on the
worker node by a custom resource, a worker node lost mid-sweep (SIGKILL of its raylet and workers by their
recorded PIDs), the head's Ray processes killed and restarted under GCS fault tolerance (its state in a Redis
local-up starts; the driver on the head resumed from another process), and two trials on two nodes sharing one
stage-cache entry through the shared --storage. A SIGKILLed driver's `results` and resume: test_signals.py.

One cluster serves the module (starting one takes about a minute on 2 cores): the head offers 1 CPU and the
trial drivers, worker-1 offers 1 CPU and `raybench_worker`. A test that kills worker-1 starts it again.
Every wait polls an event (an MLflow run, a process, a node) with a bounded deadline and says what it waited for.
"""
from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import signal
import sqlite3
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
import pytest
from clusters import alive, free_port_base, port_is_free, port_plan, recorded, script
from helpers.mlflow_stores import seeded_store
from helpers.paths import BIN
from helpers.processes import signal_and_wait, stop_processes_under
from helpers.system_packages import require_system_package
from mlflow.tracking import MlflowClient

pytestmark = pytest.mark.timeout(1500)

WORKER = "worker-1"
SWEEP_TIMEOUT_S = 900


def wait_for(what: str, condition: Callable[[], Any], timeout: float, poll: float = 0.5) -> Any:
    """Poll `condition` until it returns something truthy; fail naming `what` after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(poll)
    pytest.fail(f"timed out after {timeout:g}s waiting for {what}")


def processes_recorded_in(state: Path) -> list[psutil.Process]:
    """The live processes a node's ray.pids in `state` records, with all their descendants."""
    tree: dict[int, psutil.Process] = {}
    for pid, created in recorded(state):
        if alive(pid, created):
            proc = psutil.Process(pid)
            tree.update({p.pid: p for p in [proc, *proc.children(recursive=True)]})
    return list(tree.values())


@dataclass
class TwoNodes:
    """The module's cluster: its environment, state dir and GCS address, and its worker node's processes."""

    env: dict[str, str]
    state: Path
    gcs: str

    @property
    def worker_state(self) -> Path:
        return self.state / "nodes" / WORKER

    def worker_processes(self) -> list[psutil.Process]:
        """worker-1's recorded processes (raylet, agents, log monitor) and all their descendants (its Ray
        workers), listed before any is signalled."""
        return processes_recorded_in(self.worker_state)

    def kill_worker_node(self) -> list[int]:
        """SIGKILL the whole worker node at once, as a machine that loses power."""
        procs = self.worker_processes()
        signal_and_wait(procs, signal.SIGKILL, 30)
        return [p.pid for p in procs]

    def ensure_worker_node(self) -> None:
        """worker-1 up: after a kill, clear its record (local-down --node) and add it again."""
        if (self.worker_state / "ray.pids").exists() and any(alive(*entry) for entry in recorded(self.worker_state)):
            return
        script("local-down.sh", self.env, "--node", WORKER, timeout=180)
        added = script("local-up.sh", self.env, "--add-worker")
        assert added.returncode == 0, added.stderr + added.stdout

    def head_processes(self) -> list[psutil.Process]:
        """The head's recorded Ray processes (GCS, raylet, dashboard, monitors) and their descendants (agents,
        the trials it runs); not MLflow, not Redis, not the drivers, which are none of its children."""
        return processes_recorded_in(self.state)

    def sweep(self, *args: str, cwd: Path, on_worker_node: bool = False) -> subprocess.Popen:
        """`raybench sweep` from this host; its driver joins the head's node, or worker-1's (RAYBENCH_NODE_TEMP_DIR)."""
        env = dict(self.env)
        if on_worker_node:
            env["RAYBENCH_NODE_TEMP_DIR"] = (self.worker_state / "ray_temp_dir").read_text().strip()
        return subprocess.Popen([str(BIN / "raybench"), "sweep", *args, "--address", self.gcs], env=env, cwd=cwd,
                                start_new_session=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


@pytest.fixture(scope="module")
def two_nodes(tmp_path_factory, shared_data_dir):
    require_system_package(shutil.which("redis-server") is not None, "redis-server",
                           "the two-node cluster (its head keeps the GCS's tables in Redis, RAYBENCH_GCS_FT=1)")
    root = tmp_path_factory.mktemp("two-nodes")
    token = root / "ray_auth_token"  # private: the tests never touch ~/.ray
    token.write_text(secrets.token_hex(32))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RAYBENCH_", "RAY_"))}
    env.update({"RAYBENCH_PORT_BASE": str(free_port_base_for_nodes(2)), "RAYBENCH_CLUSTER_DIR": str(root / "state"),
                "RAY_NUM_CPUS": "1", "RAYBENCH_WORKER_NODES": "1", "RAYBENCH_WORKER_CPUS": "1", "RAYBENCH_BIN": str(BIN),
                "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(token), "RAYBENCH_DATA_DIR": str(shared_data_dir),
                "RAY_USAGE_STATS_ENABLED": "0", "MLFLOW_DISABLE_TELEMETRY": "true", "PYTHONUNBUFFERED": "1",
                # GCS fault tolerance: the head keeps its tables in a Redis of its own; nodes and drivers wait up
                # to this long for a restarted GCS (Ray's default 60 s is tight on a loaded 2-core host).
                "RAYBENCH_GCS_FT": "1", "RAY_gcs_rpc_server_reconnect_timeout_s": "180",
                "PATH": f"{BIN}:{os.environ.get('PATH', '')}"})
    env.pop("MLFLOW_TRACKING_URI", None)
    plan = port_plan(env)
    up = script("local-up.sh", env)
    cluster = TwoNodes(env, root / "state", f"127.0.0.1:{plan['RAY_PORT']}")
    redis = None
    try:
        assert up.returncode == 0, up.stderr + up.stdout
        redis = psutil.Process(int((root / "state" / "redis.pid").read_text()))
        assert f"127.0.0.1:{plan['RAYBENCH_REDIS_PORT']}" in " ".join(redis.cmdline())
        yield cluster
    finally:
        started = [entry for pids in (root / "state").glob("**/ray.pids") for entry in recorded(pids.parent)]
        down = script("local-down.sh", env, timeout=240)
        redis_stopped = redis is None or not redis.is_running()
        if not redis_stopped:  # only if local-down could not
            redis.kill()
        for temp in (root / "state").glob("**/ray_temp_dir"):  # only if local-down could not
            stop_processes_under(temp.read_text().strip())
    assert down.returncode == 0, down.stderr
    assert started and not [pid for pid, created in started if alive(pid, created)], "local-down left a node's processes"
    assert not (root / "state" / "nodes").exists() and not (root / "state" / "ray_temp_dir").exists()
    assert not (root / "state" / "redis.pid").exists() and redis_stopped, "local-down left the GCS's Redis running"


def free_port_base_for_nodes(nodes: int) -> int:
    """A base whose blocks for the head and its worker nodes are all free (local-up: 200 ports a node)."""
    base = free_port_base()
    while not all(port_is_free(p) for p in range(base, base + 200 * nodes)):
        base = free_port_base()
    return base


# ----- MLflow views -----------------------------------------------------------------------------------------------
def parent_recorded(uri: str, sweep: str) -> bool:
    """Whether the sweep's parent run is in the SQLite store, read-only: an MlflowClient opened while the sweep
    creates the store would race it to create the schema ("table _alembic_tmp_experiments already exists")."""
    path = Path(uri.removeprefix("sqlite:///"))
    if not path.exists():
        return False
    try:
        with contextlib.closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=5)) as db:
            found = db.execute("SELECT count(*) FROM tags WHERE key = 'raybench.sweep' AND value = ?", (sweep,))
            return found.fetchone()[0] > 0
    except sqlite3.Error:  # no tables yet, or being created
        return False


def runs_of(uri: str, stage: str, sweep: str) -> list[Any]:
    if uri.startswith("sqlite:///") and not parent_recorded(uri, sweep):
        return []
    client = MlflowClient(tracking_uri=uri)
    experiment = client.get_experiment_by_name("raybench")
    if experiment is None:
        return []
    parents = client.search_runs([experiment.experiment_id], f"tags.stage = 'sweep' and tags.`raybench.sweep` = '{sweep}'")
    if not parents:
        return []
    return client.search_runs([experiment.experiment_id], f"tags.stage = '{stage}' and "
                              f"tags.`mlflow.parentRunId` = '{parents[0].info.run_id}'")


def epochs_logged(uri: str, run_id: str) -> list[int]:
    return sorted(m.step for m in MlflowClient(tracking_uri=uri).get_metric_history(run_id, "ood_val/acc"))


def summary_of(storage: Path, name: str) -> dict[str, Any]:
    return json.loads((storage / name / "results" / "summary.json").read_text())


def finish(proc: subprocess.Popen, what: str) -> str:
    try:
        output, _ = proc.communicate(timeout=SWEEP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        output, _ = proc.communicate()
        pytest.fail(f"{what} did not finish within {SWEEP_TIMEOUT_S}s:\n{output[-4000:]}")
    assert proc.returncode == 0, f"{what} exited {proc.returncode}:\n{output[-4000:]}"
    return output


def table(summary: dict[str, Any]) -> list[tuple]:
    """What a user compares between two sweeps: the trials in order, their configs, statuses and values."""
    return [(t["trial_id"], json.dumps(t["sampled"], sort_keys=True), t["status"], t["selection_value"], t["best_epoch"])
            for t in summary["trials"]]


# ----- trials land where they are asked to ------------------------------------------------------------------------
def test_two_nodes_join_and_trials_land_on_the_worker_node_by_its_resource(store_uri, two_nodes, tmp_path):
    two_nodes.ensure_worker_node()
    nodes = subprocess.run(
        [str(BIN / "python"), "-c", "import json, ray; ray.init(address='" + two_nodes.gcs + "', log_to_driver=False); "
         "print(json.dumps([[n['Labels'].get('raybench.node'), n['Resources']] for n in ray.nodes() if n['Alive']]))"],
        env=two_nodes.env, capture_output=True, text=True, timeout=120)
    assert nodes.returncode == 0, nodes.stderr[-3000:]
    found = dict(json.loads(nodes.stdout.strip().splitlines()[-1]))
    assert set(found) == {"head", WORKER}, found
    assert found[WORKER]["raybench_worker"] == 1 and found[WORKER]["CPU"] == 1 and "trial_driver" not in found[WORKER]
    assert found["head"]["trial_driver"] >= 1 and "raybench_worker" not in found["head"]

    uri = store_uri
    proc = two_nodes.sweep("erm", "--smoke", "--trials", "2", "--replicates", "0", "--executor", "function",
                           "--worker-resource", "raybench_worker=1", "--name", "placed", "--storage",
                           str(tmp_path / "runs"), "--tracking-uri", uri, cwd=tmp_path)
    finish(proc, "the placed sweep")
    trials = summary_of(tmp_path / "runs", "placed")["trials"]
    assert [t["node"] for t in trials] == [WORKER, WORKER], trials
    assert sorted(r.data.tags["raybench.nodes"] for r in runs_of(uri, "search", "placed")) == [WORKER, WORKER]


# ----- a worker node lost mid-sweep --------------------------------------------------------------------------------
# No replicates: the node is lost in the search, and selection is what the uninterrupted sweep must agree on. Two
# trials run at once, one on each node (each offers one CPU): the one on worker-1 is lost.
NODE_LOSS = ["erm", "--trials", "2", "--replicates", "0", "--seed", "3", "--max-concurrent", "2",
             "--set", "epochs=3", "--set", "max_steps_per_epoch=60", "--set", "patience=none"]


def running_on_worker_mid_trial(uri: str, sweep: str) -> Any:
    """A search run whose epochs ran on worker-1, with a checkpointed epoch and epochs still to go."""
    for run in runs_of(uri, "search", sweep):
        if run.info.status == "RUNNING" and run.data.tags.get("raybench.nodes") == WORKER \
                and 1 <= len(epochs_logged(uri, run.info.run_id)) < 3:
            return run
    return None


def test_a_lost_worker_node_moves_its_trials_to_a_surviving_node_from_their_checkpoints(store_uri, two_nodes, tmp_path):
    """Train executor, a checkpoint every epoch: the node dies (raylet, object store, workers) and the sweep
    ends as an uninterrupted one with the same seed: same trials, configs, values and selection."""
    two_nodes.ensure_worker_node()
    storage, uri = tmp_path / "runs", store_uri
    lost = two_nodes.sweep(*NODE_LOSS, "--name", "lost", "--storage", str(storage), "--tracking-uri", uri, cwd=tmp_path)
    try:
        victim = wait_for("a trial on worker-1 with a checkpointed epoch and epochs to go, or the sweep's end",
                          lambda: "ended" if lost.poll() is not None else running_on_worker_mid_trial(uri, "lost"),
                          timeout=600)
        assert victim != "ended", "the sweep ended before a trial was seen mid-run on worker-1:\n" + lost.communicate()[0][-3000:]
        epochs_before = epochs_logged(uri, victim.info.run_id)
        killed = two_nodes.kill_worker_node()
        assert killed and not two_nodes.worker_processes()
        output = finish(lost, "the sweep that lost a node")
    finally:
        if lost.poll() is None:
            lost.kill()
    summary = summary_of(storage, "lost")
    assert len(summary["trials"]) == 2 and len({t["trial_id"] for t in summary["trials"]}) == 2, output[-3000:]
    assert all(t["status"] == "ok" for t in summary["trials"]), summary["trials"]

    # MLflow: each trial once, every epoch once; the lost one carried on from its checkpoint on the head.
    search = runs_of(uri, "search", "lost")
    assert sorted(r.data.tags["trial_id"] for r in search) == sorted(t["trial_id"] for t in summary["trials"])
    assert all(r.info.status == "FINISHED" for r in search)
    assert all(epochs_logged(uri, r.info.run_id) == [0, 1, 2] for r in search), \
        {r.data.tags["trial_id"]: epochs_logged(uri, r.info.run_id) for r in search}
    moved = next(r for r in search if r.info.run_id == victim.info.run_id)
    assert moved.data.tags["raybench.nodes"] == f"{WORKER},head", (epochs_before, moved.data.tags)

    # The same sweep, never interrupted (worker-1 back): the same table and the same selection. It runs the
    # same trainer on the same configs and seeds through the function executor, in a fraction of the time.
    two_nodes.ensure_worker_node()
    calm = two_nodes.sweep(*NODE_LOSS, "--executor", "function", "--name", "calm", "--storage", str(storage),
                           "--tracking-uri", uri, cwd=tmp_path)
    finish(calm, "the uninterrupted sweep")
    reference = summary_of(storage, "calm")
    assert table(summary) == table(reference)
    assert summary["selected"]["trial_id"] == reference["selected"]["trial_id"]


# ----- the head restarted under GCS fault tolerance ----------------------------------------------------------------
def assert_complete_once(storage: Path, uri: str, name: str, trials: int, epochs: int) -> None:
    """Every trial once and ok, every epoch of every trial once in MLflow, the sweep finished."""
    summary = summary_of(storage, name)
    ids = [t["trial_id"] for t in summary["trials"]]
    assert len(ids) == trials and len(set(ids)) == trials and all(t["status"] == "ok" for t in summary["trials"])
    assert summary["state"] == "finished", summary["state"]
    search = runs_of(uri, "search", name)
    assert sorted(r.data.tags["trial_id"] for r in search) == sorted(ids), f"{name}: a trial was duplicated or lost in MLflow"
    assert all(r.info.status == "FINISHED" for r in search)
    assert {r.data.tags["trial_id"]: epochs_logged(uri, r.info.run_id) for r in search} == \
        {trial: list(range(epochs)) for trial in ids}, f"{name}: an epoch was lost or logged twice"


def test_a_head_restart_is_survived_by_a_driver_off_the_head_and_resumed_by_one_on_it(two_nodes, tmp_path, empty_store):
    """Two sweeps at once; the head's Ray processes (GCS, raylet and the trials under it, dashboard) are SIGKILLed
    mid-search and started again by `local-up.sh --restart-head`, the GCS reloading its tables from Redis.
    The driver on worker-1 waits for the GCS and finishes on its own: its trial on the head is retried. The
    driver on the head lost its raylet: it stops itself as interrupted (exit 143, a resume line) instead of
    waiting forever, and `--resume` completes it. Both: every trial once, every epoch once in MLflow."""
    two_nodes.ensure_worker_node()
    storage, epochs = tmp_path / "runs", 3
    uris = {name: seeded_store(empty_store, tmp_path / f"{name}.db") for name in ("off", "on")}
    # One trial at a time: once a sweep has finished its first trial, three are still to run while the test waits
    # for the other sweep to get as far (with two at a time, the faster sweep had finished by then under load).
    # No replicates: the head dies in the search, which both sweeps must finish with every trial and epoch once.
    args = {name: ["erm", "--smoke", "--trials", "4", "--replicates", "0", "--executor", "function", "--max-concurrent",
                   "1", "--set", f"epochs={epochs}", "--name", name, "--storage", str(storage), "--tracking-uri", uri]
            for name, uri in uris.items()}
    sweeps = {"off": two_nodes.sweep(*args["off"], cwd=tmp_path, on_worker_node=True),
              "on": two_nodes.sweep(*args["on"], cwd=tmp_path)}
    try:
        wait_for("a finished search trial in both sweeps, or a sweep's end", lambda: any(
            p.poll() is not None for p in sweeps.values()) or all(
            any(r.info.status == "FINISHED" for r in runs_of(uris[name], "search", name)) for name in sweeps), timeout=600)
        assert all(p.poll() is None for p in sweeps.values()), \
            "a sweep ended before the head was killed:\n" + "\n".join(p.communicate()[0][-2000:] for p in sweeps.values())
        head = two_nodes.head_processes()
        signal_and_wait(head, signal.SIGKILL, 30)
        assert not two_nodes.head_processes(), "the head's processes outlived SIGKILL"
        finished = {name: sum(r.info.status == "FINISHED" for r in runs_of(uris[name], "search", name)) for name in sweeps}
        assert all(p.poll() is None for p in sweeps.values()) and max(finished.values()) < 4, \
            f"a sweep was no longer mid-search when the head died (finished search trials: {finished})"
        restarted = script("local-up.sh", two_nodes.env, "--restart-head")
        assert restarted.returncode == 0, restarted.stderr + restarted.stdout
        assert "reloaded from Redis" in restarted.stdout

        finish(sweeps["off"], "the sweep whose driver is on worker-1")
        output, _ = sweeps["on"].communicate(timeout=SWEEP_TIMEOUT_S)
    finally:
        for proc in sweeps.values():
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.communicate(timeout=60)
    assert_complete_once(storage, uris["off"], "off", trials=4, epochs=epochs)
    assert sweeps["on"].returncode == 143, output[-4000:]
    assert "the Ray node this driver joined" in output and "is gone" in output, output[-4000:]
    assert "resume with: raybench sweep erm" in output and "--resume" in output, output[-4000:]
    finish(two_nodes.sweep(*args["on"], "--resume", cwd=tmp_path), "the resumed sweep that was on the head")
    assert_complete_once(storage, uris["on"], "on", trials=4, epochs=epochs)


# ----- one stage-cache entry for two trials on two nodes -----------------------------------------------------------
def test_two_trials_on_two_nodes_train_their_shared_reference_model_once(store_uri, two_nodes, tmp_path):
    """JTT's reference ERM model depends on T_r and its lr and weight decay (the trial's own unless set): with
    those fixed, two concurrent trials (one per node, each node having one CPU) need the same one. One trains
    it, the other waits on the lock and loads it."""
    two_nodes.ensure_worker_node()
    storage, uri = tmp_path / "runs", store_uri
    proc = two_nodes.sweep("jtt", "--dataset", "spuco-digits", "--smoke", "--trials", "2", "--replicates", "0",
                           "--executor", "function", "--set", "reference_epochs=1", "--set", "reference_lr=0.01",
                           "--set", "reference_weight_decay=0.01", "--set", "upsample=5", "--name", "shared",
                           "--storage", str(storage), "--tracking-uri", uri, cwd=tmp_path)
    finish(proc, "the JTT sweep")
    trials = summary_of(storage, "shared")["trials"]
    assert all(t["status"] == "ok" for t in trials) and len(trials) == 2
    assert sorted(t["node"] for t in trials) == ["head", WORKER], "the two trials did not run on two nodes"
    entries = [p for p in (storage / "stage_cache").iterdir() if p.is_dir()]
    assert len(entries) == 1, entries
    client = MlflowClient(tracking_uri=uri)
    experiment = client.get_experiment_by_name("raybench")
    stages = client.search_runs([experiment.experiment_id], "tags.`raybench.method_stage` = 'reference'")
    assert sorted(r.data.tags["cached"] for r in stages) == ["False", "True"]
    assert {r.data.params["stage_key"] for r in stages} == {entries[0].name}


# ----- a researcher's own method, from a plug-in, on the cluster and as a Ray job ------------------------------------
PLUGIN = Path(__file__).resolve().parents[1] / "examples" / "raybench-vrex" / "raybench_vrex"
PLUGIN_SWEEP = ["vrex", "--dataset", "colored-moons", "--smoke", "--trials", "2", "--replicates", "1",
                "--worker-resource", "raybench_worker=1"]
JOB_SCRIPT = """
import json, sys, time
from ray.job_submission import JobStatus, JobSubmissionClient

dashboard, entrypoint, plugin = sys.argv[1:]
client = JobSubmissionClient(dashboard)
job = client.submit_job(entrypoint=entrypoint, runtime_env={"py_modules": [plugin]})
deadline = time.monotonic() + 800
while (status := client.get_job_status(job)) not in (JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.STOPPED):
    if time.monotonic() > deadline:
        client.stop_job(job)
        break
    time.sleep(1)
print(json.dumps({"status": str(status), "logs": client.get_job_logs(job)[-4000:]}))
"""


def test_a_plugin_method_trains_on_the_worker_node_directly_and_as_a_ray_job(store_uri, two_nodes, tmp_path):
    """The example plug-in's V-REx on its own dataset: once with the Train executor from this host (the plug-in
    named by its folder), once as a Ray job whose runtime_env ships the plug-in (`py_modules`) and whose driver
    joins the job's cluster by itself (no --address); then `compare` puts both rows beside ERM's."""
    two_nodes.ensure_worker_node()
    storage = tmp_path / "runs"
    common = ["--storage", str(storage), "--tracking-uri", store_uri]
    finish(two_nodes.sweep(*PLUGIN_SWEEP, "--plugin", str(PLUGIN), "--name", "vrex-direct", *common, cwd=tmp_path),
           "the plug-in's sweep")
    entrypoint = " ".join([str(BIN / "raybench"), "sweep", *PLUGIN_SWEEP, "--plugin", "raybench_vrex",
                           "--name", "vrex-job", *common])
    dashboard = f"http://127.0.0.1:{port_plan(two_nodes.env)['DASHBOARD_PORT']}"
    job = subprocess.run([str(BIN / "python"), "-c", JOB_SCRIPT, dashboard, entrypoint, str(PLUGIN)],
                         env=two_nodes.env, capture_output=True, text=True, timeout=900)
    assert job.returncode == 0, job.stderr[-3000:]
    outcome = json.loads(job.stdout.strip().splitlines()[-1])
    assert outcome["status"] == "SUCCEEDED", outcome["logs"]
    for name in ("vrex-direct", "vrex-job"):
        summary = summary_of(storage, name)
        assert summary["algorithm"] == "vrex"
        assert [(t["status"], t["node"]) for t in summary["trials"]] == [("ok", WORKER)] * 2, summary["trials"]
    finish(two_nodes.sweep("erm", "--dataset", "colored-moons", "--smoke", "--trials", "1", "--replicates", "1",
                           "--executor", "function", "--plugin", str(PLUGIN), "--name", "erm-moons", *common,
                           cwd=tmp_path), "the ERM baseline")
    compared = subprocess.run([str(BIN / "raybench"), "compare", "--dataset", "colored-moons", "--format", "json",
                               "--tracking-uri", store_uri], env=two_nodes.env, capture_output=True, text=True,
                              timeout=120)
    assert compared.returncode == 0, compared.stderr
    rows = {(row["sweep"], row["algorithm"]) for row in json.loads(compared.stdout)["rows"]}
    assert {("vrex-direct", "vrex"), ("vrex-job", "vrex"), ("erm-moons", "erm")} <= rows, compared.stdout
