"""Local clusters for the tests: cluster/local-up.sh and local-down.sh driven with explicit port blocks and a
private token, and the session's one Ray head that sweeps join with --address instead of each starting a Ray."""
from __future__ import annotations

import random
import secrets
import socket
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import psutil
import pytest

REPO = Path(__file__).resolve().parents[1]
CLUSTER = REPO / "cluster"
BIN = Path(sys.executable).parent


BLOCK = 200  # local-up.sh's port block: RAYBENCH_PORT_BASE .. +199
PORT_VARS = ("RAYBENCH_PORT_BASE", "RAY_PORT", "DASHBOARD_PORT", "RAYBENCH_DASHBOARD_AGENT_LISTEN_PORT",
             "RAYBENCH_DASHBOARD_AGENT_GRPC_PORT", "RAYBENCH_RUNTIME_ENV_AGENT_PORT", "RAYBENCH_METRICS_EXPORT_PORT",
             "RAYBENCH_NODE_MANAGER_PORT", "RAYBENCH_OBJECT_MANAGER_PORT", "RAYBENCH_CLIENT_SERVER_PORT",
             "DASHBOARD_METRIC_PORT", "AUTOSCALER_METRIC_PORT", "MLFLOW_PORT", "RAYBENCH_REDIS_PORT", "RAYBENCH_MIN_WORKER_PORT",
             "RAYBENCH_MAX_WORKER_PORT")
RAY_DEFAULT_PORTS = {6379, 8265, 52365, 10001, 44217, 44227}


def port_is_free(port: int) -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("0.0.0.0", port))  # Ray's GCS and raylet bind every interface
        except OSError:
            return False
    return True


def free_port_base(avoid: tuple[int, ...] = ()) -> int:
    """A base whose whole block is free: between Ray's default worker ports (10002-19999) and the ephemeral
    range (32768+), so neither another Ray nor an outgoing connection takes one of its ports meanwhile."""
    rng = random.Random()
    for _ in range(100):
        base = rng.randrange(20000, 32768 - BLOCK)
        if all(abs(base - other) >= BLOCK for other in avoid) and all(map(port_is_free, range(base, base + BLOCK))):
            return base
    pytest.fail(f"no free block of {BLOCK} ports between 20000 and 32767")


def cluster_env(sweep_env: dict, tmp_path: Path, name: str, base: int, **extra: str) -> dict:
    token = private_token(tmp_path)
    env = {k: v for k, v in sweep_env.items() if k not in PORT_VARS and k != "RAY_TEMP_DIR"}
    return {**env, "RAYBENCH_PORT_BASE": str(base), "RAYBENCH_CLUSTER_DIR": str(tmp_path / name),
            "RAY_NUM_CPUS": "2", "RAYBENCH_BIN": str(BIN), "RAY_AUTH_MODE": "token",
            "RAY_AUTH_TOKEN_PATH": str(token), **extra}


def script(name: str, env: dict, *args: str, timeout: float = 420) -> subprocess.CompletedProcess:
    return subprocess.run([str(CLUSTER / name), *args], env=env, capture_output=True, text=True, timeout=timeout)


def port_plan(env: dict) -> dict[str, int]:
    plan = script("local-up.sh", env, "--print-ports", timeout=30)
    assert plan.returncode == 0, plan.stderr
    return {name: int(port) for name, port in (line.split("=") for line in plan.stdout.split())}


def recorded(state: Path) -> list[tuple[int, float]]:
    return [(int(pid), float(created)) for pid, created in
            (line.split() for line in (state / "ray.pids").read_text().splitlines())]


def alive(pid: int, created: float) -> bool:
    try:
        return abs(psutil.Process(pid).create_time() - created) < 0.01
    except psutil.NoSuchProcess:
        return False


def listening_ports(pids: list[int]) -> dict[int, set[int]]:
    """TCP ports on which these processes or their descendants listen, by process."""
    tree = set()
    for pid in pids:
        try:
            tree |= {pid, *(child.pid for child in psutil.Process(pid).children(recursive=True))}
        except psutil.NoSuchProcess:
            pass
    ports: dict[int, set[int]] = {}
    for conn in psutil.net_connections("tcp"):
        if conn.pid in tree and conn.status == psutil.CONN_LISTEN:
            ports.setdefault(conn.pid, set()).add(conn.laddr.port)
    return ports


def answers(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(2)
        return s.connect_ex(("127.0.0.1", port)) == 0



def private_token(folder: Path) -> Path:
    """A private Ray auth token for a test cluster: the tests never touch ~/.ray."""
    token = folder / "ray_auth_token"
    if not token.exists():
        token.write_text(secrets.token_hex(32))
    return token


@dataclass
class LocalHead:
    """A head started by cluster/local-up.sh: its environment (ports, token, state dir), GCS address and MLflow
    server. Every sweep that joins it with `--address` skips starting a Ray of its own (about 10 s on 2 cores)."""

    env: dict[str, str]
    state: Path
    address: str
    mlflow_uri: str

    @classmethod
    def start(cls, root: Path, base_env: dict[str, str]) -> LocalHead:
        """Start it with `base_env`, which its Ray workers inherit (the data dir, offline flags)."""
        env = cluster_env({k: v for k, v in base_env.items() if k != "RAY_TMPDIR"}, root, "state", free_port_base())
        plan = port_plan(env)
        up = script("local-up.sh", env)
        head = cls(env, root / "state", f"127.0.0.1:{plan['RAY_PORT']}", f"http://127.0.0.1:{plan['MLFLOW_PORT']}")
        if up.returncode != 0:
            head.stop()
            pytest.fail(f"the session's Ray head did not start:\n{up.stderr[-3000:]}{up.stdout[-3000:]}")
        return head

    def temp_dirs(self) -> list[str]:
        return [path.read_text().strip() for path in self.state.glob("**/ray_temp_dir")]

    def stop(self) -> subprocess.CompletedProcess:
        """local-down.sh: exactly the recorded processes and the marked temp dir."""
        return script("local-down.sh", self.env, timeout=240)
