"""Which files a loadable Camelyon17-WILDS copy lacks, for `raybench data check`.

`raybench data check` must say, before a sweep starts, whether `wilds.get_dataset("camelyon17", ...)`
with download=False will load and read every example, and if not, which files to fetch. wilds itself
only notices a missing RELEASE file (then tries to download) and a missing patch when a batch first
asks for it, possibly hours into a run. So this lists what its loaders open:

- labeled: `camelyon17_v1.0/` with RELEASE_v1.0.txt, metadata.csv and
  `patches/patient_{p}_node_{n}/patch_patient_{p}_node_{n}_x_{x}_y_{y}.png` for every row;
- unlabeled: `camelyon17_unlabeled_v1.0/` with the same files (tumor -1 in its metadata).

The real metadata has ~450k (labeled) and ~3M (unlabeled) rows, so paths are built with vectorised
string operations and compared with one `os.listdir` per patch folder.
"""
from __future__ import annotations

import pathlib

import pandas as pd

from raybench.data.wilds.layouts._listing import listdir, read_csv, regular_file

LABELED_DIR = "camelyon17_v1.0"
UNLABELED_DIR = "camelyon17_unlabeled_v1.0"
RELEASE = "RELEASE_v1.0.txt"
METADATA = "metadata.csv"


def missing_files(root: pathlib.Path, unlabeled: bool) -> list[str]:
    """Paths relative to `root` that the copy needs and lacks: fixed files first, then patches in row order."""
    folder = UNLABELED_DIR if unlabeled else LABELED_DIR
    fixed = [f"{folder}/{RELEASE}", f"{folder}/{METADATA}"]
    missing = [path for path in fixed if not regular_file(root / path)]
    patches = patch_paths(root / folder / METADATA)
    if patches is None:
        return missing
    return missing + [f"{folder}/{path}" for path in absent(root / folder, *patches)]


def patch_paths(metadata: pathlib.Path) -> tuple[pd.Series, pd.Series] | None:
    """Each row's patch folder and patch path (relative to the dataset folder), as the loader spells
    them; None if the metadata cannot be read."""
    try:
        rows = read_csv(metadata, usecols=["patient", "node", "x_coord", "y_coord"], dtype={"patient": "str"})
    except (OSError, ValueError):  # absent, empty, malformed or lacking a column
        return None
    name = "patient_" + rows["patient"] + "_node_" + rows["node"].astype(str)
    coords = "_x_" + rows["x_coord"].astype(str) + "_y_" + rows["y_coord"].astype(str)
    directories = "patches/" + name
    return directories, directories + "/patch_" + name + coords + ".png"


def absent(folder: pathlib.Path, directories: pd.Series, paths: pd.Series) -> list[str]:
    """The `paths` (relative to `folder`, in `directories`) not on disk, in order, without repeats.

    One listing per directory, then a single vectorised membership test."""
    existing = {f"{directory}/{name}" for directory in directories.unique()
                for name in listdir(folder / directory)}
    return paths[~paths.isin(existing)].drop_duplicates().tolist()
