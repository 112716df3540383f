"""Which files a loadable PovertyMap-WILDS copy lacks, for `raybench data check`.

`raybench data check` must say, before a sweep starts, whether `wilds.get_dataset("poverty", ...)`
with download=False will load and read every example, and if not, which files to fetch. wilds itself
only notices a missing RELEASE file (then tries to download) and a missing image when a batch first
asks for it. So this lists what its loaders open:

- labeled: `poverty_v1.1/` with RELEASE_v1.1.txt, dhs_metadata.csv and
  `images/landsat_poverty_img_{i}.npz` for every row number i;
- unlabeled: `poverty_unlabeled_v1.0/` with RELEASE_v1.0.txt, unlabeled_metadata.csv and the same
  image names under its own `images/`.

Images are named by row number, so only the row count is needed: one column is read, and the image
folder is listed once.
"""
from __future__ import annotations

import pathlib

import pandas as pd

from raybench.data.wilds.layouts._listing import absent, read_csv, regular_file

LABELED = ("poverty_v1.1", "RELEASE_v1.1.txt", "dhs_metadata.csv")
UNLABELED = ("poverty_unlabeled_v1.0", "RELEASE_v1.0.txt", "unlabeled_metadata.csv")


def missing_files(root: pathlib.Path, unlabeled: bool) -> list[str]:
    """Paths relative to `root` that the copy needs and lacks: fixed files first, then images by row."""
    folder, release, metadata = UNLABELED if unlabeled else LABELED
    fixed = [f"{folder}/{release}", f"{folder}/{metadata}"]
    missing = [path for path in fixed if not regular_file(root / path)]
    n_rows = row_count(root / folder / metadata)
    if n_rows is None:
        return missing
    names = image_names(n_rows)
    return missing + [f"{folder}/images/{name}" for name in absent(root / folder / "images", names)]


def row_count(metadata: pathlib.Path) -> int | None:
    """Rows in the metadata (read through its `country` column, which the loader needs); None if unreadable."""
    try:
        return len(read_csv(metadata, usecols=["country"]))
    except (OSError, ValueError):  # absent, empty, malformed or lacking the column
        return None


def image_names(n_rows: int) -> pd.Series:
    """The loader's `landsat_poverty_img_{idx}.npz`, idx being the row number."""
    return "landsat_poverty_img_" + pd.Series(range(n_rows)).astype(str) + ".npz"
