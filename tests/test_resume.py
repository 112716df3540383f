"""--resume: a sweep killed mid-way continues without re-running finished trials or duplicating ids."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import time

from mlflow.tracking import MlflowClient

from conftest import BIN, run_cli, stop_processes_under

TRIALS = 3


def _finished_search_runs(uri: str) -> list:
    client = MlflowClient(tracking_uri=uri)
    experiment = client.get_experiment_by_name("raybench")
    if experiment is None:
        return []
    return client.search_runs([experiment.experiment_id], "tags.stage = 'search' and attributes.status = 'FINISHED'")


def test_killed_sweep_resumes_to_exactly_n_trials(tmp_path, sweep_env):
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    args = ["sweep", "erm", "--smoke", "--trials", str(TRIALS), "--replicates", "0", "--max-concurrent", "1",
            "--name", "resume", "--storage", str(tmp_path / "runs"), "--tracking-uri", uri]
    proc = subprocess.Popen([str(BIN / "raybench"), *args], env=sweep_env, cwd=tmp_path, start_new_session=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 300
    try:
        while time.monotonic() < deadline and proc.poll() is None and not _finished_search_runs(uri):
            time.sleep(1)
        assert proc.poll() is None, "the sweep finished before it could be interrupted"
        assert _finished_search_runs(uri), "no trial finished in time"
    finally:
        os.killpg(proc.pid, signal.SIGKILL)  # the sweep and everything it started, mid-way
        proc.wait()
        stop_processes_under(sweep_env["RAY_TMPDIR"])
    finished_before = {r.data.tags["trial_id"] for r in _finished_search_runs(uri)}
    shown = run_cli(["results", "resume", "--tracking-uri", uri], sweep_env, tmp_path)
    assert "INTERRUPTED (its driver process is gone)" in shown.stderr + shown.stdout
    assert "resume with: raybench sweep erm" in shown.stderr + shown.stdout and "--resume" in shown.stderr + shown.stdout

    resumed = run_cli([*args, "--resume"], sweep_env, tmp_path)
    assert resumed.returncode == 0, resumed.stderr[-4000:]
    summary = json.loads((tmp_path / "runs" / "resume" / "results" / "summary.json").read_text())
    ids = [t["trial_id"] for t in summary["trials"]]
    assert len(ids) == TRIALS and len(set(ids)) == TRIALS
    assert all(t["status"] == "ok" for t in summary["trials"])

    client = MlflowClient(tracking_uri=uri)
    experiment = client.get_experiment_by_name("raybench")
    parents = client.search_runs([experiment.experiment_id], "tags.stage = 'sweep'")
    assert len(parents) == 1 and parents[0].info.status == "FINISHED"
    children = client.search_runs([experiment.experiment_id], "tags.stage = 'search'")
    assert sorted(r.data.tags["trial_id"] for r in children) == sorted(ids)
    assert all(r.info.status == "FINISHED" for r in children)
    for run in children:
        if run.data.tags["trial_id"] in finished_before:  # trained once: one value per epoch, none repeated
            steps = [m.step for m in client.get_metric_history(run.info.run_id, "val/acc")]
            assert sorted(steps) == [0, 1]
