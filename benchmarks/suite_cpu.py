"""Where a command's CPU time goes, by the kind of process that spent it (the map for
the goal of a 30-minute suite).

    .venv/bin/python benchmarks/suite_cpu.py                       # `make test`
    .venv/bin/python benchmarks/suite_cpu.py --json cpu.json -- make test PYTEST_ARGS=-x

On 2 cores the suite is CPU-bound (vmstat: under 2 % idle), so its wall time follows the CPU-seconds its
processes spend, and those are mostly fresh interpreters starting (`raybench` commands, trial processes, Ray's
daemons, MLflow servers), not training. This script says how many CPU-seconds each kind took, so that a cut
can aim at the largest share, and be measured by the same table afterwards.

How: it makes itself a child subreaper (prctl PR_SET_CHILD_SUBREAPER), so processes that daemonize (`ray start`'s
GCS and raylet, local-up's MLflow server) stay in its tree; it samples every process of that tree once a second
with psutil, and names each one's kind from its command line, again while Ray retitles a worker (ray::IDLE
becomes ray::function_trial). A process keeps the kind it last had. What it misses: a process that lives under
a second, and each process's last second. The kernel's own count (getrusage of the reaped descendants) is printed
beside it as a lower bound only: a process's CPU reaches it only if every process between it and this one waited
for it, and Ray's killed daemons and workers often are not waited for. A process still running 30 s after the
command ended is listed, since it is a leak of the command's.
"""
from __future__ import annotations

import argparse
import ctypes
import json
import os
import resource
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from raybench.paths import writable_dir_problem, write_text_atomically

PR_SET_CHILD_SUBREAPER = 36
SAMPLE_S = 1.0
LEFTOVER_GRACE_S = 30.0
STARTING = "Ray worker, idle or not yet titled"

# (kind, what its command line contains); the first match wins, so the specific names come first.
KINDS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("trial process (Tune trial, Train driver)", ("ray::function_trial", "ray::train_driver", "ray::ImplicitFunc",
                                                  "ray::_Inner", "ray::Shaped")),
    ("Ray Train controller and workers", ("ray::RayTrainWorker", "ray::TrainController", "ray::_RayTrainWorker",
                                          "ray::TrainStateActor", "ray::SynchronizationActor")),
    (STARTING, ("ray::IDLE", "default_worker.py", "setup_worker.py")),  # before the daemons: its flags name the raylet
    ("Ray daemons (GCS, raylet, agents, dashboard, monitors)", ("gcs_server", "raylet", "ray::DashboardAgent",
                                                                 "ray::RuntimeEnvAgent", "dashboard/dashboard.py",
                                                                 "ray-dashboard", "autoscaler/_private/monitor.py",
                                                                 "ray.util.client.server", "log_monitor.py",
                                                                 "ray::JobSupervisor")),
    ("other Ray actors and tasks", ("ray::",)),
    ("raybench commands (sweep, benchmark, results...)", ("bin/raybench", "-m raybench")),
    ("MLflow servers", ("mlflow server", "bin/mlflow", "uvicorn", "gunicorn", "huey")),
    ("Chromium", ("chromium", "/chrome")),
    # Not any word "pytest": a helper's arguments often name pytest's temp folders (/tmp/pytest-of-...).
    ("pytest (main process and xdist workers)", ("-m pytest", "bin/pytest", "import sys;exec(eval(")),
    ("benchmarks/ scripts", ("benchmarks/",)),
    ("Redis", ("redis-server",)),
    ("espeak-ng", ("espeak",)),
)


def kind_of(command: str) -> str:
    for kind, marks in KINDS:
        if any(mark in command for mark in marks):
            return kind
    first = command.split(" ", 1)[0].rsplit("/", 1)[-1]
    return f"other ({first or '?'})"


@dataclass
class Seen:
    kind: str
    cpu_at_first_sight: float
    cpu: float


@dataclass
class Tally:
    processes: dict[tuple[int, float], Seen] = field(default_factory=dict)
    left_running: list[str] = field(default_factory=list)  # alive LEFTOVER_GRACE_S after the command ended

    def sample(self, root: psutil.Process) -> None:
        for proc in root.children(recursive=True):
            try:
                key = (proc.pid, proc.create_time())
                times = proc.cpu_times()
                cpu = times.user + times.system
                seen = self.processes.get(key)
                if seen is None:
                    # First sight within a second of its start: what it spent so far is this command's too.
                    self.processes[key] = Seen(kind_of(" ".join(proc.cmdline())), 0.0, cpu)
                    continue
                seen.cpu = cpu
                if seen.kind == STARTING:  # Ray retitles a worker once it takes an actor or a task
                    seen.kind = kind_of(" ".join(proc.cmdline()))
            except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
                continue

    def by_kind(self) -> dict[str, tuple[float, int]]:
        totals: dict[str, tuple[float, int]] = {}
        for seen in self.processes.values():
            cpu, count = totals.get(seen.kind, (0.0, 0))
            totals[seen.kind] = (cpu + seen.cpu - seen.cpu_at_first_sight, count + 1)
        return dict(sorted(totals.items(), key=lambda item: -item[1][0]))


def reap_orphans() -> None:
    """As a subreaper this process inherits the orphans of the command's tree; reap the dead ones."""
    while True:
        try:
            pid, _status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def run(command: list[str]) -> tuple[int, float, Tally]:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_CHILD_SUBREAPER)")
    tally, started = Tally(), time.monotonic()
    child = subprocess.Popen(command)
    me = psutil.Process()
    while child.poll() is None:
        tally.sample(me)
        reap_orphans()
        time.sleep(SAMPLE_S)
    wall = time.monotonic() - started
    deadline = time.monotonic() + LEFTOVER_GRACE_S  # orphans still stopping: their CPU counts, and the kernel's
    while me.children(recursive=True) and time.monotonic() < deadline:
        tally.sample(me)
        reap_orphans()
        time.sleep(SAMPLE_S / 4)
    tally.left_running = [described(p) for p in me.children(recursive=True)]
    return child.returncode, wall, tally


def described(proc: psutil.Process) -> str:
    try:
        return f"{proc.pid} {' '.join(proc.cmdline())[:100]}"
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        return f"{proc.pid} (gone while listed)"


def report(code: int, wall: float, tally: Tally) -> dict:
    kinds = tally.by_kind()
    sampled = sum(cpu for cpu, _ in kinds.values())
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    kernel = usage.ru_utime + usage.ru_stime
    rows = [{"kind": kind, "cpu_s": round(cpu, 1), "share": round(cpu / sampled, 4) if sampled else 0.0,
             "processes": count} for kind, (cpu, count) in kinds.items()]
    return {"exit": code, "wall_s": round(wall, 1), "cores": os.cpu_count(), "sampled_cpu_s": round(sampled, 1),
            "reaped_cpu_s": round(kernel, 1), "busy_cores": round(sampled / wall, 3) if wall else 0.0, "kinds": rows,
            "left_running": tally.left_running}


def print_table(result: dict) -> None:
    print(f"\nexit {result['exit']}; wall {result['wall_s']:.1f} s on {result['cores']} cores; "
          f"CPU sampled {result['sampled_cpu_s']:.1f} s ({result['busy_cores']:.3f} cores busy on average); "
          f"the kernel's count of reaped descendants, a lower bound: {result['reaped_cpu_s']:.1f} s")
    print(f"{'kind':58} {'CPU s':>9} {'share':>7} {'processes':>10}")
    for row in result["kinds"]:
        print(f"{row['kind'][:58]:58} {row['cpu_s']:9.1f} {row['share']:7.3f} {row['processes']:10d}")
    for line in result["left_running"]:
        print(f"left running {LEFTOVER_GRACE_S:.0f} s after the command ended: {line}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", help="also write the table here, as JSON")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="the command to run (after --); default: make test")
    args = parser.parse_args()
    command = (args.command[1:] if args.command[:1] == ["--"] else args.command) or ["make", "test"]
    # Refused before the command runs, in one line: a whole suite's measurement must not be lost at its end.
    if args.json and (problem := writable_dir_problem(Path(args.json).resolve().parent)):
        parser.exit(2, f"suite_cpu.py: error: --json {args.json}: {problem}\n")
    if shutil.which(command[0]) is None:
        parser.exit(2, f"suite_cpu.py: error: {command[0]!r}: expected a command on PATH or a path to one\n")
    code, wall, tally = run(command)
    result = {"command": command, **report(code, wall, tally)}
    print_table(result)
    if args.json:
        write_text_atomically(Path(args.json), json.dumps(result, indent=1))
    return code


if __name__ == "__main__":
    sys.exit(main())
