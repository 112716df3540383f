"""Which files a loadable FMoW-WILDS copy lacks, for `raybench data check`.

`raybench data check` must say, before a sweep starts, whether `wilds.get_dataset("fmow", ...)` with
download=False will load and read every example, and if not, which files to fetch. wilds itself only
notices a missing RELEASE file (then tries to download) and a missing image when a batch first asks
for it. Labeled (v1.1) and unlabeled (v1.0) data share one folder, `fmow_v1.1/`, but read different rows:

- labeled: RELEASE_v1.1.txt, rgb_metadata.csv, country_code_mapping.csv and `images/rgb_img_{i}.png`
  for every row number i whose split is not "seq";
- unlabeled: rgb_metadata.csv, country_code_mapping.csv (its class only checks that the folder
  exists, not the RELEASE file) and the images of the rows it keeps: "seq" rows before 2013 and
  non-val/test rows from 2013 on (split scheme time_after_2016, as the loader computes it).

Two metadata columns are read, and the image folder is listed once.
"""
from __future__ import annotations

import datetime
import pathlib

import numpy as np
import pandas as pd

from raybench.data.wilds.layouts._listing import absent, read_csv, regular_file

DATA_DIR = "fmow_v1.1"
RELEASE = "RELEASE_v1.1.txt"
METADATA = "rgb_metadata.csv"
COUNTRY_MAPPING = "country_code_mapping.csv"
OOD_VAL_START = datetime.datetime(2013, 1, 1, tzinfo=datetime.timezone.utc)  # time_after_2016 minus 3 years


def missing_files(root: pathlib.Path, unlabeled: bool) -> list[str]:
    """Paths relative to `root` that the copy needs and lacks: fixed files first, then images by row."""
    fixed = [METADATA, COUNTRY_MAPPING] if unlabeled else [RELEASE, METADATA, COUNTRY_MAPPING]
    missing = [f"{DATA_DIR}/{name}" for name in fixed if not regular_file(root / DATA_DIR / name)]
    rows = read_rows(root / DATA_DIR / METADATA, unlabeled)
    if rows is None:
        return missing
    names = "rgb_img_" + pd.Series(rows).astype(str) + ".png"
    return missing + [f"{DATA_DIR}/images/{name}" for name in absent(root / DATA_DIR / "images", names)]


def read_rows(metadata: pathlib.Path, unlabeled: bool) -> np.ndarray | None:
    """Row numbers whose image the labeled or unlabeled loader reads; None if the metadata is unreadable."""
    try:
        table = read_csv(metadata, usecols=["split", "timestamp"])
        keep = unlabeled_mask(table) if unlabeled else np.asarray(table["split"] != "seq")
    except (OSError, ValueError, TypeError):  # absent, malformed, lacking a column, naive timestamps
        return None
    return np.flatnonzero(keep)


def unlabeled_mask(table: pd.DataFrame) -> np.ndarray:
    """train_unlabeled (seq before 2013) | val_unlabeled and test_unlabeled (not val/test, from 2013)."""
    ood = np.asarray(pd.to_datetime(table["timestamp"]) >= OOD_VAL_START)
    split = table["split"]
    return np.asarray(((split == "seq") & ~ood) | (~split.isin(["val", "test"]) & ood))
