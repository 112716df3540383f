"""Files a loadable Amazon-WILDS copy needs, so `raybench data check` can name what is absent.

The labeled and the unlabeled class both read `amazon_v2.1/reviews.csv` (the review text is in it: there
are no input files) and `amazon_v2.1/splits/user.csv`. The labeled class also needs `RELEASE_v2.1.txt`,
without which wilds would try to download; the unlabeled class (version 1.0, an alias of `amazon_v2.1`)
only needs the folder to exist, so its list has no release file.
"""
from __future__ import annotations

import pathlib

from raybench.file_kinds import regular_file

FOLDER = "amazon_v2.1"
DATA_FILES = ("reviews.csv", "splits/user.csv")
RELEASE = "RELEASE_v2.1.txt"


def required_files(unlabeled: bool) -> list[str]:
    """Paths relative to the WILDS root, in the order they are reported."""
    names = DATA_FILES if unlabeled else (RELEASE, *DATA_FILES)
    return [f"{FOLDER}/{name}" for name in names]


def missing_files(root: pathlib.Path, unlabeled: bool) -> list[str]:
    """The required files that are not on disk under `root` (the `root_dir` given to wilds)."""
    root = pathlib.Path(root)
    return [path for path in required_files(unlabeled) if not regular_file(root / path)]
