"""Directory listings shared by the layout modules: one `listdir` per folder, then vectorised membership."""
from __future__ import annotations

import os
import pathlib

import pandas as pd


def listdir(directory: pathlib.Path) -> list[str]:
    """The names in `directory`; none when it is absent (every file in it is then missing)."""
    try:
        return os.listdir(directory)
    except (FileNotFoundError, NotADirectoryError):
        return []


def absent(directory: pathlib.Path, names: pd.Series) -> list[str]:
    """The `names` not in `directory`, in order, without repeats: one listing, one membership test."""
    return names[~names.isin(listdir(directory))].drop_duplicates().tolist()
