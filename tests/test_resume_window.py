"""A sweep stopped while it starts (Ray starting, Tune not yet at its first folder) leaves a command that works:
the interrupted line's command is accepted, whether the parent run was created already or not. A `--resume` of a
sweep neither the storage nor the tracking store knows is still refused before anything is written."""
from __future__ import annotations

import shlex
from pathlib import Path

import pytest
from helpers.cli import cli, fail_on_reaching

from raybench.sweep import ray_backend
from raybench.tracking import SweepTracker


@pytest.fixture
def args(tmp_path, in_private_dirs, store_uri) -> list[str]:
    return ["sweep", "erm", "--name", "window", "--storage", str(tmp_path / "runs"), "--tracking-uri", store_uri,
            "--trials", "1", "--set", "epochs=1"]


def stopped(*args, **kwargs):
    raise KeyboardInterrupt


def stopped_after(real):
    def call(*args, **kwargs):
        real(*args, **kwargs)
        raise KeyboardInterrupt
    return call


@pytest.mark.parametrize("where", ["Ray starting", "parent run just created"])
def test_the_command_a_sweep_stopped_while_starting_prints_is_accepted(args, capsys, monkeypatch, where):
    if where == "Ray starting":
        monkeypatch.setattr(ray_backend, "connect", stopped)
    else:
        monkeypatch.setattr(SweepTracker, "start_sweep", stopped_after(SweepTracker.start_sweep))
    first = cli(args, capsys)
    assert first.returncode == 130, first.stderr[-2000:]
    printed = first.stderr.strip().splitlines()[-1]
    command = shlex.split(printed[printed.index("raybench sweep"):])
    fail_on_reaching(monkeypatch, (ray_backend, "connect"))
    with pytest.raises(AssertionError, match="start Ray"):  # past every check: it would run
        again = cli(command[1:], capsys)
        pytest.fail(f"{printed} -> exit {again.returncode}: {again.stderr[-1500:]}")


def test_a_resume_of_a_sweep_nobody_recorded_is_refused_and_writes_nothing(args, tmp_path, capsys):
    done = cli([*args, "--resume"], capsys)
    assert done.returncode == 2 and "no sweep named 'window'" in done.stderr, done.stderr
    assert not Path(tmp_path / "runs").exists()
