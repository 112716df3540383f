"""Where search spaces and benchmark grids are found by name: the folders a name is looked up in, in order.

A space name (`dann`) is the file NAME.yaml of the first folder that holds one, from these sources:

1. the user's folders: each `--spaces DIR` in the order given, then each folder of `$RAYBENCH_SPACES`
   (os.pathsep-separated). A user folder may shadow a shipped space: it is the user's own choice, made on the
   command line or in the shell, and `raybench list spaces` says which shipped file it hides;
2. the folders plug-ins add (`add_space_folder`), in the order they were added. A plug-in may not take a name
   that raybench ships or another plug-in already added: its space would silently change what a shared name
   means for everybody who loads the plug-in, so that is a SpaceNameClash;
3. the spaces raybench ships, package data found through importlib.resources (`raybench/search_spaces/`), so an
   installed wheel finds them wherever it is run from.

Benchmark grids ship the same way (`raybench/grids/NAME.yaml`), found by `find_grid`.

Standard library only (no torch): `raybench list spaces` and the CLI's flag checks use it before anything heavy
loads, and the plug-in loader calls `add_space_folder` while plug-ins import.
"""
from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from importlib.resources import files
from pathlib import Path

SHIPPED = "raybench"  # the origin of the spaces and grids raybench ships
ENV_VAR = "RAYBENCH_SPACES"
ENV_ORIGIN = f"${ENV_VAR}"
FLAG = "--spaces"
SUFFIX = ".yaml"


class SpaceFolderError(ValueError):
    """A folder of spaces that cannot be one (missing, not a directory): one line naming where it was given."""


class SpaceNameClash(ValueError):
    """A plug-in's folder holds a space name that raybench ships or another plug-in already added."""


class UnknownSpaceError(LookupError):
    """A space (or grid) name no source holds; the message lists the names that do exist."""


@dataclass(frozen=True)
class SpaceSource:
    """One folder names are looked up in, and who put it there: "raybench", "plugin NAME", "--spaces DIR",
    "$RAYBENCH_SPACES"."""

    folder: Path
    origin: str

    @property
    def kind(self) -> str:
        """"raybench", "plug-in" (a folder added by add_space_folder) or "user folder": what `raybench list spaces`
        calls the source."""
        if self.origin == SHIPPED:
            return "raybench"
        if self.origin == ENV_ORIGIN or self.origin.startswith(FLAG):
            return "user folder"
        return "plug-in"

    def path_of(self, name: str) -> Path:
        return self.folder / f"{name}{SUFFIX}"

    def names(self) -> list[str]:
        """The space names this folder holds (its NAME.yaml files), sorted."""
        return sorted(p.stem for p in self.folder.glob(f"*{SUFFIX}") if p.is_file())


@dataclass(frozen=True)
class SpaceOrigin:
    """Where a name resolves: its file, the source that holds it, and the files of later sources it hides."""

    name: str
    path: Path
    source: SpaceSource
    shadows: tuple[Path, ...] = ()

    @property
    def origin(self) -> str:
        return self.source.origin


# Folders plug-ins added, in order; the plug-in loader fills it while each plug-in imports.
_PLUGIN_SOURCES: list[SpaceSource] = []


def _packaged(folder: str) -> Path:
    """A folder of raybench's package data as a real path: the space loader reads files by path (and Ray ships
    paths to its workers), which an installed package (a folder in site-packages) always has."""
    return Path(os.fspath(files("raybench") / folder))


def shipped_folder() -> Path:
    """The folder of the search spaces raybench ships."""
    return _packaged("search_spaces")


def grids_folder() -> Path:
    """The folder of the benchmark grids raybench ships."""
    return _packaged("grids")


def folder_problem(text: str | os.PathLike[str]) -> str | None:
    """Why `text` cannot be a folder of spaces (it is missing, or not a directory), or None when it can. An empty
    word is refused too: Path("") is the working folder, which the user did not name."""
    if not os.fspath(text).strip():
        return f"expected a folder of search spaces (NAME.yaml files), got {os.fspath(text)!r}"
    path = Path(text)
    try:
        if path.is_dir():
            return None
        exists = path.exists()
    except (OSError, ValueError) as err:
        return f"expected a folder of search spaces (NAME.yaml files), got {str(text)!r} ({err})"
    what = "a file, not a folder" if exists else "no such folder"
    return f"expected a folder of search spaces (NAME.yaml files), got {str(text)!r} ({what})"


def env_folders() -> list[str]:
    """The folders $RAYBENCH_SPACES names, in order (empty entries, as in `a::b`, left out)."""
    return [part for part in os.environ.get(ENV_VAR, "").split(os.pathsep) if part]


def user_sources(folders: Iterable[str | os.PathLike[str]] = ()) -> list[SpaceSource]:
    """The user's sources: `folders` (from --spaces) first, then $RAYBENCH_SPACES'; a folder that cannot be one
    is a SpaceFolderError naming the flag or the variable, so a typo is never a silently empty source."""
    sources = []
    for folder in folders:
        problem = folder_problem(folder)
        if problem:
            raise SpaceFolderError(f"{FLAG}: {problem}")
        sources.append(SpaceSource(Path(folder).resolve(), f"{FLAG} {folder}"))
    for folder in env_folders():
        problem = folder_problem(folder)
        if problem:
            raise SpaceFolderError(f"{ENV_ORIGIN}: {problem}")
        sources.append(SpaceSource(Path(folder).resolve(), ENV_ORIGIN))
    return sources


def space_sources(folders: Iterable[str | os.PathLike[str]] = ()) -> list[SpaceSource]:
    """Every source, in lookup order: the user's (`folders` given by --spaces, then $RAYBENCH_SPACES), the
    plug-ins', then raybench's own."""
    return [*user_sources(folders), *_PLUGIN_SOURCES, SpaceSource(shipped_folder(), SHIPPED)]


def add_space_folder(folder: Path, origin: str) -> None:
    """Add a plug-in's folder of spaces, looked up after the user's folders and before raybench's own. A name in
    it that raybench ships, or that another plug-in's folder already holds, raises SpaceNameClash: a plug-in
    adds names, it never redefines one. Adding the same folder for the same origin again changes nothing (a
    process may load its plug-ins more than once)."""
    problem = folder_problem(folder)
    if problem:
        raise SpaceFolderError(f"{origin}: {problem}")
    source = SpaceSource(Path(folder).resolve(), origin)
    if source in _PLUGIN_SOURCES:
        return
    taken = {name: other for other in [SpaceSource(shipped_folder(), SHIPPED), *_PLUGIN_SOURCES]
             for name in other.names()}
    for name in source.names():
        if name in taken:
            other = taken[name]
            owner = "raybench's own space" if other.origin == SHIPPED else f"the space of {other.origin}"
            raise SpaceNameClash(f"{origin}: search space {name!r} in {source.folder} clashes with {owner} "
                                 f"{name!r} ({other.path_of(name)}); expected a name not taken, so rename the file")
    _PLUGIN_SOURCES.append(source)


def remove_space_folders(origin: str) -> None:
    """Forget every folder `origin` added (a plug-in unloaded, or a test that added one)."""
    _PLUGIN_SOURCES[:] = [s for s in _PLUGIN_SOURCES if s.origin != origin]


def space_names(folders: Iterable[str | os.PathLike[str]] = ()) -> dict[str, SpaceOrigin]:
    """Every space name, sorted, with where it resolves and the files of later sources it hides."""
    found: dict[str, SpaceOrigin] = {}
    for source in space_sources(folders):
        for name in source.names():
            if name in found:
                first = found[name]
                found[name] = SpaceOrigin(name, first.path, first.source, (*first.shadows, source.path_of(name)))
            else:
                found[name] = SpaceOrigin(name, source.path_of(name), source)
    return dict(sorted(found.items()))


def find_space(name: str, folders: Sequence[str | os.PathLike[str]] = ()) -> tuple[Path, str]:
    """(the file, its origin) of the space `name`, from the first source that holds it; UnknownSpaceError lists
    every known name and where they were looked for."""
    sources = space_sources(folders)
    for source in sources:
        path = source.path_of(name)
        if path.is_file():
            return path, source.origin
    known = sorted({n for source in sources for n in source.names()})
    where = ", ".join(str(s.folder) for s in sources)
    raise UnknownSpaceError(f"unknown search space {name!r}: expected a YAML file or one of {', '.join(known)} "
                            f"(looked in {where})")


def grid_names() -> list[str]:
    """The benchmark grids raybench ships, by name."""
    return SpaceSource(grids_folder(), SHIPPED).names()


def find_grid(name: str) -> Path:
    """The shipped benchmark grid `name` (raybench/grids/NAME.yaml); UnknownSpaceError lists the shipped ones."""
    path = grids_folder() / f"{name}{SUFFIX}"
    if path.is_file():
        return path
    raise UnknownSpaceError(f"unknown benchmark {name!r}: expected a benchmark YAML file or one of "
                            f"{', '.join(grid_names())} (shipped in {grids_folder()})")


def listing(folders: Iterable[str | os.PathLike[str]] = ()) -> str:
    """What `raybench list spaces` prints: each name, where it comes from (raybench, a plug-in, a user folder),
    its file, and the files of later sources it hides, one name per line."""
    entries = list(space_names(folders).values())
    if not entries:
        return ""
    wheres = [where_from(e.source) for e in entries]
    name_width, where_width = max(len(e.name) for e in entries), max(len(w) for w in wheres)
    lines = []
    for entry, where in zip(entries, wheres):
        line = f"{entry.name:{name_width}s}  {where:{where_width}s}  {entry.path}"
        if entry.shadows:
            line += "  (shadows " + ", ".join(str(p) for p in entry.shadows) + ")"
        lines.append(line)
    return "\n".join(lines)


def where_from(source: SpaceSource) -> str:
    """A source as `list spaces` names it: `raybench`, `plug-in NAME`, `user folder (--spaces DIR)`."""
    if source.kind == "raybench":
        return SHIPPED
    if source.kind == "plug-in":
        name = source.origin.removeprefix("plugin ").removeprefix("plug-in ")
        return f"plug-in {name}" if name != source.origin else f"added by {source.origin}"
    return f"user folder ({source.origin})"
