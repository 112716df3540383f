"""A test plug-in: ERM under another name."""
from pathlib import Path

from raybench.algorithms.erm import ERM
from raybench.algorithms.registry import register
from raybench.plugins import add_search_spaces


@register("erm_twin")
class ERMTwin(ERM):
    """ERM again, from a plug-in."""


add_search_spaces(Path(__file__).parent / "spaces")
