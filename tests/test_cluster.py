"""cluster/: the launcher YAML validates against Ray's own autoscaler schema; the RayJob parses; the local
head + MLflow server start, take a submitted job, and stop exactly what they started."""
from __future__ import annotations

import json
import os
import socket
import subprocess
import time
from pathlib import Path

import jsonschema
import pytest
import ray.autoscaler
import yaml
from mlflow.tracking import MlflowClient

from conftest import BIN, REPO, run_cli

CLUSTER = REPO / "cluster"


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


def test_rayjob_manifest_parses_and_runs_a_sweep():
    job = yaml.safe_load((CLUSTER / "rayjob.yaml").read_text())
    assert job["apiVersion"] == "ray.io/v1" and job["kind"] == "RayJob"
    assert job["spec"]["entrypoint"].startswith("raybench sweep ") and "--address auto" in job["spec"]["entrypoint"]
    head = job["spec"]["rayClusterSpec"]["headGroupSpec"]
    assert "trial_driver" in head["rayStartParams"]["resources"]
    assert job["spec"]["rayClusterSpec"]["workerGroupSpecs"][0]["template"]["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == 1


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_job_submission_to_a_local_head_with_an_http_mlflow_server(tmp_path, sweep_env):
    state = tmp_path / "cluster"
    ports = {"RAY_PORT": str(free_port()), "DASHBOARD_PORT": str(free_port()), "MLFLOW_PORT": str(free_port())}
    env = {**sweep_env, **ports, "RAYBENCH_CLUSTER_DIR": str(state), "RAY_NUM_CPUS": "2",
           "RAY_TEMP_DIR": sweep_env["RAY_TMPDIR"], "RAYBENCH_BIN": str(BIN), "RAY_AUTH_MODE": "token"}
    up = subprocess.run([str(CLUSTER / "local-up.sh")], env=env, capture_output=True, text=True, timeout=180)
    try:
        assert up.returncode == 0, up.stderr + up.stdout
        dashboard, mlflow_uri = f"http://127.0.0.1:{ports['DASHBOARD_PORT']}", f"http://127.0.0.1:{ports['MLFLOW_PORT']}"
        for _ in range(12):  # the head's job agent can still be starting when the dashboard already answers
            submit = subprocess.run(
                [str(BIN / "ray"), "job", "submit", "--address", dashboard, "--working-dir", str(REPO), "--",
                 "raybench", "sweep", "erm", "--smoke", "--address", "auto", "--name", "job",
                 "--tracking-uri", mlflow_uri, "--storage", str(tmp_path / "runs")],
                env=env, capture_output=True, text=True, timeout=600,
            )
            if "No available agent" not in submit.stdout + submit.stderr:
                break
            time.sleep(5)
        assert submit.returncode == 0 and "succeeded" in submit.stdout, submit.stdout[-3000:] + submit.stderr[-3000:]
        client = MlflowClient(tracking_uri=mlflow_uri)
        experiment = client.get_experiment_by_name("raybench")
        parent = client.search_runs([experiment.experiment_id], "tags.stage = 'sweep'")[0]
        assert parent.info.status == "FINISHED"
        children = client.search_runs([experiment.experiment_id], f"tags.`mlflow.parentRunId` = '{parent.info.run_id}'")
        assert sorted(r.data.tags["stage"] for r in children) == ["replicate", "replicate", "search", "search"]
        results = run_cli(["results", "job", "--format", "json", "--tracking-uri", mlflow_uri], env, tmp_path)
        assert results.returncode == 0 and json.loads(results.stdout)["name"] == "job"
    finally:
        down = subprocess.run([str(CLUSTER / "local-down.sh")], env=env, capture_output=True, text=True, timeout=120)
    assert down.returncode == 0, down.stderr
    leftover = subprocess.run(["pgrep", "-f", "--", sweep_env["RAY_TMPDIR"]], capture_output=True, text=True)
    assert leftover.stdout.strip() == "", "local-down.sh left Ray processes running"
    with socket.socket() as s:
        assert s.connect_ex(("127.0.0.1", int(ports["MLFLOW_PORT"]))) != 0, "local-down.sh left MLflow running"
    assert not (state / "mlflow.pid").exists() and not (state / "ray_temp_dir").exists()
