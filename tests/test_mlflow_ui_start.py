"""The MLflow UI command a sweep prints starts quickly on a small machine, and no link in a sweep's output opens
MLflow's GenAI view.

The command is taken exactly as raybench prints it (raybench.commands.sweep.mlflow_hint, on a free port) and run by
the shell, as a user pastes it: its process tree holds one uvicorn process serving and no job runner (MLflow's
defaults, four workers and about ten job-runner processes each importing MLflow, took about a minute to answer
on 2 cores). How long it took to answer /health is recorded (printed, and a user property of the test), not
asserted: it depends on the machine and its load. MLflow's own "View run ... at: URL" lines, which lack
`?workflowType=machine_learning`, are turned off in every process that imports raybench.tracking.
"""
from __future__ import annotations

import contextlib
import os
import shlex
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import psutil
import pytest
from helpers.mlflow_stores import seeded_store
from helpers.paths import BIN, REPO

from raybench.commands.sweep import mlflow_hint
from raybench.tracking import SweepTracker, ui_command, ui_link

SUPPRESS = "MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT"
START_TIMEOUT_S = 240  # far above a start on a loaded 2-core machine; a hang fails instead of waiting forever
POLL_S = 0.2
IDS = {"experiment_id": "1", "run_id": "0123456789abcdef"}
# MLflow settings a user's environment may hold that would change what the printed words start
SERVER_SETTINGS = ("MLFLOW_SERVER_ENABLE_JOB_EXECUTION", "MLFLOW_WORKERS", "MLFLOW_UVICORN_OPTS",
                   "MLFLOW_GUNICORN_OPTS", "MLFLOW_BACKEND_STORE_URI")


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def printed_command(uri: str, port: int) -> str:
    """The shell command of the hint a sweep on `uri` prints (what comes before `, then open LINK`)."""
    hint = mlflow_hint(uri, IDS, port=port)
    command, sep, link = hint.partition(", then open ")
    assert sep and link == ui_link(f"http://127.0.0.1:{port}", IDS["experiment_id"], IDS["run_id"]), hint
    return command


def group_processes(pgid: int) -> list[psutil.Process]:
    found = []
    for proc in psutil.process_iter():
        with contextlib.suppress(psutil.Error, ProcessLookupError):
            if os.getpgid(proc.pid) == pgid:
                found.append(proc)
    return found


def cmdline(proc: psutil.Process) -> str:
    with contextlib.suppress(psutil.Error):
        return " ".join(proc.cmdline())
    return ""


def stop_group(proc: subprocess.Popen) -> None:
    """SIGTERM to the command's own process group, SIGKILL to whatever of it is left after 30 s."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and group_processes(proc.pid):
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=POLL_S)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)


def wait_for_health(proc: subprocess.Popen, port: int, log: Path) -> float:
    """Seconds from now until /health answers 200; fails at once if the command exits, or after the timeout."""
    start = time.monotonic()
    while time.monotonic() - start < START_TIMEOUT_S:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as response:
                if response.status == 200:
                    return time.monotonic() - start
        except OSError:
            pass
        if proc.poll() is not None:
            pytest.fail(f"the printed command exited ({proc.returncode}) before /health answered: "
                        f"{log.read_text(errors='replace')[-3000:]}")
        time.sleep(POLL_S)
    pytest.fail(f"/health did not answer within {START_TIMEOUT_S} s: {log.read_text(errors='replace')[-3000:]}")


def test_the_printed_command_answers_with_one_worker_and_no_job_runner(tmp_path, empty_store, record_property):
    uri = seeded_store(empty_store, tmp_path / "mlflow.db")
    port = free_port()
    command = printed_command(uri, port)
    env = {k: v for k, v in os.environ.items() if k not in SERVER_SETTINGS}
    env["PATH"] = f"{BIN}{os.pathsep}{env.get('PATH', '')}"  # `mlflow` is this environment's, as after `activate`
    log = tmp_path / "mlflow-ui.log"
    with log.open("w") as out:
        proc = subprocess.Popen(["/bin/sh", "-c", command], cwd=tmp_path, env=env, stdin=subprocess.DEVNULL,
                                stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        seconds = wait_for_health(proc, port, log)
        record_property("mlflow_ui_health_s", round(seconds, 2))
        print(f"\nthe printed `mlflow ui` command answered /health after {seconds:.1f} s: {command}")
        tree = group_processes(proc.pid)
        lines = [cmdline(p) for p in tree]
        servers = [p for p, line in zip(tree, lines, strict=True) if "uvicorn" in line]
        assert len(servers) == 1, lines
        assert servers[0].children() == [], lines  # it serves itself: no supervisor with worker processes
        assert not [line for line in lines if "huey" in line or "_job_runner" in line], lines
    finally:
        stop_group(proc)
    assert not group_processes(proc.pid)


def test_the_printed_command_is_shell_words_for_any_store_path(tmp_path):
    uri = f"sqlite:///{tmp_path}/a folder/it's mlflow.db"
    words = shlex.split(printed_command(uri, 5000))
    assert words == ["MLFLOW_SERVER_ENABLE_JOB_EXECUTION=false", "mlflow", "ui", "--backend-store-uri", uri,
                     "--host", "127.0.0.1", "--port", "5000", "--workers", "1"]


def test_the_hint_defaults_to_port_5000_and_every_link_opens_the_model_training_view():
    assert mlflow_hint("sqlite:///mlflow.db", IDS) == (
        "MLFLOW_SERVER_ENABLE_JOB_EXECUTION=false mlflow ui --backend-store-uri sqlite:///mlflow.db --host 127.0.0.1 "
        "--port 5000 --workers 1, then open http://127.0.0.1:5000/#/experiments/1/runs/0123456789abcdef"
        "?workflowType=machine_learning")
    for hint in (mlflow_hint("sqlite:///mlflow.db", {}), mlflow_hint("http://127.0.0.1:5001", IDS),
                 mlflow_hint("http://127.0.0.1:5001", {})):
        assert hint.endswith("?workflowType=machine_learning"), hint


def test_the_docs_show_the_command_raybench_prints():
    shown = ui_command("sqlite:///mlflow.db", program=".venv/bin/mlflow")  # the docs call this environment's
    printed = "MLflow: " + mlflow_hint("sqlite:///mlflow.db", {"experiment_id": "1", "run_id": "<parent run id>"})
    assert printed in (REPO / "docs/quickstart.md").read_text()  # the sweep's output, as the quickstart shows it
    for page in ("README.md", "docs/quickstart.md", "docs/reference/results.md"):
        text = (REPO / page).read_text()
        assert shown in text, page
        assert "mlflow ui" not in text.replace(shown, "").replace(printed, ""), page  # no other form of it


def test_importing_raybench_tracking_turns_off_mlflows_run_links_unless_asked_for():
    probe = f"import os, raybench.tracking; print(os.environ.get({SUPPRESS!r}))"
    env = {k: v for k, v in os.environ.items() if k != SUPPRESS}
    done = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and done.stdout.strip() == "true", done.stderr[-2000:]
    done = subprocess.run([sys.executable, "-c", probe], env={**env, SUPPRESS: "false"}, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0 and done.stdout.strip() == "false", done.stderr[-2000:]


def test_runs_ended_through_raybench_print_no_view_run_line(mlflow_server, capsys):
    tracker = SweepTracker(mlflow_server)
    tracker.start_sweep("no-links", {"lr": 0.1}, {"stage": "sweep"})
    child = tracker.start_child("t1", "search-t1", {"lr": 0.1}, {"stage": "search"})
    tracker.end_child(child, "FINISHED")
    tracker.end_sweep("FINISHED")
    out = capsys.readouterr().out
    assert "View run" not in out and "View experiment" not in out, out
