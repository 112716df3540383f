"""Inside a Ray job (or with $RAY_ADDRESS set) a sweep joins that cluster on its own, as Ray's own drivers do; an
--address that names another cluster from inside a job, or no address at all (a port Ray's client would retry
for ever), is one line before anything is written, and no password in an address is ever printed."""
from __future__ import annotations

import subprocess

import pytest
from helpers.paths import BIN
from hypothesis import given
from hypothesis import strategies as st

from raybench.sweep.errors import OptionError
from raybench.sweep.options import (
    RAY_ADDRESS_VARIABLE,
    RAY_JOB_VARIABLE,
    address_problem,
    cluster_address,
    shown_address,
)


def test_ray_address_is_joined_when_no_flag_names_a_cluster(monkeypatch):
    monkeypatch.delenv(RAY_JOB_VARIABLE, raising=False)
    monkeypatch.delenv(RAY_ADDRESS_VARIABLE, raising=False)
    assert cluster_address(None) is None  # a private local Ray
    monkeypatch.setenv(RAY_ADDRESS_VARIABLE, "10.1.2.3:6379")
    assert cluster_address(None) == "10.1.2.3:6379"
    assert cluster_address("auto") == "10.1.2.3:6379"
    assert cluster_address("127.0.0.1:7000") == "127.0.0.1:7000"  # outside a job the flag wins, as in ray.init


def test_inside_a_job_an_address_of_another_cluster_is_refused(monkeypatch):
    monkeypatch.setenv(RAY_ADDRESS_VARIABLE, "10.1.2.3:6379")
    monkeypatch.setenv(RAY_JOB_VARIABLE, "{}")
    assert cluster_address("10.1.2.3:6379") == "10.1.2.3:6379"
    with pytest.raises(OptionError, match="inside a Ray job"):
        cluster_address("127.0.0.1:7000")


def test_the_cli_refuses_it_in_one_line_before_anything_is_written(sweep_env, tmp_path):
    env = {**sweep_env, RAY_ADDRESS_VARIABLE: "10.1.2.3:6379", RAY_JOB_VARIABLE: "{}"}
    done = subprocess.run([str(BIN / "raybench"), "sweep", "erm", "--smoke", "--address", "127.0.0.1:7000",
                           "--storage", str(tmp_path / "runs")], env=env, cwd=tmp_path, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
    assert "inside a Ray job" in done.stderr and not (tmp_path / "runs").exists()


@given(st.integers().filter(lambda port: not 1 <= port <= 65535))
def test_a_port_outside_1_to_65535_is_refused_before_anything_connects(port):
    for address in (f"127.0.0.1:{port}", f"ray://127.0.0.1:{port}", f"[::1]:{port}"):
        assert "a port 1-65535" in address_problem(address), address


@given(st.integers(1, 65535))
def test_every_real_port_is_taken(port):
    for address in (f"127.0.0.1:{port}", f"ray://head:{port}", f"[::1]:{port}", f"ray://u:p@10.0.0.1:{port}"):
        assert address_problem(address) is None, address


@pytest.mark.parametrize("address", ["127.0.0.1", "http://127.0.0.1:8265", "127.0.0.1:port", ":6379",
                                     "[::1:6379", "[nope]:6379", "127.0.0.1:6379x"])
def test_a_malformed_address_is_named_as_such(address):
    assert address_problem(address) is not None


@given(st.text("abcdefgh0123456789", min_size=1, max_size=12), st.text("abcdefgh0123456789!$", min_size=1, max_size=12))
def test_credentials_in_an_address_are_never_shown(user, password):
    shown = shown_address(f"ray://{user}:{password}@127.0.0.1:10001")
    assert shown == "ray://***@127.0.0.1:10001"


@pytest.mark.parametrize("address", ["127.0.0.1:-1", "127.0.0.1:0", "127.0.0.1:70000",
                                     "ray://alice:s3cr3tpw@127.0.0.1:1"])
def test_a_bad_or_unreachable_address_is_one_line_exit_2_nothing_written_no_secret(address, sweep_env, tmp_path):
    env = {k: v for k, v in sweep_env.items() if k not in (RAY_ADDRESS_VARIABLE, RAY_JOB_VARIABLE)}
    done = subprocess.run([str(BIN / "raybench"), "sweep", "erm", "--smoke", "--address", address,
                           "--storage", str(tmp_path / "runs"), "--tracking-uri", f"sqlite:///{tmp_path / 'm.db'}"],
                          env=env, cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
    assert done.stderr.startswith("raybench: error: --address: ") and "s3cr3tpw" not in done.stderr, done.stderr
    assert not (tmp_path / "runs").exists() and not (tmp_path / "m.db").exists()
