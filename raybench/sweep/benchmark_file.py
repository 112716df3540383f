"""Benchmark files: a grid of (dataset, search space) pairs and how to sweep each, parsed once into typed
records and validated before any cluster work.

The format (documented with the shipped files in raybench/grids/README.md; `raybench benchmark NAME` runs
the shipped NAME.yaml):

    name: embedded-grid
    selection: ood_val          # ood_val, id_val or oracle, for every pair
    trials: 4                   # per pair, unless a pair says otherwise
    replicates: 2
    max_concurrent_trials: 2    # for the whole benchmark
    converge: {factor: 2, attempts: 3}  # optional: each pair under the convergence rule (`sweep --converge`)
    grid:
      - {datasets: [digits-shift], spaces: [erm, coral, dann]}
    exclude:
      - {datasets: [digits-shift], spaces: [coral], reason: "why this pair is not run"}
    pairs:
      - {dataset: digits-shift, space: dann, trials: 2, set: {penalty: 1.0}}

Every error names the file, the key, the value and what was expected, in one line, as a search space's do.
`bind_pairs` then binds each pair's space to its dataset exactly as the pair's own sweep will (`runner.prepare`),
so `--plan` refuses what the run would. A dataset whose files are not on this machine (a WILDS root lives on the
cluster) leaves its pairs to their own sweeps, which make the same checks before their own cluster work; a pair
failing them is recorded and the others go on.
"""
from __future__ import annotations

import hashlib
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from raybench.data import DATASETS
from raybench.paths import NAME_RULE, name_problem, safe_name
from raybench.settings import MAX_SEED, number_text
from raybench.sweep import space_catalog
from raybench.sweep.converge import (
    ATTEMPTS_WORDS,
    DEFAULT_ATTEMPTS,
    FACTOR_WORDS,
    ConvergeRule,
    attempts_problem,
    factor_problem,
)
from raybench.sweep.selection import SELECTIONS
from raybench.sweep.space import (
    OWN_FLAGS,
    SpaceError,
    YamlFileError,
    is_file,
    load_space,
    no_unknown_keys,
    read_yaml,
    resolve_path,
)
from raybench.trainer import ConfigError, TrainConfig
from raybench.words import EXECUTORS

TOP_KEYS = {"name", "description", "selection", "seed", "trials", "replicates", "executor", "smoke",
            "max_concurrent_trials", "sweeps_at_once", "set", "grid", "exclude", "pairs", "converge"}
CONVERGE_KEYS = {"factor", "attempts"}
PAIR_KEYS = {"dataset", "space", "trials", "replicates", "set"}
# Upper ends of the file's counts: past any real benchmark (WILDS 2.0: 10 trials, 10 replicates at most), so a
# typo is one line at load, not a sweep that fails after Ray started.
MAX_TRIALS = 10_000
MAX_REPLICATES = 1_000
MAX_CONCURRENT = 100_000


class BenchmarkError(YamlFileError):
    """A malformed benchmark file."""


@dataclass(frozen=True)
class Pair:
    """One sweep of the benchmark: a search space on a dataset, with the settings it runs under."""

    dataset: str
    space: str  # as written in the file: a space name (raybench list spaces) or a path
    space_path: Path
    method: str  # the space's file stem (erm_aug), the row name `compare` gives it
    algorithm: str
    sweep: str  # the sweep's name: <benchmark>-<method>-<dataset>
    trials: int
    replicates: int | None  # None: the dataset's own count, as `raybench sweep`
    fixed: dict[str, Any] = field(default_factory=dict)
    space_digest: str = ""  # sha256 of the space file as loaded: a resume tells an edited space from the same one

    @property
    def label(self) -> str:
        return f"{self.method} on {self.dataset}"

    @property
    def runs(self) -> int:
        """Runs this pair trains, as far as known before it starts (replicates default to 3)."""
        return self.trials + (3 if self.replicates is None else self.replicates)


@dataclass(frozen=True)
class Refused:
    """A pair of the grid the file rules out, and why (e.g. the paper did not run it)."""

    dataset: str
    method: str
    reason: str


@dataclass(frozen=True)
class Benchmark:
    path: Path
    name: str
    description: str
    selection: str
    seed: int
    executor: str
    smoke: bool
    max_concurrent_trials: int
    sweeps_at_once: int
    pairs: list[Pair]
    refused: list[Refused]
    converge: ConvergeRule | None = None  # each pair's sweep under the convergence rule; None: one sweep each

    @property
    def unqueued_sweeps_at_once(self) -> int:
        """How many sweeps may run at once without a trial queue (a sweep target a library caller builds; a
        benchmark's own runs always have one): each needs a slot of its own, so no more than the cap."""
        return min(self.sweeps_at_once, self.max_concurrent_trials)

    @property
    def trials_per_sweep(self) -> int:
        """Each running sweep's static share of the benchmark's trial cap, for a sweep target without a trial
        queue, so the running trials never exceed the cap."""
        return max(1, self.max_concurrent_trials // self.unqueued_sweeps_at_once)


def load_benchmark(path_text: str, folders: Sequence[str | os.PathLike[str]] = ()) -> Benchmark:
    """The benchmark a file (or the name of a grid raybench ships) describes, parsed and validated; its space names
    are looked up in the user's `folders` (--spaces) first, as each pair's sweep looks them up."""
    path = benchmark_path(path_text)
    if not is_file(path):
        raise BenchmarkError(path, "file", str(path), f"an existing benchmark YAML file or one of: "
                                                      f"{', '.join(space_catalog.grid_names())}")
    return parse_benchmark(read_yaml(path), path, folders)


def benchmark_path(path_text: str) -> Path:
    """A path as given, or the shipped grid a bare name stands for (`embedded` -> raybench/grids/embedded.yaml)."""
    path = Path(path_text)
    if path.suffix in (".yaml", ".yml") or is_file(path) or path_text not in space_catalog.grid_names():
        return path
    return space_catalog.find_grid(path_text)


def parse_benchmark(data: Any, path: Path, folders: Sequence[str | os.PathLike[str]] = ()) -> Benchmark:
    if not isinstance(data, dict):
        raise BenchmarkError(path, "(top level)", data, f"a mapping with keys {', '.join(sorted(TOP_KEYS))}")
    no_unknown_keys(data, TOP_KEYS, path, "", BenchmarkError)
    name = data.get("name")
    if not isinstance(name, str) or name_problem(name):
        raise BenchmarkError(path, "name", name, NAME_RULE)
    selection = data.get("selection", "ood_val")
    if not isinstance(selection, str) or selection not in SELECTIONS:
        raise BenchmarkError(path, "selection", selection, f"one of {', '.join(SELECTIONS.names())}")
    executor = data.get("executor", "train")
    if not isinstance(executor, str) or executor not in EXECUTORS:
        raise BenchmarkError(path, "executor", executor, f"one of {', '.join(EXECUTORS)}")
    smoke = data.get("smoke", False)
    if not isinstance(smoke, bool):
        raise BenchmarkError(path, "smoke", smoke, "true or false")
    cap = _count(data, "max_concurrent_trials", path, "max_concurrent_trials", 1, 2, MAX_CONCURRENT)
    grid = _grid(data.get("grid"), path, folders)
    excluded = _exclusions(data.get("exclude"), path, grid)
    runnable = [(d, s) for d, s in grid if (d, s) not in excluded]
    if not runnable:
        raise BenchmarkError(path, "grid", data.get("grid"), "at least one pair that `exclude` does not rule out")
    # More sweeps than slots is allowed: in the trial queue a running sweep holds a slot only while a trial of its
    # own runs, so a sweep starting up or between its stages leaves its slot to another's trial.
    at_once = _count(data, "sweeps_at_once", path, "sweeps_at_once", 1, min(cap, len(runnable)), MAX_CONCURRENT)
    defaults = {"trials": _count(data, "trials", path, "trials", 1, 10, MAX_TRIALS),
                "replicates": _count(data, "replicates", path, "replicates", 1, None, MAX_REPLICATES),
                "set": _settings(data.get("set"), path, "set")}
    overrides = _overrides(data.get("pairs"), path, runnable)
    pairs = [_pair(str(name), dataset, space, defaults, overrides.get((dataset, space), {}), path, folders)
             for dataset, space in runnable]
    refused = [Refused(d, _space_path(s, path, folders).stem, excluded[(d, s)]) for d, s in grid if (d, s) in excluded]
    _refuse_name_clashes(pairs, path)
    description = data.get("description", "")
    if not isinstance(description, str):
        raise BenchmarkError(path, "description", description, "text")
    return Benchmark(path, str(name), description, selection, _count(data, "seed", path, "seed", 0, 0, MAX_SEED),
                     executor, smoke, cap, at_once, pairs, refused, _converge(data.get("converge"), path))


def _converge(value: Any, path: Path) -> ConvergeRule | None:
    """`converge: {factor: 2, attempts: 3}`: every pair's sweep under the convergence rule, as `raybench sweep
    --converge 2 --converge-attempts 3` (the benchmark's own --converge flags override it)."""
    if value is None:
        return None
    if not isinstance(value, dict):
        raise BenchmarkError(path, "converge", value, "a mapping with keys factor and attempts (e.g. {factor: 2, "
                                                      "attempts: 3})")
    no_unknown_keys(value, CONVERGE_KEYS, path, "converge.", BenchmarkError)
    factor, attempts = value.get("factor"), value.get("attempts", DEFAULT_ATTEMPTS)
    if factor_problem(factor):
        raise BenchmarkError(path, "converge.factor", factor, FACTOR_WORDS)
    if attempts_problem(attempts):
        raise BenchmarkError(path, "converge.attempts", attempts, ATTEMPTS_WORDS)
    return ConvergeRule(float(factor), attempts)


def _count(data: dict, key: str, path: Path, where: str, minimum: int, default: int | None, maximum: int) -> Any:
    """An integer in [minimum, maximum]; `replicates: 0` is refused by its minimum: a pair's row in the
    comparison is the mean over its replicates, so a pair without any would end "finished" with no numbers."""
    value = data.get(key, default)
    if value is None and default is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise BenchmarkError(path, where, value, f"an integer >= {minimum}")
    if value > maximum:
        raise BenchmarkError(path, where, value, f"an integer >= {minimum}, at most {number_text(maximum)}")
    return value


def _names(value: Any, path: Path, key: str) -> list[str]:
    if not isinstance(value, list) or not value or not all(isinstance(v, str) and v for v in value):
        raise BenchmarkError(path, key, value, "a non-empty list of names")
    return value


def _grid(blocks: Any, path: Path, folders: Sequence[str | os.PathLike[str]]) -> list[tuple[str, str]]:
    """Every (dataset, space) pair of the grid's blocks, in file order; a pair named twice is an error."""
    if not isinstance(blocks, list) or not blocks:
        raise BenchmarkError(path, "grid", blocks, "a non-empty list of {datasets: [...], spaces: [...]} blocks")
    pairs: list[tuple[str, str]] = []
    for i, block in enumerate(blocks):
        key = f"grid[{i}]"
        if not isinstance(block, dict):
            raise BenchmarkError(path, key, block, "a mapping with keys datasets, spaces")
        no_unknown_keys(block, {"datasets", "spaces"}, path, f"{key}.", BenchmarkError)
        datasets, spaces = _names(block.get("datasets"), path, f"{key}.datasets"), _names(block.get("spaces"), path, f"{key}.spaces")
        for dataset in datasets:
            if dataset not in DATASETS:
                raise BenchmarkError(path, f"{key}.datasets", dataset, f"a dataset name: one of {', '.join(DATASETS.names())}")
        for space in spaces:
            _space_path(space, path, folders)  # refuses a missing file now
        for pair in ((d, s) for d in datasets for s in spaces):
            if pair in pairs:
                raise BenchmarkError(path, key, f"{pair[1]} on {pair[0]}", "each pair once in the grid")
            pairs.append(pair)
    return pairs


def _space_path(space: str, path: Path, folders: Sequence[str | os.PathLike[str]]) -> Path:
    """A space name (looked up as `raybench sweep NAME` looks it up) or a YAML path, relative to the benchmark
    file's folder."""
    if space.endswith((".yaml", ".yml")):
        candidate = path.parent / space
    else:
        try:
            candidate = resolve_path(space, folders)
        except SpaceError:
            candidate = path.parent / f"{space}.yaml"  # no such name: refused below, naming the known ones
    if not is_file(candidate):
        known = ", ".join(space_catalog.space_names(folders))
        raise BenchmarkError(path, "spaces", space, f"a search-space name ({known}) or a YAML file (relative to the "
                                                    f"benchmark file)")
    return candidate


def _exclusions(entries: Any, path: Path, grid: list[tuple[str, str]]) -> dict[tuple[str, str], str]:
    if entries is None:
        return {}
    if not isinstance(entries, list):
        raise BenchmarkError(path, "exclude", entries, "a list of {datasets, spaces, reason} entries")
    excluded: dict[tuple[str, str], str] = {}
    for i, entry in enumerate(entries):
        key = f"exclude[{i}]"
        if not isinstance(entry, dict):
            raise BenchmarkError(path, key, entry, "a mapping with keys datasets, spaces, reason")
        no_unknown_keys(entry, {"datasets", "spaces", "reason"}, path, f"{key}.", BenchmarkError)
        reason = entry.get("reason")
        if not isinstance(reason, str) or not reason.strip():
            raise BenchmarkError(path, f"{key}.reason", reason, "the reason the pairs are ruled out, in words")
        named = [(d, s) for d in _names(entry.get("datasets"), path, f"{key}.datasets")
                 for s in _names(entry.get("spaces"), path, f"{key}.spaces")]
        for dataset, space in named:
            if (dataset, space) not in grid:
                raise BenchmarkError(path, key, f"{space} on {dataset}", "a pair of the grid")
            excluded[(dataset, space)] = reason.strip()
    return excluded


def _settings(value: Any, path: Path, key: str) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise BenchmarkError(path, key, value, "a mapping of trainer settings or hyperparameters to values")
    for name in value:
        if name in OWN_FLAGS:
            raise BenchmarkError(path, f"{key}.{name}", value[name], f"no value: a sweep sets {name} through {OWN_FLAGS[name]}")
    return dict(value)


def _overrides(entries: Any, path: Path, runnable: list[tuple[str, str]]) -> dict[tuple[str, str], dict[str, Any]]:
    if entries is None:
        return {}
    if not isinstance(entries, list):
        raise BenchmarkError(path, "pairs", entries, "a list of {dataset, space, trials, replicates, set} entries")
    found: dict[tuple[str, str], dict[str, Any]] = {}
    for i, entry in enumerate(entries):
        key = f"pairs[{i}]"
        if not isinstance(entry, dict):
            raise BenchmarkError(path, key, entry, "a mapping with keys dataset, space and the settings it overrides")
        no_unknown_keys(entry, PAIR_KEYS, path, f"{key}.", BenchmarkError)
        pair = (entry.get("dataset"), entry.get("space"))
        if pair not in runnable:
            raise BenchmarkError(path, key, f"{pair[1]} on {pair[0]}", "a pair of the grid that is not excluded")
        if pair in found:
            raise BenchmarkError(path, key, f"{pair[1]} on {pair[0]}", "each pair overridden once")
        overrides: dict[str, Any] = {}
        if "trials" in entry:
            overrides["trials"] = _count(entry, "trials", path, f"{key}.trials", 1, None, MAX_TRIALS)
        if "replicates" in entry:
            overrides["replicates"] = _count(entry, "replicates", path, f"{key}.replicates", 1, None, MAX_REPLICATES)
        if "set" in entry:
            overrides["set"] = _settings(entry.get("set"), path, f"{key}.set")
        found[pair] = overrides  # type: ignore[index]
    return found


def _pair(benchmark: str, dataset: str, space: str, defaults: dict[str, Any], override: dict[str, Any], path: Path,
          folders: Sequence[str | os.PathLike[str]]) -> Pair:
    space_path = _space_path(space, path, folders)
    parsed = load_space(str(space_path))  # a malformed space is refused now, naming its own file and key
    fixed = {**defaults["set"], **override.get("set", {})}
    try:
        TrainConfig.from_flat({"algorithm": parsed.algorithm, **fixed})
    except ConfigError as err:
        where = "pairs" if err.key in override.get("set", {}) else "set"
        raise BenchmarkError(path, f"{where}: {space_path.stem} on {dataset}: set.{err.key}", fixed.get(err.key),
                             err.detail.partition(", got")[0].removeprefix("expected ")) from None
    method = space_path.stem
    return Pair(dataset, space, space_path, method, parsed.algorithm, safe_name(f"{benchmark}-{method}-{dataset}"),
                override.get("trials", defaults["trials"]), override.get("replicates", defaults["replicates"]), fixed,
                hashlib.sha256(space_path.read_bytes()).hexdigest())


def _refuse_name_clashes(pairs: list[Pair], path: Path) -> None:
    """Two spaces with one file stem (a path and a shipped name) would share a sweep name, and one's records."""
    seen: dict[str, Pair] = {}
    for pair in pairs:
        if pair.sweep in seen:
            raise BenchmarkError(path, "grid", pair.space, f"spaces with distinct file names ({seen[pair.sweep].space} "
                                                           f"and {pair.space} both make sweep {pair.sweep!r})")
        seen[pair.sweep] = pair


# ----- each pair on its dataset, as its sweep will bind it -------------------------------------------------------
class PairError(BenchmarkError):
    """A pair its own sweep would refuse on its dataset: one line naming the benchmark file, the pair, where the
    refused value comes from (the file's `set`, `smoke`, or the space as it resolves on that dataset) and why."""

    def __init__(self, path: Path, pair: Pair, source: str, detail: str) -> None:
        ValueError.__init__(self, f"{path}: {pair.label}: {source}: {detail}")


@dataclass(frozen=True)
class Binding:
    """A pair checked on its dataset, or why it could not be here: its dataset's files are not on this machine
    (a WILDS root on the cluster), and its sweep makes the checks before its own cluster work."""

    pair: Pair
    unchecked: str = ""


def bind_pairs(benchmark: Benchmark) -> list[Binding]:
    """Every pair's space bound to its dataset with the settings its sweep gets, as `runner.prepare` binds it: the
    first pair its sweep would refuse is a PairError. Each dataset is loaded once."""
    from raybench.data import load_dataset

    loaded: dict[str, Any] = {}
    bindings = []
    for pair in benchmark.pairs:
        if pair.dataset not in loaded:
            try:
                loaded[pair.dataset] = load_dataset(pair.dataset)
            except OSError as err:  # WILDS files, a Debian package's sources: where the sweep runs, maybe
                loaded[pair.dataset] = f"{pair.dataset}: {err}"
        dataset = loaded[pair.dataset]
        if isinstance(dataset, str):
            bindings.append(Binding(pair, dataset))
            continue
        _bind(benchmark, pair, dataset)
        bindings.append(Binding(pair))
    return bindings


def _bind(benchmark: Benchmark, pair: Pair, dataset: Any) -> None:
    """The pair's dry run: the search space on the dataset, the sweep's fixed settings, one full trial config."""
    from raybench.sweep.space import SMOKE_FIXED, SpaceError, command_line_overrides, midpoints, sweep_space

    overrides = command_line_overrides(benchmark.smoke, pair.fixed)
    try:
        resolved = sweep_space(load_space(str(pair.space_path)), dataset, overrides)
        metric = SELECTIONS.get(benchmark.selection).metric(dataset)
        resolved.fixed.update({"selection_metric": metric, "seed": benchmark.seed, **overrides})
        TrainConfig.from_flat(resolved.materialize(midpoints(resolved))).resolve(dataset)
    except SpaceError as err:
        raise PairError(benchmark.path, pair, "its space", str(err)) from None
    except ConfigError as err:
        source = (f"set.{err.key}" if err.key in pair.fixed else
                  f"smoke (which sets {err.key})" if benchmark.smoke and err.key in SMOKE_FIXED else
                  f"{pair.space_path}: {err.key}, as the space resolves on {pair.dataset}")
        raise PairError(benchmark.path, pair, source, err.detail) from None
    except ValueError as err:  # the selection's split: `id_val` on a dataset without one
        raise PairError(benchmark.path, pair, f"selection {benchmark.selection}", str(err)) from None
    if not resolved.search and pair.trials > 1:
        raise PairError(benchmark.path, pair, "trials", f"expected 1, since `set` fixes every setting "
                                                        f"{pair.space_path.name} searches, got {pair.trials}")
