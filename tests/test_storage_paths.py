"""Paths the OS refuses are one line naming the flag, exit 2, before anything is written: a loop of symbolic
links, a name over 255 bytes, a path over 4,095, a NUL byte, an empty path. Each is tried on every flag that
names a folder raybench writes into, through the real command line in this process."""
from __future__ import annotations

from pathlib import Path

import pytest
from helpers.cli import cli, fail_on_reaching
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from raybench.paths import MAX_NAME_BYTES, MAX_PATH_BYTES, path_problem
from raybench.sweep import ray_backend


def symlink_loop(tmp: Path) -> str:
    (tmp / "a").symlink_to(tmp / "b")
    (tmp / "b").symlink_to(tmp / "a")
    return str(tmp / "a" / "runs")


BAD_PATHS = {
    "symlink loop": symlink_loop,
    "long name": lambda tmp: str(tmp / ("n" * (MAX_NAME_BYTES + 1)) / "runs"),
    "long multibyte name": lambda tmp: str(tmp / ("é" * 128)),  # 256 bytes in 128 characters
    "long path": lambda tmp: str(tmp / "/".join(["d" * 200] * 25)),
    "empty": lambda tmp: "",
    "NUL byte": lambda tmp: str(tmp / "a\0b"),
}

FLAGS = {
    "sweep --storage": lambda path: ["sweep", "erm", "--storage", path, "--trials", "1"],
    "benchmark --storage": lambda path: ["benchmark", "queue_smoke", "--storage", path],
    "train --output": lambda path: ["train", "--algorithm", "erm", "--epochs", "1", "--output", path],
    "results --plots": lambda path: ["results", "nothing-here", "--plots", path],
}


@pytest.fixture
def no_cluster(in_private_dirs, monkeypatch) -> None:
    fail_on_reaching(monkeypatch, (ray_backend, "connect"))


@pytest.mark.parametrize("bad", BAD_PATHS)
@pytest.mark.parametrize("flag", FLAGS)
def test_a_path_the_os_refuses_is_one_line_naming_the_flag(tmp_path, no_cluster, capsys, flag, bad):
    path = BAD_PATHS[bad](tmp_path)
    done = cli(FLAGS[flag](path), capsys)
    line = done.stderr.strip()
    assert done.returncode == 2 and "\n" not in line, (flag, bad, done.stderr[-2000:])
    assert line.startswith(f"raybench: error: {flag.split()[1]}"), (flag, bad, line)
    assert "Traceback" not in done.stderr
    assert not Path("runs").exists() and not Path("mlflow.db").exists()


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(parts=st.lists(st.text(st.characters(codec="utf-8", exclude_characters="/\0"), min_size=1, max_size=300),
                      min_size=1, max_size=30))
def test_path_problem_names_exactly_what_the_os_would_refuse(tmp_path, parts):
    path = str(tmp_path.joinpath(*parts))
    problem = path_problem(path)
    too_long = len(path.encode()) > MAX_PATH_BYTES or any(len(p.encode()) > MAX_NAME_BYTES for p in parts)
    if too_long:
        assert problem is not None and "bytes long" in problem
    else:
        assert problem is None, (path, problem)
        Path(path).exists()  # the OS takes it: no OSError, no RuntimeError
