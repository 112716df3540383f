"""Names and folders a user hands raybench: checked once, before anything is written.

A sweep name becomes folder names under `--storage` and tag values in MLflow, so it is restricted to
characters that can do neither harm (no separators, no quotes, no leading dot). A folder raybench will
write into is probed without leaving anything behind, so an unwritable `--storage`, `--output` or SQLite
path is one line before Ray starts instead of a failure after it. `--storage` is also probed for file locks,
which the stage cache takes on it from every node.
"""
from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import re
import socket
import stat
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from raybench.file_kinds import kind_words

NAME_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
NAME_RULE = "1-128 characters from A-Z a-z 0-9 . _ -, starting with a letter or digit"


def name_problem(name: str) -> str | None:
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


# Linux's limits (NAME_MAX, PATH_MAX); a file system may allow fewer, which its own error then names.
MAX_NAME_BYTES, MAX_PATH_BYTES = 255, 4095


def path_problem(path: Path) -> str | None:
    """Why the OS would refuse `path` itself, before any folder of it is probed, or None: empty, a name over
    255 bytes, a path over 4,095, a NUL byte, a loop of symbolic links. Python's own checks raise these as
    a RuntimeError (`Symlink loop`) or an OSError from the first call that touches the path."""
    text = os.fspath(path)
    if not text.strip():
        return "expected a path, got an empty one"
    if "\0" in text:
        return f"expected a path, got one holding a NUL byte: {text!r}"
    absolute = os.path.abspath(os.path.expanduser(text))
    if len(os.fsencode(absolute)) > MAX_PATH_BYTES:
        return f"the path is {len(os.fsencode(absolute)):,} bytes long; the OS takes at most {MAX_PATH_BYTES:,}"
    long_name = next((part for part in Path(absolute).parts if len(os.fsencode(part)) > MAX_NAME_BYTES), None)
    if long_name is not None:
        return (f"the name {long_name[:40]!r}... is {len(os.fsencode(long_name))} bytes long; a file or folder "
                f"name takes at most {MAX_NAME_BYTES}")
    try:
        Path(absolute).resolve()
    except RuntimeError:  # Python 3.11's pathlib: a loop of symbolic links
        return f"{text!r} runs into a loop of symbolic links"
    except OSError as err:
        return f"{text!r} cannot be resolved ({err.strerror or err})"
    if _symlink_loop(Path(absolute)):
        return f"{text!r} runs into a loop of symbolic links"
    return None


def _symlink_loop(path: Path) -> bool:
    """Whether some prefix of `path` is a link that never ends (ELOOP), which resolve() may let through."""
    for prefix in [*reversed(path.parents), path]:
        try:
            os.stat(prefix)
        except OSError as err:
            if err.errno == errno.ELOOP:
                return True
            if err.errno in (errno.ENOENT, errno.ENOTDIR):
                return False
    return False


def writable_dir_problem(path: Path) -> str | None:
    """Why raybench could not create and write into the folder `path`, or None if it could.

    Probes the folder itself if it exists, else its nearest existing ancestor (where it would be created),
    by creating and removing a temporary folder: permission bits say nothing when running as root, while a
    read-only mount or /proc refuses the probe. Nothing is left behind either way."""
    problem = path_problem(path)
    if problem is not None:
        return problem
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


def file_lock_problem(path: Path) -> str | None:
    """Why an exclusive `flock` cannot be taken in the folder `path` (or its nearest existing ancestor), or None.

    The stage cache (raybench.trainer.stages) serialises the trials that need the same earlier stage on such a
    lock, from whichever node they run on, and a sweep's driver holds one for its lifetime (take_lock), so that
    a second driver of the same sweep is refused. A local disk and NFSv4 (where Linux maps flock onto NFS
    byte-range locks) honour it; some FUSE and object-store mounts refuse it, and trials would then train one
    stage twice."""
    if path_problem(path) is not None:
        return None  # writable_dir_problem names this case
    path = Path(path).expanduser()
    existing = path if path.is_dir() else next((p for p in path.absolute().parents if p.is_dir()), None)
    if existing is None:
        return None  # writable_dir_problem names this case
    try:
        with tempfile.TemporaryDirectory(dir=existing, prefix=".raybench-lock-probe-") as folder, \
                open(Path(folder) / "probe.lock", "w") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            fcntl.flock(handle, fcntl.LOCK_UN)
    except OSError as err:
        return (f"file locks (flock) fail in {str(existing)!r} ({err.strerror or err}); the stage cache and the sweep "
                f"lock need them on the storage every node shares: use a local folder or an NFSv4 mount")
    return None


# ----- records written all or nothing, and a full disk named ------------------------------------------------
DISK_FULL = {errno.ENOSPC: "ENOSPC", errno.EDQUOT: "EDQUOT"}  # out of space; out of the user's quota
_ERRNO_IN_TEXT = re.compile(r"\[errno (\d+)\]", re.IGNORECASE)


def disk_full_error(err: BaseException) -> OSError | None:
    """The OSError saying its file system ran out of space or quota, when `err` is one or was raised from one
    (Arrow's errors, from Parquet or Ray's uploads, are OSErrors with the errno too); None otherwise."""
    seen: set[int] = set()
    current: BaseException | None = err
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, OSError) and current.errno in DISK_FULL:
            return current
        current = current.__cause__ or current.__context__
    return None


def disk_full_errno_in(text: str) -> int | None:
    """ENOSPC or EDQUOT when an error's text names one, else None: a trial's error reaches the sweep's driver
    as a remote traceback, where Python writes `[Errno 28] ...` and Arrow `[errno 28] ...`."""
    for match in _ERRNO_IN_TEXT.finditer(text):
        if int(match.group(1)) in DISK_FULL:
            return int(match.group(1))
    return None


class StorageFull(Exception):
    """A sweep's folder filled up (or its quota ran out) while raybench or Ray wrote into it. Every record is
    written all or nothing, so what was written before is whole, and `--resume` continues once space is freed.
    Deliberately no OSError: code that tolerates a failed probe or copy must not swallow it."""

    def __init__(self, folder: Path, what: str, code: int = errno.ENOSPC, flag: str = "--storage") -> None:
        self.folder, self.what, self.errno, self.flag = Path(folder), what, code, flag
        reason = os.strerror(code)
        super().__init__(f"{flag + ' ' if flag else ''}{self.folder}: {reason[:1].lower()}{reason[1:]} "
                         f"({DISK_FULL.get(code, code)}) while writing {what}")


def write_atomically(path: Path, write: Callable[[Path], Any]) -> None:
    """Write the file `path` all or nothing: `write` fills a temporary file beside it, which is flushed to the
    disk (fsync: file systems that allocate blocks late report a full disk only then) and only then renamed
    over `path`. A write that fails (no space left, an exception in `write`, a crash) leaves the previous file
    or none, never half of one, and removes its temporary file so the space it took is free again. A full disk
    is raised as an OSError naming `path` itself, not the temporary file, also when `write` said it otherwise
    (torch.save raises a RuntimeError without an errno): a write that failed with no block left was that."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex[:8]}.partial")
    try:
        write(tmp)
        _fsync(tmp)
        os.replace(tmp, path)
    except Exception as err:
        full = disk_full_error(err)
        code = full.errno if full is not None else (errno.ENOSPC if _no_space_left(path.parent) else None)
        tmp.unlink(missing_ok=True)
        if code is not None and (full is None or full.filename != str(path)):
            raise OSError(code, os.strerror(code), str(path)) from err
        raise
    except BaseException:  # Ctrl-C mid-write: no temporary file left behind either
        tmp.unlink(missing_ok=True)
        raise
    _fsync_directory(path.parent)


def write_text_atomically(path: Path, text: str) -> None:
    """`text` as the file `path`, all or nothing (write_atomically)."""
    write_atomically(path, lambda tmp: tmp.write_text(text))


def _no_space_left(folder: Path) -> bool:
    try:
        return os.statvfs(folder).f_bavail == 0
    except OSError:
        return False


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_directory(folder: Path) -> None:
    """The rename itself onto the disk; a file system that cannot sync a folder (some network mounts) is let be:
    the file is whole either way."""
    try:
        fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


@contextmanager
def storage_writes(folder: Path, what: str) -> Iterator[None]:
    """Inside, a full disk or quota becomes one StorageFull naming `folder` and `what` (and the file, when the
    error names one); every other error passes unchanged."""
    try:
        yield
    except StorageFull:
        raise
    except Exception as err:
        full = disk_full_error(err)
        if full is None:
            raise
        written = Path(str(full.filename)) if full.filename else None
        if written is not None and inside(Path(folder), written):
            what = f"{what} ({written.resolve().relative_to(Path(folder).resolve())})"
        raise StorageFull(folder, what, full.errno) from err


# ----- a lock held for a process's lifetime -----------------------------------------------------------
@dataclass(frozen=True)
class LockHolder:
    """Who holds a lock file (or held it last without releasing it): written into the file by its holder, so
    a process that is refused can name the one it waits for."""

    host: str
    pid: int
    since: str  # local time the lock was taken

    @classmethod
    def this_process(cls) -> LockHolder:
        return cls(socket.gethostname(), os.getpid(), time.strftime("%Y-%m-%d %H:%M:%S"))

    @classmethod
    def parse(cls, text: str) -> LockHolder | None:
        """The holder a lock file names; None when it is empty (released cleanly, or not written yet)."""
        try:
            fields = json.loads(text)
            return cls(str(fields["host"]), int(fields["pid"]), str(fields["since"]))
        except (ValueError, TypeError, KeyError):
            return None

    def words(self) -> str:
        return f"host {self.host}, pid {self.pid}, since {self.since}"


class LockBusy(Exception):
    """The lock file is held by another live process (or another open of it in this one)."""

    def __init__(self, path: Path, holder: LockHolder | None) -> None:
        super().__init__(f"{path} is held by {holder.words() if holder else 'a process that has not named itself yet'}")
        self.path, self.holder = path, holder


class HeldLock:
    """An exclusive `flock` on a file, held until `release()` or until the process dies: the kernel drops a
    flock with the last descriptor of its file, so a killed holder never leaves a lock nobody can take, and
    no stale-lock guessing (PIDs, timeouts) is needed. The descriptor is not inherited by child processes
    (O_CLOEXEC), so a Ray process the holder started cannot keep the lock alive after it.

    `previous` is the holder the file still named when this one took it: a process that died holding it."""

    def __init__(self, path: Path, fd: int, holder: LockHolder, previous: LockHolder | None) -> None:
        self.path, self._fd, self.holder, self.previous = path, fd, holder, previous

    def release(self) -> None:
        """Empty the file (a clean release names nobody), then let go of the lock."""
        if self._fd < 0:
            return
        try:
            os.ftruncate(self._fd, 0)
        finally:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = -1

    def __enter__(self) -> HeldLock:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


BUSY_ERRNOS = (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES)
# A lock held by nobody named: its holder is between flock and writing its name, or lock_busy() is probing it.
# Either lasts microseconds, so the lock is tried again for this long before it counts as held.
UNNAMED_HOLDER_WAIT_S = 1.0


class UnsafeLockFile(Exception):
    """A lock file (or its folder) that raybench did not make: a symbolic link, a FIFO, a device, a folder. A
    lock is opened for writing, so following a link would truncate whatever it points to, and opening a FIFO
    blocks until someone writes to it: such a file is refused, never opened for reading or writing."""

    def __init__(self, path: Path, what: str) -> None:
        super().__init__(f"the lock file {str(path)!r} is {what}, not a file raybench wrote; remove it if no "
                         f"raybench is running")
        self.path, self.what = path, what


def _kind_of(mode: int) -> str:
    """An lstat's mode in words: a link is named as one, everything else as file_kinds names it."""
    return "a symbolic link" if stat.S_ISLNK(mode) else kind_words(mode)


def open_lock_file(path: Path, create: bool) -> int | None:
    """A descriptor on the regular file `path`, opened read-write (created with its folder when `create`),
    or None when it does not exist and `create` is false. Neither the file nor its folder may be a link
    (O_NOFOLLOW, and the folder opened with O_NOFOLLOW | O_DIRECTORY), and O_NONBLOCK makes the open of a FIFO
    return at once, so that its kind can be checked (fstat) before anything reads or writes it."""
    folder = path.parent
    if create:
        folder.mkdir(parents=True, exist_ok=True)
    try:
        folder_fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    except OSError as err:
        if err.errno in (errno.ELOOP, errno.ENOTDIR):
            raise UnsafeLockFile(folder, _kind_of(os.lstat(folder).st_mode)) from None
        raise
    try:
        flags = os.O_RDWR | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC | (os.O_CREAT if create else 0)
        try:
            fd = os.open(path.name, flags, 0o644, dir_fd=folder_fd)
        except FileNotFoundError:
            return None
        except OSError as err:
            if err.errno in (errno.ELOOP, errno.EISDIR, errno.ENXIO, errno.ETXTBSY):
                raise UnsafeLockFile(path, _kind_of(os.lstat(path.name, dir_fd=folder_fd).st_mode)) from None
            raise
    finally:
        os.close(folder_fd)
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        raise UnsafeLockFile(path, _kind_of(mode))
    os.set_blocking(fd, True)
    return fd


def take_lock(path: Path) -> HeldLock:
    """Take the exclusive lock `path` (created with its folder if missing) without waiting for a holder, and
    write this process into it; raises LockBusy naming the holder when a live process has it, UnsafeLockFile
    when the path is not a regular file. A lock file left by a process that died is simply taken: its flock
    died with it."""
    fd = open_lock_file(path, create=True)
    assert fd is not None  # created when missing
    deadline = time.monotonic() + UNNAMED_HOLDER_WAIT_S
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            break
        except OSError as err:
            holder = LockHolder.parse(_read_all(fd)) if err.errno in BUSY_ERRNOS else None
            if err.errno in BUSY_ERRNOS and holder is None and time.monotonic() < deadline:
                time.sleep(0.02)
                continue
            os.close(fd)
            if err.errno in BUSY_ERRNOS:
                raise LockBusy(path, holder) from None
            raise
    try:
        previous = LockHolder.parse(_read_all(fd))
        holder = LockHolder.this_process()
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(asdict(holder)).encode(), 0)
        os.fsync(fd)
    except BaseException:
        os.close(fd)  # the flock goes with it: a full disk leaves the lock free, not held by a half-written name
        raise
    return HeldLock(path, fd, holder, previous)


def lock_busy(path: Path) -> LockBusy | None:
    """LockBusy naming the holder when a live process holds the lock `path`, else None. Creates and writes
    nothing: a shared lock is tried and dropped at once (take_lock tolerates such a probe, see above). A path
    that is not a regular file raises UnsafeLockFile, as take_lock would."""
    try:
        fd = open_lock_file(path, create=False)
    except UnsafeLockFile:
        raise
    except OSError:
        return None  # unreadable: take_lock names the problem
    if fd is None:
        return None  # no lock file: nobody ever held it
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        fcntl.flock(fd, fcntl.LOCK_UN)
        return None
    except OSError as err:
        return LockBusy(path, LockHolder.parse(_read_all(fd))) if err.errno in BUSY_ERRNOS else None
    finally:
        os.close(fd)


def _read_all(fd: int) -> str:
    return os.pread(fd, 4096, 0).decode("utf-8", errors="replace")


def missing_folders(folder: Path) -> list[Path]:
    """`folder` and each of its parents that does not exist yet, innermost first: what a command makes."""
    return [path for path in (folder, *folder.absolute().parents) if not path.exists()]


def remove_if_empty(folders: Sequence[Path]) -> None:
    """Remove each folder (innermost first) that is still empty: a failed command leaves no folder it made."""
    for folder in folders:
        with contextlib.suppress(OSError):
            folder.rmdir()


@contextlib.contextmanager
def staging_inside(directory: Path, prefix: str) -> Iterator[Path]:
    """A hidden folder made inside `directory` (and `directory` made, with its missing parents), where a command
    writes its files before renaming each into place, so a reader never sees half of one. The folder is always
    removed; on an error, so is every folder this call made that is left empty."""
    import shutil
    import tempfile

    made = missing_folders(directory)
    directory.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=prefix, dir=directory))
    try:
        yield staging
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        remove_if_empty(made)
        raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
