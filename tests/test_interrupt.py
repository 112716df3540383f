"""Ctrl-C ends a sweep as interrupted (exit 130, MLflow KILLED, a --resume line), SIGTERM (`ray job stop`,
Kubernetes and Slurm preemption, sent to the driver alone) the same way with exit 143 and none of Ray's own
signal dump, and --resume finishes it exactly: replicates belong to the selected trial id and its derived seeds,
whichever stage was cut short. The sweeps join the session's Ray head (`--address`): a driver that joins a cluster
installs Ray's signal handlers in ray.init as one that starts a private Ray does (test_signals.py's benchmark and
SIGKILL tests run on private Rays)."""
from __future__ import annotations

import json
import signal
import subprocess
import time
from pathlib import Path

from clusters import LocalHead
from helpers.cli import cli, on_head, run_cli
from helpers.paths import BIN
from helpers.processes import signal_and_collect
from mlflow.tracking import MlflowClient

from raybench.sweep.outcome import replicate_seeds

NAME = "ctrlc"
WAIT_S = 420


def _args(uri: str, tmp_path: Path, head: LocalHead) -> list[str]:
    return on_head(["sweep", "erm", "--trials", "2", "--replicates", "2", "--max-concurrent", "1", "--name", NAME,
            "--executor", "function",  # the interrupt and the resume are the subject here, not Ray Train
            "--storage", str(tmp_path / "runs"), "--tracking-uri", uri,
            "--set", "epochs=2", "--set", "max_steps_per_epoch=20", "--set", "patience=none"], head)


def _completed(tmp_path: Path, pattern: str) -> list[Path]:
    return sorted((tmp_path / "runs").glob(f"{pattern}/completed/*.json"))


def _interrupt_after(tmp_path: Path, env: dict, args: list[str], pattern: str,
                     sig: signal.Signals = signal.SIGINT) -> subprocess.CompletedProcess:
    """Start the sweep and, once a run matching `pattern` finished, press Ctrl-C (SIGINT to its process group)
    or send SIGTERM to the driver process alone."""
    proc = subprocess.Popen([str(BIN / "raybench"), *args], env=env, cwd=tmp_path, start_new_session=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline and proc.poll() is None and not _completed(tmp_path, pattern):
        time.sleep(0.5)
    assert proc.poll() is None, f"the sweep ended before it could be interrupted:\n{proc.communicate()[1][-3000:]}"
    assert _completed(tmp_path, pattern), f"no run of {pattern} finished within {WAIT_S} s"
    return signal_and_collect(proc, sig, WAIT_S)


def _runs(uri: str) -> list:
    client = MlflowClient(tracking_uri=uri)
    return client.search_runs([client.get_experiment_by_name("raybench").experiment_id], "")


def _assert_interrupted(proc: subprocess.CompletedProcess, uri: str, stage: str, sig: signal.Signals) -> None:
    assert proc.returncode == 128 + sig, proc.stderr[-3000:]
    assert "SIGTERM received" not in proc.stderr, "Ray's own SIGTERM handler ran: " + proc.stderr[-3000:]
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith(f"raybench: sweep '{NAME}' interrupted during the {stage}") and last.endswith("--resume"), last
    statuses = {(r.data.tags.get("stage"), r.info.status) for r in _runs(uri)}
    assert ("sweep", "KILLED") in statuses and not any(status == "RUNNING" for _, status in statuses), statuses


def test_ctrl_c_in_search_then_sigterm_in_replicates_then_resume(store_uri, tmp_path, ray_head, capsys):
    uri, env = store_uri, ray_head.env
    args = _args(uri, tmp_path, ray_head)

    search_cut = _interrupt_after(tmp_path, env, args, f"{NAME}-search")
    _assert_interrupted(search_cut, uri, "search", signal.SIGINT)
    partial = json.loads((tmp_path / "runs" / NAME / "results" / "summary.json").read_text())
    assert partial["state"] == "interrupted during the search" and partial["selected"] is None
    assert not list((tmp_path / "runs").glob(f"{NAME}-replicate*")), "replicates ran after an interrupted search"
    shown = cli(["results", NAME, "--tracking-uri", uri], capsys)
    assert "INTERRUPTED" in shown.stdout and "--resume" in shown.stdout

    replicate_cut = _interrupt_after(tmp_path, env, [*args, "--resume"], f"{NAME}-replicate-*", signal.SIGTERM)
    _assert_interrupted(replicate_cut, uri, "replicates", signal.SIGTERM)

    finished = run_cli([*args, "--resume"], env, tmp_path)
    assert finished.returncode == 0, finished.stderr[-4000:]
    summary = json.loads((tmp_path / "runs" / NAME / "results" / "summary.json").read_text())
    assert summary["state"] == "finished" and len(summary["trials"]) == 2
    assert all(t["status"] == "ok" for t in summary["trials"])
    selected = summary["selected"]["trial_id"]
    assert summary["replicates"]["seeds"] == replicate_seeds(selected, 2)
    assert sorted(r["seed"] for r in summary["replicates"]["runs"]) == sorted(replicate_seeds(selected, 2))
    assert [p.name for p in (tmp_path / "runs").glob(f"{NAME}-replicate*")] == [f"{NAME}-replicate-{selected}"]
    runs = _runs(uri)
    replicate_runs = [r for r in runs if r.data.tags.get("stage") == "replicate"]
    assert {r.data.tags["trial_id"] for r in replicate_runs} == {selected}
    assert sorted(int(r.data.tags["seed"]) for r in replicate_runs) == sorted(replicate_seeds(selected, 2))
    parent = [r for r in runs if r.data.tags.get("stage") == "sweep"]
    assert len(parent) == 1 and parent[0].info.status == "FINISHED"
    assert parent[0].data.tags["raybench.state"] == "finished"
