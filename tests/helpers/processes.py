"""The processes the tests start, in private temp dirs: found by the paths their command lines name (or by
raybench's record of a private Ray), and stopped by PID."""
from __future__ import annotations

import os
import re
import signal
import subprocess
import tempfile
from pathlib import Path

import psutil


def processes_under(path: str) -> list:
    """The processes (psutil) whose command line names `path` itself or something inside it, this one excepted.

    `/tmp/rbt-ab` matches `/tmp/rbt-ab`, `--temp-dir=/tmp/rbt-ab` and `--log_dir=/tmp/rbt-ab/session_x/logs`,
    never `/tmp/rbt-abc` nor `/var/tmp/rbt-ab`."""
    path = os.path.normpath(path)
    assert path not in ("/", "/tmp", tempfile.gettempdir()), f"refusing to match every process under {path}"
    names = re.compile(r"(?:^|[=:,\s'\"])" + re.escape(path) + r"(?:/|$|[:,\s'\"])")
    found = [proc for proc in psutil.process_iter(["cmdline"])
             if proc.pid != os.getpid() and any(names.search(arg) for arg in proc.info["cmdline"] or ())]
    return found + [proc for proc in recorded_under(path) if proc.pid not in {p.pid for p in found}]


def recorded_under(path: str) -> list:
    """The processes that raybench's driver records list for the private Rays under `path` (as RAY_TMPDIR or as
    Ray's own temp folder): Ray retitles its agents (`ray::DashboardAgent`), so no command line names `path`."""
    from raybench.sweep.leftovers import leftover_processes

    found = {}
    for root in (Path(path), Path(path) / "ray"):
        found.update({proc.pid: proc for proc in leftover_processes(root, dead_drivers_only=False)
                      if proc.pid != os.getpid()})
    return list(found.values())


def stop_processes_under(path: str, grace: float = 10.0) -> None:
    """Stop every process whose command line names `path` (a private Ray temp dir): TERM, then KILL whatever
    is left after `grace` seconds. Never a host-wide `ray stop`, never a pattern match by pkill."""
    procs = processes_under(path)
    _, alive = signal_and_wait(procs, signal.SIGTERM, grace)
    signal_and_wait(alive, signal.SIGKILL, 5)


def signal_and_wait(procs: list, sig: int, timeout: float) -> tuple[list, list]:
    """Send `sig` to each of these psutil processes (psutil checks the create time first, so a reused PID is
    never signalled), then wait up to `timeout` seconds; returns (gone, alive)."""
    for proc in procs:
        try:
            proc.send_signal(sig)
        except psutil.Error:
            pass
    return psutil.wait_procs(procs, timeout=timeout)


def signal_and_collect(proc: subprocess.Popen, sig: int, timeout: float) -> subprocess.CompletedProcess:
    """Send `sig` to a raybench command started in its own session: SIGINT to its process group, as a Ctrl-C in
    its terminal; any other signal to the driver alone, as `ray job stop` or a scheduler's preemption. Then its
    exit status and output, killing the group should it outlive `timeout`."""
    if sig == signal.SIGINT:
        os.killpg(proc.pid, signal.SIGINT)
    else:
        proc.send_signal(sig)
    try:
        out, err = proc.communicate(timeout=timeout)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
