"""Names a package exports but imports only when first asked for (PEP 562).

A package whose `__init__` re-exports names from modules that import torch would make every process that
touches the package pay for torch: `raybench list algorithms`, or Ray Train's controller unpickling a report
callback. `names_on_first_use` gives such a package a module `__getattr__` instead."""
from __future__ import annotations

from collections.abc import Callable, Mapping
from importlib import import_module
from typing import Any


def names_on_first_use(namespace: dict[str, Any], homes: Mapping[str, str]) -> Callable[[str], Any]:
    """A module `__getattr__` for `homes` (name -> the module that defines it): each name is imported from its
    home when first asked for and kept in `namespace` (the package's globals), so later lookups are plain."""

    def __getattr__(name: str) -> Any:
        if name not in homes:
            raise AttributeError(f"module {namespace['__name__']!r} has no attribute {name!r}")
        value = getattr(import_module(homes[name]), name)
        namespace[name] = value
        return value

    return __getattr__
