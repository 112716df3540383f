"""pytest's hooks for this suite (its options, the collection order, the tier marks) and the shared fixtures.
Everything else the tests share lives in tests/helpers/, one module per concern (its __init__ maps them); the
fixtures' bodies call those. tests/test_helpers_layout.py keeps this file to hooks and fixtures."""
from __future__ import annotations

import os
import shutil
import tempfile
import uuid
from pathlib import Path
from typing import Any

os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")

import module_costs
import pytest
import tiers
import torch
from clusters import LocalHead, alive, answers, port_plan, recorded
from helpers import cli, datasets, mlflow_stores, processes

from raybench.data import ShiftDataset

# ----- hooks -----------------------------------------------------------------------------------------------


def pytest_addoption(parser) -> None:
    parser.addoption("--record-module-costs", action="store_true",
                     help=f"write each test module's seconds in this run to {module_costs.COSTS_FILE.name}")


def pytest_configure(config) -> None:
    """Under pytest-xdist (`make test` runs two workers) each worker's torch takes its share of the cores, not
    all of them: two workers each running every core's worth of intra-op threads would oversubscribe the machine.
    The process that controls the run (not an xdist worker) records module costs when asked."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    for tier, meaning in tiers.TIERS.items():
        config.addinivalue_line("markers", f"{tier}: {meaning} (left out by make test-fast)")
    if workers > 1:
        torch.set_num_threads(max(1, len(os.sched_getaffinity(0)) // workers))
    if config.getoption("--record-module-costs") and not hasattr(config, "workerinput"):
        config.pluginmanager.register(module_costs.CostRecorder(module_costs.COSTS_FILE), "module-cost-recorder")


def pytest_collection_modifyitems(config, items) -> None:
    """The costliest modules first (module_costs.py says why); every process orders the same collection alike.
    Each test is marked with its tiers (tiers.py), which `make test-fast` leaves out."""
    tiers.mark_tiers(items)
    items[:] = module_costs.costliest_first(items, module_costs.load_costs())


# ----- every test ------------------------------------------------------------------------------------------


@pytest.fixture(scope="session", autouse=True)
def code_memo_dir(tmp_path_factory) -> Any:
    """raybench's code memo (raybench.code_memo) in this session's temporary folder, for every command a test
    runs, in its process or a child: a test never reads or fills the memo in the user's home."""
    os.environ["RAYBENCH_CACHE_DIR"] = str(tmp_path_factory.mktemp("code-memo"))
    yield Path(os.environ["RAYBENCH_CACHE_DIR"])


@pytest.fixture(autouse=True)
def restore_torch_threads():
    """Put torch's intra-op thread count back after every test: a test that pins it to one thread would
    otherwise leave every later test on one thread, and results would depend on test order."""
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


# ----- datasets (helpers/datasets.py) ----------------------------------------------------------------------


@pytest.fixture(scope="session")
def tiny_dataset() -> ShiftDataset:
    return datasets.make_tiny_dataset()


@pytest.fixture(scope="session")
def tiny_group_dataset() -> ShiftDataset:
    return datasets.make_tiny_group_dataset()


@pytest.fixture(scope="session")
def shared_data_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("raybench-data")


# ----- MLflow stores and servers (helpers/mlflow_stores.py) ------------------------------------------------


@pytest.fixture(scope="session")
def empty_store(tmp_path_factory) -> Path:
    """One empty MLflow SQLite store, migrated once for the session. A fresh store runs MLflow's Alembic
    migrations (about 5 s here); copies of this one let the sweeps whose subject is not store creation skip
    them. A new store is still made from nothing by the tests that name it (tracking, the input catalogue)."""
    return mlflow_stores.migrate_empty_store(tmp_path_factory.mktemp("empty-store") / "mlflow.db")


@pytest.fixture
def store_uri(empty_store, tmp_path) -> str:
    """This test's own MLflow store, tmp_path/mlflow.db, made from the session's migrated empty one."""
    return mlflow_stores.seeded_store(empty_store, tmp_path / "mlflow.db")


@pytest.fixture
def mlflow_server(tmp_path, empty_store):
    """A real MLflow server on 127.0.0.1 (it ignores the basic-auth header a URI with credentials sends)."""
    mlflow_stores.seeded_store(empty_store, tmp_path / "server.db")
    port = mlflow_stores.free_local_port()
    proc = mlflow_stores.start_mlflow_server(tmp_path / "server.db", tmp_path / "server-artifacts", port)
    yield f"http://127.0.0.1:{port}"
    mlflow_stores.stop_mlflow_server(proc)


# ----- commands and Ray (helpers/cli.py, helpers/processes.py) ---------------------------------------------


@pytest.fixture
def in_private_dirs(tmp_path, shared_data_dir, monkeypatch) -> None:
    """An in-process command that reads the session's data, no MLflow URI from outside, and writes under tmp_path."""
    monkeypatch.setenv("RAYBENCH_DATA_DIR", str(shared_data_dir))
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.chdir(tmp_path)


@pytest.fixture
def sweep_env(shared_data_dir, tmp_path):
    """Environment for a subprocess that starts its own local Ray: a short private temp dir, cleaned after."""
    ray_tmp = tempfile.mkdtemp(prefix=f"rbt-{uuid.uuid4().hex[:6]}-", dir="/tmp")
    yield cli.command_env(shared_data_dir, RAY_TMPDIR=ray_tmp)
    processes.stop_processes_under(ray_tmp)
    shutil.rmtree(ray_tmp, ignore_errors=True)


@pytest.fixture(scope="session")
def ray_head(tmp_path_factory, shared_data_dir) -> LocalHead:
    """The session's one Ray head (cluster/local-up.sh: 2 CPUs, its own port block, a private token), started
    by the first test that asks for it. Sweeps whose subject is not Ray's own start-up or teardown join it with
    `--address` instead of each starting a private Ray. Its workers inherit this environment, so the data dir
    is the session's shared one."""
    head = LocalHead.start(tmp_path_factory.mktemp("ray-head"), cli.command_env(shared_data_dir, HF_HUB_OFFLINE="1"))
    temp_dirs, plan = head.temp_dirs(), port_plan(head.env)
    yield head
    started = recorded(head.state)
    down = head.stop()
    for temp in temp_dirs:  # only if local-down could not
        processes.stop_processes_under(temp)
    assert down.returncode == 0, down.stderr
    # Stopping it leaves nothing: no recorded process, no port of its plan answering, no temp dir.
    assert started and not [pid for pid, created in started if alive(pid, created)], "local-down left Ray processes"
    assert not [role for role, port in plan.items() if not role.endswith("_WORKER_PORT") and answers(port)]
    assert not [temp for temp in temp_dirs if Path(temp).exists()], "local-down kept the head's temp dir"


@pytest.fixture
def head_env(ray_head) -> dict:
    """Environment for a `raybench` subprocess that joins the session's head (its token and ports)."""
    return dict(ray_head.env)
