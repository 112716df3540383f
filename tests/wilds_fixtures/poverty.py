"""A tiny PovertyMap-WILDS (labeled v1.1 + unlabeled v1.0) in the exact on-disk format wilds 2.0.0 reads.

Layout written under `root` (the `root_dir` given to `wilds.get_dataset`):

    poverty_v1.1/RELEASE_v1.1.txt
    poverty_v1.1/dhs_metadata.csv                 country (lower-case DHS name, e.g. "cote_d_ivoire"),
                                                  urban (True/False), wealthpooled (float)
    poverty_v1.1/images/landsat_poverty_img_{i}.npz            key "x": float32 (8, 224, 224), i = row
    poverty_unlabeled_v1.0/RELEASE_v1.0.txt
    poverty_unlabeled_v1.0/unlabeled_metadata.csv             country
    poverty_unlabeled_v1.0/images/landsat_poverty_img_{i}.npz  same as above

Only these columns are written because they are all the loaders read. Splits come from the fold
(default A, the one this fixture fills): its test countries are `test`, its val countries `val`, and
of the remaining ("in-country") rows the loader shuffles and reserves exactly 2000 for id_val (1000)
and id_test (1000), giving only the rest to `train`. So a copy with a non-empty train split needs more
than 2000 in-country rows and images; here 2000 + 24. To keep that cheap, each image is one of a few
seeded payloads of per-band constant values, compressed (np.savez_compressed, ~2 KB each); np.load
reads compressed and plain npz alike. The unlabeled class splits the same way by country but reserves
nothing: train_unlabeled / val_unlabeled / test_unlabeled.
"""
from __future__ import annotations

import io
import pathlib

import numpy as np
import pandas as pd

LABELED_DIR = "poverty_v1.1"
UNLABELED_DIR = "poverty_unlabeled_v1.0"
LABELED_RELEASE = "RELEASE_v1.1.txt"
UNLABELED_RELEASE = "RELEASE_v1.0.txt"
IMAGE_SHAPE = (8, 224, 224)  # BLUE, GREEN, RED, SWIR1, SWIR2, TEMP1, NIR, NIGHTLIGHTS
N_RESERVED_IN_COUNTRY = 2000  # the loader's id_val + id_test
N_TRAIN = 24
# Fold A: train countries stay in-country; val and test countries are the fold's OOD ones.
IN_COUNTRY = ("kenya", "malawi", "nigeria", "zambia")
VAL_COUNTRIES = ("benin", "guinea")
TEST_COUNTRIES = ("angola", "mali")
N_OOD_PER_SPLIT = 12
N_UNLABELED_PER_SPLIT = 8
N_PAYLOADS = 8
SEED = 41


def write(root: pathlib.Path) -> None:
    """Write the labeled and unlabeled copies under `root`, deterministically."""
    rng = np.random.default_rng(SEED)
    payloads = [_npz_bytes(rng) for _ in range(N_PAYLOADS)]
    labeled = labeled_rows(rng)
    _write_copy(root / LABELED_DIR, LABELED_RELEASE, "dhs_metadata.csv", labeled, payloads, rng)
    unlabeled = unlabeled_rows(rng)
    _write_copy(root / UNLABELED_DIR, UNLABELED_RELEASE, "unlabeled_metadata.csv", unlabeled, payloads, rng)


def labeled_rows(rng: np.random.Generator) -> pd.DataFrame:
    """In-country rows enough for the 2000 reserved plus a small train split; urban alternates."""
    countries = [
        *np.resize(IN_COUNTRY, N_RESERVED_IN_COUNTRY + N_TRAIN),
        *np.resize(VAL_COUNTRIES, N_OOD_PER_SPLIT),
        *np.resize(TEST_COUNTRIES, N_OOD_PER_SPLIT),
    ]
    n = len(countries)
    rows = pd.DataFrame({
        "country": countries,
        "urban": np.arange(n) % 4 < 2,  # both values within every country
        "wealthpooled": rng.normal(0.0, 1.0, size=n).round(6),
    })
    return rows.iloc[rng.permutation(n)].reset_index(drop=True)


def unlabeled_rows(rng: np.random.Generator) -> pd.DataFrame:
    countries = [*IN_COUNTRY[:2], *VAL_COUNTRIES, *TEST_COUNTRIES]
    return pd.DataFrame({"country": np.repeat(countries, N_UNLABELED_PER_SPLIT // 2)})


def _npz_bytes(rng: np.random.Generator) -> bytes:
    """One image: a seeded constant per band (compresses ~1000x), in the release's npz form."""
    image = np.broadcast_to(rng.normal(size=(IMAGE_SHAPE[0], 1, 1)), IMAGE_SHAPE).astype(np.float32)
    buffer = io.BytesIO()
    np.savez_compressed(buffer, x=image)
    return buffer.getvalue()


def _write_copy(folder: pathlib.Path, release: str, metadata: str, rows: pd.DataFrame,
                payloads: list[bytes], rng: np.random.Generator) -> None:
    (folder / "images").mkdir(parents=True, exist_ok=True)
    (folder / release).write_text("fixture\n")
    rows.to_csv(folder / metadata, index=False)
    for i, payload in enumerate(rng.integers(0, len(payloads), size=len(rows))):
        (folder / "images" / f"landsat_poverty_img_{i}.npz").write_bytes(payloads[payload])
