"""raybench's Python API: everything the command line does, as typed functions a notebook or a script calls.

The `raybench` command calls these functions (train, results, compare, benchmark); a sweep runs through the same
`prepare` and `run_sweep` the command's sweep process uses. The names in `__all__` are stable: they keep their
meaning across releases. Everything else in raybench may move.

```python
from raybench import api

api.load_plugins("my_method")                      # your algorithms, datasets, models, spaces
summary = api.sweep({"algorithm": "erm", "search": {"lr": {"distribution": "lr"}}},
                    dataset="digits-shift", trials=4, replicates=2)
print(summary.replicates.summary["test/acc"])      # mean and std over seeds, as the paper's Table 2
model, record = api.load_model(summary.name)       # the selected checkpoint, rebuilt as an nn.Module
```

Errors are raybench's own exceptions, each with a one-line message naming the bad value: `SpaceError` (a search
space), `OptionError` (a sweep option), `ConfigError` (a trainer setting), `TrackingError` (the MLflow store),
`PluginError` (a plug-in), `UnknownNameError` (a name no registry has).

Nothing heavy is imported with this module: torch, Ray and MLflow load when a function needs them.
"""
from __future__ import annotations

import dataclasses
import io
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from raybench.lazy import names_on_first_use
from raybench.plugins import LoadedPlugin, PluginError
from raybench.plugins import add_search_spaces as _add_search_spaces
from raybench.plugins import load_plugins as _load_plugins
from raybench.records import SweepSummary
from raybench.registry import UnknownNameError
from raybench.sweep.errors import OptionError
from raybench.sweep.options import SweepOptions, cluster_address

if TYPE_CHECKING:
    from torch import nn

    from raybench.checkpoints import ModelRecord
    from raybench.commands.benchmark import Outcome
    from raybench.report.compare import Comparison
    from raybench.report.stats import StatsSettings
    from raybench.sweep.space import SearchSpace, SpaceError
    from raybench.trainer import FitResult, TrainConfig

__all__ = [
    "LoadedPlugin", "OptionError", "PluginError", "SearchSpace", "SpaceError", "SweepOptions", "SweepSummary",
    "UnknownNameError", "add_search_spaces", "benchmark", "compare", "evaluate", "load_model", "load_plugins",
    "load_space",
    "results", "sweep", "train",
]

# The space module imports the registries' packages (and torch with the datasets): `raybench results` and
# `compare` call this API and must not pay for it.
__getattr__ = names_on_first_use(globals(), dict.fromkeys(("SearchSpace", "SpaceError"), "raybench.sweep.space"))



# ----- plug-ins and spaces -----------------------------------------------------------------------------------
def load_plugins(*plugins: str) -> tuple[LoadedPlugin, ...]:
    """Import plug-ins (module names, `.py` files or package folders), and those `$RAYBENCH_PLUGINS` and the
    `raybench.plugins` entry points name; every plug-in loaded so far. A sweep imports the same ones in each of
    its trials and workers, and ships their code to the cluster's nodes.

    Raises:
        PluginError: a plug-in that cannot be imported, or registers a name that is taken.
    """
    return _load_plugins(plugins)


def add_search_spaces(folder: str | os.PathLike[str]) -> None:
    """Add a folder of search-space YAML files, found by name (`sweep("my_space")`) after the shipped ones.
    A plug-in calls this when it is imported; a name a shipped space has is refused."""
    _add_search_spaces(Path(folder))


def load_space(space: str | os.PathLike[str] | Mapping[str, Any] | SearchSpace,
               folders: Sequence[str | os.PathLike[str]] = ()) -> SearchSpace:
    """A search space, parsed and validated: a name (`"dann"`), a YAML path, a mapping with a YAML file's keys
    (validated exactly as the file would be), or a `SearchSpace` as it is. `folders` are looked up first, as
    `--spaces` folders are.

    Raises:
        SpaceError: naming the key, the value and what was expected.
    """
    from raybench.sweep.space import SearchSpace, space_from_mapping
    from raybench.sweep.space import load_space as load_named

    if isinstance(space, SearchSpace):
        return space
    if isinstance(space, Mapping):
        return space_from_mapping(space)
    return load_named(os.fspath(space), folders)


# ----- sweeps ------------------------------------------------------------------------------------------------
def sweep(space: str | os.PathLike[str] | Mapping[str, Any] | SearchSpace, *,
          options: SweepOptions | None = None, **fields: Any) -> SweepSummary:
    """Run one sweep: random configs of `space` on Ray (a private local Ray unless `address`), each trial
    tracked in MLflow, selection on OOD validation, then seed replicates of the selected config.

    `fields` are `SweepOptions` fields (`dataset`, `trials`, `replicates`, `seed`, `storage`, `tracking_uri`,
    `address`, `plugins`, `extra_fixed`, ...), on top of `options` when given. The summary is what
    `raybench results NAME` shows, typed.

    Raises:
        SpaceError, OptionError, ConfigError, TrackingError, PluginError: a bad input, before any cluster work.
        SweepInterrupted: a stop signal; the same call with `resume=True` continues it.
    """
    from raybench.report.record import SWEEP_RECORD
    from raybench.sweep.runner import sweep_until_converged

    chosen = _sweep_options(space, options, fields)
    cluster_address(chosen.address)  # a malformed address is refused before anything is written
    _load_plugins(chosen.plugins)  # a plug-in may define the space's algorithm and the dataset
    parsed = load_space(space, chosen.spaces) if not isinstance(space, (str, os.PathLike)) else None
    return sweep_until_converged(chosen, parsed, recorder=SWEEP_RECORD)[0]  # with `converge`, the attempts of the convergence rule


def _sweep_options(space: Any, options: SweepOptions | None, fields: Mapping[str, Any]) -> SweepOptions:
    """The options a call means; a field SweepOptions has not is an OptionError naming it."""
    known = {f.name for f in dataclasses.fields(SweepOptions)}
    unknown = sorted(set(fields) - known)
    if unknown:
        raise OptionError(f"sweep: {unknown[0]!r} is no sweep option; expected one of {', '.join(sorted(known))}")
    label = os.fspath(space) if isinstance(space, (str, os.PathLike)) else _space_label(space)
    base = options if options is not None else SweepOptions(space=label)
    return dataclasses.replace(base, space=label, **fields)


def _space_label(space: Mapping[str, Any] | SearchSpace) -> str:
    """How a space given as an object is named in the sweep's records and default name: its algorithm, as the
    shipped space of that algorithm is named."""
    from raybench.sweep.space import SearchSpace, SpaceError

    algorithm = space.algorithm if isinstance(space, SearchSpace) else space.get("algorithm")
    if not isinstance(algorithm, str):
        raise SpaceError(Path("<mapping>"), "algorithm", algorithm, "the name of a registered algorithm")
    return algorithm


def results(name: str, tracking_uri: str | None = None) -> SweepSummary:
    """A finished (or interrupted) sweep read back from MLflow: its trials, the selection and the replicates.

    Raises:
        TrackingError: no such sweep, no results recorded yet, or an unreachable store.
    """
    from raybench.tracking import default_tracking_uri, load_sweep_results

    return load_sweep_results(tracking_uri or default_tracking_uri(), name)


def compare(sweeps: Sequence[str] = (), *, dataset: str | None = None, algorithms: Sequence[str] = (),
            selection: str | None = None, stats: StatsSettings | None = None,
            tracking_uri: str | None = None) -> Comparison:
    """The WILDS Table 2 across finished sweeps: one table per dataset, a row per method, mean ± std over
    replicates (and with `stats`, intervals and tests against a baseline). `sweeps` picks sweeps by name, in
    row order; by default every sweep of the store, oldest first.

    Raises:
        TrackingError: a store that cannot be read, or a sweep named that it does not hold.
        BaselineError: `stats.baseline` names no ranked row.
    """
    from raybench.report.compare import from_records
    from raybench.tracking import TrackingError, default_tracking_uri, find_sweeps

    records = find_sweeps(tracking_uri or default_tracking_uri(), tuple(sweeps), dataset, tuple(algorithms))
    missing = [name for name in sweeps if name not in {r.name for r in records}]
    if missing:
        raise TrackingError(f"no sweep named {', '.join(map(repr, missing))} in the tracking store")
    if not records:
        raise TrackingError(f"no sweep matches {_filter_words(dataset, algorithms)} in the tracking store")
    if sweeps:
        records.sort(key=lambda r: list(sweeps).index(r.name))
    return from_records(records, selection, stats)


def _filter_words(dataset: str | None, algorithms: Sequence[str]) -> str:
    words = [f"--dataset {dataset}"] if dataset else []
    words += [f"--algorithms {','.join(algorithms)}"] if algorithms else []
    return f"({' '.join(words)})" if words else "(the store has no sweeps)"


def benchmark(file: str | os.PathLike[str], *, storage: str | os.PathLike[str] = "runs",
              tracking_uri: str | None = None, address: str | None = None, resume: bool = False,
              spaces: Sequence[str | os.PathLike[str]] = ()) -> Outcome:
    """Every (dataset, search space) pair of a benchmark file (a path, or a shipped grid's name) as one sweep
    each, on one Ray cluster, then their comparison; the outcome of every pair.

    Raises:
        BenchmarkError, SpaceError: a bad benchmark file or a space it names.
        SweepExists, OptionError, TrackingError, ClusterError: as `sweep`.
    """
    from raybench.commands.benchmark import BenchmarkOptions, run_benchmark
    from raybench.sweep.benchmark_file import load_benchmark
    from raybench.tracking import default_tracking_uri

    folders = tuple(str(Path(folder).resolve()) for folder in spaces)
    options = BenchmarkOptions(Path(storage).resolve(), tracking_uri or default_tracking_uri(), address, resume,
                               spaces=folders)
    return run_benchmark(load_benchmark(os.fspath(file), folders), options)


# ----- one config, and models back ---------------------------------------------------------------------------
def train(settings: Mapping[str, Any] | TrainConfig, *, output: str | os.PathLike[str] | None = None,
          echo: TextIO | None = None) -> FitResult:
    """Train one config in this process, without Ray: `settings` are trainer settings and algorithm
    hyperparameters by name (`{"dataset": "digits-shift", "algorithm": "dann", "lr": 1e-3}`), or a TrainConfig.
    With `output`, the run's checkpoints (`state.pt`, `best_model.pt`) are kept there, every epoch; with `echo`,
    one line per epoch is printed to that stream (`raybench train` gives stderr).

    Raises:
        ConfigError: a setting that is unknown or out of range; UnknownNameError: an unknown dataset.
        DivergenceError: the loss became NaN or infinite.
    """
    from raybench.data import load_dataset
    from raybench.trainer import TrainConfig, Trainer
    from raybench.trainer.console import ConsoleCallback

    _load_plugins()  # the environment's and the entry points' plug-ins may define the names
    config = settings if isinstance(settings, TrainConfig) else TrainConfig.from_flat(dict(settings))
    config.check_device_available()
    dataset = load_dataset(config.dataset, config.data_dir, config.data_seed)
    console = ConsoleCallback(echo or io.StringIO(), Path(output) if output is not None else None)
    return Trainer(config, callbacks=[console], dataset=dataset).fit()


def load_model(sweep_or_checkpoint: str | os.PathLike[str], *, tracking_uri: str | None = None,
               destination: str | os.PathLike[str] | None = None) -> tuple[nn.Module, ModelRecord]:
    """The selected model of a finished sweep (by name, from MLflow), or of a `best_model.pt` file, rebuilt as a
    ready `nn.Module` in eval mode, with the record of what built it: the model and its build arguments, the
    dataset and the resolved settings. The weights are read with `weights_only=True`.

    Raises:
        TrackingError: no such sweep, or it kept no selected checkpoint.
        UnreadableWeightsError: a file that is no raybench model checkpoint, or one written without a record.
    """
    import tempfile

    from raybench.rebuild import rebuild_model

    path = Path(os.fspath(sweep_or_checkpoint))
    if path.suffix == ".pt" or path.is_file():
        return rebuild_model(path)
    from raybench.tracking import default_tracking_uri, download_selected_checkpoint

    folder = Path(destination) if destination is not None else Path(tempfile.mkdtemp(prefix="raybench-model-"))
    checkpoint = download_selected_checkpoint(tracking_uri or default_tracking_uri(), str(sweep_or_checkpoint),
                                              folder)
    return rebuild_model(checkpoint)


def evaluate(model: nn.Module, record: ModelRecord, split: str = "test",
             data_dir: str | os.PathLike[str] | None = None) -> dict[str, float]:
    """A rebuilt model's metrics on one split of the dataset its record names (`test` is OOD test, `id_test` ID
    test), keyed as the trainer logs them (`test/acc`), by the trainer's own evaluation code. `data_dir`: where
    the dataset is (default: the record's setting, else $RAYBENCH_DATA_DIR).

    Raises:
        UnknownNameError: a dataset no registry has (a plug-in's: load it first).
    """
    from raybench.rebuild import evaluate_split

    return evaluate_split(model, record, split, Path(data_dir) if data_dir is not None else None)
