"""Plug-ins: a researcher's own algorithms, datasets, models and search spaces, in a module of their own.

A plug-in is a Python module, a `.py` file or a package folder whose import registers its entries with the same
decorators raybench's own modules use (`raybench.algorithms.registry.register`, `DATASETS.register`,
`MODELS.register`) and adds its search spaces with `add_search_spaces`. It is named by a repeatable `--plugin`,
by `$RAYBENCH_PLUGINS` (names separated by the OS path separator, as in PYTHONPATH), or by an installed
distribution's entry point in the group `raybench.plugins`.

Every process that turns a name into an object imports the plug-ins first:
- the driver, before a flag is checked (raybench.cli, the sweep's `prepare`);
- Tune's trial processes and Ray Train's workers, told the plug-ins' module names by their TrialSpec
  (ray_trial.py, ray_worker.py), with the plug-ins' code shipped to every node by Ray's runtime_env
  (`py_modules`, `runtime_env_modules`), so a cluster needs no copy by hand;
- each pair of a benchmark, a process of its own, through `$RAYBENCH_PLUGINS`, which `export_to_children` sets.

A plug-in that cannot be imported, or registers a name that is taken (a built-in's, another plug-in's, its own
twice), is a `PluginError`: one line naming the plug-in and the reason, before any cluster work.

Standard library only: the command line imports this before torch, Ray or MLflow.
"""
from __future__ import annotations

import importlib
import importlib.util
import os
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from importlib.metadata import entry_points
from pathlib import Path
from types import ModuleType

from raybench.registry import REGISTERING_FOR

ENV_VAR = "RAYBENCH_PLUGINS"
ENTRY_POINT_GROUP = "raybench.plugins"
FLAG_SOURCE = "--plugin"
ENV_SOURCE = f"${ENV_VAR}"


class PluginError(Exception):
    """A plug-in that cannot be used: its name and the reason, in one line."""

    def __init__(self, plugin: str, reason: str) -> None:
        super().__init__(f"plug-in {plugin!r}: {reason}")
        self.plugin = plugin
        self.reason = reason

    def __reduce__(self) -> tuple:
        """Rebuilt from its fields when Ray carries it out of a worker (a plug-in a node cannot import): the
        trial's recorded reason is then this line."""
        return type(self), (self.plugin, self.reason)


@dataclass(frozen=True)
class PluginRef:
    """A plug-in as the user named it: a module name or a path, and where the name was given."""

    spec: str
    source: str  # "--plugin", "$RAYBENCH_PLUGINS", "entry point NAME of DIST"


@dataclass(frozen=True)
class LoadedPlugin:
    """An imported plug-in: the module name every other process imports it by, and the top-level file or folder
    that holds its code (what Ray's runtime_env ships to the nodes)."""

    ref: PluginRef
    module: str
    location: Path | None

    @property
    def name(self) -> str:
        """How raybench names the plug-in in listings (`raybench list algorithms`) and errors."""
        return self.module


_LOADED: dict[str, LoadedPlugin] = {}  # by module name, in load order


def requested(flags: Iterable[str] = ()) -> list[PluginRef]:
    """The plug-ins this process should load: the flags' first, then the environment's, then the entry points
    of installed distributions, each once."""
    refs = [PluginRef(spec, FLAG_SOURCE) for spec in flags]
    refs += [PluginRef(spec, ENV_SOURCE) for spec in os.environ.get(ENV_VAR, "").split(os.pathsep) if spec.strip()]
    refs += [PluginRef(point.value, f"entry point {point.name!r} of {_distribution(point)}")
             for point in entry_points(group=ENTRY_POINT_GROUP)]
    seen: set[str] = set()
    unique = []
    for ref in refs:
        key = ref.spec.strip()
        if key and key not in seen:
            seen.add(key)
            unique.append(PluginRef(key, ref.source))
    return unique


def _distribution(point: object) -> str:
    dist = getattr(point, "dist", None)
    return getattr(dist, "name", None) or "an installed package"


def load_plugins(flags: Iterable[str] = ()) -> tuple[LoadedPlugin, ...]:
    """Import every requested plug-in (flags, environment, entry points) once; every one loaded so far."""
    for ref in requested(flags):
        load(ref)
    return loaded()


def load_modules(modules: Sequence[str]) -> None:
    """Import plug-ins by module name, as a Ray worker does with what its TrialSpec names (the driver shipped
    their code with the job's runtime_env, so the names import there), and the environment's and entry points'."""
    load_plugins(modules)


def loaded() -> tuple[LoadedPlugin, ...]:
    return tuple(_LOADED.values())


def module_names() -> tuple[str, ...]:
    """The module names of the loaded plug-ins, in load order: what a trial's processes are told to import."""
    return tuple(_LOADED)


def load(ref: PluginRef) -> LoadedPlugin:
    """Import one plug-in with its registrations filed under its name; a PluginError for any failure."""
    path = _as_path(ref.spec)
    module_name = _module_name(ref, path)
    if module_name in _LOADED:
        return _LOADED[module_name]
    _register_built_ins()
    token = REGISTERING_FOR.set(module_name)
    try:
        module = _import_file(module_name, path) if path is not None else _import_named(ref.spec)
    except PluginError:
        raise
    except ModuleNotFoundError as err:
        if err.name and (ref.spec == err.name or ref.spec.startswith(f"{err.name}.")):
            raise PluginError(ref.spec, f"no module named {err.name!r} (given by {ref.source}); install it, or give "
                                        f"the path of its .py file or package folder") from None
        raise PluginError(ref.spec, f"importing it failed: {type(err).__name__}: {err}") from None
    except Exception as err:  # noqa: BLE001  whatever a user's module raises (a clash, a typo) is one line
        raise PluginError(ref.spec, f"importing it failed: {type(err).__name__}: {err}") from None
    finally:
        REGISTERING_FOR.reset(token)
    plugin = LoadedPlugin(ref, module_name, _top_level_location(module))
    _LOADED[module_name] = plugin
    return plugin


def _register_built_ins() -> None:
    """raybench's own registries filled before a plug-in's import runs: what they register while it runs would
    be filed under the plug-in's name (the datasets' package registers its WILDS datasets as values with no
    module of their own), and a clash with a built-in must be seen as one."""
    for package in ("raybench.algorithms", "raybench.models", "raybench.data"):
        importlib.import_module(package)


def _as_path(spec: str) -> Path | None:
    """The file or package folder a spec names, or None when it is a module name."""
    if spec.endswith(".py") or os.sep in spec or (os.altsep and os.altsep in spec) or Path(spec).is_dir():
        return Path(spec).expanduser().resolve()
    return None


def _module_name(ref: PluginRef, path: Path | None) -> str:
    name = ref.spec if path is None else (path.stem if path.suffix == ".py" else path.name)
    if not all(part.isidentifier() for part in name.split(".")):
        raise PluginError(ref.spec, f"expected a module name, a .py file or a package folder, got {name!r} "
                                    f"(given by {ref.source})")
    return name


def _import_named(name: str) -> ModuleType:
    return importlib.import_module(name)


def _import_file(name: str, path: Path) -> ModuleType:
    """Import a plug-in's .py file or package folder under `name`, the name its shipped copy has on the nodes."""
    if name in sys.modules and _same_file(sys.modules[name], path):
        return sys.modules[name]
    if path.is_dir():
        init = path / "__init__.py"
        if not init.is_file():
            raise PluginError(str(path), "expected a package folder (with __init__.py) or a .py file")
        spec = importlib.util.spec_from_file_location(name, init, submodule_search_locations=[str(path)])
    elif path.is_file():
        spec = importlib.util.spec_from_file_location(name, path)
    else:
        raise PluginError(str(path), "no such file or folder")
    if spec is None or spec.loader is None:
        raise PluginError(str(path), "Python cannot import it")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        sys.modules.pop(name, None)
        raise
    return module


def _same_file(module: ModuleType, path: Path) -> bool:
    origin = getattr(module, "__file__", None)
    if origin is None:
        return False
    origin_path = Path(origin).resolve()
    return origin_path == path or origin_path.parent == path


def _top_level_location(module: ModuleType) -> Path | None:
    """The file or folder of the plug-in's top-level module: what `py_modules` ships (a top-level name)."""
    top = sys.modules.get(module.__name__.split(".")[0], module)
    paths = list(getattr(top, "__path__", []) or [])
    if paths:
        return Path(paths[0])
    origin = getattr(top, "__file__", None)
    return Path(origin) if origin else None


def runtime_env_modules() -> list[str]:
    """The loaded plug-ins' code, for Ray's `py_modules`: every node's workers can import them by name."""
    return sorted({str(p.location) for p in _LOADED.values() if p.location is not None})


def export_to_children() -> None:
    """Name the loaded plug-ins in `$RAYBENCH_PLUGINS` for the processes this one starts (a benchmark's sweeps),
    by the paths or module names they were loaded from."""
    specs = [p.ref.spec if _as_path(p.ref.spec) is None else str(_as_path(p.ref.spec)) for p in _LOADED.values()
             if not p.ref.source.startswith("entry point")]
    current = [s for s in os.environ.get(ENV_VAR, "").split(os.pathsep) if s]
    merged = current + [s for s in specs if s not in current]
    if merged:
        os.environ[ENV_VAR] = os.pathsep.join(merged)


def add_search_spaces(folder: str | Path) -> None:
    """Add a folder of search-space YAML files; a plug-in calls it when imported, so its spaces are found by name.

    A name that a shipped space or another plug-in already has is refused (the plug-in then fails to load)."""
    from raybench.sweep.space_catalog import add_space_folder

    plugin = REGISTERING_FOR.get()
    add_space_folder(Path(folder), f"plug-in {plugin}" if plugin else "the Python API")


def origin_word(origin: str) -> str:
    """How a listing names where an entry came from: `raybench`, or `plug-in NAME`."""
    from raybench.registry import BUILT_IN

    return origin if origin == BUILT_IN else f"plug-in {origin}"
