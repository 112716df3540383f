"""How long the `mlflow ui` command raybench prints takes to answer `/health`, against MLflow's defaults (four
uvicorn workers and its job runner), side by side in one run.

Each command starts as a user's shell starts it (`/bin/sh -c WORDS`, in its own session, with no MLFLOW_* variables
in its environment and this venv's bin first on PATH), over the same migrated SQLite store, on a free port; the
two alternate, so both meet the same load. A start is timed until `GET /health` answers 200 (polled every 0.2 s),
then its whole process group is stopped. Printed: each start's seconds, processes and the load average it began
under, then each command's median and the ratio of the medians.

    .venv/bin/python benchmarks/mlflow_ui_start.py [--runs 3] [--folder DIR]
"""
from __future__ import annotations

import argparse
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import psutil

from raybench.tracking import ui_command

BIN = Path(sys.executable).parent
LIMIT_S = 300.0


@dataclass(frozen=True)
class Start:
    command: str
    seconds: float | None  # None: /health never answered within LIMIT_S
    processes: int  # the command's process group when /health answered
    load: float  # the 1-minute load average it started under


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def group_size(pgid: int) -> int:
    count = 0
    for process in psutil.process_iter():
        try:
            count += os.getpgid(process.pid) == pgid
        except (psutil.Error, ProcessLookupError):
            continue
    return count


def answers(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as reply:
            return reply.status == 200
    except OSError:
        return False


def stop_group(process: subprocess.Popen) -> None:
    """SIGTERM to the command's whole process group, then SIGKILL to what is left after 30 s."""
    os.killpg(process.pid, signal.SIGTERM)
    deadline = time.monotonic() + 30
    while group_size(process.pid) and time.monotonic() < deadline:
        time.sleep(0.2)
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    process.wait()


def time_start(name: str, words: str, folder: Path) -> Start:
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("MLFLOW_")}
    env["PATH"] = f"{BIN}{os.pathsep}{env.get('PATH', '')}"
    load, began = os.getloadavg()[0], time.monotonic()
    with (folder / f"{name}-{port}.log").open("w") as log:
        process = subprocess.Popen(["/bin/sh", "-c", words.format(port=port)], cwd=folder, env=env,
                                   stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                   start_new_session=True)
    seconds = None
    try:
        while time.monotonic() - began < LIMIT_S and process.poll() is None:
            if answers(port):
                seconds = time.monotonic() - began
                break
            time.sleep(0.2)
        processes = group_size(process.pid)
    finally:
        stop_group(process)
    time.sleep(5)  # the stopped server's processes are gone before the next start
    return Start(name, seconds, processes, load)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--folder", type=Path, default=None, help="where the store and the logs go (default: a temp dir)")
    args = parser.parse_args()
    folder = args.folder or Path(tempfile.mkdtemp(prefix="mlflow-ui-start-"))
    folder.mkdir(parents=True, exist_ok=True)
    uri = f"sqlite:///{folder / 'mlflow.db'}"
    migrate = "import sys; from mlflow.tracking import MlflowClient; MlflowClient(sys.argv[1]).search_experiments()"
    subprocess.run([str(BIN / "python"), "-c", migrate, uri], check=True, capture_output=True)
    commands = {"MLflow's defaults": f"mlflow ui --backend-store-uri {uri} --host 127.0.0.1 --port {{port}}",
                "raybench's": ui_command(uri, port=0).replace("--port 0", "--port {port}")}
    starts = []
    for run in range(args.runs):
        for name, words in commands.items():
            start = time_start(name.split("'")[0], words, folder)
            starts.append((name, start))
            shown = "no answer" if start.seconds is None else f"{start.seconds:.1f} s"
            print(f"run {run + 1}, {name}: {shown}, {start.processes} processes, load {start.load:.2f}", flush=True)
    medians = {}
    for name, words in commands.items():
        times = [s.seconds for n, s in starts if n == name and s.seconds is not None]
        medians[name] = statistics.median(times) if times else None
        median = "no answer" if medians[name] is None else f"{medians[name]:.1f} s"
        print(f"{name} ({words.format(port='PORT')}): median {median} over {len(times)} starts")
    old, new = medians["MLflow's defaults"], medians["raybench's"]
    if old and new:
        print(f"raybench's / MLflow's defaults, medians: {new / old:.3f}")


if __name__ == "__main__":
    main()
