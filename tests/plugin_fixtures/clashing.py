"""A plug-in whose algorithm takes a built-in's name."""
from raybench.algorithms.erm import ERM
from raybench.algorithms.registry import register


@register("erm")
class MyERM(ERM):
    """Another ERM under the built-in's name."""
