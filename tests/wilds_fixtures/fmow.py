"""A tiny FMoW-WILDS (v1.1, labeled and unlabeled in one folder) in the exact format wilds 2.0.0 reads.

Layout written under `root` (the `root_dir` given to `wilds.get_dataset`):

    fmow_v1.1/RELEASE_v1.1.txt
    fmow_v1.1/rgb_metadata.csv           split (train/val/test/seq), category (one of the 62 names),
                                         country_code (alpha-3), timestamp (ISO 8601 with "Z": the loader
                                         compares it with UTC datetimes, so it must be timezone-aware)
    fmow_v1.1/country_code_mapping.csv   alpha-3, region (codes absent from it become region "Other")
    fmow_v1.1/images/rgb_img_{i}.png     224x224 RGB, i = row number in rgb_metadata.csv

The loader, not the file, makes the splits from `split` and the year (scheme time_after_2016):
train/id_val/id_test = train/val/test rows before 2013, val = val rows 2013-2015, test = test rows from
2016; `seq` rows are dropped from the labeled dataset. The unlabeled class (v1.0) reads the same folder
and takes train_unlabeled = seq rows before 2013, val_unlabeled = train/seq rows 2013-2015,
test_unlabeled = train/seq rows from 2016. Years must lie in 2002-2017 (else the year field is -1).
Rows are shuffled, so row number and dataset index differ, as in the release.
"""
from __future__ import annotations

import pathlib

import numpy as np
import pandas as pd
from PIL import Image

DATA_DIR = "fmow_v1.1"
RELEASE = "RELEASE_v1.1.txt"
IMAGE_SIDE = 224  # the loader reports (224, 224) as the original resolution
N_CATEGORIES = 62
COUNTRIES = {"NGA": "Africa", "BRA": "Americas", "IND": "Asia", "FRA": "Europe", "AUS": "Oceania"}
UNMAPPED_COUNTRY = "ATA"  # not in the mapping: the loader files it under region "Other"
ROW_GROUPS = [  # (split column, first year, last year, rows) -> the split the loaders derive
    ("train", 2002, 2012, 16),  # train
    ("val", 2002, 2012, 6),  # id_val
    ("test", 2002, 2012, 6),  # id_test
    ("val", 2013, 2015, 8),  # val
    ("test", 2016, 2017, 8),  # test
    ("seq", 2002, 2012, 6),  # train_unlabeled
    ("train", 2013, 2015, 4),  # val_unlabeled (also in the labeled dataset, outside every split)
    ("seq", 2013, 2015, 2),  # val_unlabeled
    ("train", 2016, 2017, 4),  # test_unlabeled (likewise)
    ("seq", 2016, 2017, 2),  # test_unlabeled
]
SEED = 31


def write(root: pathlib.Path) -> None:
    """Write the shared labeled/unlabeled folder under `root`, deterministically."""
    rng = np.random.default_rng(SEED)
    folder = root / DATA_DIR
    (folder / "images").mkdir(parents=True, exist_ok=True)
    (folder / RELEASE).write_text("fixture\n")
    country_mapping().to_csv(folder / "country_code_mapping.csv", index=False)
    rows = metadata_rows(rng)
    rows.to_csv(folder / "rgb_metadata.csv", index=False)
    for i in range(len(rows)):
        image = _blocky_rgb(rng, IMAGE_SIDE, IMAGE_SIDE)
        Image.fromarray(image).save(folder / "images" / f"rgb_img_{i}.png", compress_level=1)


def country_mapping() -> pd.DataFrame:
    return pd.DataFrame({"alpha-3": list(COUNTRIES), "region": list(COUNTRIES.values())})


def metadata_rows(rng: np.random.Generator) -> pd.DataFrame:
    """Every group cycles through all regions (and "Other"), with spread-out years and random classes."""
    codes = [*COUNTRIES, UNMAPPED_COUNTRY]
    frames = []
    for split, first_year, last_year, n in ROW_GROUPS:
        frames.append(pd.DataFrame({
            "split": split,
            "category": _categories(rng, n),
            "country_code": np.resize(np.roll(codes, len(frames)), n),
            "timestamp": _timestamps(rng, n, first_year, last_year),
        }))
    rows = pd.concat(frames, ignore_index=True)
    return rows.iloc[rng.permutation(len(rows))].reset_index(drop=True)


def _categories(rng: np.random.Generator, n: int) -> list[str]:
    from raybench.data.wilds import compat

    compat.apply()
    from wilds.datasets.fmow_dataset import categories  # the loader's own list of the 62 names

    assert len(categories) == N_CATEGORIES
    return [categories[i] for i in rng.integers(0, N_CATEGORIES, size=n)]


def _timestamps(rng: np.random.Generator, n: int, first_year: int, last_year: int) -> list[str]:
    """Years cycle over the range (so train has several year groups); day and time are random."""
    years = np.resize(np.arange(first_year, last_year + 1), n)
    stamps = [pd.Timestamp(year=int(year), month=1, day=1) + pd.Timedelta(seconds=int(rng.integers(0, 364 * 86400)))
              for year in years]
    return [stamp.strftime("%Y-%m-%dT%H:%M:%SZ") for stamp in stamps]


def _blocky_rgb(rng: np.random.Generator, height: int, width: int) -> np.ndarray:
    """Random 8x8-pixel blocks: varied content that still compresses, so writing stays fast."""
    blocks = rng.integers(0, 256, (height // 8, width // 8, 3), dtype=np.uint8)
    return np.repeat(np.repeat(blocks, 8, axis=0), 8, axis=1)
