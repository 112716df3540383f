"""A tiny OGB-MolPCBA copy (labeled and unlabeled) in the raw formats ogb 1.3.6 processes offline.

Labeled, `ogbg_molpcba/` (ogb's folder for 'ogbg-molpcba'; master.csv: csv format, add_inverse_edge=True,
128 tasks, version 1): `RELEASE_v1.txt` (without it ogb asks on stdin whether to re-download), `raw/`
`edge.csv.gz` (one row `src,dst` per bond, local node ids, each bond once: ogb adds the reverse),
`node-feat.csv.gz` (9 integer atom features per row), `edge-feat.csv.gz` (3 integer bond features per bond),
`num-node-list.csv.gz`, `num-edge-list.csv.gz` (per graph, bonds counted once), `graph-label.csv.gz`
(128 columns, empty field = NaN = unmeasured); all without header. `split/scaffold/{train,valid,test}.csv.gz`
hold graph indices, and wilds reads `raw/scaffold_group.npy` (one scaffold id per graph) for metadata.

Unlabeled, `molpcba_unlabeled/` (wilds' meta_dict: binary npz format, no inverse edges added): `RELEASE_v1.txt`,
`raw/data.npz` (edge_index (2, E) with both directions of every bond, num_nodes_list, num_edges_list,
node_feat, edge_feat), `raw/graph-label.npz` (`graph_label`; wilds discards it, but ogb reshapes each row
to (1, -1), so it may not be empty), `split/scaffold/*.csv.gz` and `processed/group_assignment.npy`.

Molecules are small random trees of C/N/O/S/Cl atoms with one ring; features stay inside ogb's
`get_atom_feature_dims()` / `get_bond_feature_dims()`. Each split has its own scaffolds, several per split.
"""
from __future__ import annotations

import pathlib
from dataclasses import dataclass

import numpy as np
import pandas as pd

SEED = 20_200_501
LABELED, UNLABELED = "ogbg_molpcba", "molpcba_unlabeled"
N_TASKS = 128
GRAPHS_PER_SCAFFOLD = 12
# scaffold ids per split: train has the big scaffolds, val and test their own
SCAFFOLDS = {"train": [0, 1, 2, 3, 4, 5], "valid": [6, 7, 8], "test": [9, 10, 11]}
UNLABELED_PER_SCAFFOLD = 4
ELEMENTS = np.array([6, 6, 6, 6, 7, 8, 16, 17])  # atomic numbers, carbon-heavy
LABELED_FRACTION, POSITIVE_RATE = 0.5, 0.25
GZIP = {"method": "gzip", "mtime": 0}  # byte-identical files across runs


@dataclass
class Molecule:
    node_feat: np.ndarray  # (n_atoms, 9) int64
    bonds: np.ndarray  # (n_bonds, 2) int64, each bond once
    edge_feat: np.ndarray  # (n_bonds, 3) int64


def write(root: pathlib.Path) -> None:
    """Write both folders under `root`."""
    rng = np.random.default_rng(SEED)
    root = pathlib.Path(root)
    _write_labeled(root / LABELED, rng)
    _write_unlabeled(root / UNLABELED, rng)


def _write_labeled(folder: pathlib.Path, rng: np.random.Generator) -> None:
    groups = _shuffled_groups(rng, GRAPHS_PER_SCAFFOLD)
    molecules = [_molecule(rng) for _ in groups]
    raw = folder / "raw"
    raw.mkdir(parents=True, exist_ok=True)
    _csv(raw / "edge.csv.gz", np.concatenate([m.bonds for m in molecules]))
    _csv(raw / "node-feat.csv.gz", np.concatenate([m.node_feat for m in molecules]))
    _csv(raw / "edge-feat.csv.gz", np.concatenate([m.edge_feat for m in molecules]))
    _csv(raw / "num-node-list.csv.gz", np.array([[len(m.node_feat)] for m in molecules]))
    _csv(raw / "num-edge-list.csv.gz", np.array([[len(m.bonds)] for m in molecules]))
    pd.DataFrame(_labels(rng, len(molecules))).to_csv(raw / "graph-label.csv.gz", header=False, index=False,
                                                      compression=GZIP)
    np.save(raw / "scaffold_group.npy", groups)
    _write_split(folder, groups)
    (folder / "RELEASE_v1.txt").write_text("ogbg-molpcba v1 (raybench test fixture)\n")


def _write_unlabeled(folder: pathlib.Path, rng: np.random.Generator) -> None:
    groups = _shuffled_groups(rng, UNLABELED_PER_SCAFFOLD)
    molecules = [_molecule(rng) for _ in groups]
    (folder / "raw").mkdir(parents=True, exist_ok=True)
    (folder / "processed").mkdir(parents=True, exist_ok=True)
    directed = [np.concatenate([m.bonds, m.bonds[:, ::-1]]) for m in molecules]
    np.savez_compressed(
        folder / "raw" / "data.npz",
        edge_index=np.concatenate(directed).T.astype(np.int64),
        num_nodes_list=np.array([len(m.node_feat) for m in molecules], dtype=np.int64),
        num_edges_list=np.array([len(d) for d in directed], dtype=np.int64),
        node_feat=np.concatenate([m.node_feat for m in molecules]),
        edge_feat=np.concatenate([np.concatenate([m.edge_feat, m.edge_feat]) for m in molecules]),
    )
    np.savez_compressed(folder / "raw" / "graph-label.npz",
                        graph_label=np.full((len(molecules), N_TASKS), np.nan, dtype=np.float32))
    np.save(folder / "processed" / "group_assignment.npy", groups)
    _write_split(folder, groups)
    (folder / "RELEASE_v1.txt").write_text("molpcba_unlabeled v1 (raybench test fixture)\n")


def _shuffled_groups(rng: np.random.Generator, per_scaffold: int) -> np.ndarray:
    """Scaffold id of each graph; graphs of one split are interleaved with the others, as in OGB."""
    groups = np.repeat(np.concatenate(list(SCAFFOLDS.values())), per_scaffold)
    return rng.permutation(groups).astype(np.int64)


def _write_split(folder: pathlib.Path, groups: np.ndarray) -> None:
    split = folder / "split" / "scaffold"
    split.mkdir(parents=True, exist_ok=True)
    for name, scaffolds in SCAFFOLDS.items():
        _csv(split / f"{name}.csv.gz", np.flatnonzero(np.isin(groups, scaffolds))[:, None])


def _csv(path: pathlib.Path, values: np.ndarray) -> None:
    pd.DataFrame(values).to_csv(path, header=False, index=False, compression=GZIP)


def _labels(rng: np.random.Generator, n: int) -> np.ndarray:
    """(n, 128) of 0/1 with NaN where unmeasured; every task gets both labels somewhere."""
    labels = (rng.random((n, N_TASKS)) < POSITIVE_RATE).astype(np.float64)
    labels[rng.random((n, N_TASKS)) >= LABELED_FRACTION] = np.nan
    return labels


def _molecule(rng: np.random.Generator) -> Molecule:
    """A random tree of 6-18 heavy atoms plus one ring-closing bond (aromatic half the time)."""
    n_atoms = int(rng.integers(6, 19))
    bonds = [(int(rng.integers(max(0, i - 3), i)), i) for i in range(1, n_atoms)]
    ring = _ring_atoms(bonds, int(rng.integers(0, n_atoms - 5)), n_atoms)
    in_ring = np.zeros(n_atoms, dtype=np.int64)
    if ring is not None:
        bonds.append((ring[0], ring[-1]))
        in_ring[ring] = 1
    bond_array = np.array(bonds, dtype=np.int64)
    degree = np.bincount(bond_array.ravel(), minlength=n_atoms)
    aromatic = in_ring * int(rng.random() < 0.5)
    return Molecule(_atom_features(rng, degree, in_ring, aromatic), bond_array,
                    _bond_features(rng, bond_array, aromatic))


def _ring_atoms(bonds: list[tuple[int, int]], start: int, n_atoms: int) -> list[int] | None:
    """The tree path from `start` to a descendant 3-5 bonds away: closing it makes a 4- to 6-ring."""
    parent = {child: par for par, child in bonds}
    for end in range(n_atoms - 1, start, -1):
        path = [end]
        while path[-1] in parent and path[-1] != start:
            path.append(parent[path[-1]])
        if path[-1] == start and 4 <= len(path) <= 6:
            return sorted(path)
    return None


def _atom_features(rng: np.random.Generator, degree: np.ndarray, in_ring: np.ndarray,
                   aromatic: np.ndarray) -> np.ndarray:
    """ogb's 9 atom features as indices: atomic number - 1, chirality, degree, formal charge (index 5 = 0),
    hydrogens, radicals, hybridization (1 = SP2, 2 = SP3), aromatic, in ring."""
    n = len(degree)
    atomic = rng.choice(ELEMENTS, n) - 1
    hydrogens = np.clip(4 - degree - aromatic, 0, 3)
    hybridization = np.where(aromatic == 1, 1, 2)
    columns = [atomic, np.zeros(n), np.minimum(degree, 10), np.full(n, 5), hydrogens, np.zeros(n), hybridization,
               aromatic, in_ring]
    return np.stack(columns, axis=1).astype(np.int64)


def _bond_features(rng: np.random.Generator, bonds: np.ndarray, aromatic: np.ndarray) -> np.ndarray:
    """ogb's 3 bond features: type (0 single, 1 double, 3 aromatic), stereo (0 none), conjugated."""
    aromatic_bond = (aromatic[bonds[:, 0]] == 1) & (aromatic[bonds[:, 1]] == 1)
    kind = np.where(aromatic_bond, 3, np.where(rng.random(len(bonds)) < 0.15, 1, 0))
    conjugated = (kind != 0).astype(np.int64)
    return np.stack([kind, np.zeros(len(bonds), dtype=np.int64), conjugated], axis=1).astype(np.int64)
