"""Directory listings and reads shared by the layout modules: one listing per folder, then vectorised membership;
every file examined (os.stat) before it is opened.

A check must never hang: a FIFO where metadata.csv belongs blocks its reader until something writes to it, so a
fixed file or a table that exists as anything but a regular file (a FIFO, a socket, a device, a folder) raises
NotARegularFile naming it, and is never opened. In a listing, only regular files count as present: a patch that
is a FIFO is reported as missing, as the loader could not read it either.
"""
from __future__ import annotations

import os
import pathlib
from typing import Any

import pandas as pd

from raybench.file_kinds import NotARegularFile, regular_file

__all__ = ["NotARegularFile", "absent", "listdir", "read_csv", "regular_file"]


def listdir(directory: pathlib.Path) -> list[str]:
    """The names of the regular files in `directory` (links followed); none when it is absent (every file in it
    is then missing). The entries' types come with the listing: no file is opened or examined one by one."""
    try:
        with os.scandir(directory) as entries:
            return [entry.name for entry in entries if _is_regular(entry)]
    except (FileNotFoundError, NotADirectoryError):
        return []


def _is_regular(entry: os.DirEntry[str]) -> bool:
    try:
        return entry.is_file()
    except OSError:  # a link that cannot be followed: no file the loader could read
        return False


def absent(directory: pathlib.Path, names: pd.Series) -> list[str]:
    """The `names` not in `directory`, in order, without repeats: one listing, one membership test."""
    return names[~names.isin(listdir(directory))].drop_duplicates().tolist()


def read_csv(path: pathlib.Path, **kwargs: Any) -> pd.DataFrame:
    """pandas.read_csv of `path` once it is known to be a regular file: FileNotFoundError when it is absent (the
    layouts treat that as unreadable), NotARegularFile when it is something else."""
    if not regular_file(path):
        raise FileNotFoundError(2, "No such file", str(path))
    return pd.read_csv(path, **kwargs)
