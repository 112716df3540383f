"""Names and folders a user hands raybench: checked once, before anything is written.

A sweep name becomes folder names under `--storage` and tag values in MLflow, so it is restricted to
characters that can do neither harm (no separators, no quotes, no leading dot). A folder raybench will
write into is probed without leaving anything behind, so an unwritable `--storage`, `--output` or SQLite
path is one line before Ray starts instead of a failure after it. `--storage` is also probed for file locks,
which the stage cache takes on it from every node.
"""
from __future__ import annotations

import fcntl
import re
import tempfile
from pathlib import Path
from typing import Optional

NAME_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
NAME_RULE = "1-128 characters from A-Z a-z 0-9 . _ -, starting with a letter or digit"


def name_problem(name: str) -> Optional[str]:
    """Why `name` cannot name a sweep, or None if it can."""
    if NAME_PATTERN.fullmatch(name) is None:
        return f"expected {NAME_RULE}, got {name!r}"
    return None


def safe_name(text: str) -> str:
    """`text` with every character outside the allowed set replaced by '-' (for names built from file stems)."""
    cleaned = re.sub(r"[^A-Za-z0-9._-]", "-", text).lstrip(".-_") or "sweep"
    return cleaned[:128]


def inside(root: Path, child: Path) -> bool:
    """Whether `child` resolves to `root` or a path below it (symlinks followed)."""
    root, child = root.resolve(), child.resolve()
    return child == root or root in child.parents


def writable_dir_problem(path: Path) -> Optional[str]:
    """Why raybench could not create and write into the folder `path`, or None if it could.

    Probes the folder itself if it exists, else its nearest existing ancestor (where it would be created),
    by creating and removing a temporary folder: permission bits say nothing when running as root, while a
    read-only mount or /proc refuses the probe. Nothing is left behind either way."""
    path = Path(path).expanduser()
    if path.exists() and not path.is_dir():
        return f"expected a directory, got the file {str(path)!r}"
    existing = path if path.exists() else next((p for p in path.absolute().parents if p.exists()), None)
    if existing is None or not existing.is_dir():
        return f"cannot create {str(path)!r}: {str(existing)!r} is not a directory"
    try:
        with tempfile.TemporaryDirectory(dir=existing, prefix=".raybench-probe-"):
            pass
    except OSError as err:
        return f"cannot write to {str(existing)!r} ({err.strerror or err})"
    return None


def file_lock_problem(path: Path) -> Optional[str]:
    """Why an exclusive `flock` cannot be taken in the folder `path` (or its nearest existing ancestor), or None.

    The stage cache (raybench.trainer.stages) serialises the trials that need the same earlier stage on such a
    lock, from whichever node they run on. A local disk and NFSv4 (where Linux maps flock onto NFS byte-range
    locks) honour it; some FUSE and object-store mounts refuse it, and trials would then train one stage twice."""
    path = Path(path).expanduser()
    existing = path if path.is_dir() else next((p for p in path.absolute().parents if p.is_dir()), None)
    if existing is None:
        return None  # writable_dir_problem names this case
    try:
        with tempfile.TemporaryDirectory(dir=existing, prefix=".raybench-lock-probe-") as folder:
            with open(Path(folder) / "probe.lock", "w") as handle:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                fcntl.flock(handle, fcntl.LOCK_UN)
    except OSError as err:
        return (f"file locks (flock) fail in {str(existing)!r} ({err.strerror or err}); the stage cache needs them "
                f"on the storage every node shares: use a local folder or an NFSv4 mount")
    return None
