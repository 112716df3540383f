"""The algorithm registry: `@ALGORITHMS.register("name")` on an `Algorithm` subclass."""
from __future__ import annotations

from collections.abc import Callable

from raybench.algorithms.base import Algorithm
from raybench.registry import Registry

ALGORITHMS: Registry[type[Algorithm]] = Registry("algorithm")


def register(name: str) -> Callable[[type[Algorithm]], type[Algorithm]]:
    def decorate(cls: type[Algorithm]) -> type[Algorithm]:
        cls.name = name
        return ALGORITHMS.register(name)(cls)

    return decorate
