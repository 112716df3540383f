"""Files a loadable OGB-MolPCBA copy needs, so `raybench data check` can name what is absent.

The ogb package downloads a folder it does not find and asks on stdin when `RELEASE_v1.txt` is missing, so
both must be caught before a run. On every load PyG checks ogb's `raw_file_names` (labeled: edge, node-feat,
edge-feat csv.gz; unlabeled: data.npz) and downloads if one is absent. The remaining raw files (graph
counts and labels) are only read by the one-off processing step, so they are required only until
`processed/geometric_data_processed.pt` exists. wilds itself reads the scaffold split csv.gz files and the
scaffold ids (`raw/scaffold_group.npy`, unlabeled: `processed/group_assignment.npy`).
"""
from __future__ import annotations

import pathlib

from raybench.file_kinds import regular_file

LABELED, LABELED_PROCESSED_ALIAS, UNLABELED = "ogbg_molpcba", "ogbg_molpcba_pyg", "molpcba_unlabeled"
PROCESSED = "processed/geometric_data_processed.pt"
SPLITS = tuple(f"split/scaffold/{name}.csv.gz" for name in ("train", "valid", "test"))
CHECKED_EVERY_LOAD = {
    False: ("raw/edge.csv.gz", "raw/node-feat.csv.gz", "raw/edge-feat.csv.gz"),
    True: ("raw/data.npz",),
}
PROCESSING_INPUTS = {
    False: ("raw/num-node-list.csv.gz", "raw/num-edge-list.csv.gz", "raw/graph-label.csv.gz"),
    True: ("raw/graph-label.npz",),
}
SCAFFOLD_IDS = {False: "raw/scaffold_group.npy", True: "processed/group_assignment.npy"}


def dataset_folder(root: pathlib.Path, unlabeled: bool) -> str:
    """ogb prefers an existing `ogbg_molpcba_pyg` folder over `ogbg_molpcba` for the labeled data."""
    if unlabeled:
        return UNLABELED
    return LABELED_PROCESSED_ALIAS if (root / LABELED_PROCESSED_ALIAS).is_dir() else LABELED


def required_files(root: pathlib.Path, unlabeled: bool) -> list[str]:
    """Paths relative to the WILDS root, in the order they are reported."""
    folder = dataset_folder(root, unlabeled)
    names = ["RELEASE_v1.txt", *CHECKED_EVERY_LOAD[unlabeled]]
    if not regular_file(root / folder / PROCESSED):
        names += PROCESSING_INPUTS[unlabeled]
    names += [*SPLITS, SCAFFOLD_IDS[unlabeled]]
    return [f"{folder}/{name}" for name in names]


def missing_files(root: pathlib.Path, unlabeled: bool) -> list[str]:
    """The required files that are not on disk under `root` (the `root_dir` given to wilds)."""
    root = pathlib.Path(root)
    return [path for path in required_files(root, unlabeled) if not regular_file(root / path)]
