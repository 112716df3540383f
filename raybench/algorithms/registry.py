"""The algorithm registry: `@ALGORITHMS.register("name")` on an `Algorithm` subclass."""
from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from raybench.registry import Registry

if TYPE_CHECKING:  # the base class imports torch; the registry's names and summaries need none
    from raybench.algorithms.base import Algorithm

ALGORITHMS: Registry[type[Algorithm]] = Registry("algorithm")


def register(name: str) -> Callable[[type[Algorithm]], type[Algorithm]]:
    def decorate(cls: type[Algorithm]) -> type[Algorithm]:
        cls.name = name
        return ALGORITHMS.register(name)(cls)

    return decorate
