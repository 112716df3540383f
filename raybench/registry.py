"""Name -> object registries: the only place where a string picks an implementation.

Datasets, models and algorithms each get one `Registry`. Adding an entry is a decorator on the
definition, so there is no list to keep in sync by hand and no `if name == ...` chain anywhere.
"""
from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable, Iterable, Iterator
from typing import Generic, TypeVar

T = TypeVar("T")


class UnknownNameError(KeyError):
    """A name that no registry entry has; the message lists the names that do exist."""

    def __str__(self) -> str:  # KeyError quotes its argument; we want a readable sentence.
        return str(self.args[0])


class Registry(Generic[T]):
    """A mapping from names to registered objects of one kind ("algorithm", "dataset", ...)."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._entries: dict[str, T] = {}

    def register(self, name: str) -> Callable[[T], T]:
        """Decorator that files the decorated object under `name`; duplicate names are a bug."""

        def decorate(obj: T) -> T:
            if name in self._entries:
                raise ValueError(f"{self.kind} {name!r} is registered twice")
            self._entries[name] = obj
            return obj

        return decorate

    def get(self, name: str) -> T:
        try:
            return self._entries[name]
        except KeyError:
            known = ", ".join(sorted(self._entries)) or "(none)"
            raise UnknownNameError(f"unknown {self.kind} {name!r}; known: {known}") from None

    def names(self) -> list[str]:
        return sorted(self._entries)

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())


def import_every_module(package: str, path: Iterable[str]) -> None:
    """Import every module of `package` (its `__path__`): each registers its entries on import with the
    decorator, so a new entry is one new file, with no list of modules to keep in step."""
    for module in pkgutil.iter_modules(path):
        importlib.import_module(f"{package}.{module.name}")
