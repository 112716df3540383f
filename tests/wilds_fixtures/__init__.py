"""Tiny copies of the eight WILDS datasets in their exact on-disk formats, written by the tests themselves.

`write_all(root)` lays all eight out under one WILDS root, labeled and unlabeled, in about a second;
each module's `write(root)` does one. Nothing here is committed data: every byte comes from a seeded RNG.
"""
from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from . import amazon, camelyon17, civilcomments, fmow, globalwheat, iwildcam, ogb_molpcba, poverty

WRITERS: dict[str, Callable[[Path], None]] = {
    "amazon": amazon.write, "camelyon17": camelyon17.write, "civilcomments": civilcomments.write,
    "fmow": fmow.write, "globalwheat": globalwheat.write, "iwildcam": iwildcam.write,
    "ogb-molpcba": ogb_molpcba.write, "poverty": poverty.write,
}


def write_all(root: Path) -> Path:
    for write in WRITERS.values():
        write(root)
    return root
