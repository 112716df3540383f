"""A benchmark's trial queue on a cluster it did not start (`--address`): slot files in a folder on the benchmark's
host, each held by one trial of one of its sweeps through an exclusive lock.

On its private Ray a benchmark declares its cap as a custom resource that every trial holds, and Ray's scheduler
keeps the queue (benchmark.py). A user's cluster declares no such resource, and declaring one on a node would pin
every trial to that node. Every pair's sweep is a process on the benchmark's own host, though, so the queue can
live there: the benchmark writes one slot file per trial of its cap, and each sweep's driver lets Tune create a
trial only once it holds a free slot, and frees the slot when Tune ends the trial (ray_backend.QueuedSearch).
A slot is an open file with an exclusive, non-blocking `flock`: the kernel frees it when its holder closes it or
dies, even by SIGKILL, so a killed sweep never strands a slot and nothing needs cleaning up after one.
"""
from __future__ import annotations

import fcntl
import os
from pathlib import Path
from typing import Any

SLOT_PREFIX = "slot-"


def make_slots(folder: Path, count: int) -> Path:
    """`folder` holding exactly `count` slot files (a resumed benchmark may have changed its cap)."""
    folder.mkdir(parents=True, exist_ok=True)
    wanted = {f"{SLOT_PREFIX}{i:04d}" for i in range(count)}
    for path in slot_files(folder):
        if path.name not in wanted:
            path.unlink()
    for name in sorted(wanted):
        (folder / name).touch()
    return folder


def slot_files(folder: Path) -> list[Path]:
    return sorted(p for p in folder.glob(f"{SLOT_PREFIX}*") if p.is_file())


def slot_folder_problem(text: str) -> str | None:
    """Why `text` cannot be a sweep's --trial-slots folder, or None: it must exist and hold slot files."""
    folder = Path(text)
    if not folder.is_dir():
        return f"expected a folder of trial slots (a benchmark writes one), got {text!r}, which is not a folder"
    if not slot_files(folder):
        return f"expected a folder of trial slots, got {text!r}, which holds no {SLOT_PREFIX}* file"
    return None


def lock_problem(folder: Path) -> str | None:
    """Why slot files in `folder` could not be locked, or None: a filesystem without `flock` (some network and
    FUSE mounts) would otherwise fail each sweep at its first trial, after the benchmark had started them.
    A folder not made yet is judged by the nearest one that exists, where it will be made."""
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    probe = folder / f".{SLOT_PREFIX}probe-{os.getpid()}"
    try:
        handle = os.open(probe, os.O_RDONLY | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        finally:
            os.close(handle)
    except OSError as err:
        return (f"expected a folder whose files can be locked (a benchmark at --address keeps its trial queue there "
                f"as locked slot files), but locking a file in {str(folder)!r} failed: {err.strerror or err}")
    finally:
        probe.unlink(missing_ok=True)
    return None


class TrialSlots:
    """The slots of one folder as one sweep's driver holds them: taken without waiting, one per owner (a trial),
    given back when the owner ends. Pickled (Tune keeps its search algorithm in the experiment state) it keeps
    only the folder: locks belong to the process that took them."""

    def __init__(self, folder: Path) -> None:
        self.folder = Path(folder)
        self._held: dict[str, int] = {}  # owner -> the open, locked slot file

    def __getstate__(self) -> dict[str, Any]:
        return {"folder": self.folder, "_held": {}}

    def held(self) -> list[str]:
        return sorted(self._held)

    def take(self, owner: str) -> bool:
        """A free slot for `owner` (True), or none free now (False); an owner that holds one keeps it."""
        if owner in self._held:
            return True
        for path in slot_files(self.folder):
            handle = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BaseException as err:
                os.close(handle)  # held by another trial (try the next slot), or no lock at all (never leak the file)
                if isinstance(err, BlockingIOError):
                    continue
                raise
            self._held[owner] = handle
            return True
        return False

    def hand_over(self, owner: str, new_owner: str) -> None:
        """The slot `owner` holds now belongs to `new_owner` (a slot taken before Tune named the trial)."""
        self._held[new_owner] = self._held.pop(owner)

    def give_back(self, owner: str) -> None:
        """Free `owner`'s slot; nothing when it holds none (a trial restored by a resume took none)."""
        handle = self._held.pop(owner, None)
        if handle is not None:
            os.close(handle)  # closing the file drops its lock
