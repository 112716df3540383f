"""Datasets: WILDS-shaped splits behind one registry.

`load_dataset(name)` is the only way the rest of raybench gets data. Builders register with
`@DATASETS.register(name)` and take the cache directory and a generation seed.
"""
from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

from raybench.data.base import (
    EVAL_SPLITS,
    LABELED_SPLITS,
    UNLABELED_SPLITS,
    Batch,
    ShiftDataset,
    Split,
    Task,
    TaskKind,
    TrainDefaults,
    Views,
)
from raybench.registry import Registry, import_every_module

DatasetBuilder = Callable[[Path, int], ShiftDataset]
DATASETS: Registry[DatasetBuilder] = Registry("dataset")


def default_data_dir() -> Path:
    """`$RAYBENCH_DATA_DIR`, else `~/.cache/raybench`: generated data is cached here, keyed by its parameters."""
    return Path(os.environ.get("RAYBENCH_DATA_DIR", Path.home() / ".cache" / "raybench")).expanduser()


def load_dataset(name: str, data_dir: Path | None = None, seed: int = 0) -> ShiftDataset:
    builder = DATASETS.get(name)
    return builder(Path(data_dir) if data_dir else default_data_dir(), seed)


import_every_module(__name__, __path__)  # each dataset module registers itself: no list to keep

from raybench.data.wilds import adapter as _wilds

_wilds.register_all()

__all__ = [
    "DATASETS", "EVAL_SPLITS", "LABELED_SPLITS", "UNLABELED_SPLITS", "Batch", "ShiftDataset", "Split",
    "Task", "TaskKind", "TrainDefaults", "Views", "default_data_dir", "load_dataset",
]
