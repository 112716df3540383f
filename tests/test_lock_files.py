"""A sweep's lock file is raybench's own: a link, a FIFO or a folder in its place is refused, never followed
or opened, so a planted link cannot truncate the file it points to and a FIFO cannot hang the driver; a full
disk while the lock is taken is the full disk's exit, 74.

The sweep cases run the real command line in this process; a sweep that got past its checks would reach
Ray's start-up, which fails the test (helpers.cli.fail_on_reaching)."""
from __future__ import annotations

import errno
import os
import signal
from pathlib import Path

import pytest
from helpers.cli import cli, fail_on_reaching

from raybench.paths import HeldLock, UnsafeLockFile, lock_busy, take_lock
from raybench.sweep import ray_backend, runner
from raybench.sweep.runner import LOCK_FOLDER, sweep_lock_path

NAME = "locked"


def _lock(tmp_path: Path) -> Path:
    return sweep_lock_path((tmp_path / "runs").resolve(), NAME)


def plant_symlink(lock: Path, tmp_path: Path) -> Path:
    target = tmp_path / "precious.txt"
    target.write_text("a user's file outside --storage")
    lock.symlink_to(target)
    return target


def plant_dangling_symlink(lock: Path, tmp_path: Path) -> Path:
    lock.symlink_to(tmp_path / "would-be-created")
    return tmp_path / "would-be-created"


def plant_fifo(lock: Path, tmp_path: Path) -> None:
    os.mkfifo(lock)


def plant_folder(lock: Path, tmp_path: Path) -> None:
    lock.mkdir()


PLANTS = {"symlink": plant_symlink, "dangling symlink": plant_dangling_symlink, "fifo": plant_fifo,
          "folder": plant_folder}
KINDS = {"symlink": "a symbolic link", "dangling symlink": "a symbolic link", "fifo": "a FIFO", "folder": "a folder"}


def within_seconds(call, seconds: int = 20):
    """`call()`, which must end in time: a FIFO opened for reading would block for ever. SIGALRM's handler
    raises in the blocked call (this thread is the main one, which the CLI's own signal handling needs)."""
    def too_long(signum, frame):
        raise TimeoutError(f"still blocked after {seconds} s")

    previous = signal.signal(signal.SIGALRM, too_long)
    signal.alarm(seconds)
    try:
        return call()
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


@pytest.mark.parametrize("plant", PLANTS)
def test_take_lock_and_lock_busy_refuse_what_is_not_a_regular_file(tmp_path, plant):
    lock = tmp_path / LOCK_FOLDER / "x.lock"
    lock.parent.mkdir()
    target = PLANTS[plant](lock, tmp_path)
    for probe in (lambda: lock_busy(lock), lambda: take_lock(lock)):
        with pytest.raises(UnsafeLockFile, match=KINDS[plant]):
            within_seconds(probe)
    if plant == "symlink":
        assert target.read_text() == "a user's file outside --storage"
    if plant == "dangling symlink":
        assert not target.exists()


def test_a_symlinked_lock_folder_is_refused_and_nothing_is_created_where_it_points(tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    (tmp_path / "runs").mkdir()
    (tmp_path / "runs" / LOCK_FOLDER).symlink_to(outside)
    with pytest.raises(UnsafeLockFile, match="symbolic link"):
        take_lock(tmp_path / "runs" / LOCK_FOLDER / "x.lock")
    assert list(outside.iterdir()) == []


def test_a_regular_lock_file_is_still_taken_and_a_dead_holders_is_taken_over(tmp_path):
    lock = tmp_path / LOCK_FOLDER / "x.lock"
    with take_lock(lock) as held:
        assert isinstance(held, HeldLock) and lock_busy(lock) is not None
    lock.write_text('{"host": "gone", "pid": 1, "since": "then"}')
    with take_lock(lock) as again:
        assert again.previous is not None and again.previous.host == "gone"
    assert lock_busy(lock) is None


@pytest.fixture
def sweep_args(tmp_path, in_private_dirs, monkeypatch) -> list[str]:
    fail_on_reaching(monkeypatch, (ray_backend, "connect"))
    return ["sweep", "erm", "--name", NAME, "--storage", str(tmp_path / "runs"), "--tracking-uri",
            f"sqlite:///{tmp_path / 'mlflow.db'}", "--trials", "1", "--set", "epochs=1"]


@pytest.mark.parametrize("plant", PLANTS)
def test_a_sweep_whose_lock_was_replaced_is_refused_in_one_line(tmp_path, sweep_args, capsys, plant):
    lock = _lock(tmp_path)
    lock.parent.mkdir(parents=True)
    target = PLANTS[plant](lock, tmp_path)
    done = within_seconds(lambda: cli(sweep_args, capsys), 120)
    assert done.returncode == 2, done.stderr
    line = done.stderr.strip()
    assert "\n" not in line and line.startswith("raybench: error: --storage: the lock file") and KINDS[plant] in line
    assert not (tmp_path / "mlflow.db").exists()
    if plant == "symlink":
        assert target.read_text() == "a user's file outside --storage"


@pytest.mark.parametrize("failing", ["pwrite", "fsync", "ftruncate"])
def test_a_full_disk_while_the_lock_is_taken_is_exit_74_and_leaves_the_lock_free(tmp_path, sweep_args, capsys,
                                                                                 monkeypatch, failing):
    real = getattr(os, failing)

    def full(fd, *args):
        if Path(os.readlink(f"/proc/self/fd/{fd}")).name == f"{NAME}.lock":
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real(fd, *args)

    monkeypatch.setattr(os, failing, full)
    done = cli(sweep_args, capsys)
    monkeypatch.setattr(os, failing, real)
    assert done.returncode == 74, done.stderr
    line = done.stderr.strip()
    assert "\n" not in line and "no space left on device" in line and "the sweep lock" in line, line
    assert lock_busy(_lock(tmp_path)) is None
    assert not (tmp_path / "mlflow.db").exists()


def test_the_stage_cache_lock_refuses_a_link_too(tmp_path):
    from raybench.trainer.stages import StageCache

    cache = StageCache(tmp_path / "stage_cache")
    (tmp_path / "stage_cache").mkdir()
    target = plant_symlink(tmp_path / "stage_cache" / "k.lock", tmp_path)
    with pytest.raises(UnsafeLockFile), cache._lock("k"):
        pass
    assert target.read_text() == "a user's file outside --storage"
    assert runner.LOCK_FOLDER.startswith(".")
