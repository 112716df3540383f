"""A plug-in that registers one name twice."""
from raybench.algorithms.erm import ERM
from raybench.algorithms.registry import register


@register("twice_algo")
class First(ERM):
    """The first."""


@register("twice_algo")
class Second(ERM):
    """The second, under the same name."""
