"""Inside a Ray job (or with $RAY_ADDRESS set) a sweep joins that cluster on its own, as Ray's own drivers do; an
--address that names another cluster from inside a job is one line."""
from __future__ import annotations

import subprocess

import pytest
from conftest import BIN

from raybench.sweep.errors import OptionError
from raybench.sweep.options import RAY_ADDRESS_VARIABLE, RAY_JOB_VARIABLE, cluster_address


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
