"""Which files a loadable iWildCam2020-WILDS copy lacks, for `raybench data check`.

`raybench data check` must say, before a sweep starts, whether `wilds.get_dataset("iwildcam", ...)`
with download=False will load and read every example, and if not, which files to fetch. wilds itself
only notices a missing RELEASE file (then tries to download) and a missing image when a batch first
asks for it. So this lists what its loaders open:

- labeled: `iwildcam_v2.0/` with RELEASE_v2.0.txt, metadata.csv and `train/{filename}` for every row
  (all splits' images live in `train/`);
- unlabeled: `iwildcam_unlabeled_v1.0/` with RELEASE_v1.0.txt, metadata.csv and `images/{uid}.jpg`
  for every row.

Metadata is read for one column only, and each image folder is listed once.
"""
from __future__ import annotations

import pathlib

import pandas as pd

from raybench.data.wilds.layouts._listing import absent, read_csv, regular_file

LABELED_DIR = "iwildcam_v2.0"
UNLABELED_DIR = "iwildcam_unlabeled_v1.0"
LABELED_RELEASE = "RELEASE_v2.0.txt"
UNLABELED_RELEASE = "RELEASE_v1.0.txt"
METADATA = "metadata.csv"


def missing_files(root: pathlib.Path, unlabeled: bool) -> list[str]:
    """Paths relative to `root` that the copy needs and lacks: fixed files first, then images in row order."""
    folder, release = (UNLABELED_DIR, UNLABELED_RELEASE) if unlabeled else (LABELED_DIR, LABELED_RELEASE)
    fixed = [f"{folder}/{release}", f"{folder}/{METADATA}"]
    missing = [path for path in fixed if not regular_file(root / path)]
    names = unlabeled_image_names if unlabeled else labeled_image_names
    images = names(root / folder / METADATA)
    if images is None:
        return missing
    image_dir = "images" if unlabeled else "train"
    return missing + [f"{folder}/{image_dir}/{name}" for name in absent(root / folder / image_dir, images)]


def labeled_image_names(metadata: pathlib.Path) -> pd.Series | None:
    """The `filename` column (files in `train/`); None if the metadata cannot be read."""
    rows = _read(metadata, "filename")
    return None if rows is None else rows["filename"]


def unlabeled_image_names(metadata: pathlib.Path) -> pd.Series | None:
    """`{uid}.jpg` per row (files in `images/`); None if the metadata cannot be read."""
    rows = _read(metadata, "uid")
    return None if rows is None else rows["uid"] + ".jpg"


def _read(metadata: pathlib.Path, column: str) -> pd.DataFrame | None:
    try:
        return read_csv(metadata, usecols=[column], dtype={column: "str"})
    except (OSError, ValueError):  # absent, empty, malformed or lacking the column
        return None
