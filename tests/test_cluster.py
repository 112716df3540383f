"""cluster/: the launcher YAML validates against Ray's own autoscaler schema; the RayJob parses and keeps its
dashboard inside the pod network; the local head + MLflow server choose every port themselves, take a
submitted job as soon as local-up returns, coexist with a second cluster, stop exactly what they started,
and never adopt, kill or delete what is not theirs."""
from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path

import jsonschema
import psutil
import pytest
import ray.autoscaler
import yaml
from clusters import (
    BLOCK,
    CLUSTER,
    PORT_VARS,
    RAY_DEFAULT_PORTS,
    LocalHead,
    alive,
    answers,
    cluster_env,
    free_port_base,
    listening_ports,
    port_plan,
    recorded,
    script,
)
from helpers.cli import cli
from helpers.paths import BIN, REPO
from helpers.processes import processes_under
from mlflow.tracking import MlflowClient


def test_launcher_yaml_validates_against_the_autoscaler_schema():
    from ray.autoscaler._private.util import prepare_config, validate_config

    config = yaml.safe_load((CLUSTER / "gpu-cluster.yaml").read_text())
    schema = json.loads((Path(ray.autoscaler.__file__).parent / "ray-schema.json").read_text())
    jsonschema.validate(config, schema)
    validate_config(prepare_config(config))
    assert config["available_node_types"][config["head_node_type"]]["resources"]["trial_driver"] >= 1


def test_launcher_yaml_schema_rejects_a_typo():
    config = yaml.safe_load((CLUSTER / "gpu-cluster.yaml").read_text())
    config["max_worker"] = config.pop("max_workers")
    schema = json.loads((Path(ray.autoscaler.__file__).parent / "ray-schema.json").read_text())
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(config, schema)


def test_rayjob_manifest_parses_and_asks_for_a_gpu_sweep_on_its_own_cluster():
    job = yaml.safe_load((CLUSTER / "rayjob.yaml").read_text())
    assert job["apiVersion"] == "ray.io/v1" and job["kind"] == "RayJob"
    assert job["spec"]["entrypoint"].startswith("raybench sweep ") and "--address auto" in job["spec"]["entrypoint"]
    head = job["spec"]["rayClusterSpec"]["headGroupSpec"]
    assert "trial_driver" in head["rayStartParams"]["resources"]
    assert job["spec"]["rayClusterSpec"]["workerGroupSpecs"][0]["template"]["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == 1


def test_rayjob_dashboard_stays_inside_the_pod_network():
    """KubeRay submits through the head Service, so the dashboard binds the pod's interfaces; that is only
    acceptable while nothing publishes it beyond the cluster, and people use a port-forward."""
    text = (CLUSTER / "rayjob.yaml").read_text()
    head = yaml.safe_load(text)["spec"]["rayClusterSpec"]["headGroupSpec"]
    if head["rayStartParams"].get("dashboard-host", "localhost") in ("localhost", "127.0.0.1"):
        return  # loopback: nothing to justify
    assert head.get("serviceType", "ClusterIP") == "ClusterIP", "a NodePort/LoadBalancer head publishes the dashboard"
    assert head.get("enableIngress", False) is False, "an Ingress publishes the dashboard"
    assert "kubectl port-forward svc/raybench-dann-head-svc 8265:8265" in text
    assert "Why the dashboard binds 0.0.0.0" in text


# ----- the local head + MLflow server (cluster/local-up.sh, cluster/local-down.sh) ------------------------

def test_port_plan_derives_every_port_from_one_base_and_each_can_be_overridden(sweep_env, tmp_path):
    env = cluster_env(sweep_env, tmp_path, "plan", 30000)
    first, second = port_plan(env), port_plan({**env, "RAYBENCH_PORT_BASE": "30200"})
    assert set(first) == set(PORT_VARS[1:])

    def used(plan):
        fixed = {port for name, port in plan.items() if not name.endswith("_WORKER_PORT")}
        assert len(fixed) == 13, "two roles share a port"
        workers = set(range(plan["RAYBENCH_MIN_WORKER_PORT"], plan["RAYBENCH_MAX_WORKER_PORT"] + 1))
        assert not fixed & workers, "a fixed port lies in the worker range"
        return fixed | workers

    assert used(first) <= set(range(30000, 30000 + BLOCK))
    assert not used(first) & used(second), "clusters with bases 200 apart share a port"
    default = port_plan({k: v for k, v in env.items() if k != "RAYBENCH_PORT_BASE"})
    assert not used(default) & RAY_DEFAULT_PORTS and not 10002 <= default["RAYBENCH_CLIENT_SERVER_PORT"] <= 19999
    assert port_plan({**env, "RAYBENCH_DASHBOARD_AGENT_GRPC_PORT": "30015"})["RAYBENCH_DASHBOARD_AGENT_GRPC_PORT"] == 30015

    for bad in ({"RAYBENCH_CLIENT_SERVER_PORT": "12000"}, {"RAYBENCH_NODE_MANAGER_PORT": "30050"},
                {"MLFLOW_PORT": "30000"}, {"RAYBENCH_PORT_BASE": "65500"}, {"RAYBENCH_REDIS_PORT": "30011"},
                {"RAYBENCH_GCS_FT": "yes"}):
        refused = script("local-up.sh", {**env, **bad}, "--print-ports", timeout=30)
        assert refused.returncode == 2 and refused.stdout == "", (bad, refused.stdout)
        assert len(refused.stderr.strip().splitlines()) == 1 and refused.stderr.startswith("local-up: "), refused.stderr


def test_worker_nodes_take_the_blocks_after_the_heads_and_bad_settings_are_refused(sweep_env, tmp_path, fake_bin):
    env = cluster_env(sweep_env, tmp_path, "plan", 30000, RAYBENCH_WORKER_NODES="2", RAYBENCH_BIN=str(fake_bin))
    plan = port_plan(env)
    head = {port for name, port in plan.items() if not name.startswith("WORKER_") and not name.endswith("_WORKER_PORT")}
    for k in (1, 2):
        node = {name.removeprefix(f"WORKER_{k}_"): port for name, port in plan.items() if name.startswith(f"WORKER_{k}_")}
        assert set(node) == {"RAYBENCH_DASHBOARD_AGENT_LISTEN_PORT", "RAYBENCH_DASHBOARD_AGENT_GRPC_PORT",
                             "RAYBENCH_RUNTIME_ENV_AGENT_PORT", "RAYBENCH_METRICS_EXPORT_PORT",
                             "RAYBENCH_NODE_MANAGER_PORT", "RAYBENCH_OBJECT_MANAGER_PORT",
                             "RAYBENCH_MIN_WORKER_PORT", "RAYBENCH_MAX_WORKER_PORT"}
        block = set(range(30000 + BLOCK * k, 30000 + BLOCK * (k + 1)))
        workers = set(range(node["RAYBENCH_MIN_WORKER_PORT"], node["RAYBENCH_MAX_WORKER_PORT"] + 1))
        fixed = {port for name, port in node.items() if not name.endswith("_WORKER_PORT")}
        assert fixed | workers <= block and not fixed & workers and not head & block

    for bad, named in (({"RAYBENCH_WORKER_CPUS": "0"}, "RAYBENCH_WORKER_CPUS"),
                       ({"RAYBENCH_WORKER_NODES": "two"}, "RAYBENCH_WORKER_NODES"),
                       ({"RAYBENCH_WORKER_RESOURCES": "[1]"}, "RAYBENCH_WORKER_RESOURCES"),
                       ({"RAYBENCH_MLFLOW_WORKERS": "0"}, "RAYBENCH_MLFLOW_WORKERS")):
        refused = script("local-up.sh", {**env, **bad}, timeout=60)
        assert refused.returncode == 2 and named in refused.stderr, refused.stderr
        assert len(refused.stderr.strip().splitlines()) == 1 and refused.stderr.startswith("local-up: "), refused.stderr
    alone = script("local-up.sh", env, "--add-worker", timeout=60)  # no head recorded in this state dir
    assert alone.returncode == 2 and "no running head is recorded" in alone.stderr, alone.stderr
    down = script("local-down.sh", env, "--node", "worker-9", timeout=60)
    assert down.returncode == 2 and "no worker node worker-9 is recorded" in down.stderr, down.stderr
    assert not (fake_bin / "ran").exists(), "a refusal started something: " + (fake_bin / "ran").read_text()


def test_a_local_up_node_runs_no_log_monitor(ray_head):
    """local-up starts its nodes with --include-log-monitor=false: every raybench driver sets
    log_to_driver=False, so a log monitor would stream every worker's output to no one, at a CPU cost."""
    commands = [" ".join(proc.cmdline()) for temp in ray_head.temp_dirs() for proc in processes_under(temp)
                if proc.is_running()]
    assert any("raylet" in command for command in commands), commands  # the head's own processes were found
    assert not [command for command in commands if "log_monitor" in command]


def test_two_clusters_on_one_host_each_take_a_job_and_stop_separately(sweep_env, tmp_path, capsys, ray_head):
    """A second local head beside the session's (each with its own MLflow server and ports). Each takes a probe
    job that names its GCS; the new one, started in an empty RAY_TEMP_DIR it adopts, also runs cluster/rayjob.yaml's
    own sweep entrypoint against its HTTP MLflow server. Stopping it leaves the session's head whole; the session's
    teardown (conftest.ray_head) then checks that stopping that one leaves nothing."""
    ray_tmp_a = sweep_env["RAY_TMPDIR"]  # an empty folder given as RAY_TEMP_DIR is adopted (and marked)
    envs = {"a": cluster_env(sweep_env, tmp_path, "a", free_port_base(avoid=(port_base_of(ray_head),)),
                             RAY_TEMP_DIR=ray_tmp_a),
            "b": dict(ray_head.env)}
    plans = {name: port_plan(env) for name, env in envs.items()}
    states = {"a": Path(envs["a"]["RAYBENCH_CLUSTER_DIR"]), "b": ray_head.state}
    try:
        up = script("local-up.sh", envs["a"])
        assert up.returncode == 0, f"cluster a: {up.stderr}{up.stdout}"
        for name, env in envs.items():
            plan, state = plans[name], states[name]
            ray_tmp = Path((state / "ray_temp_dir").read_text().strip())
            assert ray_tmp.parent == Path("/tmp") and (ray_tmp / ".raybench-cluster").read_text().strip() == str(state)
            # Every port its processes listen on is one it chose: none of Ray's defaults, none of the other's.
            allowed = {port for n, port in plan.items() if not n.endswith("_WORKER_PORT")}
            allowed |= set(range(plan["RAYBENCH_MIN_WORKER_PORT"], plan["RAYBENCH_MAX_WORKER_PORT"] + 1))
            listening = listening_ports([pid for pid, _ in recorded(state)])
            strays = {pid: sorted(ports - allowed) for pid, ports in listening.items() if ports - allowed}
            assert not strays, f"cluster {name} listens outside its port plan: {strays}"
            for role in ("RAY_PORT", "DASHBOARD_PORT", "RAYBENCH_DASHBOARD_AGENT_LISTEN_PORT", "MLFLOW_PORT"):
                assert answers(plan[role]), f"cluster {name}: nothing answers on {role}={plan[role]}"
            # A job submitted right after local-up runs (no retries: local-up returns only once the job agent
            # has run a job), and on this cluster, not on the other one.
            probe = "import ray; ray.init(); print('GCS', ray.get_runtime_context().gcs_address)"
            job = subprocess.run(
                [str(BIN / "ray"), "job", "submit", "--address", f"http://127.0.0.1:{plan['DASHBOARD_PORT']}",
                 "--", sys.executable, "-c", probe],
                env=env, capture_output=True, text=True, timeout=300)
            assert job.returncode == 0 and "succeeded" in job.stdout, job.stdout[-3000:] + job.stderr[-3000:]
            assert f":{plan['RAY_PORT']}\n" in job.stdout, job.stdout[-3000:]
        assert Path((states["a"] / "ray_temp_dir").read_text().strip()) == Path(ray_tmp_a)
        submit_the_manifests_sweep(envs["a"], plans["a"], tmp_path, capsys)

        pids_b = recorded(states["b"])
        pids_a = recorded(states["a"])
        down = script("local-down.sh", envs["a"], timeout=180)
        assert down.returncode == 0, down.stderr
        assert not [pid for pid, created in pids_a if alive(pid, created)], "local-down.sh left Ray processes of a"
        assert not processes_under(ray_tmp_a) and not Path(ray_tmp_a).exists(), "local-down.sh kept a's temp dir"
        assert not [role for role, port in plans["a"].items() if not role.endswith("_WORKER_PORT") and answers(port)]
        assert not {"ray_temp_dir", "ray.pids", "mlflow.pid"} & {p.name for p in states["a"].iterdir()}
        assert all(alive(pid, created) for pid, created in pids_b), "stopping cluster a hit the session's head"
        assert answers(plans["b"]["RAY_PORT"]) and answers(plans["b"]["MLFLOW_PORT"])
    finally:
        script("local-down.sh", envs["a"], timeout=180)  # a no-op for a cluster already stopped


def port_base_of(head: LocalHead) -> int:
    return int(head.env["RAYBENCH_PORT_BASE"])


@pytest.fixture
def fake_bin(tmp_path) -> Path:
    """A bin dir whose `ray` and `mlflow` only note that they ran: a refusal test must start nothing, and
    should local-up regress, it still starts nothing real."""
    fake = tmp_path / "fake-bin"
    fake.mkdir()
    (fake / "python").write_text(f'#!/bin/sh\nexec "{sys.executable}" "$@"\n')
    for tool in ("ray", "mlflow"):
        (fake / tool).write_text(f'#!/bin/sh\necho "$0 $*" >> "{fake}/ran"\nexit 1\n')
    for tool in fake.iterdir():
        tool.chmod(0o755)
    return fake


@pytest.mark.parametrize("kind", ["tmp-root", "non-empty", "marked-for-another-cluster"])
def test_local_up_refuses_a_temp_dir_it_did_not_create(kind, sweep_env, tmp_path, fake_bin):
    sentinel = None
    if kind == "tmp-root":
        ray_tmp = Path("/tmp")
        fd, sentinel = tempfile.mkstemp(prefix="rb-sentinel-", dir="/tmp")
        os.close(fd)
    else:
        ray_tmp = Path(sweep_env["RAY_TMPDIR"])  # short, under /tmp, private to this test
        (ray_tmp / "precious.txt").write_text("keep me")
        if kind == "marked-for-another-cluster":
            (ray_tmp / ".raybench-cluster").write_text(str(tmp_path / "another") + "\n")
    env = cluster_env(sweep_env, tmp_path, "state", free_port_base(), RAY_TEMP_DIR=str(ray_tmp),
                      RAYBENCH_BIN=str(fake_bin))
    state = Path(env["RAYBENCH_CLUSTER_DIR"])
    try:
        up = script("local-up.sh", env, timeout=60)
        assert up.returncode == 2, up.stdout + up.stderr
        assert len(up.stderr.strip().splitlines()) == 1 and "RAY_TEMP_DIR" in up.stderr, up.stderr
        assert not (fake_bin / "ran").exists(), "local-up started something: " + (fake_bin / "ran").read_text()
        assert not (state / "ray_temp_dir").exists()
        if sentinel:
            assert Path(sentinel).exists()
            assert not (ray_tmp / ".raybench-cluster").exists()
        else:
            assert (ray_tmp / "precious.txt").read_text() == "keep me"
            assert sorted(p.name for p in ray_tmp.iterdir()) == sorted(
                ["precious.txt"] + ([".raybench-cluster"] if kind == "marked-for-another-cluster" else []))
    finally:
        if sentinel:
            os.unlink(sentinel)


@pytest.mark.parametrize("kind", ["unmarked", "marked-for-another-cluster"])
def test_local_down_with_a_tampered_state_kills_and_deletes_nothing(kind, tmp_path):
    victim_dir = tmp_path / "victim"
    victim_dir.mkdir()
    (victim_dir / "precious.txt").write_text("keep me")
    if kind == "marked-for-another-cluster":
        (victim_dir / ".raybench-cluster").write_text(str(tmp_path / "another") + "\n")
    # A process that names the folder on its command line: the old `pkill -f` would have killed it.
    victim = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)", str(victim_dir)])
    try:
        state = tmp_path / "state"
        state.mkdir()
        (state / "ray_temp_dir").write_text(f"{victim_dir}\n")
        # Its PID, but not its create time: a recorded PID that has since been reused by someone else.
        (state / "ray.pids").write_text(f"{victim.pid} {psutil.Process(victim.pid).create_time() - 100.0!r}\n")
        env = {**os.environ, "RAYBENCH_CLUSTER_DIR": str(state), "RAYBENCH_BIN": str(BIN), "RAYBENCH_STOP_GRACE": "2"}
        down = script("local-down.sh", env, timeout=120)
        assert down.returncode == 2, down.stdout + down.stderr
        assert down.stderr.strip().splitlines() == [
            f"local-down: not deleting {victim_dir}: it carries no local-up marker naming {state}"]
        assert (victim_dir / "precious.txt").read_text() == "keep me"
        assert victim.poll() is None, "local-down.sh killed a process it did not start"
        assert (state / "ray_temp_dir").exists(), "the suspicious record must stay for inspection"
    finally:
        victim.kill()
        victim.wait()


def manifest_entrypoint_at_smoke_size(mlflow_uri: str, storage: Path) -> list[str]:
    """cluster/rayjob.yaml's own entrypoint, with only what a CPU-only test host must change: the embedded
    dataset for camelyon17, no GPUs, smoke size, one trial and one replicate, and this test's storage and tracking server. Everything else
    (the algorithm, `--address auto`, `--max-concurrent`) is submitted as the manifest writes it."""
    words = shlex.split(yaml.safe_load((CLUSTER / "rayjob.yaml").read_text())["spec"]["entrypoint"])
    overrides = {"--dataset": "digits-shift", "--trials": "1", "--replicates": "1", "--storage": str(storage),
                 "--tracking-uri": mlflow_uri}
    for flag, value in overrides.items():
        words[words.index(flag) + 1] = value
    at = words.index("--gpus-per-worker")
    del words[at:at + 2]
    return [*words, "--smoke", "--name", "job"]


def submit_the_manifests_sweep(env: dict, plan: dict[str, int], tmp_path: Path, capsys) -> None:
    """cluster/rayjob.yaml's entrypoint, submitted with `ray job submit` to a local head, tracked on its HTTP
    MLflow server: one parent sweep run with its trials and replicate nested, readable by `results`."""
    dashboard, mlflow_uri = f"http://127.0.0.1:{plan['DASHBOARD_PORT']}", f"http://127.0.0.1:{plan['MLFLOW_PORT']}"
    entrypoint = manifest_entrypoint_at_smoke_size(mlflow_uri, tmp_path / "runs")
    submit = subprocess.run(
        [str(BIN / "ray"), "job", "submit", "--address", dashboard, "--working-dir", str(REPO), "--", *entrypoint],
        env=env, capture_output=True, text=True, timeout=600,
    )
    assert submit.returncode == 0 and "succeeded" in submit.stdout, submit.stdout[-3000:] + submit.stderr[-3000:]
    client = MlflowClient(tracking_uri=mlflow_uri)
    experiment = client.get_experiment_by_name("raybench")
    parent = client.search_runs([experiment.experiment_id], "tags.stage = 'sweep'")[0]
    assert parent.info.status == "FINISHED" and parent.data.tags["algorithm"] == "dann"
    children = client.search_runs([experiment.experiment_id], f"tags.`mlflow.parentRunId` = '{parent.info.run_id}'")
    assert sorted(r.data.tags["stage"] for r in children) == ["replicate", "search"]
    results = cli(["results", "job", "--format", "json", "--tracking-uri", mlflow_uri], capsys)
    assert results.returncode == 0 and json.loads(results.stdout)["name"] == "job"


@pytest.mark.parametrize("recorded_state, expected", [
    ({}, "no head is recorded in"),
    ({"ray_temp_dir": "/tmp/rb-none\n", "head.env": "cpus=1\ndrivers=8\ngcs_ft=0\n"},
     "was started without GCS fault tolerance"),
    ({"ray_temp_dir": "/tmp/rb-none\n", "head.env": "cpus=1\ndrivers=8\ngcs_ft=1\n", "redis.pid": "999999999\n"},
     "Redis recorded in"),
])
def test_restart_head_refuses_what_it_cannot_restart_in_one_line(recorded_state, expected, sweep_env, tmp_path, fake_bin):
    """--restart-head starts nothing when no head is recorded, when the head kept its state in memory (a new
    head would be an empty cluster), or when the Redis holding its state is gone."""
    env = {**cluster_env(sweep_env, tmp_path, "state", 30000), "RAYBENCH_BIN": str(fake_bin)}
    state = Path(env["RAYBENCH_CLUSTER_DIR"])
    state.mkdir()
    for name, text in recorded_state.items():
        (state / name).write_text(text)
    refused = script("local-up.sh", env, "--restart-head", timeout=60)
    assert refused.returncode == 2 and refused.stdout == "", refused.stdout + refused.stderr
    assert len(refused.stderr.strip().splitlines()) == 1 and expected in refused.stderr, refused.stderr
    assert not (fake_bin / "ran").exists(), "a refusal started something: " + (fake_bin / "ran").read_text()
