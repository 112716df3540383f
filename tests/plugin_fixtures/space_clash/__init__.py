"""A plug-in whose search space takes a shipped space's name."""
from pathlib import Path

from raybench.plugins import add_search_spaces

add_search_spaces(Path(__file__).parent / "spaces")
