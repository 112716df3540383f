"""Who wrote a run: the driver process running a sweep (DRIVER_TAG, so a later reader can tell a dead driver from
a live one) and the code it ran (the tags every run of a sweep starts with)."""
from __future__ import annotations

import os
import socket
import subprocess
from pathlib import Path

import raybench
from raybench.tracking.names import ALGORITHM_TAG, COMMIT_TAG, DATASET_TAG, VERSION_TAG


def driver_identity() -> str:
    """host:pid:start-time of this process, so a later reader can tell whether the sweep's driver still lives."""
    return f"{socket.gethostname()}:{os.getpid()}:{_process_start(os.getpid())}"


def _process_start(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return "?"


def driver_alive(identity: str | None) -> bool | None:
    """Whether the process named by `driver_identity()` still runs; None when it ran on another host."""
    if not identity or identity.count(":") < 2:
        return None
    host, pid, start = identity.rsplit(":", 2)
    if host != socket.gethostname():
        return None
    return pid.isdigit() and _process_start(int(pid)) == start


def git_commit() -> str | None:
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5,
                             cwd=Path(__file__).resolve().parent)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None if out.returncode == 0 else None


def base_tags(dataset: str, algorithm: str) -> dict[str, str]:
    """The tags every run of a sweep (and a suite's runs) carries: what it trained and which raybench did."""
    tags = {DATASET_TAG: dataset, ALGORITHM_TAG: algorithm, VERSION_TAG: raybench.__version__}
    commit = git_commit()
    if commit:
        tags[COMMIT_TAG] = commit
    return tags
