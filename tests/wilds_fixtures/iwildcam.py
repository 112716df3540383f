"""A tiny iWildCam2020-WILDS (labeled v2.0 + unlabeled v1.0) in the exact on-disk format wilds 2.0.0 reads.

Layout written under `root` (the `root_dir` given to `wilds.get_dataset`):

    iwildcam_v2.0/RELEASE_v2.0.txt
    iwildcam_v2.0/metadata.csv        split (the split's *name*: train/val/test/id_val/id_test), filename,
                                      y, location_remapped, sequence_remapped,
                                      datetime ("%Y-%m-%d %H:%M:%S.%f", every row)
    iwildcam_v2.0/train/{filename}    every labeled image, whatever its split; JPEG RGB
    iwildcam_unlabeled_v1.0/RELEASE_v1.0.txt
    iwildcam_unlabeled_v1.0/metadata.csv   uid, location_remapped, sequence_remapped, datetime (may be
                                           empty), y (-1 or 99999 = no usable label; the loader maps both
                                           to -100)
    iwildcam_unlabeled_v1.0/images/{uid}.jpg

The labeled loader asserts that `y`, `location_remapped` and `sequence_remapped` each take every value
in 0..max, so all three are contiguous from 0 here. `uid` must not parse as a number (the loader appends
".jpg" to it as a string), so ids are UUID strings, as in the release. ID splits share the train
locations; `val` and `test` have their own, as in the release. Images are 64x48: the loader does not
assume a size (models resize to 448).
"""
from __future__ import annotations

import pathlib
import uuid

import numpy as np
import pandas as pd
from PIL import Image

LABELED_DIR = "iwildcam_v2.0"
UNLABELED_DIR = "iwildcam_unlabeled_v1.0"
LABELED_RELEASE = "RELEASE_v2.0.txt"
UNLABELED_RELEASE = "RELEASE_v1.0.txt"
IMAGE_SIZE = (64, 48)  # width, height
N_CLASSES = 5
SPLITS = {  # split name -> (number of images, locations)
    "train": (20, (0, 1, 2)),
    "id_val": (8, (0, 1, 2)),
    "id_test": (8, (0, 1, 2)),
    "val": (8, (3, 4)),
    "test": (8, (5, 6)),
}
N_UNLABELED = 24
N_UNLABELED_LOCATIONS = 4
IMAGES_PER_SEQUENCE = 2
SEED = 23


def write(root: pathlib.Path) -> None:
    """Write the labeled and unlabeled copies under `root`, deterministically."""
    rng = np.random.default_rng(SEED)
    labeled = labeled_rows(rng)
    _write_copy(root / LABELED_DIR, LABELED_RELEASE, labeled, "train", labeled["filename"], rng)
    unlabeled = unlabeled_rows(rng)
    _write_copy(root / UNLABELED_DIR, UNLABELED_RELEASE, unlabeled, "images", unlabeled["uid"] + ".jpg", rng)


def labeled_rows(rng: np.random.Generator) -> pd.DataFrame:
    """Every split holds several classes and its locations; classes cycle so all of 0..N_CLASSES-1 occur."""
    frames = []
    for split, (n, locations) in SPLITS.items():
        frames.append(pd.DataFrame({
            "split": split,
            "filename": [f"{_uid(rng)}.jpg" for _ in range(n)],
            "y": rng.permutation(np.arange(n) % N_CLASSES),
            "location_remapped": np.resize(locations, n),
            "datetime": _datetimes(rng, n),
        }))
    rows = pd.concat(frames, ignore_index=True)
    rows["sequence_remapped"] = np.arange(len(rows)) // IMAGES_PER_SEQUENCE
    return rows[["split", "filename", "y", "location_remapped", "sequence_remapped", "datetime"]]


def unlabeled_rows(rng: np.random.Generator) -> pd.DataFrame:
    """Mostly unusable labels (-1, 99999) with a few real classes, and one image without a timestamp."""
    datetimes = _datetimes(rng, N_UNLABELED)
    datetimes[0] = None  # written as an empty cell, which the loader turns into year/month/... = -1
    return pd.DataFrame({
        "uid": [_uid(rng) for _ in range(N_UNLABELED)],
        "location_remapped": np.resize(np.arange(N_UNLABELED_LOCATIONS), N_UNLABELED),
        "sequence_remapped": np.arange(N_UNLABELED) // IMAGES_PER_SEQUENCE,
        "datetime": datetimes,
        "y": rng.choice([-1, 99999, 0, 3], size=N_UNLABELED),
    })


def _uid(rng: np.random.Generator) -> str:
    return str(uuid.UUID(bytes=rng.bytes(16)))


def _datetimes(rng: np.random.Generator, n: int) -> list:
    seconds = rng.integers(0, 3 * 365 * 24 * 3600, size=n)
    stamps = pd.Timestamp("2013-01-01") + pd.to_timedelta(seconds, unit="s")
    return [stamp.strftime("%Y-%m-%d %H:%M:%S.000") for stamp in stamps]


def _write_copy(folder: pathlib.Path, release: str, rows: pd.DataFrame, image_dir: str,
                filenames: pd.Series, rng: np.random.Generator) -> None:
    (folder / image_dir).mkdir(parents=True, exist_ok=True)
    (folder / release).write_text("fixture\n")
    rows.to_csv(folder / "metadata.csv", index=False)
    width, height = IMAGE_SIZE
    for filename in filenames:
        Image.fromarray(_blocky_rgb(rng, height, width)).save(folder / image_dir / filename, quality=80)


def _blocky_rgb(rng: np.random.Generator, height: int, width: int) -> np.ndarray:
    """Random 8x8-pixel blocks: varied content that still compresses, so writing stays fast."""
    blocks = rng.integers(0, 256, (height // 8, width // 8, 3), dtype=np.uint8)
    return np.repeat(np.repeat(blocks, 8, axis=0), 8, axis=1)
