"""Search spaces: YAML files parsed once into typed objects, validated before any cluster work.

A file names an algorithm and lists what is sampled (`search`), what is set (`fixed`), what follows
from the sampled values (`derived`) and per-dataset overrides (`datasets: {name: {...}}`). The format
is documented in raybench/search_spaces/README.md. A space is named by its file's path, or by a name that
raybench.sweep.space_catalog looks up (the user's folders, the plug-ins', the shipped ones). Every error names
the file, the key, the value and what was expected, in one line.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from raybench.algorithms import ALGORITHMS
from raybench.data import DATASETS, ShiftDataset
from raybench.settings import Distribution, FieldType
from raybench.sweep import space_catalog
from raybench.sweep.converge import scaled_epochs
from raybench.trainer import ConfigError, TrainConfig
from raybench.words import REPLICATE_STAGE

TOP_KEYS = {"algorithm", "description", "search", "fixed", "derived", "datasets"}
OVERRIDE_KEYS = {"search", "fixed", "derived"}
DISTRIBUTIONS = ("loguniform", "uniform", "choice", "lr")
# ratio_epochs: epochs = ceil(factor * E / (k + 1)); max_batch_size: the dataset's MAX_BS (App. D), else its
# default batch size. The second depends on the dataset only, so it is fixed when the space is bound.
DERIVED_RULES = ("ratio_epochs", "max_batch_size")
SEARCH_DIR = space_catalog.shipped_folder()  # the spaces raybench ships (package data)


class YamlFileError(ValueError):
    """A malformed YAML file of raybench's: one line naming file, key, value and what was expected."""

    def __init__(self, path: str | Path, key: str, value: Any, expected: str) -> None:
        super().__init__(f"{path}: {key}: expected {expected}, got {quoted(value)}")


class SpaceError(YamlFileError):
    """A malformed search-space file."""


# The longest value an error quotes: a one-line message stays one readable line whatever the file held.
MAX_QUOTED = 120


def quoted(value: Any) -> str:
    """repr(value), cut to MAX_QUOTED characters with the full length said."""
    text = repr(value)
    if len(text) <= MAX_QUOTED:
        return text
    return f"{text[:MAX_QUOTED]}... ({len(text):,} characters)"


@dataclass(frozen=True, kw_only=True)
class Param(Distribution):
    """One sampled parameter: a Distribution with the name it is sampled under. `lr` means log-uniform over
    [r / 10^decades, r * 10^decades] (WILDS 2.0 App. D)."""

    name: str


@dataclass(frozen=True)
class Derived:
    """A value computed from sampled ones or from the dataset (see DERIVED_RULES)."""

    name: str
    rule: str
    factor: float = 2.0


@dataclass
class SearchSpace:
    path: Path
    algorithm: str
    description: str
    search: dict[str, Param]
    fixed: dict[str, Any]
    derived: dict[str, Derived]
    datasets: dict[str, dict[str, Any]] = field(default_factory=dict)

    def for_dataset(self, dataset: ShiftDataset) -> ResolvedSpace:
        """Merge the dataset's overrides and turn `lr` distributions into concrete bounds."""
        override = self.datasets.get(dataset.name, {})
        search = {**self.search, **override.get("search", {})}
        fixed = {**self.fixed, **override.get("fixed", {})}
        derived = {**self.derived, **override.get("derived", {})}
        _refuse_unsound_merge(self.path, dataset.name, {"search": search, "fixed": fixed, "derived": derived})
        for name in [n for n, rule in derived.items() if rule.rule == "max_batch_size"]:
            fixed.setdefault(name, dataset.defaults.max_batch_size or dataset.defaults.batch_size)
            del derived[name]
        base = TrainConfig.from_flat({"dataset": dataset.name, "algorithm": self.algorithm, **fixed}).resolve(dataset)
        center = dataset.defaults.lr_center or base.lr * (base.batch_size * base.grad_accum) / dataset.defaults.batch_size
        concrete = {name: _concrete(p, center) for name, p in search.items()}
        for name, param in search.items():
            if param.distribution == "lr":  # its bounds are known only now, on this dataset's centre
                where = f"datasets.{dataset.name}.search" if name in override.get("search", {}) else "search"
                _check_lr_range(concrete[name], param, self.path, f"{where}.{name}", self.algorithm, dataset.name, center)
        resolved = ResolvedSpace(self.algorithm, dataset.name, concrete, fixed, derived, dataset.defaults.epochs, center)
        for name, param in search.items():
            where = f"datasets.{dataset.name}.search" if name in override.get("search", {}) else "search"
            _check_each_value_on(resolved, dataset, param, concrete[name], self.path, f"{where}.{name}")
        return resolved


def _refuse_unsound_merge(path: Path, dataset: str, sections: Mapping[str, Mapping[str, Any]]) -> None:
    """A file's load refuses these with the exact key (parse_space); a SearchSpace a caller built is taken as it
    is (raybench.api.load_space), so the merged sections are held to the same two rules here: no setting a sweep
    sets itself, and each setting in one section."""
    seen: dict[str, str] = {}
    for section, values in sections.items():
        for name, value in values.items():
            written = list(value.values) if isinstance(value, Param) else value
            if name in OWN_FLAGS:
                raise SpaceError(path, f"{section}.{name} on {dataset}", written, _owned_words(name, written))
            if name in seen:
                raise SpaceError(path, f"{section}.{name} on {dataset}", written,
                                 f"no value, since {name!r} is also {SECTION_VERBS[seen[name]]}: a setting is "
                                 f"searched, fixed or derived in one place, else one value silently wins")
            seen[name] = section


def _check_lr_range(concrete: Param, param: Param, path: Path, key: str, algorithm: str, dataset: str,
                    center: float) -> None:
    """An `lr` distribution's bounds, r / 10^decades and r * 10^decades, inside its setting's declared range: a
    wide `decades` would otherwise draw learning rates (1e58) that fail only as trials on the cluster."""
    for value in (concrete.low, concrete.high):
        try:
            TrainConfig.from_flat({"algorithm": algorithm, param.name: value})
        except ConfigError as err:
            expected = err.detail.partition(", got")[0].removeprefix("expected ")
            raise SpaceError(path, f"{key}.decades", param.decades,
                             f"a range whose ends are each {expected}; on {dataset}, r = {center:g}, so "
                             f"r x 10^+-decades spans [{concrete.low:g}, {concrete.high:g}]") from None


def _check_each_value_on(resolved: ResolvedSpace, dataset: ShiftDataset, param: Param, concrete: Param, path: Path,
                         key: str) -> None:
    """Every value a search of one setting can hand a trial (each choice, each end of a range), with the space's
    fixed and derived values, resolved on the dataset as a trial resolves it. The dry run before any cluster work
    builds one config only (each choice's first value): a second choice naming a model the dataset cannot run, or
    an augmentation it lacks, would otherwise fail every trial that draws it."""
    if concrete.distribution == "choice":
        written = [(f"values[{i}]", value) for i, value in enumerate(concrete.values)]
    else:  # an `lr` distribution's ends come from its decades
        ends = ("decades", "decades") if param.distribution == "lr" else ("low", "high")
        written = list(zip(ends, (concrete.low, concrete.high)))
    for place, value in written:
        try:
            TrainConfig.from_flat(resolved.materialize({param.name: value})).resolve(dataset)
        except ConfigError as err:
            detail = err.detail.partition(", got")[0].removeprefix("expected ")
            blame = detail if err.key == param.name else f"a value under which {err.key} is {detail}"
            raise SpaceError(path, f"{key}.{place}", value, f"{blame} on {dataset.name}") from None


def _concrete(param: Param, lr_center: float) -> Param:
    if param.distribution != "lr":
        return param
    scale = 10.0 ** param.decades
    return dataclasses.replace(param, distribution="loguniform", low=lr_center / scale, high=lr_center * scale)


@dataclass
class ResolvedSpace:
    """A space bound to one dataset: concrete distributions plus everything needed to build a config."""

    algorithm: str
    dataset: str
    search: dict[str, Param]
    fixed: dict[str, Any]
    derived: dict[str, Derived]
    default_epochs: int
    lr_center: float
    epochs_scale: float = 1.0  # the convergence rule's raise of every config's epochs (with_epochs_scale)

    def materialize(self, sampled: Mapping[str, Any]) -> dict[str, Any]:
        """The full flat trainer config of a trial: fixed values, then sampled, then derived ones."""
        config: dict[str, Any] = {"dataset": self.dataset, "algorithm": self.algorithm, **self.fixed}
        config.update({k: _plain(v) for k, v in sampled.items()})
        for name, rule in self.derived.items():
            config[name] = self._derive(rule, config)
        return config

    def _derive(self, rule: Derived, config: Mapping[str, Any]) -> Any:
        k = int(config.get("unlabeled_ratio") or 1)
        return max(1, math.ceil(rule.factor * self.default_epochs / (k + 1)))

    def with_epochs_scale(self, scale: float) -> ResolvedSpace:
        """This space with every config's epochs raised by `scale` alike (the convergence rule, `sweep
        --converge`): the dataset's E that `ratio_epochs` derives from becomes ceil(E x scale), so a method keeps
        its budget's ratio to ERM's; a space that leaves epochs to the dataset (ERM) fixes ceil(E x scale); a
        fixed value, or a searched one's values or bounds, are raised the same. The search draws the same
        configs (its other distributions are untouched); patience and everything else stay. A copy: the
        space itself is unchanged."""
        if scale == 1:
            return self
        epochs = scaled_epochs(self.default_epochs, scale)
        fixed, search = dict(self.fixed), dict(self.search)
        if "epochs" in search:
            search["epochs"] = _scaled_param(search["epochs"], scale)
        elif not _unset(fixed.get("epochs")):
            fixed["epochs"] = _scaled_setting(fixed["epochs"], scale)
        elif "epochs" not in self.derived:
            fixed["epochs"] = epochs
        return dataclasses.replace(self, search=search, fixed=fixed, derived=dict(self.derived), default_epochs=epochs,
                                   epochs_scale=self.epochs_scale * scale)


def _unset(value: Any) -> bool:
    """A fixed `epochs` that leaves them to the dataset: absent, None, or `none` as --set spells it."""
    return value is None or (isinstance(value, str) and value.strip().lower() == "none")


def _scaled_setting(value: Any, scale: float) -> Any:
    """A fixed `epochs` raised by `scale`; --set gives the word as typed ("4"). A value that is no finite
    number is left as it is, for the config's own check to refuse by name."""
    try:
        number = float(value)
    except (TypeError, ValueError):
        return value
    return scaled_epochs(number, scale) if math.isfinite(number) and not isinstance(value, bool) else value


def _scaled_param(param: Param, scale: float) -> Param:
    """A searched `epochs` raised by `scale`: each choice rounded up, a range's ends multiplied (the same draw
    then lands `scale` times as far)."""
    if param.values:
        return dataclasses.replace(param, values=tuple(scaled_epochs(v, scale) for v in param.values))
    return dataclasses.replace(param, low=param.low * scale, high=param.high * scale)


def _plain(value: Any) -> Any:
    """numpy scalars from samplers -> Python scalars, so configs hash and serialise the same everywhere."""
    return value.item() if hasattr(value, "item") else value


# Not part of a trial's identity: the seed (replicates share the trial id) and where stages are cached.
NOT_IDENTITY = ("seed", "stage_cache")


def trial_id(config: Mapping[str, Any]) -> str:
    """Content-derived identity: a hash of dataset, algorithm and config (DomainBed's idea)."""
    canonical = json.dumps({k: _plain(v) for k, v in sorted(config.items()) if k not in NOT_IDENTITY},
                           sort_keys=True, default=str)
    return hashlib.sha256(canonical.encode()).hexdigest()[:12]


def run_key(config: Mapping[str, Any], stage: str) -> str:
    """The identity of one run: the trial id, plus the seed for replicates (same config, several seeds)."""
    return _seeded(trial_id(config), config, stage)


def _seeded(key: str, config: Mapping[str, Any], stage: str) -> str:
    """A replicate's key carries its seed: the stage runs one config under several seeds."""
    return f"{key}-seed{config['seed']}" if stage == REPLICATE_STAGE else key


@dataclass(frozen=True)
class RunIdentity:
    """One run, made once from what Tune sampled: its full trainer config, its trial id and its key (the trial
    id, plus the seed in the replicate stage). The trial, the sweep's callbacks and `collect` all name the run by
    `key` (its completed record, its MLflow run): deriving it in one place keeps them naming the same run."""

    config: dict[str, Any]
    trial_id: str
    key: str

    @classmethod
    def of(cls, space: ResolvedSpace, sampled: Mapping[str, Any], stage: str) -> RunIdentity:
        """The run Tune's `sampled` config (a trial's config) stands for in `stage`; hashed once."""
        config = space.materialize(sampled)
        identity = trial_id(config)
        return cls(config, identity, _seeded(identity, config, stage))


# ----- parsing and validation -------------------------------------------------------------------
def resolve_path(name_or_path: str, folders: Sequence[str | os.PathLike[str]] = ()) -> Path:
    """A path as given, or the file a space name stands for (`dann` -> .../raybench/search_spaces/dann.yaml), looked
    up in the user's `folders` (--spaces), then $RAYBENCH_SPACES', the plug-ins' and raybench's own. A name no
    source holds is a SpaceError listing the names that exist."""
    path = Path(name_or_path)
    if path.suffix in (".yaml", ".yml") or is_file(path):
        return path
    try:
        return space_catalog.find_space(name_or_path, folders)[0]
    except space_catalog.UnknownSpaceError:
        raise missing_space(Path(f"{name_or_path}.yaml"), folders) from None


def missing_space(path: Path, folders: Sequence[str | os.PathLike[str]] = ()) -> SpaceError:
    """The error for a space file that does not exist: it names every space name a sweep could use instead, and
    the folders they were looked up in."""
    sources = space_catalog.space_sources(folders)
    known = ", ".join(space_catalog.space_names(folders))
    where = ", ".join(str(source.folder) for source in sources)
    return SpaceError(path, "file", str(path), f"an existing YAML file or one of: {known} (the spaces in {where})")


def is_file(path: Path) -> bool:
    """Whether `path` is a file; a name the OS cannot even look up (too long, a NUL byte) is none."""
    try:
        return path.is_file()
    except (OSError, ValueError):
        return False


class DuplicateKeyError(yaml.YAMLError):
    """A key given twice in one mapping; PyYAML's safe_load would silently keep the last value."""

    def __init__(self, key: Any, line: int, first_line: int) -> None:
        super().__init__(f"line {line}: duplicate key {key!r} (first on line {first_line})")
        self.key, self.line, self.first_line = key, line, first_line


class StrictLoader(yaml.SafeLoader):
    """SafeLoader that refuses duplicate keys: `lr` twice in `fixed` is a mistake, not an override."""

    def construct_mapping(self, node: yaml.Node, deep: bool = False) -> dict:
        if isinstance(node, yaml.MappingNode):
            self._refuse_duplicates(node)
        return super().construct_mapping(node, deep=deep)

    def _refuse_duplicates(self, node: yaml.MappingNode) -> None:
        """Checks the keys written in this mapping (merge keys `<<` may legitimately be overridden)."""
        seen: dict[Any, int] = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key, line = self.construct_object(key_node, deep=True), key_node.start_mark.line + 1
            try:
                if key in seen:
                    raise DuplicateKeyError(key, line, seen[key])
                seen[key] = line
            except TypeError:  # an unhashable key: SafeConstructor reports it
                continue


def read_text(path: Path) -> str:
    """The file as UTF-8 text; a stray Latin-1 byte is one line naming where it is, not a traceback."""
    try:
        raw = path.read_bytes()
    except OSError as err:
        raise SpaceError(path, "file", err.strerror or str(err), "a readable file") from None
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as err:
        line = raw[:err.start].count(b"\n") + 1
        raise SpaceError(path, f"line {line}", raw[err.start:err.end], "UTF-8 text") from None


def load_space(name_or_path: str, folders: Sequence[str | os.PathLike[str]] = ()) -> SearchSpace:
    """The space a name or a path stands for, parsed and validated; `folders`: the user's --spaces folders,
    looked up first. SpaceError for a missing or malformed file, SpaceFolderError for a folder that is none."""
    path = resolve_path(name_or_path, folders)
    if not is_file(path):
        raise missing_space(path, folders)
    return parse_space(read_yaml(path), path)


# Values (scalars, lists, mappings) a file may hold once its aliases are expanded. The largest shipped file
# holds a few hundred; an alias bomb (each level a list of aliases of the one before) holds 10^9 in a few lines,
# and anything that walks it (validation, an error quoting it, json) takes minutes and gigabytes.
MAX_YAML_VALUES = 20_000
# Lists and mappings a file may nest, one inside the other, aliases expanded. The shipped spaces and grids nest at
# most 6 deep (a dataset's override of a choice); PyYAML composes and constructs by recursion, and repr, json and
# the checks walk a value the same way, so a few kilobytes of `[` (or a chain of aliases) ended in a RecursionError.
MAX_YAML_DEPTH = 64


def expanded_size(root: yaml.Node) -> tuple[float, float]:
    """(values, depth) of the node graph with every alias expanded: how many values it holds, each node counted
    once per path to it, and how many lists and mappings nest at its deepest (a scalar: 0), computed in one pass
    over the distinct nodes (an alias is the same node object reached again). A value that contains itself (a
    recursive alias) expands without end: infinity, both."""
    counts: dict[int, float] = {}
    depths: dict[int, float] = {}
    stack, seen = [root], set()
    while stack:  # post-order without recursion: a deep file cannot exhaust Python's stack
        node = stack[-1]
        if id(node) in seen:
            stack.pop()
            if id(node) not in counts:
                kids = children(node)
                counts[id(node)] = 1 + sum(counts.get(id(child), math.inf) for child in kids)
                nested = isinstance(node, yaml.CollectionNode)
                depths[id(node)] = nested + max((depths.get(id(child), math.inf) for child in kids), default=0)
            continue
        seen.add(id(node))
        stack.extend(child for child in children(node) if id(child) not in seen)
    return counts[id(root)], depths[id(root)]


def refuse_deep_text(text: str, path: Path) -> None:
    """A SpaceError at the first list or mapping nested past MAX_YAML_DEPTH, found in the parser's event stream
    before anything is composed: PyYAML's parser is a loop, its composer a recursion that a deep file exhausts.
    It reads no further than that collection, so a file nested a million deep is refused as fast as one of 65."""
    depth = 0
    for event in yaml.parse(text, Loader=yaml.SafeLoader):
        if isinstance(event, yaml.CollectionStartEvent):
            depth += 1
            if depth > MAX_YAML_DEPTH:
                kind = "list" if isinstance(event, yaml.SequenceStartEvent) else "mapping"
                raise SpaceError(path, f"line {event.start_mark.line + 1}", f"a {kind} nested {depth} deep",
                                 f"lists and mappings nested at most {MAX_YAML_DEPTH} deep")
        elif isinstance(event, yaml.CollectionEndEvent):
            depth -= 1


def children(node: yaml.Node) -> list[yaml.Node]:
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    if isinstance(node, yaml.MappingNode):
        return [part for pair in node.value for part in pair]
    return []


def read_yaml(path: Path) -> Any:
    """The file parsed with duplicate keys refused and its size once aliases are expanded bounded; a problem
    is one SpaceError naming the file and the line (search spaces and benchmark files alike)."""
    return read_yaml_text(read_text(path), path)


def read_yaml_text(text: str, path: Path) -> Any:
    """`read_yaml` on text already read; errors name `path`."""
    loader = StrictLoader(text)
    try:
        refuse_deep_text(text, path)
        node = loader.get_single_node()
        if node is None:
            return None
        values, depth = expanded_size(node)
        if values > MAX_YAML_VALUES:
            raise SpaceError(path, "file", "endless (a recursive alias)" if math.isinf(values) else int(values),
                             f"at most {MAX_YAML_VALUES:,} values once its aliases are expanded (an alias bomb?)")
        if depth > MAX_YAML_DEPTH:  # aliases of aliases: each level shallow as written
            raise SpaceError(path, "file", f"lists and mappings nested {int(depth)} deep",
                             f"lists and mappings nested at most {MAX_YAML_DEPTH} deep once its aliases are expanded")
        return loader.construct_document(node)
    except DuplicateKeyError as err:
        raise SpaceError(path, f"line {err.line}", err.key,
                         f"each key once per mapping (first on line {err.first_line})") from None
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f"line {mark.line + 1}" if mark else "file"
        raise SpaceError(path, where, getattr(err, "problem", str(err)), "valid YAML") from None
    finally:
        loader.dispose()


def space_from_mapping(data: Mapping[str, Any], label: str = "<mapping>") -> SearchSpace:
    """A space given as a mapping with a YAML file's keys (the Python API), validated exactly as the file would
    be: written as YAML and read back by the same strict reader, so a value no YAML file can hold is refused too."""
    path = Path(label)
    if not isinstance(data, Mapping):
        raise SpaceError(path, "(top level)", data, "a mapping with keys algorithm, search, fixed, derived, datasets")
    _refuse_deep_mapping(data, path)
    try:
        text = yaml.safe_dump(_plain_mapping(data), sort_keys=False)
    except yaml.YAMLError as err:
        raise SpaceError(path, "(top level)", str(err).splitlines()[0], "plain YAML values (text, numbers, "
                                                                        "booleans, lists and mappings)") from None
    return parse_space(read_yaml_text(text, path), path)


def _refuse_deep_mapping(data: Mapping[str, Any], path: Path) -> None:
    """A caller's mapping held to a file's bounds before anything walks it by recursion (_plain_mapping, the YAML
    writer): lists and mappings nested at most MAX_YAML_DEPTH deep, at most MAX_YAML_VALUES values with a shared
    part counted once per path to it. A mapping that contains itself nests without end, so it is refused too."""
    stack: list[tuple[Any, int]] = [(data, 0)]
    values = 0
    while stack:
        value, outer = stack.pop()
        values += 1
        if values > MAX_YAML_VALUES:
            raise SpaceError(path, "(top level)", f"more than {MAX_YAML_VALUES:,} values",
                             f"at most {MAX_YAML_VALUES:,} values, a part shared by several counted at each")
        if isinstance(value, (Mapping, list, tuple)):
            if outer + 1 > MAX_YAML_DEPTH:
                raise SpaceError(path, "(top level)", f"lists and mappings nested {outer + 1} deep",
                                 f"lists and mappings nested at most {MAX_YAML_DEPTH} deep")
            stack.extend((item, outer + 1) for item in (value.values() if isinstance(value, Mapping) else value))


def _plain_mapping(data: Mapping[str, Any]) -> Any:
    """Nested mappings as dicts, so that safe_dump takes any Mapping a caller built (and nothing else)."""
    if isinstance(data, Mapping):
        return {key: _plain_mapping(value) for key, value in data.items()}
    if isinstance(data, (list, tuple)):
        return [_plain_mapping(value) for value in data]
    return data


def parse_space(data: Any, path: Path) -> SearchSpace:
    if not isinstance(data, dict):
        raise SpaceError(path, "(top level)", data, "a mapping with keys algorithm, search, fixed, derived, datasets")
    no_unknown_keys(data, TOP_KEYS, path, "")
    algorithm = data.get("algorithm")
    if not isinstance(algorithm, str) or algorithm not in ALGORITHMS:
        raise SpaceError(path, "algorithm", algorithm, f"one of {', '.join(ALGORITHMS.names())}")
    section = _parse_section(data, path, "", algorithm)
    datasets = data.get("datasets") or {}
    if not isinstance(datasets, dict):
        raise SpaceError(path, "datasets", datasets, "a mapping from dataset name to overrides")
    overrides = {}
    for name, body in datasets.items():
        if name not in DATASETS:
            raise SpaceError(path, f"datasets.{name}", name, f"a dataset name: one of {', '.join(DATASETS.names())}")
        if not isinstance(body, dict):
            raise SpaceError(path, f"datasets.{name}", body, "a mapping with keys search, fixed, derived")
        no_unknown_keys(body, OVERRIDE_KEYS, path, f"datasets.{name}.")
        overrides[str(name)] = _parse_section(body, path, f"datasets.{name}.", algorithm)
    _refuse_two_places(data, path)
    description = data.get("description", "")
    if not isinstance(description, str):
        raise SpaceError(path, "description", description, "text")
    return SearchSpace(path, algorithm, str(description), section["search"], section["fixed"], section["derived"], overrides)


def no_unknown_keys(data: dict, allowed: set[str], path: Path, prefix: str,
                    error: type[YamlFileError] = SpaceError) -> None:
    """Refuse the first key of `data` outside `allowed` (a typo must not be silently ignored), as `error`."""
    for key, value in data.items():
        if key not in allowed:
            raise error(path, f"{prefix}{key}", value, f"one of the keys {', '.join(sorted(allowed))}")


def _parse_section(data: dict, path: Path, prefix: str, algorithm: str) -> dict[str, Any]:
    search = {name: _parse_param(name, spec, path, f"{prefix}search.{name}", algorithm)
              for name, spec in _mapping(data.get("search"), path, f"{prefix}search").items()}
    fixed = _mapping(data.get("fixed"), path, f"{prefix}fixed")
    for name, value in fixed.items():
        _check_value(name, value, path, f"{prefix}fixed.{name}", algorithm)
    derived = {name: _parse_derived(name, spec, path, f"{prefix}derived.{name}", algorithm)
               for name, spec in _mapping(data.get("derived"), path, f"{prefix}derived").items()}
    return {"search": search, "fixed": fixed, "derived": derived}


SECTIONS = ("search", "fixed", "derived")
SECTION_VERBS = {"search": "searched", "fixed": "fixed", "derived": "derived"}


@dataclass(frozen=True)
class Place:
    """Where a file gives a setting its value on one dataset: the section, the key that names it, what it says."""

    section: str
    key: str
    value: Any
    per_dataset: bool


def _refuse_two_places(data: dict, path: Path) -> None:
    """Each setting searched, fixed or derived in one place, at the top and on every dataset once its overrides
    are merged. Two would each be taken and one silently win (a sampled value over a fixed one, a derived value
    over a sampled one); a dataset's own section replacing the same section's value above stays an override."""
    datasets = data.get("datasets") or {}
    for prefix, override in [("", {}), *((f"datasets.{name}.", body) for name, body in datasets.items())]:
        places: dict[str, list[Place]] = {}
        for section in SECTIONS:
            top, own = data.get(section) or {}, override.get(section) or {}
            for name in {**top, **own}:
                place = (Place(section, f"{prefix}{section}.{name}", own[name], True) if name in own else
                         Place(section, f"{section}.{name}", top[name], False))
                places.setdefault(name, []).append(place)
        for name, found in places.items():
            if len(found) > 1:
                first, second = sorted(found, key=lambda p: (p.per_dataset, SECTIONS.index(p.section)))[:2]
                raise SpaceError(path, second.key, second.value,
                                 f"no value, since {name!r} is also {SECTION_VERBS[first.section]} ({first.key}): "
                                 f"a setting is searched, fixed or derived in one place, else one value silently wins")


def _mapping(value: Any, path: Path, key: str) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise SpaceError(path, key, value, "a mapping")
    return value


def _known_names(algorithm: str) -> set[str]:
    hparams = {f.name for f in dataclasses.fields(ALGORITHMS.get(algorithm).Hparams)}
    return (set(TrainConfig.field_names()) | hparams) - {"dataset", "algorithm"}


def _setting_type(name: str, algorithm: str) -> FieldType:
    """The declared type of a trainer setting or hyperparameter (a trainer setting wins a shared name, as in
    TrainConfig.from_flat)."""
    fields = {f.name: f for f in dataclasses.fields(ALGORITHMS.get(algorithm).Hparams)}
    fields.update({f.name: f for f in dataclasses.fields(TrainConfig)})
    return FieldType.of(fields[name].type)


def _check_name(name: str, path: Path, key: str, algorithm: str, written: Any) -> None:
    """A name the space may set: a trainer setting or a hyperparameter, and none a sweep sets itself (what
    `--set` refuses, a file may not say either: a searched seed gives two trials one trial id, a stage_cache
    writes outside --storage, a selection_metric selects on what --selection does not say)."""
    if name in OWN_FLAGS:
        raise SpaceError(path, key, written, _owned_words(name, written))
    if name not in _known_names(algorithm):
        raise SpaceError(path, key, name, f"a trainer setting or a hyperparameter of {algorithm!r}: "
                                          f"{', '.join(sorted(_known_names(algorithm)))}")


def _owned_words(name: str, written: Any) -> str:
    """What a file that sets a sweep's own setting is told; a selection on a test split is named as such."""
    words = f"no value: a sweep sets {name} through {OWN_FLAGS[name]}"
    test = next((text for text in _texts(written) if names_test_split(text)), None)
    if name in SELECTION_SETTINGS and test is not None:
        words += f"; {test!r} names a test split, and selecting on test is what the protocol forbids"
    return words


def _texts(written: Any) -> list[str]:
    """The text a written value holds (a fixed value, a choice's values), in file order: where a split is named."""
    stack, texts = [written], []
    while stack:
        value = stack.pop()
        if isinstance(value, str):
            texts.append(value)
        elif isinstance(value, dict):
            stack.extend(reversed(list(value.values())))
        elif isinstance(value, list):
            stack.extend(reversed(value))
    return texts


def names_test_split(text: str) -> bool:
    """Whether `text` (a split, or split/metric: `test/acc`, `id_test/acc`, `test_unlabeled`) names a test split."""
    split = text.partition("/")[0].lower()
    return "test" in re.split(r"[+_\-\s]", split)


def _check_value(name: str, value: Any, path: Path, key: str, algorithm: str) -> None:
    """Type- and range-check one value the way the trainer will, so a bad file fails before Ray starts; the value
    must already be of the setting's type (a file's YAML has types; only the command line's text is coerced)."""
    _check_name(name, path, key, algorithm, value)
    try:
        TrainConfig.from_flat({"algorithm": algorithm, name: value})
    except ConfigError as err:
        raise SpaceError(path, key, value, err.detail.partition(", got")[0].removeprefix("expected ")) from None
    setting = _setting_type(name, algorithm)
    expected = setting.written_expectation(value)
    if expected:  # a value the trainer would coerce (64.0 to 64, 5 to '5'): the file still wrote another type
        hint = setting.written_hint(value)
        raise SpaceError(path, key, value, f"{expected} ({name} is {setting.text}{'; ' + hint if hint else ''})")


def _number(spec: dict, field_name: str, path: Path, key: str, limit: float = math.inf) -> float:
    """A finite number of the file's own syntax (a bound, decades, a factor), at most `limit` in size."""
    value = spec.get(field_name)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not -MAX_BOUND <= value <= MAX_BOUND:
        raise SpaceError(path, f"{key}.{field_name}", value, "a finite number")
    if abs(value) > limit:
        raise SpaceError(path, f"{key}.{field_name}", value, f"a number of size at most {limit:g}")
    return float(value)


# The largest bound a file may write (a float's own largest is 1.8e308; an int beyond it cannot become one).
MAX_BOUND = 1e300
MAX_DECADES = 10.0  # an `lr` distribution spans r / 10^decades to r * 10^decades; WILDS uses 1
MAX_FACTOR = 100.0  # ratio_epochs: epochs = ceil(factor * E / (k + 1)); WILDS uses 1 and 2


def _parse_param(name: str, spec: Any, path: Path, key: str, algorithm: str) -> Param:
    _check_name(name, path, key, algorithm, spec)
    if not isinstance(spec, dict):
        raise SpaceError(path, key, spec, "a mapping with a 'distribution' key")
    kind = spec.get("distribution")
    if kind not in DISTRIBUTIONS:
        raise SpaceError(path, f"{key}.distribution", kind, f"one of {', '.join(DISTRIBUTIONS)}")
    allowed = {"loguniform": {"low", "high"}, "uniform": {"low", "high"}, "choice": {"values"}, "lr": {"decades"}}[kind]
    no_unknown_keys(spec, allowed | {"distribution"}, path, f"{key}.")
    setting = _setting_type(name, algorithm)
    if kind != "choice" and not setting.continuous:
        raise SpaceError(path, f"{key}.distribution", kind, f"choice (the values to try): {name} is {setting.text}, "
                                                            f"and {kind} draws real numbers, which no trial can take")
    if kind == "choice":
        return Param(kind, values=_choices(name, spec.get("values"), path, key, algorithm), name=name)
    if kind == "lr":
        decades = _number(spec, "decades", path, key, MAX_DECADES) if "decades" in spec else 1.0
        if decades <= 0:
            raise SpaceError(path, f"{key}.decades", decades, "a positive number")
        return Param(kind, decades=decades, name=name)
    low, high = _number(spec, "low", path, key), _number(spec, "high", path, key)
    if kind == "loguniform" and low <= 0:
        raise SpaceError(path, f"{key}.low", low, "a positive number (log-uniform)")
    if low >= high:
        raise SpaceError(path, f"{key}.high", high, f"a number greater than low ({low})")
    for bound, value in (("low", low), ("high", high)):
        _check_value(name, value, path, f"{key}.{bound}", algorithm)
    return Param(kind, low=low, high=high, name=name)


def _choices(name: str, values: Any, path: Path, key: str, algorithm: str) -> tuple[Any, ...]:
    """A choice's values, each of the setting's type and range, each once: a value given twice is drawn twice as
    often, and 3 and 3.0 would train one config under two trial ids."""
    if not isinstance(values, list) or not values:
        raise SpaceError(path, f"{key}.values", values, "a non-empty list")
    for i, value in enumerate(values):
        _check_value(name, value, path, f"{key}.values[{i}]", algorithm)
        if value in values[:i]:
            raise SpaceError(path, f"{key}.values[{i}]", value, f"each value once (also values[{values.index(value)}])")
    return tuple(values)


# What each derived rule gives: a whole number, so only an integer setting can take it (ratio_epochs on lr
# would silently train at lr = 10).
RULE_GIVES = {"ratio_epochs": "a whole number of epochs", "max_batch_size": "a batch size"}


def _parse_derived(name: str, spec: Any, path: Path, key: str, algorithm: str) -> Derived:
    _check_name(name, path, key, algorithm, spec)
    if not isinstance(spec, dict) or spec.get("rule") not in DERIVED_RULES:
        got = spec.get("rule") if isinstance(spec, dict) else spec
        raise SpaceError(path, f"{key}.rule", got, f"one of {', '.join(DERIVED_RULES)}")
    no_unknown_keys(spec, {"rule", "factor"}, path, f"{key}.")
    setting = _setting_type(name, algorithm)
    if setting.kind != "int":
        raise SpaceError(path, f"{key}.rule", spec["rule"], f"a rule for an integer setting: {spec['rule']} gives "
                                                            f"{RULE_GIVES[spec['rule']]}, and {name} is {setting.text}")
    factor = _number(spec, "factor", path, key, MAX_FACTOR) if "factor" in spec else 2.0
    if factor <= 0:
        raise SpaceError(path, f"{key}.factor", factor, "a positive number")
    return Derived(name, spec["rule"], factor)


# ----- what a sweep's command line does to a space (here, not in the runner: `space show`/`draw` and the
# benchmark file's checks use them without importing the runner and MLflow) -----
SMOKE_FIXED = {"epochs": 2, "max_steps_per_epoch": 4, "patience": None}
# Trainer settings a sweep decides through its own flags: a --set would train one thing under another's label.
OWN_FLAGS = {"dataset": "--dataset", "algorithm": "the search space's `algorithm:` (another space file)",
             "selection_metric": "--selection (ood_val, id_val, oracle)", "seed": "--seed (the search's seed; "
             "replicate seeds derive from the selected trial)", "stage_cache": "--storage"}
# The settings that decide what a run is selected on: none may name a test split (selection on test is what the
# protocol forbids; --selection oracle does it, labelled analysis-only wherever it is shown).
SELECTION_SETTINGS = ("selection_metric",)


def refuse_selection_on_test(settings: Mapping[str, Any]) -> None:
    """ConfigError for a setting that decides what is selected on (SELECTION_SETTINGS) naming a test split, given
    on a command line: `raybench train --set selection_metric=test/acc` would pick its best epoch on test."""
    for name in SELECTION_SETTINGS:
        value = settings.get(name)
        if isinstance(value, str) and names_test_split(value):
            raise ConfigError(name, f"expected a validation split/metric (selecting on test is what the protocol "
                                    f"forbids; a sweep's --selection oracle does it, labelled analysis-only), "
                                    f"got {value!r}")


def command_line_overrides(smoke: bool, extra_fixed: Mapping[str, Any]) -> dict[str, Any]:
    """--smoke's presets, then --set: the user named the value, so it wins. A --set that selects on a test split
    is a ConfigError (`raybench sweep` refuses any --set of a sweep's own settings before it gets here; `space
    show` and `draw` show what a sweep would run, and none selects on test through --set)."""
    refuse_selection_on_test(extra_fixed)
    return {**(SMOKE_FIXED if smoke else {}), **extra_fixed}


def sweep_space(space: SearchSpace, dataset: ShiftDataset, overrides: Mapping[str, Any]) -> ResolvedSpace:
    """The space a sweep searches: the dataset's version of it, less what the command line fixed (a value set
    there wins over the space's search and derivation). `raybench space draw` draws from exactly this."""
    resolved = space.for_dataset(dataset)
    for name in overrides:
        resolved.search.pop(name, None)
        resolved.derived.pop(name, None)
    return resolved


def midpoints(space: ResolvedSpace) -> dict[str, Any]:
    """One config inside the space (each range's middle, each choice's first value): what a sweep dry-runs
    through TrainConfig before any cluster work, so a bad combination is refused at once."""
    return {n: p.values[0] if p.values else (p.low + p.high) / 2 for n, p in space.search.items()}
