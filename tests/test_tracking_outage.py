"""A tracking outage costs a sweep nothing: its MLflow server stopped in the middle of a sweep and started again
later, the sweep goes on, its trial-run writer catches up, and MLflow holds every run and every epoch once.

The server is a real `mlflow server` that the test starts, stops and starts again by its PID (the process group it
made) on the same port and SQLite file; the sweep is the `raybench` command on the session's Ray head. It is
stopped twice: in the search, once an epoch is stored (the writer has writes to send and runs to create while it
is down), and as the replicates start (their writer is made while it is down). Each outage lasts until a run has
finished without the server, which proves the sweep went on, not a minute: tracking.OUTAGE_S (five minutes) is
what lets the writer outlast one of a minute and more.
"""
from __future__ import annotations

import json
import os
import random
import signal
import socket
import subprocess
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

from clusters import BLOCK, LocalHead, port_is_free
from helpers.cli import on_head
from helpers.mlflow_stores import seeded_store, start_mlflow_server, stop_mlflow_server
from helpers.paths import BIN
from mlflow.tracking import MlflowClient

NAME = "outage"
EPOCHS = 2  # --smoke's
WAIT_S = 300  # any one wait below; the machine may be busy with other tests


def quiet_port(head: LocalHead) -> int:
    """A free port outside the head's port block and below the ephemeral range, so that no outgoing connection
    takes it while the server is down and the restart finds it free."""
    base = int(head.env["RAYBENCH_PORT_BASE"])
    rng = random.Random()
    for _ in range(200):
        port = rng.randrange(20000, 32768)
        if not base <= port < base + BLOCK and port_is_free(port):
            return port
    raise AssertionError("no free port between 20000 and 32767")


def refused(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(2)
        return s.connect_ex(("127.0.0.1", port)) != 0


class Sweep:
    """The sweep's process (its own process group, its output in a file) and what it left under --storage."""

    def __init__(self, uri: str, tmp_path: Path, head: LocalHead) -> None:
        self.storage, self.log = tmp_path / "runs", tmp_path / "sweep.log"
        command = on_head(["sweep", "erm", "--smoke", "--replicates", "1", "--max-concurrent", "1",
                           "--executor", "function", "--name", NAME, "--storage", str(self.storage),
                           "--tracking-uri", uri], head)
        with self.log.open("w") as out:
            self.proc = subprocess.Popen([str(BIN / "raybench"), *command], env=head.env, cwd=tmp_path,
                                         start_new_session=True, stdout=out, stderr=subprocess.STDOUT)

    def completed(self) -> dict[str, dict]:
        """Every run's completed record (ray_trial.CompletedRuns: <stage dir>/completed/<run key>.json) by key."""
        return {path.stem: json.loads(path.read_text()) for path in self.storage.glob(f"{NAME}-*/completed/*.json")}

    def said(self, words: str) -> bool:
        return words in self.log.read_text()

    def wait_for(self, what: str, ready: Callable[[], bool]) -> None:
        """Poll `ready` until it holds; fail, with the sweep's output, if the sweep exits first or WAIT_S pass."""
        deadline = time.monotonic() + WAIT_S
        while not ready():
            assert self.proc.poll() is None, f"the sweep exited ({self.proc.returncode}) before {what}:\n{self.tail()}"
            assert time.monotonic() < deadline, f"no {what} within {WAIT_S} s:\n{self.tail()}"
            time.sleep(0.1)

    def finish_in_time(self) -> int:
        return self.proc.wait(timeout=WAIT_S)

    def tail(self) -> str:
        return self.log.read_text()[-4000:]

    def kill(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=30)


class Server:
    """The sweep's tracking server, stopped and started again by the PID (process group) the test started."""

    def __init__(self, db: Path, artifacts: Path, port: int) -> None:
        self.db, self.artifacts, self.port = db, artifacts, port
        self.proc: subprocess.Popen | None = start_mlflow_server(db, artifacts, port)

    @property
    def uri(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def stop(self) -> None:
        if self.proc is not None:
            stop_mlflow_server(self.proc)
            self.proc = None
        assert refused(self.port), "the stopped server's port still takes connections"

    def start(self) -> None:
        assert self.proc is None and refused(self.port)
        self.proc = start_mlflow_server(self.db, self.artifacts, self.port)


def an_epoch_is_stored(uri: str) -> bool:
    """Whether the store holds an epoch of some trial's run (read while the server is up)."""
    client = MlflowClient(tracking_uri=uri)
    experiment = client.get_experiment_by_name("raybench")
    return experiment is not None and bool(client.search_runs([experiment.experiment_id], "metrics.epoch >= 0"))


def outage(server: Server, sweep: Sweep, what: str) -> None:
    """Stop the server, wait until a run finishes without it (the sweep went on), and start it again."""
    done = set(sweep.completed())
    server.stop()
    sweep.wait_for(f"run finished {what} while the server was down", lambda: set(sweep.completed()) - done)
    server.start()


def assert_every_run_and_epoch_once(uri: str, records: dict[str, dict]) -> None:
    """Each run key the completed records name has one run, FINISHED, whose epoch metrics have each epoch the
    record says was run exactly once; the sweep has no other child run."""
    client = MlflowClient(tracking_uri=uri)
    experiment = client.get_experiment_by_name("raybench").experiment_id
    [parent] = client.search_runs([experiment], f"tags.`raybench.sweep` = '{NAME}' and tags.stage = 'sweep'")
    assert parent.info.status == "FINISHED"
    runs = client.search_runs([experiment], f"tags.`mlflow.parentRunId` = '{parent.info.run_id}'")
    assert Counter(run.data.tags["raybench.key"] for run in runs) == Counter(set(records)), sorted(records)
    assert len(records) == 3, f"2 trials and 1 replicate, completed: {sorted(records)}"
    for run in runs:
        key, epochs = run.data.tags["raybench.key"], list(range(EPOCHS))
        assert run.info.status == "FINISHED", (key, run.info.status)
        assert int(records[key]["epochs_done"]) == EPOCHS, records[key]
        for metric in ("epoch", "ood_val/acc", "train/loss/total"):
            steps = sorted(m.step for m in client.get_metric_history(run.info.run_id, metric))
            assert steps == epochs, f"{key} {metric}: steps {steps}, epochs run {epochs}"


def test_a_sweep_goes_on_through_tracking_outages_and_the_store_catches_up(tmp_path, empty_store, ray_head):
    seeded_store(empty_store, tmp_path / "server.db")
    server = Server(tmp_path / "server.db", tmp_path / "artifacts", quiet_port(ray_head))
    sweep = Sweep(server.uri, tmp_path, ray_head)
    try:
        sweep.wait_for("epoch in the store", lambda: an_epoch_is_stored(server.uri))
        outage(server, sweep, "in the search")
        sweep.wait_for("start of the replicates", lambda: sweep.said("replicates: 1 seeds of trial"))
        outage(server, sweep, "in the replicates")
        assert sweep.finish_in_time() == 0, sweep.tail()
        assert_every_run_and_epoch_once(server.uri, sweep.completed())
    finally:
        sweep.kill()
        server.stop()
