"""A tiny CivilComments-WILDS 1.0 copy (labeled and unlabeled) in the exact format `wilds` reads.

`civilcomments_v1.0/all_data_with_identities.csv` and
`civilcomments_unlabeled_v1.0/unlabeled_data_with_identities.csv` are pandas CSVs whose first column is an
unnamed row index (the loaders read them with `index_col=0`). Columns the loaders read: `comment_text`,
`split` (train / val / test; the unlabeled loader overwrites it with 13), `toxicity`, the 8 identity columns
and the 7 auxiliary ones, all fractions of annotators in [0, 1] that the loader thresholds at 0.5.

Worst-group accuracy is a minimum over 16 groups (8 identities x toxic / non-toxic), and an empty group
counts as accuracy 0, so every split gets, for every identity, comments of both labels that mention it.
Values are kept away from the 0.5 threshold so the labels are unambiguous.
"""
from __future__ import annotations

import pathlib

import numpy as np
import pandas as pd

SEED = 20_190_513
LABELED, UNLABELED = "civilcomments_v1.0", "civilcomments_unlabeled_v1.0"
IDENTITIES = ["male", "female", "LGBTQ", "christian", "muslim", "other_religions", "black", "white"]
AUXILIARY = ["severe_toxicity", "obscene", "threat", "insult", "identity_attack", "sexual_explicit"]
# comments per (identity, label) in each split, plus comments that mention no identity
PER_GROUP = {"train": 4, "val": 3, "test": 3}
NO_IDENTITY = {"train": 8, "val": 4, "test": 4}
UNLABELED_COUNT = 48
SUBJECTS = {
    "male": "men", "female": "women", "LGBTQ": "gay people", "christian": "christians",
    "muslim": "muslims", "other_religions": "buddhists", "black": "black people", "white": "white people",
}


def write(root: pathlib.Path) -> None:
    """Write both folders under `root`, each with its RELEASE file."""
    rng = np.random.default_rng(SEED)
    root = pathlib.Path(root)
    labeled = pd.concat([_split(rng, name) for name in PER_GROUP], ignore_index=True)
    unlabeled = _comments(rng, [None] * UNLABELED_COUNT, rng.integers(0, 2, UNLABELED_COUNT), "extra_unlabeled")
    _save(root / LABELED, "all_data_with_identities.csv", labeled)
    _save(root / UNLABELED, "unlabeled_data_with_identities.csv", unlabeled)


def _save(folder: pathlib.Path, name: str, frame: pd.DataFrame) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    frame.to_csv(folder / name)  # with the unnamed index column, as the real files have
    (folder / "RELEASE_v1.0.txt").write_text("civilcomments v1.0 (raybench test fixture)\n")


def _split(rng: np.random.Generator, split: str) -> pd.DataFrame:
    """Every (identity, label) group of this split, then identity-free comments, in shuffled order."""
    identities: list[str | None] = []
    labels: list[int] = []
    for identity in IDENTITIES:
        for label in (0, 1):
            identities += [identity] * PER_GROUP[split]
            labels += [label] * PER_GROUP[split]
    identities += [None] * NO_IDENTITY[split]
    labels += list(rng.integers(0, 2, NO_IDENTITY[split]))
    order = rng.permutation(len(labels))
    return _comments(rng, [identities[i] for i in order], np.asarray(labels)[order], split)


def _comments(rng: np.random.Generator, identities: list[str | None], labels: np.ndarray, split: str) -> pd.DataFrame:
    """Rows with the loader's columns; `identities[i]` is the identity row i clearly mentions, if any."""
    n = len(labels)
    toxicity = np.where(labels == 1, rng.uniform(0.55, 1.0, n), rng.uniform(0.0, 0.45, n))
    frame = pd.DataFrame({
        "id": rng.choice(np.arange(200_000, 7_000_000), n, replace=False),
        "comment_text": [_text(rng, who, int(y)) for who, y in zip(identities, labels)],
        "split": split,
        "toxicity": toxicity.round(6),
    })
    scores = np.where(rng.random((n, len(IDENTITIES))) < 0.7, 0.0, rng.uniform(0.0, 0.4, (n, len(IDENTITIES))))
    for row, who in enumerate(identities):
        if who is not None:
            scores[row, IDENTITIES.index(who)] = rng.uniform(0.6, 1.0)
    for column, identity in enumerate(IDENTITIES):
        frame[identity] = scores[:, column].round(6)
    for name in AUXILIARY:  # sub-scores never exceed the overall toxicity
        frame[name] = (toxicity * rng.uniform(0.0, 1.0, n)).round(6)
    frame["identity_any"] = (scores >= 0.5).any(axis=1).astype(float)
    return frame


def _text(rng: np.random.Generator, identity: str | None, toxic: int) -> str:
    subject = SUBJECTS[identity] if identity else str(rng.choice(["the council", "this article", "the mayor"]))
    verdict = rng.choice(["are idiots", "are pathetic, stupid"]) if toxic else rng.choice(
        ["make a fair point", "deserve respect, honestly"])
    return f"I think {subject} {verdict}. Comment #{int(rng.integers(1, 10_000))}"
