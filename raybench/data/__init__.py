"""Datasets: WILDS-shaped splits behind one registry.

`load_dataset(name)` is the only way the rest of raybench gets data. Builders register with
`@DATASETS.register(name)` and take the cache directory and a generation seed.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Callable, Optional

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
from raybench.registry import Registry

DatasetBuilder = Callable[[Path, int], ShiftDataset]
DATASETS: Registry[DatasetBuilder] = Registry("dataset")


def default_data_dir() -> Path:
    """`$RAYBENCH_DATA_DIR`, else `~/.cache/raybench`: generated data is cached here, keyed by its parameters."""
    return Path(os.environ.get("RAYBENCH_DATA_DIR", Path.home() / ".cache" / "raybench")).expanduser()


def load_dataset(name: str, data_dir: Optional[Path] = None, seed: int = 0) -> ShiftDataset:
    builder = DATASETS.get(name)
    return builder(Path(data_dir) if data_dir else default_data_dir(), seed)


# Importing the modules registers their datasets.
from raybench.data import digits_shift  # noqa: E402,F401
from raybench.data import spuco  # noqa: E402,F401
from raybench.data import spoken_digits  # noqa: E402,F401
from raybench.data import text_shift  # noqa: E402,F401
from raybench.data.wilds import adapter as _wilds  # noqa: E402

_wilds.register_all()

__all__ = [
    "DATASETS", "EVAL_SPLITS", "LABELED_SPLITS", "UNLABELED_SPLITS", "Batch", "ShiftDataset", "Split",
    "Task", "TaskKind", "TrainDefaults", "Views", "default_data_dir", "load_dataset",
]
