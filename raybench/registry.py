"""Name -> object registries: the only place where a string picks an implementation.

Datasets, models and algorithms each get one `Registry`. Adding an entry is a decorator on the
definition, so there is no list to keep in sync by hand and no `if name == ...` chain anywhere.

A package may `discover` its entries instead of importing every module: each module's source is read for its
`@register("name")` decorators, and the module is imported when one of its entries is first used. Listing the
names and what they are (`raybench list algorithms`) then imports none of them, and so no torch.
"""
from __future__ import annotations

import ast
import importlib
import pkgutil
from collections.abc import Callable, Iterable, Iterator
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Generic, TypeVar

T = TypeVar("T")

BUILT_IN = "raybench"  # the origin of every entry raybench itself registers
# The plug-in whose import is running (raybench.plugins sets it): what it registers is filed under its name.
REGISTERING_FOR: ContextVar[str | None] = ContextVar("raybench_registering_for", default=None)


class UnknownNameError(KeyError):
    """A name that no registry entry has; the message lists the names that do exist."""

    def __str__(self) -> str:  # KeyError quotes its argument; we want a readable sentence.
        return str(self.args[0])


@dataclass(frozen=True)
class Declaration:
    """An entry as its module's source declares it: the module to import for it and the docstring of what the
    decorator registers, both read without running the module."""

    module: str
    doc: str | None


class Registry(Generic[T]):
    """A mapping from names to registered objects of one kind ("algorithm", "dataset", ...)."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._entries: dict[str, T] = {}
        self._declared: dict[str, Declaration] = {}  # found by `discover`, imported on first use
        self._origins: dict[str, str] = {}  # the plug-in each name came from; absent: raybench's own

    def register(self, name: str) -> Callable[[T], T]:
        """Decorator that files the decorated object under `name`; duplicate names are a bug."""

        def decorate(obj: T) -> T:
            declared = self._declared.get(name)
            if name in self._entries or (declared and declared.module != getattr(obj, "__module__", None)):
                raise ValueError(f"{self.kind} {name!r} is registered twice{self._first_by(name)}")
            self._entries[name] = obj
            plugin = REGISTERING_FOR.get()
            module = str(getattr(obj, "__module__", ""))
            if plugin is not None and not module.startswith(f"{BUILT_IN}."):  # not a built-in the plug-in imported
                self._origins[name] = plugin
            return obj

        return decorate

    def discover(self, package: str, path: Iterable[str]) -> None:
        """Declare every entry the modules of `package` (its `__path__`) register, from their source, so a new
        entry is still one new file with no list of modules to keep in step. A module that registers in a way
        its source does not spell out (a loop, a computed name) or a subpackage is imported now instead."""
        opaque = []
        for module in pkgutil.iter_modules(path):
            name = f"{package}.{module.name}"
            found = None if module.ispkg else declared_in(_source_of(module, name))
            if found is None:
                opaque.append(name)
            for entry, doc in found or ():
                if entry in self._declared or entry in self._entries:
                    raise ValueError(f"{self.kind} {entry!r} is registered twice")
                self._declared[entry] = Declaration(name, doc)
        for name in opaque:  # after every declaration is known, so a clash with one is found
            importlib.import_module(name)

    def get(self, name: str) -> T:
        if name not in self._entries and name in self._declared:
            importlib.import_module(self._declared[name].module)  # its decorator registers it
        try:
            return self._entries[name]
        except KeyError:
            raise self.unknown(name) from None

    def origin(self, name: str) -> str:
        """Where the entry comes from: `raybench` for raybench's own, else the plug-in that registered it."""
        return self._origins.get(name, BUILT_IN)

    def _first_by(self, name: str) -> str:
        """Who registered `name` first, for the twice-registered error: a plug-in must see which name it took."""
        first = self.origin(name) if name in self._entries else BUILT_IN
        return f" (first by {'raybench itself' if first == BUILT_IN else 'plug-in ' + repr(first)})"

    def unknown(self, name: str) -> UnknownNameError:
        """The error for a name no entry has, listing the names that do exist (nothing is imported for it)."""
        return UnknownNameError(f"unknown {self.kind} {name!r}; known: {', '.join(self.names()) or '(none)'}")

    def summary(self, name: str) -> str:
        """The first line of the entry's docstring (`raybench list`), read from its source while its module is
        not imported: what an entry is must not cost importing it."""
        if name in self._entries:
            return first_line(self._entries[name].__doc__)
        if name in self._declared:
            return first_line(self._declared[name].doc)
        return first_line(self.get(name).__doc__)  # raises UnknownNameError, naming the known ones

    def names(self) -> list[str]:
        return sorted(self._entries.keys() | self._declared.keys())

    def __contains__(self, name: object) -> bool:
        return name in self._entries or name in self._declared

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())


def first_line(doc: str | None) -> str:
    """A docstring's first line, as `raybench list` shows what an entry is; "" for none."""
    return doc.strip().splitlines()[0] if doc else ""


def _source_of(module: pkgutil.ModuleInfo, name: str) -> str | None:
    """The module's Python source; None when it has none to read (a compiled extension)."""
    spec = module.module_finder.find_spec(name)
    origin = spec.origin if spec else None
    if not origin or not origin.endswith(".py"):
        return None
    with open(origin, encoding="utf-8") as handle:
        return handle.read()


def declared_in(source: str | None) -> list[tuple[str, str | None]] | None:
    """(name, docstring) of every definition the source decorates with `register("name")` or
    `X.register("name")`; None when it calls `register` any other way (`X.register(name)(obj)`), whose names
    only running the module tells."""
    if source is None:
        return None
    found, literal, calls = [], set(), []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call) and _calls_register(node):
            calls.append(node)
        elif isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            for decorator in node.decorator_list:
                name = _literal_registration(decorator)
                if name is not None:
                    found.append((name, ast.get_docstring(node, clean=False)))
                    literal.add(id(decorator))
    return found if all(id(call) in literal for call in calls) else None


def _calls_register(call: ast.Call) -> bool:
    """Whether the call is `register(...)` or `X.register(...)`: any registry's, however the module names it."""
    func = call.func
    return (isinstance(func, ast.Name) and func.id == "register") or (
        isinstance(func, ast.Attribute) and func.attr == "register")


def _literal_registration(decorator: ast.expr) -> str | None:
    """The name in a `register("name")` decorator; None for any other decorator."""
    if not (isinstance(decorator, ast.Call) and _calls_register(decorator)):
        return None
    args = decorator.args
    if len(args) == 1 and not decorator.keywords and isinstance(args[0], ast.Constant) and isinstance(args[0].value, str):
        return args[0].value
    return None


def import_every_module(package: str, path: Iterable[str]) -> None:
    """Import every module of `package` (its `__path__`): each registers its entries on import with the
    decorator, so a new entry is one new file, with no list of modules to keep in step."""
    for module in pkgutil.iter_modules(path):
        importlib.import_module(f"{package}.{module.name}")
