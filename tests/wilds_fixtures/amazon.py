"""A tiny Amazon-WILDS 2.1 copy in the exact on-disk format `wilds` reads with download=False.

`amazon_v2.1/` holds `RELEASE_v2.1.txt`, `reviews.csv` and `splits/user.csv`; the unlabeled class reads the
same folder (its version 1.0 is an alias of `amazon_v2.1`). `reviews.csv` is written with every string
quoted (`csv.QUOTE_NONNUMERIC`), as the loader reads it: unquoted fields are numbers or booleans. Row i of
`splits/user.csv` gives the split of row i of `reviews.csv` (-1 excluded, 0 train, 1 val, 2 id_val, 3 test,
4 id_test, 11/12/13 the unlabeled val/test/extra splits). OOD users (val, test, their unlabeled splits,
extra) are disjoint from the train users, whose other reviews make id_val and id_test, as in the official
user split. Every user has several reviews per split so per-user accuracy (the 10th-percentile metric) and
the user group loader have something to work on.
"""
from __future__ import annotations

import csv
import datetime as dt
import pathlib

import numpy as np
import pandas as pd

VERSION = "2.1"
FOLDER = f"amazon_v{VERSION}"
SEED = 20_210_712
CATEGORIES = ["Books", "Electronics", "Home_and_Kitchen", "Clothing_Shoes_and_Jewelry", "Movies_and_TV"]
# (split code, number of users, reviews per user); train users also write the id_val / id_test reviews.
TRAIN_USERS, OOD_USERS = 8, 4
SPLIT_PLAN = {"val": (1, 6), "test": (3, 6), "val_unlabeled": (11, 4), "test_unlabeled": (12, 6)}
EXTRA_CODE, EXCLUDED_CODE = 13, -1
TRAIN_REVIEWS, ID_REVIEWS = 6, 3
POSITIVE = ["great", "excellent", "sturdy", "lovely", "works perfectly"]
NEGATIVE = ["broken", "flimsy", "disappointing", "useless", "stopped working"]
NOUNS = ["charger", "novel", "kettle", "jacket", "cable", "movie", "lamp", "boots"]


def write(root: pathlib.Path) -> None:
    """Write `root/amazon_v2.1/` (labeled and unlabeled splits share the folder)."""
    rng = np.random.default_rng(SEED)
    folder = pathlib.Path(root) / FOLDER
    (folder / "splits").mkdir(parents=True, exist_ok=True)
    reviews, codes = _reviews(rng)
    order = rng.permutation(len(reviews))  # the real file interleaves splits
    reviews = reviews.iloc[order].reset_index(drop=True)
    codes = codes[order]
    reviews.to_csv(folder / "reviews.csv", index=False, quoting=csv.QUOTE_NONNUMERIC)
    pd.DataFrame({"split": codes}).to_csv(folder / "splits" / "user.csv", index=False)
    (folder / f"RELEASE_v{VERSION}.txt").write_text(f"amazon v{VERSION} (raybench test fixture)\n")


def _reviews(rng: np.random.Generator) -> tuple[pd.DataFrame, np.ndarray]:
    """All rows with their split codes, user by user."""
    rows: list[dict] = []
    codes: list[int] = []
    for user in _user_ids(rng, TRAIN_USERS):
        for code, count in ((0, TRAIN_REVIEWS), (2, ID_REVIEWS), (4, ID_REVIEWS)):
            rows += [_review(rng, user) for _ in range(count)]
            codes += [code] * count
    for code, per_user in SPLIT_PLAN.values():
        for user in _user_ids(rng, OOD_USERS):
            rows += [_review(rng, user) for _ in range(per_user)]
            codes += [code] * per_user
    for code, users, per_user in ((EXTRA_CODE, OOD_USERS, 4), (EXCLUDED_CODE, 2, 3)):
        for user in _user_ids(rng, users):
            rows += [_review(rng, user) for _ in range(per_user)]
            codes += [code] * per_user
    return pd.DataFrame(rows), np.asarray(codes, dtype=np.int64)


def _user_ids(rng: np.random.Generator, n: int) -> list[str]:
    """Reviewer ids look like Amazon's: 'A' followed by 13 upper-case letters and digits."""
    alphabet = np.array(list("ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"))
    return ["A" + "".join(rng.choice(alphabet, 13)) for _ in range(n)]


def _review(rng: np.random.Generator, user: str) -> dict:
    """One review; the star rating shows in the wording, so the text is (weakly) learnable."""
    stars = int(rng.integers(1, 6))
    words = POSITIVE if stars >= 4 else NEGATIVE
    noun = str(rng.choice(NOUNS))
    text = f'This {noun} is {rng.choice(words)}, and "{rng.choice(words)}" says it all. {stars} stars.'
    day = dt.date(2008, 1, 1) + dt.timedelta(days=int(rng.integers(0, 365 * 10)))
    unix = int(dt.datetime(day.year, day.month, day.day, tzinfo=dt.timezone.utc).timestamp())
    return {
        "reviewerID": user,
        "asin": "B00" + "".join(map(str, rng.integers(0, 10, 7))),
        "reviewTime": f"{day.month:02d} {day.day}, {day.year}",
        "unixReviewTime": unix,
        "reviewText": text,
        "summary": f"{rng.choice(words).capitalize()} {noun}",
        "verified": bool(rng.random() < 0.8),
        "category": str(rng.choice(CATEGORIES)),
        "reviewYear": day.year,
        "overall": float(stars),
    }
