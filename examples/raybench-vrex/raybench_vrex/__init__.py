"""raybench-vrex: a raybench plug-in with V-REx (Krueger et al., 2021), the colored-moons dataset and their space.

Importing it, as raybench does for `--plugin raybench_vrex`, `$RAYBENCH_PLUGINS` or this distribution's entry point
(group `raybench.plugins`), registers the algorithm `vrex`, the dataset `colored-moons`, the model `moons_mlp` and
adds the search space `vrex` (spaces/vrex.yaml); raybench files them under this plug-in's name.
"""
from __future__ import annotations

from pathlib import Path

import raybench.plugins

from . import colored_moons, vrex

raybench.plugins.add_search_spaces(Path(__file__).parent / "spaces")

__all__ = ["colored_moons", "vrex"]
