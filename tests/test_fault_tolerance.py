"""Ray Train's FailureConfig: a trial whose worker process dies resumes from its last checkpoint. The sweep joins the
session's Ray head, whose raylet the killed worker is found under."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import time

from helpers.cli import on_head
from helpers.paths import BIN
from mlflow.tracking import MlflowClient


def _our_train_workers(ray_tmp: str) -> list[int]:
    """PIDs of Ray Train worker actors whose raylet belongs to the Ray whose temp dir is `ray_tmp`."""
    ours = set(subprocess.run(["pgrep", "-f", "--", ray_tmp], capture_output=True, text=True).stdout.split())
    workers = subprocess.run(["pgrep", "-f", "RayTrainWorker"], capture_output=True, text=True).stdout.split()
    found = []
    for pid in workers:
        try:
            with open(f"/proc/{pid}/stat") as fh:
                parent = fh.read().rsplit(")", 1)[1].split()[1]
        except OSError:
            continue
        if parent in ours:
            found.append(int(pid))
    return found


def _epochs_logged(uri: str) -> list[int]:
    client = MlflowClient(tracking_uri=uri)
    experiment = client.get_experiment_by_name("raybench")
    if experiment is None:
        return []
    runs = client.search_runs([experiment.experiment_id], "tags.stage = 'search'")
    return sorted(m.step for r in runs for m in client.get_metric_history(r.info.run_id, "ood_val/acc"))


def test_a_killed_worker_is_retried_from_its_last_checkpoint(store_uri, tmp_path, ray_head):
    uri = store_uri
    args = on_head(["sweep", "erm", "--trials", "1", "--replicates", "0", "--name", "crash", "--storage", str(tmp_path / "runs"),
            "--tracking-uri", uri, "--set", "epochs=4", "--set", "max_steps_per_epoch=80", "--set", "patience=none"], ray_head)
    (ray_tmp,) = ray_head.temp_dirs()
    proc = subprocess.Popen([str(BIN / "raybench"), *args], env=ray_head.env, cwd=tmp_path, start_new_session=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    killed, seen = False, []
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and proc.poll() is None and not killed:
        seen = _epochs_logged(uri)
        # Some epoch reported with its checkpoint, the last one still to come: kill the worker mid-run.
        if seen and seen == list(range(len(seen))) and len(seen) < 4:
            for pid in _our_train_workers(ray_tmp):
                os.kill(pid, signal.SIGKILL)
                killed = True
        time.sleep(0.2)
    output, _ = proc.communicate(timeout=600)
    assert killed, f"the worker was never seen mid-training (epochs seen {seen}):\n{output[-3000:]}"
    assert proc.returncode == 0, output[-4000:]
    summary = json.loads((tmp_path / "runs" / "crash" / "results" / "summary.json").read_text())
    assert [t["status"] for t in summary["trials"]] == ["ok"]
    # Resumed from the epoch-0 checkpoint: every epoch reported exactly once, none restarted from scratch.
    assert _epochs_logged(uri) == [0, 1, 2, 3]
