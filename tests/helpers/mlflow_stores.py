"""MLflow stores for the tests: a migrated empty SQLite store made once a session and copied for each test that
needs its own (a fresh store runs MLflow's Alembic migrations, about 5 s), and a real `mlflow server`."""
from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

from helpers.paths import BIN


def migrate_empty_store(db: Path) -> Path:
    """A new MLflow SQLite store at `db`, migrated: MLflow makes the file and its Default experiment on first use."""
    from mlflow.tracking import MlflowClient

    assert MlflowClient(tracking_uri=f"sqlite:///{db}").search_experiments(), "MLflow made no Default experiment"
    return db


def seeded_store(template: Path, db: Path) -> str:
    """A tracking URI for a new store at `db`: a copy of the session's migrated empty store."""
    db.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(template, db)
    return f"sqlite:///{db}"


def free_local_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now (the OS picks it)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def start_mlflow_server(db: Path, artifacts: Path, port: int, wait_s: float = 120) -> subprocess.Popen:
    """A real `mlflow server` on 127.0.0.1:`port` over the SQLite file `db`, listening when this returns. It runs
    in a process group of its own (its leader's pid), so stop_mlflow_server stops its workers with it."""
    env = {**os.environ, "MLFLOW_DISABLE_TELEMETRY": "true", "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
    proc = subprocess.Popen([str(BIN / "mlflow"), "server", "--host", "127.0.0.1", "--port", str(port), "--workers", "1",
                             "--backend-store-uri", f"sqlite:///{db}", "--artifacts-destination", str(artifacts)],
                            env=env, start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return proc
        except OSError:
            if proc.poll() is not None:
                raise AssertionError("the MLflow server exited during start-up") from None
            time.sleep(0.5)
    stop_mlflow_server(proc)
    raise AssertionError(f"the MLflow server did not listen within {wait_s:.0f} s")


def stop_mlflow_server(proc: subprocess.Popen) -> None:
    """SIGTERM to the server's own process group (the one start_mlflow_server made), SIGKILL after 30 s."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
