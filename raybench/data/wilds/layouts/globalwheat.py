"""Files a loadable GlobalWheat-WILDS copy needs, so `raybench data check` can name what is absent.

wilds reads every split CSV of the official scheme and the session table when the dataset is built, but
opens an image only when an example is fetched, so a missing image would surface mid-training. This
therefore also checks every image the split CSVs name. The real copy has 6,515 labeled and ~100,000
unlabeled images: the CSVs are read for their `image_name` column only and compared against one listing
of `images/`, not one stat per file.
"""
from __future__ import annotations

import pathlib

import pandas as pd

from raybench.data.wilds.layouts._listing import listdir, read_csv, regular_file

LABELED = ("globalwheat_v1.1", "RELEASE_v1.1.txt", "metadata_domain.csv",
           ("official_train.csv", "official_val.csv", "official_test.csv", "fixed_train_val.csv",
            "fixed_train_test.csv"))
UNLABELED = ("globalwheat_unlabeled_v1.0", "RELEASE_v1.0.txt", "metadata_domain_unlabeled.csv",
             tuple(f"official_{split}_unlabeled.csv" for split in ("train", "val", "test", "extra")))


def missing_files(root: pathlib.Path, unlabeled: bool) -> list[str]:
    """Absent fixed files first, then absent images named by the readable split CSVs, in CSV order."""
    folder_name, release, domains, split_csvs = UNLABELED if unlabeled else LABELED
    folder = pathlib.Path(root) / folder_name
    fixed = [release, domains, *split_csvs]
    missing = [f"{folder_name}/{name}" for name in fixed if not regular_file(folder / name)]
    images = referenced_images(folder, split_csvs)
    absent = images[~images.isin(listed_images(folder))]
    return missing + [f"{folder_name}/images/{name}" for name in absent]


def referenced_images(folder: pathlib.Path, split_csvs: tuple[str, ...]) -> pd.Series:
    """Distinct `image_name`s of the split CSVs that exist and parse; unreadable ones are skipped."""
    names = [read_image_names(folder / name) for name in split_csvs if regular_file(folder / name)]
    names = [series for series in names if series is not None]
    if not names:
        return pd.Series([], dtype=object)
    return pd.concat(names, ignore_index=True).drop_duplicates()


def read_image_names(path: pathlib.Path) -> pd.Series | None:
    try:
        return read_csv(path, usecols=["image_name"], dtype={"image_name": str})["image_name"]
    except (OSError, ValueError):  # pandas' parse errors are ValueErrors, as is a missing image_name column
        return None


def listed_images(folder: pathlib.Path) -> set[str]:
    """Names in `images/` (empty when the directory is absent)."""
    try:
        return set(listdir(folder / "images"))
    except OSError:
        return set()
