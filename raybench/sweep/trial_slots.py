"""A benchmark's trial queue on a cluster it did not start (`--address`): slot files in a folder on the benchmark's
host, each held by one trial of one of its sweeps through an exclusive lock.

On its private Ray a benchmark declares its cap as a custom resource that every trial holds, and Ray's scheduler
keeps the queue (benchmark.py). A user's cluster declares no such resource, and declaring one on a node would pin
every trial to that node. Every pair's sweep is a process on the benchmark's own host, though, so the queue can
live there: the benchmark writes one slot file per trial of its cap, and each sweep's driver lets Tune create a
trial only once it holds a free slot, and frees the slot when Tune ends the trial (ray_backend.QueuedSearch).
A slot is an open file with an exclusive, non-blocking `flock`: the kernel frees it when its holder closes it or
dies, even by SIGKILL, so a killed sweep never strands a slot and nothing needs cleaning up after one.

A `--resume` is the one moment a sweep needs several slots at once: Tune starts the trials it restores without
asking the search for them. The sweep takes their slots before it restores them (`take_for_restored`), holding
the folder's gate file exclusively while it waits; every other take holds the gate shared for an instant, so
slots freed in the meantime go to the waiting sweep, not to new trials, and two sweeps that resume together
never each hold part of what both need.
"""
from __future__ import annotations

import fcntl
import os
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

SLOT_PREFIX = "slot-"
GATE = ".gate"  # not a slot: held exclusively by a sweep taking slots for the trials its resume restores
WAIT_POLL_S = 0.25  # how often a resuming sweep looks for freed slots (a lock on one file cannot wait on many)


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


_THIS_PROCESS: dict[Path, TrialSlots] = {}


def _say(text: str) -> None:
    print(f"raybench: {text}", file=sys.stderr, flush=True)


class TrialSlots:
    """The slots of one folder as one sweep's driver holds them: taken without waiting, one per owner (a trial),
    given back when the owner ends. Locks belong to the process that took them, so a sweep keeps one view of a
    folder (`of_this_process`), and a pickled one (Tune keeps its search algorithm in the experiment state and
    hands a copy back on restore) comes back as that view: the restored search finds the slots its sweep took
    for the restored trials. In another process a copy holds nothing."""

    def __init__(self, folder: Path) -> None:
        self.folder = Path(folder)
        self._held: dict[str, int] = {}  # owner -> the open, locked slot file

    @staticmethod
    def of_this_process(folder: Path) -> TrialSlots:
        key = Path(folder).resolve()
        if key not in _THIS_PROCESS:
            _THIS_PROCESS[key] = TrialSlots(key)
        return _THIS_PROCESS[key]

    def __reduce__(self) -> tuple[Callable[[Path], TrialSlots], tuple[Path]]:
        return TrialSlots.of_this_process, (self.folder,)

    def held(self) -> list[str]:
        return sorted(self._held)

    def take(self, owner: str) -> bool:
        """A free slot for `owner` (True), or none free now (False); an owner that holds one keeps it. None is
        free to a new trial while a resuming sweep waits for the slots of the trials it restores."""
        if owner in self._held:
            return True
        gate = self._open_gate()
        try:
            try:
                fcntl.flock(gate, fcntl.LOCK_SH | fcntl.LOCK_NB)
            except BlockingIOError:
                return False
            return self._take_free(owner)
        finally:
            os.close(gate)  # drops the shared lock

    def take_for_restored(self, owners: Sequence[str], say: Callable[[str], None] = _say) -> None:
        """A slot for each of `owners`, the trials a resume restores, before Tune starts them: waits, holding the
        gate, until enough are freed. Owners beyond the folder's slots (a benchmark resumed with a smaller cap)
        start without one, and it says so. Interrupted (Ctrl-C, SIGTERM), it gives back what it took."""
        wanted = [owner for owner in owners if owner not in self._held]
        room = len(slot_files(self.folder)) - len(self._held)
        if len(wanted) > room:
            say(f"{len(wanted) - room} of the {len(wanted)} trials this resume restores start without a trial slot: "
                f"the queue in {self.folder} has {room} for them (the benchmark's cap is smaller than it was)")
            wanted = wanted[:max(room, 0)]
        gate = self._open_gate()
        try:
            try:
                fcntl.flock(gate, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:  # another resuming sweep's turn first: this one waits holding no slot
                say("resuming: waiting for another sweep of the benchmark to take the slots of the trials it "
                    "restores first")
                fcntl.flock(gate, fcntl.LOCK_EX)
            told = False
            for owner in wanted:
                while not self._take_free(owner):
                    if not told:
                        say(f"resuming: waiting for {len(wanted)} free slot{'s' * (len(wanted) != 1)} of the benchmark's "
                            f"trial queue for the trials this sweep restores (other sweeps' trials hold them now)")
                        told = True
                    time.sleep(WAIT_POLL_S)
        except BaseException:
            for owner in wanted:
                self.give_back(owner)
            raise
        finally:
            os.close(gate)

    def _open_gate(self) -> int:
        return os.open(self.folder / GATE, os.O_RDONLY | os.O_CREAT | os.O_CLOEXEC, 0o600)

    def _take_free(self, owner: str) -> bool:
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
        """Free `owner`'s slot; nothing when it holds none."""
        handle = self._held.pop(owner, None)
        if handle is not None:
            os.close(handle)  # closing the file drops its lock

    def give_back_all(self) -> None:
        """Free every slot held: a stage's fit has ended, so none of its trials runs (a trial Tune stopped on a
        signal may never have been reported as ended)."""
        for owner in list(self._held):
            self.give_back(owner)
