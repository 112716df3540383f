"""Files a loadable CivilComments-WILDS copy needs, so `raybench data check` can name what is absent.

Each class reads one CSV that carries the comment text itself (there are no input files), and wilds only
treats its folder as present when the `RELEASE_v1.0.txt` file is there (otherwise it would download).
"""
from __future__ import annotations

import pathlib

from raybench.file_kinds import regular_file

LABELED = ("civilcomments_v1.0", "all_data_with_identities.csv")
UNLABELED = ("civilcomments_unlabeled_v1.0", "unlabeled_data_with_identities.csv")
RELEASE = "RELEASE_v1.0.txt"


def required_files(unlabeled: bool) -> list[str]:
    """Paths relative to the WILDS root, release file first."""
    folder, csv_name = UNLABELED if unlabeled else LABELED
    return [f"{folder}/{RELEASE}", f"{folder}/{csv_name}"]


def missing_files(root: pathlib.Path, unlabeled: bool) -> list[str]:
    """The required files that are not on disk under `root` (the `root_dir` given to wilds)."""
    root = pathlib.Path(root)
    return [path for path in required_files(unlabeled) if not regular_file(root / path)]
