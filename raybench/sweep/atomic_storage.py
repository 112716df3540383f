"""Ray Tune's and Ray Train's own files under `--storage`, written all or nothing.

Ray uploads its experiment state, trial results and checkpoints into the storage folder with Arrow's
`copy_files`, which writes each file in place. When that folder fills up, Ray leaves half files behind: a
truncated `experiment_state-*.json` makes `Tuner.restore` fail, so `--resume` could not continue even after
space was freed, and an empty `error.pkl` crashes Tune's result grid. Given this file system (a local one
whose every new file goes to a temporary name, is fsynced and only then renamed over the target, see
raybench.paths.write_atomically) a failed upload leaves the previous version of each file or none, and its
temporary file is removed, so the space it took is free again for the writes that follow.

The files of Tune's state that its restore unpickles are sealed as they are written (raybench.sweep.state_seal),
so that a `--resume` can refuse any it did not write.

Imported only where Ray already is (ray_backend, ray_trial): Arrow's file system module costs most of a second.
"""
from __future__ import annotations

import hashlib
import os
import uuid
from pathlib import Path
from typing import Any

import pyarrow
import pyarrow.fs as pafs

from raybench.paths import write_atomically
from raybench.sweep import state_seal


class AtomicOutput:
    """A file being written: a temporary file beside `path`, renamed over it when closed after successful writes.
    The first failed write removes it at once (Arrow abandons a stream whose write failed without closing it, and
    its space must be free for the writes that follow); so does dropping it unclosed. A file of Tune's state
    (state_seal.is_sealed_name) is hashed as it is written and sealed before it is renamed into place."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.tmp = str(Path(path).with_name(f".{Path(path).name}.{uuid.uuid4().hex[:8]}.partial"))
        self.file = open(self.tmp, "wb")  # noqa: SIM115  (this object is the context manager; it closes the file)
        self.failed = False
        self.digest = hashlib.sha256() if state_seal.is_sealed_name(Path(path).name) else None

    @property
    def closed(self) -> bool:
        return self.file.closed

    def write(self, data: Any) -> int:
        try:
            written = self.file.write(data)
            if self.digest is not None:
                self.digest.update(memoryview(data).cast("B")[:written])
            return written
        except BaseException:
            self.abandon()
            raise

    def flush(self) -> None:
        try:
            self.file.flush()
        except BaseException:
            self.abandon()
            raise

    def abandon(self) -> None:
        """Close and remove the temporary file; `path` keeps what it had."""
        self.failed = True
        try:
            self.file.close()
        except OSError:  # the buffered rest cannot be written either
            pass
        Path(self.tmp).unlink(missing_ok=True)

    def close(self) -> None:
        if self.file.closed:
            return
        try:
            if not self.failed:
                self.file.flush()
                os.fsync(self.file.fileno())  # a late-allocating file system reports a full disk here
                if self.digest is not None:
                    state_seal.seal(Path(self.path), self.digest.digest())
        except BaseException:
            self.failed = True
            raise
        finally:
            try:
                self.file.close()
            except OSError:
                self.failed = True
            if self.failed:
                Path(self.tmp).unlink(missing_ok=True)
            else:
                os.replace(self.tmp, self.path)

    def __del__(self) -> None:
        if getattr(self, "file", None) is not None and not self.file.closed:
            self.abandon()


class AtomicLocalFiles(pafs.FileSystemHandler):
    """The local file system, except that every file opened for writing (or copied) appears whole or not at
    all. Picklable by reference, so Ray hands it to the trial processes that upload checkpoints."""

    def __init__(self) -> None:
        self.local = pafs.LocalFileSystem()

    def __eq__(self, other: object) -> bool:
        return isinstance(other, AtomicLocalFiles)

    def __ne__(self, other: object) -> bool:
        return not self == other

    def __hash__(self) -> int:
        return hash(AtomicLocalFiles)

    def get_type_name(self) -> str:
        return "raybench-atomic-local"

    def normalize_path(self, path: str) -> str:
        return self.local.normalize_path(path)

    def get_file_info(self, paths: list[str]) -> list[pafs.FileInfo]:
        return self.local.get_file_info(paths)

    def get_file_info_selector(self, selector: pafs.FileSelector) -> list[pafs.FileInfo]:
        return self.local.get_file_info(selector)

    def create_dir(self, path: str, recursive: bool) -> None:
        self.local.create_dir(path, recursive=recursive)

    def delete_dir(self, path: str) -> None:
        self.local.delete_dir(path)

    def delete_dir_contents(self, path: str, missing_dir_ok: bool = False) -> None:
        self.local.delete_dir_contents(path, missing_dir_ok=missing_dir_ok)

    def delete_root_dir_contents(self) -> None:
        raise OSError("raybench's storage file system never empties the root folder")

    def delete_file(self, path: str) -> None:
        self.local.delete_file(path)

    def move(self, src: str, dest: str) -> None:
        self.local.move(src, dest)

    def copy_file(self, src: str, dest: str) -> None:
        def copy_and_seal(tmp: Path) -> None:
            self.local.copy_file(src, str(tmp))
            if state_seal.is_sealed_name(Path(dest).name):
                state_seal.seal(Path(dest), hashlib.sha256(tmp.read_bytes()).digest())

        write_atomically(Path(dest), copy_and_seal)

    def open_input_stream(self, path: str) -> pyarrow.NativeFile:
        return self.local.open_input_stream(path)

    def open_input_file(self, path: str) -> pyarrow.NativeFile:
        return self.local.open_input_file(path)

    def open_output_stream(self, path: str, metadata: Any) -> pyarrow.NativeFile:
        return pyarrow.PythonFile(AtomicOutput(path), mode="w")

    def open_append_stream(self, path: str, metadata: Any) -> pyarrow.NativeFile:
        return self.local.open_append_stream(path, metadata=metadata)


def atomic_local_filesystem() -> pafs.FileSystem:
    """What `storage_filesystem` Ray Tune and Ray Train are given for a local (or NFS-mounted) `--storage`."""
    return pafs.PyFileSystem(AtomicLocalFiles())
