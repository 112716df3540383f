"""What a private local Ray leaves running when its driver dies without `ray.shutdown` (SIGKILL, the OOM killer).

Ray ties its GCS server and raylet to the driver's life (the kernel's parent-death signal) and its workers
follow the raylet, but the raylet's agents (`ray::DashboardAgent`, `ray::RuntimeEnvAgent`) do not: with Ray 2.60
they were still running minutes after the driver's SIGKILL, holding memory and ports. Ray has retitled them by
then, so no command line names their session and nothing can find them afterwards by path.

So a driver that starts a private Ray records who it is and which processes that Ray runs (`DriverRecord`, a
file in the Ray session's folder), and removes the record when it shuts Ray down itself. A later start calls
`stop_dead_drivers_leftovers`: the recorded processes of every driver that has died are stopped, and those of a
live driver (another sweep still running) are never touched. Only psutil and the file: no Ray import, so the
tests' cleanup helpers use it too.
"""
from __future__ import annotations

import json
import os
import socket
import sys
from dataclasses import dataclass
from pathlib import Path

import psutil

RECORD_NAME = "raybench-driver.json"
STOP_GRACE_S = 5.0  # SIGTERM first (the agents exit on it within a second), SIGKILL after


@dataclass(frozen=True)
class ProcessId:
    """A process as psutil knows it: a pid alone could name another process once the first one died."""

    pid: int
    created: float  # psutil's create_time, the same float on every read while the process lives

    @classmethod
    def of(cls, process: psutil.Process) -> ProcessId:
        return cls(process.pid, process.create_time())

    def process(self) -> psutil.Process | None:
        """The live process this id names; None when it ended, or when its pid now belongs to another."""
        try:
            process = psutil.Process(self.pid)
            same = abs(process.create_time() - self.created) < 0.01
        except psutil.Error:
            return None
        return process if same and process.status() != psutil.STATUS_ZOMBIE else None


@dataclass(frozen=True)
class DriverRecord:
    """A driver that started a private local Ray, and the processes of that Ray as they were once it was up."""

    host: str
    driver: ProcessId
    processes: tuple[ProcessId, ...]

    def to_json(self) -> str:
        return json.dumps({"host": self.host, "driver": [self.driver.pid, self.driver.created],
                           "processes": [[p.pid, p.created] for p in self.processes]})

    @classmethod
    def from_json(cls, text: str) -> DriverRecord:
        body = json.loads(text)
        return cls(str(body["host"]), ProcessId(int(body["driver"][0]), float(body["driver"][1])),
                   tuple(ProcessId(int(pid), float(created)) for pid, created in body["processes"]))

    def driver_alive(self) -> bool:
        return self.driver.process() is not None

    def alive(self) -> list[psutil.Process]:
        """The recorded processes still running (a pid reused since is not one of them)."""
        return [process for process in map(ProcessId.process, self.processes) if process is not None]


def record_driver(session_dir: Path, roots: list[int]) -> Path:
    """Record this process as the driver of the Ray whose own processes are `roots` (Ray's GCS, raylet, ...):
    each with every process it started so far (the raylet's agents among them)."""
    found: dict[int, psutil.Process] = {}
    for pid in roots:
        try:
            root = psutil.Process(pid)
            found.update({p.pid: p for p in [root, *root.children(recursive=True)]})
        except psutil.Error:
            continue
    ids = []
    for process in found.values():
        try:
            ids.append(ProcessId.of(process))
        except psutil.Error:
            continue
    record = DriverRecord(socket.gethostname(), ProcessId.of(psutil.Process()), tuple(ids))
    path = session_dir / RECORD_NAME
    partial = path.with_suffix(f".{os.getpid()}.tmp")
    partial.write_text(record.to_json())
    partial.replace(path)
    return path


def forget_driver(session_dir: Path) -> None:
    """Remove this process's record after a clean shutdown; a record of another driver (a benchmark's Ray that
    this sweep only joined) stays."""
    path = session_dir / RECORD_NAME
    record = load_record(path)
    if record is not None and record.driver.pid == os.getpid():
        path.unlink(missing_ok=True)


def load_record(path: Path) -> DriverRecord | None:
    """The record at `path`; None when it is missing or unreadable (a driver killed while writing it writes
    only its temporary file, so a damaged record is not expected; it is then left alone)."""
    try:
        return DriverRecord.from_json(path.read_text())
    except (OSError, ValueError, KeyError, IndexError, TypeError):
        return None


def records_in(ray_temp_root: Path) -> list[Path]:
    """The driver records of the Ray sessions under a Ray temp folder (`<root>/session_*/raybench-driver.json`),
    each once: `session_latest` is Ray's link to the newest session."""
    return sorted(path for path in ray_temp_root.glob(f"session_*/{RECORD_NAME}") if not path.parent.is_symlink())


def leftover_processes(ray_temp_root: Path, dead_drivers_only: bool = True) -> list[psutil.Process]:
    """The recorded processes still running under `ray_temp_root`: by default only those whose driver on
    this host has died; `dead_drivers_only=False` (a test's private temp folder, torn down) takes every one."""
    host, found = socket.gethostname(), []
    for path in records_in(ray_temp_root):
        record = load_record(path)
        if record is None or record.host != host or (dead_drivers_only and record.driver_alive()):
            continue
        found += record.alive()
    return found


def stop_dead_drivers_leftovers(ray_temp_root: Path, grace_s: float = STOP_GRACE_S) -> int:
    """Stop the processes that dead drivers' private Rays left under `ray_temp_root` (SIGTERM, then SIGKILL
    after `grace_s`), and drop their records. Returns how many were still running."""
    host, stopped = socket.gethostname(), 0
    for path in records_in(ray_temp_root):
        record = load_record(path)
        if record is None or record.host != host or record.driver_alive():
            continue
        alive = record.alive()
        if alive:
            print(f"raybench: stopping {len(alive)} process(es) that driver pid {record.driver.pid} (dead) left "
                  f"running of its local Ray {path.parent}", file=sys.stderr)
            stop(alive, grace_s)
            stopped += len(alive)
        path.unlink(missing_ok=True)
    return stopped


def stop(processes: list[psutil.Process], grace_s: float) -> list[psutil.Process]:
    """SIGTERM each, wait up to `grace_s`, SIGKILL what is left and wait for it; returns any still alive.
    psutil checks each process's create time before signalling, so a pid reused meanwhile is spared."""
    for process in processes:
        try:
            process.terminate()
        except psutil.Error:
            pass
    _, alive = psutil.wait_procs(processes, timeout=grace_s)
    for process in alive:
        try:
            process.kill()
        except psutil.Error:
            pass
    return psutil.wait_procs(alive, timeout=grace_s)[1]
