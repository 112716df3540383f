"""The stage cache: models that earlier stages of multi-stage methods train, stored by their own identity.

JTT, EIIL, Spare, DFR and Dispel all start from a reference ERM model; SSA from a group predictor;
Noisy Student from an ERM+augmentation teacher.
Trials of a sweep that agree on that stage's config (same data, seed, model and reference settings)
should train it once. A stage's identity is the hash of its own resolved config (plus whatever else
defines its data), so the cache is correct across trials, sweeps and replicates alike. Concurrent
trials that need the same stage serialise on a file lock: the first trains, the others wait and load.
Entries are written atomically (temp file, then rename), so a killed trial never leaves half an entry.
"""
from __future__ import annotations

import fcntl
import hashlib
import json
import os
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from raybench.checkpoints import STAGE_MODEL_FILE
from raybench.paths import open_lock_file, write_atomically

SUMMARY_FILE = "summary.json"
# Settings that change where or how fast a stage runs, not what it learns.
NOT_IDENTITY = ("device", "data_dir", "eval_batch_size", "stage_cache", "divergence_check_every")


def stage_key(config: Mapping[str, Any], identity: Mapping[str, Any]) -> str:
    canonical = {k: v for k, v in sorted(config.items()) if k not in NOT_IDENTITY}
    text = json.dumps({"config": canonical, "identity": dict(identity)}, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


@dataclass
class StageEntry:
    """A finished stage: the weights it hands on and the summary of how it got them."""

    key: str
    state: dict[str, Tensor]
    summary: dict[str, Any]
    cached: bool


class StageCache:
    def __init__(self, directory: Path) -> None:
        self.directory = Path(directory)

    def get_or_make(self, key: str, make: Callable[[], tuple[dict[str, Tensor], dict[str, Any]]]) -> StageEntry:
        """The entry for `key`, made by `make()` (weights, summary) only if no one has made it before."""
        entry_dir = self.directory / key
        with self._lock(key):
            if (entry_dir / SUMMARY_FILE).is_file():
                state = torch.load(entry_dir / STAGE_MODEL_FILE, map_location="cpu", weights_only=True)
                return StageEntry(key, state, json.loads((entry_dir / SUMMARY_FILE).read_text()), cached=True)
            state, summary = make()
            entry_dir.mkdir(parents=True, exist_ok=True)
            _atomic(entry_dir / STAGE_MODEL_FILE, lambda path: torch.save(state, path))
            _atomic(entry_dir / SUMMARY_FILE, lambda path: path.write_text(json.dumps(summary, default=str)))
            return StageEntry(key, state, summary, cached=False)

    def weights_file(self, key: str) -> Path:
        return self.directory / key / STAGE_MODEL_FILE

    @contextmanager
    def _lock(self, key: str) -> Iterator[None]:
        fd = open_lock_file(self.directory / f"{key}.lock", create=True)  # a link or FIFO there is refused
        assert fd is not None  # created when missing
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(fd, fcntl.LOCK_UN)
        finally:
            os.close(fd)


def _atomic(path: Path, write: Callable[[Path], Any]) -> None:
    write_atomically(path, write)  # a full --storage leaves no half entry, nor a temporary file taking its space
