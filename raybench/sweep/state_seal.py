"""Tune's saved state, sealed by the raybench that wrote it, so that `--resume` never unpickles a planted file.

Tune's restore unpickles what the experiment folder under `--storage` holds: `tuner.pkl`, the searcher's and
the callbacks' state, the trials' JSON with cloudpickled fields, a trial's `error.pkl`. Whoever can write to
that folder (a shared scratch disk, a copied archive) could leave a pickle there that runs code in the next
`--resume`. So every such file is sealed as it is written: raybench's storage file system (atomic_storage)
appends an HMAC-SHA256 of its folder's name, its own name and its content to the folder's seal ledger, keyed
with a secret kept outside `--storage` (STATE_KEY_ENV, else the user's state folder, readable by the user
alone). Before a resume hands the folder to Tune, every file of those names must carry a seal made with this
key; any other is refused by name, and nothing of it is read as a pickle.

A ledger lists every version of a file it sealed: a crash between the seal and the rename leaves the previous
version sealed too, and replaying an older version of a file raybench wrote runs no foreign code.

Standard library only: the driver checks before Ray is imported, and Ray's trial processes seal in turn.
"""
from __future__ import annotations

import errno
import fnmatch
import hashlib
import hmac
import os
import secrets
import stat
from dataclasses import dataclass
from pathlib import Path

STATE_KEY_ENV = "RAYBENCH_STATE_KEY"  # a file holding the key: one per user, or one shared by a cluster's nodes
LEDGER = ".raybench-seals"
KEY_BYTES = 32
MAX_LEDGER_BYTES = 64 * 2**20  # a ledger grows by a line per saved state: a month of sweeping is a few MB

# The files Tune unpickles on restore, all written by the sweep's driver: `tuner.pkl` (tune/impl/tuner_internal.py),
# the search algorithm's state (Searcher, SearchGenerator and BasicVariantGenerator `restore_from_dir`: pickles,
# whatever their suffix), the callbacks' (tune/callback.py), the trials' JSON with cloudpickled fields
# (Trial.__setstate__, TuneFunctionDecoder) and a failed trial's `error.pkl` (Trial.get_pickled_error).
# `params.pkl`, which each trial writes, is never read back, and is written where the driver's key may not be.
SEALED_PATTERNS = ("tuner.pkl", "trainer.pkl", "error.pkl", "searcher-state-*.pkl", "callback-states-*.pkl",
                   "experiment_state-*.json", "basic-variant-state-*.json", "search_gen_state-*.json")


class UnsealedState(Exception):
    """Files of a sweep's saved state that this raybench did not write: the resume is refused."""

    def __init__(self, files: list[Path], folder: Path) -> None:
        shown = ", ".join(str(f.relative_to(folder)) for f in files[:3]) + (f" and {len(files) - 3} more"
                                                                            if len(files) > 3 else "")
        super().__init__(f"--resume: the saved state in {str(folder)!r} holds {shown}, which this raybench did not "
                         f"write (no seal made with the key in {str(state_key_path())!r}); a resume would unpickle it "
                         f"and run whatever it holds, so it is refused: start the sweep again under a new --name")
        self.files, self.folder = files, folder


class StateKeyError(Exception):
    """The key file cannot be made or read (its folder unwritable, a link, the wrong size)."""


def is_sealed_name(name: str) -> bool:
    """Whether a file of this name is one Tune would unpickle on restore, so is sealed and checked."""
    return any(fnmatch.fnmatchcase(name, pattern) for pattern in SEALED_PATTERNS)


def state_key_path() -> Path:
    """Where the key lives: STATE_KEY_ENV, else $XDG_STATE_HOME/raybench, else ~/.local/state/raybench."""
    named = os.environ.get(STATE_KEY_ENV)
    if named:
        return Path(named).expanduser()
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "raybench" / "resume.key"


def state_key() -> bytes:
    """The user's key, made on first use: random, written once, readable by its owner alone."""
    path = state_key_path()
    try:
        return _read_key(path)
    except FileNotFoundError:
        pass
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    except FileExistsError:  # another process made it first
        return _read_key(path)
    try:
        os.write(fd, secrets.token_bytes(KEY_BYTES))
        os.fsync(fd)
    finally:
        os.close(fd)
    return _read_key(path)


def _read_key(path: Path) -> bytes:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as err:
        if err.errno == errno.ENOENT:
            raise
        raise StateKeyError(f"the resume key {str(path)!r} cannot be read ({err.strerror or err})") from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise StateKeyError(f"the resume key {str(path)!r} is not a regular file")
        key = os.read(fd, KEY_BYTES + 1)
    finally:
        os.close(fd)
    if len(key) != KEY_BYTES:
        raise StateKeyError(f"the resume key {str(path)!r} holds {len(key)} bytes, expected {KEY_BYTES}")
    return key


def seal_of(key: bytes, path: Path, content_sha256: bytes) -> str:
    """The seal of one version of `path`: bound to its folder's and its own name, so a file moved to another
    place or another sweep's folder does not carry its seal along."""
    message = f"{path.parent.name}/{path.name}".encode() + b"\0" + content_sha256
    return hmac.new(key, message, hashlib.sha256).hexdigest()


def seal(path: Path, content_sha256: bytes) -> None:
    """Add the seal of `path`'s new content to its folder's ledger (appended and fsynced before the file is
    renamed into place, so a file in place is never newer than its seal). The ledger is opened without
    following a link, and must be a regular file."""
    line = f"{path.name}\t{seal_of(state_key(), path, content_sha256)}\n".encode()
    fd = _open_ledger(path.parent, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    try:
        os.write(fd, line)
        os.fsync(fd)
    finally:
        os.close(fd)


def _open_ledger(folder: Path, flags: int) -> int:
    fd = os.open(folder / LEDGER, flags | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, 0o644)
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise OSError(errno.EINVAL, "the seal ledger is not a regular file", str(folder / LEDGER))
    return fd


def _ledger_seals(folder: Path) -> set[str]:
    """Every seal the folder's ledger lists; none when it is missing, unreadable, too large or not a file."""
    try:
        fd = _open_ledger(folder, os.O_RDONLY)
    except OSError:
        return set()
    try:
        if os.fstat(fd).st_size > MAX_LEDGER_BYTES:
            return set()
        with os.fdopen(os.dup(fd), "rb") as ledger:
            text = ledger.read().decode("ascii", errors="replace")
    finally:
        os.close(fd)
    return {line.split("\t", 1)[1] for line in text.splitlines() if "\t" in line}


def _sha256_of(path: Path) -> bytes | None:
    """The content's digest, read without following a link or blocking on a FIFO; None when it is no file."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        digest = hashlib.sha256()
        while chunk := os.read(fd, 1 << 20):
            digest.update(chunk)
        return digest.digest()
    finally:
        os.close(fd)


@dataclass(frozen=True)
class SealCheck:
    """What a check of one experiment folder found: the state files it checked, and those refused."""

    checked: int
    unsealed: list[Path]


def check_sealed(folder: Path) -> SealCheck:
    """Every state file under `folder` (links not followed) against its folder's ledger. A link, a FIFO or
    any other non-file under a state file's name is refused like a file without a seal."""
    key = state_key()
    checked, unsealed = 0, []
    for root, dirs, files in os.walk(folder, followlinks=False):
        here = Path(root)
        candidates = [name for name in [*files, *dirs] if is_sealed_name(name)]
        if not candidates:
            continue
        seals = _ledger_seals(here)
        for name in sorted(candidates):
            checked += 1
            digest = _sha256_of(here / name)
            if digest is None or seal_of(key, here / name, digest) not in seals:
                unsealed.append(here / name)
    return SealCheck(checked, unsealed)


def require_sealed(folder: Path) -> None:
    """Raise UnsealedState when any state file under `folder` was not written by this raybench."""
    found = check_sealed(folder)
    if found.unsealed:
        raise UnsealedState(found.unsealed, folder)
