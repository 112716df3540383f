"""The `raybench` command line: thin wrappers that parse, validate and hand over to the library.

Every bad input ends in one line `raybench: error: <flag>: <what was wrong>` and exit status 2,
never a traceback.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from raybench.code_memo import code_text
from raybench.commands import sweep as sweep_entry
from raybench.commands.sweep import (
    check_space_folders,
    load_plugins_or_refuse,
    mlflow_hint,
    probe_cluster,
    resume_command,
)
from raybench.exits import OneLineParser, Signals, UsageError, run_command
from raybench.flag_types import assignment, nonblank, positive_int, progress_seconds, seed_int
from raybench.paths import missing_folders, remove_if_empty, staging_inside
from raybench.records import PairState
from raybench.registry import Registry, UnknownNameError
from raybench.report.renderers import FORMATS
from raybench.sweep import options as sweep_options
from raybench.sweep.converge import DEFAULT_ATTEMPTS, ConvergeRule, converge_attempts, converge_factor
from raybench.sweep.spending import budget_text, parse_spend_limit
from raybench.words import SELECTION_RULES

TRACKING_URI = nonblank("an MLflow tracking URI")  # an empty one silently meant the default store


def parse_assignments(pairs: Sequence[str]) -> dict[str, str]:
    """`--set KEY=VALUE` words as a dict (the last value per key wins); a word without `=` is a UsageError."""
    try:
        return dict(assignment(pair) for pair in pairs)
    except ValueError as err:
        raise UsageError(f"--set: {err}") from None


def add_spaces_flag(parser: argparse.ArgumentParser, what: str = "") -> None:
    """The --spaces flag of every command that looks a space name up, declared as `raybench sweep` declares it."""
    parser.add_argument("--spaces", action="append", default=[], type=sweep_options.space_folder, metavar="DIR",
                        help=f"{what}a folder of your own search spaces (NAME.yaml), looked up before "
                             f"$RAYBENCH_SPACES, plug-ins' and raybench's own (repeatable)")


# ----- raybench list ----------------------------------------------------------------------------
def cmd_list(args: argparse.Namespace) -> int:
    if args.what == "spaces":
        return list_spaces(args)
    if args.spaces:
        raise UsageError(f"list {args.what}: expected no --spaces (only `list spaces` reads search spaces)")
    if args.what == "settings":
        return list_settings(args.algorithm)
    if args.algorithm is not None:
        raise UsageError(f"list {args.what}: expected no second argument (only `list settings ALGORITHM` takes one), "
                         f"got {args.algorithm!r}")
    print(declared_text(f"list {args.what}", lambda: registry_listing(listed_registry(args.what))))
    return 0


def declared_text(key: str, compute: Callable[[], str]) -> str:
    """A text the code declares, kept once per code version (raybench.code_memo), unless plug-ins are loaded:
    their entries are no part of raybench's code version, so the text is computed afresh with them."""
    from raybench.plugins import loaded

    return compute() if loaded() else code_text(key, compute)


def list_spaces(args: argparse.Namespace) -> int:
    """Every search-space name, where it comes from (raybench, a plug-in, a user folder) and its file: which of
    several same-named files a sweep of that name runs."""
    from raybench.sweep.space_catalog import listing

    if args.algorithm is not None:
        raise UsageError(f"list spaces: expected no second argument, got {args.algorithm!r}")
    check_space_folders(args.spaces)
    print(listing(args.spaces))
    return 0


def registry_listing(registry: Registry[Any]) -> str:
    """Each entry's name, where it comes from (raybench, or the plug-in that registered it) and what it is (its
    docstring's first line), one per line."""
    from raybench.plugins import origin_word

    names = registry.names()
    origins = {name: origin_word(registry.origin(name)) for name in names}
    width = max(len(n) for n in names)
    from_width = max(len(o) for o in origins.values())
    return "\n".join(f"{name:{width}s}  {origins[name]:{from_width}s}  {registry.summary(name)}".rstrip()
                     for name in names)


def listed_registry(what: str) -> Registry[Any]:
    """The registry `raybench list WHAT` prints, importing that package alone: the algorithms and models are
    listed from their modules' source (no torch); the datasets' package still imports every dataset module."""
    if what == "algorithms":
        from raybench.algorithms import ALGORITHMS

        return ALGORITHMS
    if what == "models":
        from raybench.models import MODELS

        return MODELS
    from raybench.data import DATASETS

    return DATASETS


def list_settings(algorithm: str | None) -> int:
    """Every trainer setting, then the hyperparameters of `algorithm` (of every algorithm when None), as their
    dataclasses declare them. The text depends on the code alone, so it is computed once per code version
    (raybench.code_memo): the dataclasses live in modules that import torch."""
    from raybench.algorithms import ALGORITHMS

    if algorithm is not None and algorithm not in ALGORITHMS:
        raise UsageError(f"list settings: {ALGORITHMS.unknown(algorithm)}")
    names = [algorithm] if algorithm is not None else ALGORITHMS.names()
    print(declared_text(f"list settings {' '.join(names)}", lambda: settings_text(names)))
    return 0


def settings_text(algorithms: list[str]) -> str:
    """The trainer's settings table, then each algorithm's hyperparameter table, then how defaults resolve."""
    from raybench.algorithms import ALGORITHMS
    from raybench.settings import settings_of, settings_table
    from raybench.sweep.space import OWN_FLAGS
    from raybench.trainer import TrainConfig

    trainer = [s for s in settings_of(TrainConfig) if s.name != "hparams"]
    own_flags = {name: f"a sweep sets it: {flag}" for name, flag in OWN_FLAGS.items()}
    tables = [settings_table("trainer settings (--set KEY=VALUE; a search space's search, fixed, derived)", trainer,
                             own_flags)]
    tables += [settings_table(f"{name} hyperparameters ({ALGORITHMS.get(name).Hparams.__name__})",
                              settings_of(ALGORITHMS.get(name).Hparams), {}) for name in algorithms]
    return ("\n\n".join(tables) + "\n\nDefaults are the dataclasses'; a dataset may supply its own value for any "
            "hyperparameter (its algorithm_hparams).\n`raybench space show SPACE --dataset D` prints a space's "
            "values on a dataset.")


# ----- raybench train ---------------------------------------------------------------------------
def cmd_train(args: argparse.Namespace) -> int:
    flags = {"dataset": args.dataset, "algorithm": args.algorithm, "seed": args.seed}
    if args.epochs is not None:
        flags["epochs"] = args.epochs
    overrides = parse_assignments(args.set)
    clash = sorted(set(overrides) & set(flags))
    if clash:
        raise UsageError(f"--set {clash[0]}: use the --{clash[0].replace('_', '-')} flag instead")
    names = {key: f"--{key.replace('_', '-')}" for key in flags}
    return train_once({**flags, **overrides}, names, Path(args.output) if args.output else None)


def train_once(settings: dict[str, Any], names: Mapping[str, str], output: Path | None) -> int:
    """Train one flat config (`raybench train`, `raybench probe`) and print its one JSON line.

    `names` says how the user spelled each setting they gave as a flag (`--epochs`, `checkpoint`), so an
    error names that; any other setting is named as `--set KEY`.
    """
    from raybench import api
    from raybench.data.base import InputReadError, MissingSourceError
    from raybench.sweep.space import refuse_selection_on_test
    from raybench.trainer import ConfigError, DivergenceError, TrainConfig

    problem = output_folder_problem(output) if output is not None else None
    if problem:  # found now, not after an hour of training
        raise UsageError(f"--output: {problem}")
    made = missing_folders(output) if output is not None else []
    try:
        refuse_selection_on_test(settings)  # its best epoch would be picked on test
        config = TrainConfig.from_flat(settings)
        with full_disk_named(output, "--output", "the run's checkpoints", made):
            result = api.train(config, output=output, echo=sys.stderr)
    except UnknownNameError as err:
        raise UsageError(f"--dataset: {err}") from None
    except MissingSourceError as err:  # an embedded dataset's Debian package is not installed
        raise UsageError(f"--dataset: {err}") from None
    except ConfigError as err:  # also from fit(): a teacher checkpoint is read when its round starts
        raise UsageError(f"{names.get(err.key, f'--set {err.key}')}: {err.detail}") from None
    except DivergenceError as err:
        print(f"raybench: training diverged: {err}", file=sys.stderr)
        return 1
    except InputReadError as err:
        print(f"raybench: unreadable input: {err}", file=sys.stderr)
        return 1
    summary = {
        "dataset": config.dataset, "algorithm": config.algorithm, "seed": config.seed,
        "best_epoch": result.best_epoch, "best": result.best_metrics, "final": result.final_metrics,
        "info": result.info,
    }
    if output is not None:
        from raybench.paths import write_text_atomically

        with full_disk_named(output, "--output", f"the run's {RESULT_FILE}", made):
            write_text_atomically(output / RESULT_FILE, json.dumps(summary, indent=2, sort_keys=True))
    print(json.dumps(summary, sort_keys=True))
    return 0


RESULT_FILE = "result.json"  # beside the checkpoints in `train --output`


def output_folder_problem(output: Path) -> str | None:
    """Why `train --output` could not keep its files in `output`, or None: a folder raybench cannot make or write,
    or a file it replaces there (state.pt, best_model.pt, result.json) that is no regular file. A folder named
    state.pt failed only at the first epoch's rename, and left its temporary file behind."""
    from raybench.checkpoints import BEST_MODEL_FILE, STATE_FILE  # torch, which the training imports anyway
    from raybench.file_kinds import not_a_file
    from raybench.paths import writable_dir_problem

    problem = writable_dir_problem(output)
    if problem:
        return problem
    for name in (STATE_FILE, BEST_MODEL_FILE, RESULT_FILE):
        kind = not_a_file(output / name)
        if kind is not None:
            return f"{str(output / name)!r} is {kind}; expected a file raybench may replace there, or none"
    return None


@contextlib.contextmanager
def full_disk_named(folder: Path | None, flag: str, what: str, made: Sequence[Path] = ()) -> Iterator[None]:
    """Inside, a full disk (or quota) while a command writes into `folder` (given by `flag`) becomes one
    StorageFull naming the flag and the folder: exit 74, one line (main). A write elsewhere that fills its disk
    (a file the error names outside `folder`) is named by that file's folder instead. Every write inside is all
    or nothing (raybench.paths.write_atomically), so nothing half-written is left, and the folders in `made`
    (those the command made) are removed again when that left them empty."""
    from raybench.paths import StorageFull, disk_full_error, inside

    try:
        yield
    except StorageFull:
        remove_if_empty(made)
        raise
    except Exception as err:
        code = disk_full_code(err)
        if code is None:
            raise
        remove_if_empty(made)
        full = disk_full_error(err)
        named = Path(str(full.filename)) if full is not None and full.filename else None
        if folder is None or (named is not None and not inside(folder, named)):
            where = named.parent if named is not None else Path.cwd()
            raise StorageFull(where, what, code, flag="") from err
        raise StorageFull(folder.absolute(), what, code, flag=flag) from err


def disk_full_code(err: BaseException) -> int | None:
    """ENOSPC or EDQUOT when `err` (or its cause) says the disk or the quota is full: an OSError with the errno,
    or a library's error with only the words (torch's writer raises a RuntimeError; Arrow writes `[errno 28]`)."""
    import errno

    from raybench.paths import disk_full_errno_in, disk_full_error

    full = disk_full_error(err)
    if full is not None:
        return int(full.errno)
    text = str(err)
    if "No space left on device" in text:
        return errno.ENOSPC
    if "Disk quota exceeded" in text:
        return errno.EDQUOT
    return disk_full_errno_in(text)


# ----- raybench probe ---------------------------------------------------------------------------
def cmd_probe(args: argparse.Namespace) -> int:
    """`raybench train --algorithm newt_probe --set features_from=CHECKPOINT ...`, spelled as one command."""
    settings: dict[str, Any] = {"dataset": args.dataset, "algorithm": "newt_probe", "seed": args.seed,
                                "features_from": args.checkpoint}
    names = {"dataset": "--dataset", "seed": "--seed", "features_from": "checkpoint", "model": "--model",
             "c_grid": "--c-grid"}
    if args.model is not None:
        settings["model"] = args.model
    if args.c_grid is not None:
        settings["c_grid"] = args.c_grid
    return train_once(settings, names, Path(args.output) if args.output else None)


# ----- raybench newt-suite ----------------------------------------------------------------------
def cmd_newt_suite(args: argparse.Namespace) -> int:
    from raybench.algorithms.newt_probe import NEWT_C_GRID
    from raybench.data import load_dataset
    from raybench.newt_suite import SUITE_FAMILIES, SuiteSettings, log_task_suite, run_suite
    from raybench.tracking import EXPERIMENT, TrackingError, check_reachable, default_tracking_uri, redact_uri
    from raybench.trainer import ConfigError

    if args.dataset not in SUITE_FAMILIES:
        raise UsageError(f"--dataset: expected one of {', '.join(SUITE_FAMILIES)} (a dataset the suite has task "
                         f"clusters for), got {args.dataset!r}")
    uri = args.tracking_uri or default_tracking_uri()
    try:
        check_reachable(uri)  # before a minute of probes, not after
    except TrackingError as err:
        raise UsageError(f"--tracking-uri: {err}") from None
    settings = SuiteSettings(dataset=args.dataset, features_from=args.features_from, model=args.model,
                             seed=args.seed, per_class=args.per_class, c_grid=args.c_grid or NEWT_C_GRID)
    try:
        result = run_suite(load_dataset(args.dataset), settings, SUITE_FAMILIES[args.dataset])
    except ConfigError as err:
        raise UsageError(f"--{err.key.replace('_', '-')}: {err.detail}") from None
    experiment = args.experiment or EXPERIMENT
    try:
        run_id = log_task_suite(uri, result, experiment)
    except TrackingError as err:
        raise UsageError(f"--tracking-uri: {err}") from None
    print(result.table())
    print(f"MLflow: run {run_id} ({result.name}) in experiment {experiment!r} at {redact_uri(uri)}", file=sys.stderr)
    print(json.dumps({**result.summary(), "mlflow_run_id": run_id}, sort_keys=True))
    return 0


def add_probe_parsers(sub: Any) -> None:
    p = sub.add_parser("probe", help="NeWT's linear probe on one checkpoint's frozen features (raybench train "
                                     "--algorithm newt_probe); ends in a JSON line")
    p.add_argument("checkpoint", help="a best_model.pt, a stage-cache model.pt, or a folder holding one")
    p.add_argument("--dataset", default="digits-shift")
    p.add_argument("--model", help="a registered model (default: the dataset's); must match the checkpoint")
    p.add_argument("--c-grid", help="comma-separated C values for the SVM (default: NeWT's 1e-4..1e3)")
    p.add_argument("--seed", type=seed_int, default=0)
    p.add_argument("--output", type=nonblank("a folder"), help="directory for the checkpoint (best_model.pt) and "
                                                                "result.json")
    add_plugin_flags(p)
    p.set_defaults(run=cmd_probe)

    s = sub.add_parser("newt-suite", help="45 binary digit-pair tasks in digits-shift's OOD-test domain, NeWT's "
                                          "probe on each, means per cluster; tracked in MLflow")
    s.add_argument("--dataset", default="digits-shift")
    s.add_argument("--features-from", required=True, metavar="random|PATH",
                   help="'random' (the model's seeded initialisation) or a checkpoint file or folder")
    s.add_argument("--model", help="a registered model (default: the dataset's)")
    s.add_argument("--seed", type=seed_int, default=0, help="the model's initialisation, the draws, the folds")
    s.add_argument("--per-class", type=positive_int,
                   help="train (and test) examples per class of each task (default: the most the domain allows, <= 50)")
    s.add_argument("--c-grid", help="comma-separated C values for the SVM (default: NeWT's 1e-4..1e3)")
    s.add_argument("--tracking-uri", type=TRACKING_URI,
                   help="MLflow tracking URI; default: sqlite:///mlflow.db in the working directory")
    s.add_argument("--experiment", type=nonblank("an MLflow experiment name"), help="MLflow experiment (default: the one sweeps log to)")
    add_plugin_flags(s)
    s.set_defaults(run=cmd_newt_suite)


# ----- raybench sweep ---------------------------------------------------------------------------
def cmd_sweep(args: argparse.Namespace) -> int:
    """The library runs the sweep (raybench.commands.sweep), as it does for each pair of a benchmark."""
    return sweep_entry.run(args, args.argv)


# ----- raybench benchmark -----------------------------------------------------------------------
def cmd_benchmark(args: argparse.Namespace) -> int:
    from raybench.commands.benchmark import (
        BenchmarkInterrupted,
        BenchmarkOptions,
        outcome_text,
        plan_text,
        run_benchmark,
    )
    from raybench.paths import path_problem
    from raybench.sweep import progress
    from raybench.sweep.benchmark_file import BenchmarkError, bind_pairs, load_benchmark
    from raybench.sweep.errors import ClusterError, OptionError, SweepExists
    from raybench.sweep.space import SpaceError
    from raybench.tracking import TrackingError, default_tracking_uri, redact_uri

    check_space_folders(args.spaces)
    if args.calibrate is not None and not args.plan:
        raise UsageError(f"--calibrate: expected only with --plan (it forecasts the plan's runtime), got "
                         f"--calibrate {args.calibrate} without it")
    try:
        benchmark = load_benchmark(args.file, args.spaces)
        bindings = bind_pairs(benchmark)  # as each pair's sweep binds it: --plan refuses what the run would
    except (BenchmarkError, SpaceError) as err:
        raise UsageError(str(err)) from None
    rule = benchmark_convergence(args, benchmark.converge)
    if args.plan:
        print(plan_text(benchmark, bindings, rule, benchmark_forecast(args, benchmark, bindings)))
        return 0
    try:
        address = sweep_options.cluster_address(args.address)  # inside a Ray job: the job's cluster
    except OptionError as err:
        raise UsageError(str(err)) from None
    if address:
        probe_cluster(address)
    storage_problem = path_problem(args.storage)  # before it is resolved: a loop of links raises there
    if storage_problem:
        raise UsageError(f"--storage: {storage_problem}")
    resume = resume_command(args.argv)
    options = BenchmarkOptions(Path(args.storage).resolve(), args.tracking_uri or default_tracking_uri(), address,
                               args.resume, resume, args.progress_every, force=args.force,
                               spaces=tuple(str(Path(folder).resolve()) for folder in args.spaces), converge=rule,
                               budget=parse_spend_limit(args.budget) if args.budget else None)
    with Signals() as signals:
        try:
            with progress.showing(progress.display_for(args.quiet, args.progress_every)):
                outcome = run_benchmark(benchmark, options)
        except (SweepExists, OptionError) as err:
            raise UsageError(str(err)) from None
        except TrackingError as err:
            raise UsageError(f"--tracking-uri: {err}") from None
        except ClusterError as err:
            raise UsageError(f"--address: {err}") from None
        except (BenchmarkInterrupted, KeyboardInterrupt) as err:
            print(f"raybench: {benchmark_interrupted_line(err, benchmark, options, args.argv)}", file=sys.stderr)
            return signals.exit_status
    print(outcome_text(outcome))
    print(f"\nMLflow: {mlflow_hint(redact_uri(options.tracking_uri), outcome.mlflow)}")
    return 0 if outcome.count(PairState.FAILED) == 0 else 1


def benchmark_forecast(args: argparse.Namespace, benchmark: Any, bindings: Any) -> Any:
    """`--plan --calibrate SWEEP`: the benchmark's runtime forecast from finished sweep SWEEP under --storage
    (raybench.report.forecast); None without the flag. A SWEEP that is not there, not finished or measured no
    run is refused in one line naming it and what was expected."""
    if args.calibrate is None:
        return None
    from raybench.commands.benchmark import DamagedSummary, summary_named
    from raybench.paths import name_problem
    from raybench.report.forecast import CalibrationError, calibrate, forecast, pair_steps

    problem = name_problem(args.calibrate)
    if problem:
        raise UsageError(f"--calibrate: {problem}")
    try:
        summary = summary_named(Path(args.storage), args.calibrate)
    except DamagedSummary as err:
        raise UsageError(f"--calibrate: sweep {args.calibrate!r}: {err}") from None
    if summary is None:
        raise UsageError(f"--calibrate: sweep {args.calibrate!r}: expected a finished sweep under --storage "
                         f"{args.storage} ({Path(args.storage) / args.calibrate / 'results' / 'summary.json'}), "
                         f"found none")
    try:
        return forecast(benchmark, pair_steps(benchmark, bindings), calibrate(summary))
    except CalibrationError as err:
        raise UsageError(f"--calibrate: {err}") from None


def benchmark_convergence(args: argparse.Namespace, in_file: ConvergeRule | None) -> ConvergeRule | None:
    """The convergence rule of a benchmark: the file's `converge:`, each of its two values overridden by its flag
    (--converge, --converge-attempts); --converge-attempts alone, with no factor from either, is refused."""
    factor = args.converge if args.converge is not None else (in_file.factor if in_file else None)
    if factor is None:
        if args.converge_attempts is not None:
            raise UsageError(f"--converge-attempts: expected only with --converge FACTOR or the file's converge: "
                             f"(it caps the attempts of the convergence rule), got {args.converge_attempts} without either")
        return None
    attempts = args.converge_attempts or (in_file.attempts if in_file else DEFAULT_ATTEMPTS)
    return ConvergeRule(factor, attempts)


def benchmark_interrupted_line(err: BaseException, benchmark: Any, options: Any, argv: Sequence[str]) -> str:
    """What a stopped benchmark says: the command that resumes it only when `--resume` would find its record
    (the state file a benchmark writes before it starts any pair); before that, the same command starts it."""
    from raybench.commands.benchmark import STATE_FILE, BenchmarkInterrupted, bench_dir

    what = str(err) if isinstance(err, BenchmarkInterrupted) else "benchmark interrupted"
    if (bench_dir(options.storage, benchmark) / STATE_FILE).is_file():
        return f"{what}; resume with: {options.resume_command}"
    return (f"{what} before it started: nothing was recorded under --storage, so there is nothing to resume; "
            f"start it again with: {sweep_entry.again_command(argv)}")


def add_benchmark_parser(sub: Any) -> None:
    from raybench.sweep.space_catalog import grid_names

    b = sub.add_parser("benchmark", help="every (dataset, search space) pair of a benchmark file as one sweep each, "
                                         "all on one Ray cluster, then their comparison (one MLflow parent run)")
    b.add_argument("file", type=nonblank("a benchmark YAML file or a shipped grid's name"), help=f"a benchmark YAML file, or the name of one raybench ships (raybench/grids/: "
                                f"{', '.join(grid_names())})")
    add_spaces_flag(b)
    b.add_argument("--plan", action="store_true", help="print the pairs it would run and those it rules out; run nothing")
    b.add_argument("--calibrate", type=nonblank("a finished sweep's name"), metavar="SWEEP",
                   help="with --plan: forecast each pair's run-hours, GPU-hours and wall-clock hours from finished "
                        "sweep SWEEP under --storage (e.g. `raybench sweep erm --smoke --name calib`): its runs' "
                        "measured seconds a step and a run, scaled to each pair's planned steps")
    b.add_argument("--resume", action="store_true", help="finish an interrupted benchmark: only pairs not finished run; "
                                                         "a file whose pairs' trials only went up extends their searches")
    b.add_argument("--budget", type=budget_text, metavar="AMOUNT",
                   help="the whole benchmark's compute budget, wall-clock (90m, 2h) or GPU-hours (12gpu-h), shared out "
                        "among its pairs: each pair's sweep gets its share as its own --budget")
    b.add_argument("--force", action="store_true", help="with --resume: resume even though the benchmark file changed "
                                                        "since the benchmark started (finished pairs are kept as they are)")
    b.add_argument("--address", type=nonblank(sweep_options.ADDRESS_WORDS), help="Ray cluster address ('auto' inside a submitted job); default: a private local Ray "
                                     "that every pair shares")
    b.add_argument("--tracking-uri", type=TRACKING_URI,
                   help="MLflow tracking URI; default: sqlite:///mlflow.db in the working directory")
    b.add_argument("--storage", default="runs", type=nonblank("a folder"), help="where the sweeps and the benchmark's records are written")
    b.add_argument("--progress-every", type=progress_seconds, default=30.0, metavar="SECONDS",
                   help="without a terminal (a file, a pipe, CI) or with --quiet: seconds between progress lines "
                        "while no pair ends; also each pair's sweep's interval in its log")
    b.add_argument("--quiet", action="store_true", help="no live progress display on a terminal: plain lines, as in a log")
    b.add_argument("--converge", type=converge_factor, metavar="FACTOR",
                   help="each pair under WILDS 2.0 App. D's convergence rule, as `raybench sweep --converge` "
                        "(overrides the file's converge.factor); with --resume, applies it to finished pairs")
    b.add_argument("--converge-attempts", type=converge_attempts, metavar="N",
                   help=f"with --converge (or the file's converge:): the attempts in all, the first included "
                        f"(overrides converge.attempts; default {DEFAULT_ATTEMPTS})")
    add_plugin_flags(b)
    b.set_defaults(run=cmd_benchmark)


# ----- raybench results -------------------------------------------------------------------------
def cmd_results(args: argparse.Namespace) -> int:
    from raybench import api
    from raybench.paths import writable_dir_problem
    from raybench.report.results_text import results_text
    from raybench.tracking import TrackingError, default_tracking_uri, download_plots

    plots = Path(args.plots) if args.plots is not None else None
    problem = writable_dir_problem(plots) if plots is not None else None
    if problem:
        raise UsageError(f"--plots: {problem}")
    uri = args.tracking_uri or default_tracking_uri()
    try:
        summary = api.results(args.name, uri)
        written = copy_plots(lambda staging: download_plots(uri, summary.stored.run_id, staging), plots) \
            if plots is not None else []
    except TrackingError as err:
        raise UsageError(f"results: {err}") from None
    print(results_text(summary, args.format))
    for path in written:
        print(f"wrote {path}", file=sys.stderr)
    return 0


def copy_plots(download: Callable[[Path], list[Path]], directory: Path) -> list[Path]:
    """`results --plots DIR`: the sweep's figures, downloaded into a hidden folder inside DIR and only then moved
    beside what DIR holds, each rename whole. A download that fails (a full disk, a figure whose name DIR holds as
    a folder) leaves DIR as it was: no partial file, and no DIR when this call made it."""
    from raybench.file_kinds import not_a_file

    with staging_inside(directory, ".raybench-plots-") as staging:
        with full_disk_named(directory, "--plots", "the sweep's figures"):
            staged = download(staging)
        targets = [directory / path.name for path in staged]
        for target in targets:
            kind = not_a_file(target)
            if kind is not None:
                raise UsageError(f"--plots: {str(target)!r} is {kind}; expected a figure raybench may replace "
                                 f"there, or none")
        for path, target in zip(staged, targets):
            path.replace(target)
        return targets


def name_list(text: str) -> tuple[str, ...]:
    names = tuple(n.strip() for n in text.split(",") if n.strip())
    if not names:
        raise argparse.ArgumentTypeError(f"expected comma-separated names, got {text!r}")
    return names


def cmd_compare(args: argparse.Namespace) -> int:
    from raybench import api
    from raybench.report.compare import BaselineError, render_comparison
    from raybench.tracking import TrackingError

    settings = _stats_settings(args)
    plot = Path(args.plot) if args.plot is not None else None
    problem = plot_problem(plot) if plot is not None else None
    if problem:
        raise UsageError(f"--plot: {problem}")
    try:
        comparison = api.compare(args.sweeps, dataset=args.dataset, algorithms=args.algorithms,
                                 selection=args.selection, stats=settings, tracking_uri=args.tracking_uri)
    except TrackingError as err:
        raise UsageError(f"compare: {err}") from None
    except BaselineError as err:
        raise UsageError(f"--baseline: {err}") from None
    if plot is not None:
        check_figure_names(comparison, plot)  # before anything is printed or written
    print(render_comparison(comparison, args.format))
    if plot is not None:
        with full_disk_named(plot.parent, "--plot", "the comparison figure", missing_folders(plot.parent)):
            written = _save_comparison_plots(comparison, plot)
        for path in written:
            print(f"wrote {path}", file=sys.stderr)
        if not comparison.tables:
            print(f"raybench: no figure written to {plot}: no finished sweep matches", file=sys.stderr)
    return 0


def plot_problem(plot: Path) -> str | None:
    """Why `compare --plot` could not write the PNG `plot`, or None: no .png name, a name that is a folder (or a
    FIFO, a device) already, or a folder raybench cannot make or write."""
    from raybench.file_kinds import not_a_file
    from raybench.paths import writable_dir_problem

    expected = f"expected a file name ending in .png, got {str(plot)!r}"
    if plot.suffix.lower() != ".png":
        return expected
    kind = not_a_file(plot)
    if kind is not None:
        return f"{expected}, which is {kind}"
    return writable_dir_problem(plot.parent)


def check_figure_names(comparison: Any, plot: Path) -> None:
    """Each figure `compare --plot` writes (one per dataset: FILE-<dataset>.png for several) may replace what is
    there: a folder of that name is refused before any figure is drawn."""
    from raybench.file_kinds import not_a_file
    from raybench.report.plots import comparison_names

    for name in comparison_names(comparison, plot.name):
        kind = not_a_file(plot.parent / name)
        if kind is not None:
            raise UsageError(f"--plot: {str(plot.parent / name)!r} is {kind}; expected a figure raybench may "
                             f"replace there, or none")


def _stats_settings(args: argparse.Namespace) -> Any:
    """compare's statistics as the flags ask (raybench.report.stats.StatsSettings), None without --stats; a flag
    that only --stats reads, given without it, is a usage error rather than silently ignored."""
    from raybench.report.stats import IntervalChoice, Significance, StatsSettings

    if not args.stats:
        given = [flag for flag, value in (("--baseline", args.baseline), ("--interval", args.interval),
                                          ("--test", args.test), ("--plan-seeds", args.plan_seeds or None))
                 if value is not None]
        if given:
            raise UsageError(f"{given[0]}: only with --stats")
        return None
    return StatsSettings(interval=IntervalChoice(args.interval or IntervalChoice.T),
                         test=Significance(args.test or Significance.WELCH), baseline=args.baseline,
                         plan_seeds=args.plan_seeds)


def _save_comparison_plots(comparison: Any, plot: Path) -> list[Path]:
    from raybench.report import plots

    return plots.save(plots.comparison_figures(comparison, plot.name), plot.parent)


# ----- raybench space ---------------------------------------------------------------------------
def _space_on_dataset(args: argparse.Namespace) -> tuple[Any, Any, Any]:
    """(the parsed space, the space a sweep with these flags searches, the dataset), every error one line."""
    from raybench.data import load_dataset
    from raybench.sweep.space import SpaceError, command_line_overrides, load_space, sweep_space
    from raybench.trainer import ConfigError, TrainConfig

    check_space_folders(args.spaces)
    try:
        space = load_space(args.space, args.spaces)
        dataset = load_dataset(args.dataset)
        overrides = command_line_overrides(getattr(args, "smoke", False), parse_assignments(getattr(args, "set", [])))
        TrainConfig.from_flat({"algorithm": space.algorithm, **overrides})
    except SpaceError as err:
        raise UsageError(str(err)) from None
    except UnknownNameError as err:
        raise UsageError(f"--dataset: {err}") from None
    except ConfigError as err:
        raise UsageError(f"--set {err.key}: {err.detail}") from None
    try:
        resolved = sweep_space(space, dataset, overrides)
        resolved.fixed.update(overrides)  # shown as fixed, and in the budget, as the sweep would run them
        resolved = resolved.with_epochs_scale(getattr(args, "epochs_scale", 1.0))
    except SpaceError as err:
        raise UsageError(str(err)) from None
    except ConfigError as err:
        raise _config_blame(err, args, space) from None
    return space, resolved, dataset


def _config_blame(err: Any, args: argparse.Namespace, space: Any) -> UsageError:
    """A config the space and the flags make together, refused: named by the flag when the refused setting was
    given on the command line (--set, --smoke), else by the space file, which never blames a --set not given."""
    from raybench.sweep.space import command_line_overrides

    overrides = command_line_overrides(getattr(args, "smoke", False), parse_assignments(getattr(args, "set", [])))
    if err.key in overrides:
        return UsageError(f"--set {err.key}: {err.detail}")
    return UsageError(f"{space.path}: {err.key}, as the space resolves on {args.dataset}: {err.detail}")


def _new_space_text(algorithm: str) -> str:
    from raybench.sweep.authoring import new_space_text

    return new_space_text(algorithm)


def cmd_space_show(args: argparse.Namespace) -> int:
    from raybench.sweep.authoring import describe
    from raybench.trainer import ConfigError

    space, resolved, dataset = _space_on_dataset(args)
    try:  # a trial's budget at each unlabeled ratio resolves a full config for it
        text = describe(space, resolved, dataset)
    except ConfigError as err:
        raise _config_blame(err, args, space) from None
    print(text)
    return 0


def cmd_space_draw(args: argparse.Namespace) -> int:
    from raybench.sweep.authoring import draw, draws_text

    _, resolved, _ = _space_on_dataset(args)
    print(draws_text(draw(resolved, args.trials, args.seed), args.format))
    return 0


def cmd_space_new(args: argparse.Namespace) -> int:
    from raybench.algorithms import ALGORITHMS

    if args.algorithm not in ALGORITHMS:
        raise UsageError(f"space new: {ALGORITHMS.unknown(args.algorithm)}")
    text = declared_text(f"space new {args.algorithm}", lambda: _new_space_text(args.algorithm))
    if args.output is None:
        print(text, end="")
        return 0
    write_new_file(Path(args.output), text, args.force)
    print(f"wrote {args.output}; check it with `raybench space show {args.output}`", file=sys.stderr)
    return 0


def write_new_file(path: Path, text: str, force: bool) -> None:
    """Write `text` to `path`, refusing (one line) a directory, and an existing file unless `force`."""
    from raybench.paths import writable_dir_problem

    if path.is_dir():
        raise UsageError(f"--output: expected a file name, got the directory {str(path)!r}")
    if path.exists() and not force:
        raise UsageError(f"--output: expected a new file, got the existing {str(path)!r} (--force overwrites it)")
    problem = writable_dir_problem(path.parent)
    if problem:
        raise UsageError(f"--output: {problem}")
    from raybench.paths import write_text_atomically

    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        write_text_atomically(path, text)  # never half a file, even when a --force overwrite is cut short
    except OSError as err:
        raise UsageError(f"--output: cannot write {str(path)!r} ({err.strerror or err})") from None


def epochs_scale(text: str) -> float:
    """`space show/draw --epochs-scale`: 1 (as the space says) or an attempt's scale, at most the largest one
    `sweep --converge` reaches."""
    from raybench.sweep.converge import MAX_ATTEMPTS, MAX_FACTOR

    largest = MAX_FACTOR ** (MAX_ATTEMPTS - 1)
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not 1 <= value <= largest:  # NaN fails both ends
        raise argparse.ArgumentTypeError(f"expected a number >= 1, at most {largest:g}, got {text!r}")
    return value


def add_space_parser(sub: Any) -> None:
    s = sub.add_parser("space", help="write a starting search space, or look at one: its resolved form, the configs "
                                     "a sweep would draw")
    space = s.add_subparsers(dest="space_command", required=True, parser_class=OneLineParser)
    show = space.add_parser("show", help="the space on a dataset: every distribution and bound, the lr centre r, "
                                         "fixed and derived values, and a trial's budget at each unlabeled ratio")
    draw = space.add_parser("draw", help="the exact configs `raybench sweep` with the same flags runs, in order, "
                                         "without training (random sampler)")
    for p in (show, draw):
        p.add_argument("space", help="a search-space name (e.g. dann; raybench list spaces) or a path to a YAML file")
        p.add_argument("--dataset", default="digits-shift")
        add_spaces_flag(p)
    draw.add_argument("--trials", type=positive_int, default=10)
    draw.add_argument("--seed", type=seed_int, default=0, help="the search's seed, as `raybench sweep --seed`")
    for p in (show, draw):  # a sweep's own flags, so both show what that sweep would run (and its budget)
        p.add_argument("--smoke", action="store_true", help="as `raybench sweep --smoke` (its fixed settings)")
        p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="as `raybench sweep --set`")
        p.add_argument("--epochs-scale", type=epochs_scale, default=1.0, metavar="SCALE",
                       help="every config's epochs x SCALE, as an attempt of `raybench sweep --converge` trains "
                            "them (attempt 2: the factor, attempt 3: its square)")
    draw.add_argument("--format", choices=["table", "json"], default="table")
    show.set_defaults(run=cmd_space_show)
    draw.set_defaults(run=cmd_space_draw)
    new = space.add_parser("new", help="a starting search space for an algorithm: the paper's protocol, its "
                                       "suggested distributions searched, every other hyperparameter at its default")
    new.add_argument("algorithm", help="a registered algorithm (raybench list algorithms)")
    new.add_argument("--output", metavar="FILE", type=nonblank("a file name"), help="write the YAML to FILE instead of stdout (refused if it exists)")
    new.add_argument("--force", action="store_true", help="overwrite an existing --output FILE")
    for p in (show, draw, new):
        add_plugin_flags(p)
    new.set_defaults(run=cmd_space_new)


# ----- raybench data ----------------------------------------------------------------------------
def _wilds_name(name: str) -> str:
    from raybench.data.wilds.adapter import SPECS

    if name not in SPECS:
        raise UsageError(f"data: unknown WILDS dataset {name!r}; known: {', '.join(SPECS)}")
    return name


def _root(args: argparse.Namespace) -> Path:
    from raybench.data.wilds.adapter import wilds_root
    from raybench.file_kinds import not_a_file

    root = Path(args.root) if args.root is not None else wilds_root(None)
    kind = not_a_file(root) or ("a file" if root.is_file() else None)
    if kind is not None and kind != "a folder":  # a file, a FIFO or a device given as the root
        raise UsageError(f"--root: expected the WILDS root folder, got {str(root)!r}, which is {kind}")
    return root


def _checked(name: str, root: Path, verb: str) -> Any:
    """`raybench data check`'s report of `root`; a data file there that is no regular file (a FIFO, whose
    opening would wait for ever, a socket, a device, a folder) is one line naming it, never opened."""
    from raybench.data.wilds.files import check
    from raybench.file_kinds import NotARegularFile

    try:
        return check(name, root)
    except NotARegularFile as err:
        raise UsageError(f"data {verb} {name}: {err}") from None


def cmd_data_check(args: argparse.Namespace) -> int:
    report = _checked(_wilds_name(args.name), _root(args), "check")
    print("\n".join(report.lines()))
    return 0 if report.loadable else 1


def cmd_data_prepare(args: argparse.Namespace) -> int:
    from raybench.data.wilds.files import prepare
    from raybench.paths import StorageFull

    root = _root(args)
    try:
        prepare(_wilds_name(args.name), root, unlabeled=not args.labeled_only)
    except (OSError, RuntimeError, ValueError) as err:  # no network, disk full, a bad archive
        code = disk_full_code(err)
        if code is not None:
            raise StorageFull(root.absolute(), f"WILDS {args.name}", code, flag="--root") from None
        raise UsageError(f"data prepare {args.name}: {err}; `raybench data check {args.name} --root {root}` "
                         f"shows what is on disk (re-running prepare resumes into the same folder)") from None
    print("\n".join(_checked(args.name, root, "prepare").lines()))
    return 0


def add_data_parser(sub: Any) -> None:
    d = sub.add_parser("data", help="check or download the real WILDS datasets")
    data = d.add_subparsers(dest="data_command", required=True, parser_class=OneLineParser)
    root_help = "the WILDS root (default: $RAYBENCH_WILDS_ROOT, else ~/.cache/raybench/wilds)"
    c = data.add_parser("check", help="is a folder a loadable copy? lists exactly which files are missing (exit 1 if any labeled file is)")
    c.add_argument("name")
    c.add_argument("--root", type=nonblank("a folder"), help=root_help)
    c.set_defaults(run=cmd_data_check)
    p = data.add_parser("prepare", help="download through the wilds package (needs internet; tens to hundreds of GB)")
    p.add_argument("name")
    p.add_argument("--root", type=nonblank("a folder"), help=root_help)
    p.add_argument("--labeled-only", action="store_true", help="skip the unlabeled data")
    p.set_defaults(run=cmd_data_prepare)


def add_sweep_parser(sub: Any) -> None:
    p = sub.add_parser("sweep", help=sweep_entry.DESCRIPTION)
    sweep_options.add_arguments(p)  # every flag as SweepOptions declares it
    p.set_defaults(run=cmd_sweep)

    r = sub.add_parser("results", help="read a finished sweep back from MLflow")
    r.add_argument("name")
    r.add_argument("--format", choices=FORMATS.names(), default="table")
    r.add_argument("--tracking-uri", type=TRACKING_URI)
    r.add_argument("--plots", metavar="DIR", type=nonblank("a folder"), help="also copy the sweep's figures (PNG) into DIR")
    r.set_defaults(run=cmd_results)

    c = sub.add_parser("compare", help="WILDS Table 2 across finished sweeps: methods x ID/OOD, mean ± std over replicates")
    c.add_argument("--dataset", help="only sweeps on this dataset")
    c.add_argument("--algorithms", type=name_list, default=(), metavar="A,B", help="only these algorithms (comma-separated)")
    c.add_argument("--sweeps", type=name_list, default=(), metavar="NAME,NAME",
                   help="only these sweeps, in this row order (default: every sweep, oldest first)")
    c.add_argument("--selection", choices=tuple(SELECTION_RULES),
                   help="only sweeps selected this way (default: all; oracle rows are kept apart and never ranked)")
    c.add_argument("--format", choices=FORMATS.names(), default="table")
    c.add_argument("--plot", metavar="FILE.png", type=nonblank("a file name ending in .png"), help="also draw the comparison (mean ± std per method) into this PNG")
    c.add_argument("--stats", action="store_true",
                   help="replace the within-one-std marks by statistics: each cell's 95%% interval of the mean, each "
                        "row's difference from the baseline row with its interval, p-value and verdict (better, "
                        "worse, not distinguishable, too few replicates to tell), what each selection rule (OOD val, "
                        "ID val, oracle) would pick from the search trials with Kendall's tau between their "
                        "rankings, and over several datasets each method's mean rank and IQM")
    c.add_argument("--baseline", metavar="NAME",
                   help="--stats: the row the others are tested against, by its method (search space) or sweep "
                        "name (default: erm)")
    c.add_argument("--interval", choices=["t", "bootstrap"],
                   help="--stats: each cell's interval of the mean: a t-interval (default) or scipy's BCa bootstrap "
                        "(percentile where BCa is degenerate)")
    c.add_argument("--test", choices=["welch", "permutation"],
                   help="--stats: the test against the baseline: Welch's t with its interval (default) or a "
                        "permutation test with a bootstrap interval (it cannot reach p < 0.05 with 3 vs 3 replicates)")
    c.add_argument("--plan-seeds", action="store_true",
                   help="--stats: for each row, the replicates per side Welch's test needs to tell it from the "
                        "baseline at alpha 0.05 with power 0.8, from the replicate variance measured so far")
    c.add_argument("--tracking-uri", type=TRACKING_URI)
    c.set_defaults(run=cmd_compare)


# ----- raybench export ---------------------------------------------------------------------------
def cmd_export_wilds(args: argparse.Namespace) -> int:
    """The leaderboard's files from finished sweeps (raybench.commands.export_wilds says how)."""
    from raybench.commands.export_wilds import ExportRequest, export_sweeps, report_lines

    request = ExportRequest(tuple(args.sweeps), Path(args.out), Path(args.storage), args.device, args.force)
    with full_disk_named(request.out, "--out", "the leaderboard files", missing_folders(request.out)):
        exports = export_sweeps(request, say=lambda line: print(line, file=sys.stderr))
    print("\n".join(report_lines(exports)))
    for done in exports:
        for note in done.notes:
            print(f"note: {note}", file=sys.stderr)
    return 0


def add_export_parser(sub: Any) -> None:
    e = sub.add_parser("export", help="write finished sweeps in another benchmark's submission format")
    export = e.add_subparsers(dest="export_command", required=True, parser_class=OneLineParser)
    w = export.add_parser("wilds", help="the WILDS leaderboard's prediction files (every replicate's selected "
                                        "checkpoint on each evaluation split) and {dataset}_results.json, as the "
                                        "authors' examples/evaluate.py reads and writes them")
    w.add_argument("sweeps", nargs="+", metavar="SWEEP", help="a finished sweep's name, one per WILDS dataset")
    w.add_argument("--out", required=True, metavar="DIR", type=nonblank("a folder"),
                   help="where the files go: DIR/<dataset>/ (the folder evaluate.py reads) and DIR/<dataset>_results.json")
    w.add_argument("--storage", default="runs", type=nonblank("a folder"),
                   help="the sweeps' --storage, which keeps their results and replicate checkpoints")
    w.add_argument("--device", default="auto", metavar="auto|cpu|cuda[:N]",
                   help="where the models predict (auto: a GPU when there is one, as the trainer chooses)")
    w.add_argument("--force", action="store_true", help="replace an earlier export of the same datasets in DIR")
    add_plugin_flags(w)
    w.set_defaults(run=cmd_export_wilds)


# ----- wiring -------------------------------------------------------------------------------------
class VersionAction(argparse.Action):
    """`raybench --version`: the installed distribution's version, read only when asked (the metadata lookup
    walks sys.path, which every other command would pay for if the parser read it when built)."""

    def __init__(self, option_strings: Sequence[str], dest: str = argparse.SUPPRESS, **kwargs: Any) -> None:
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, **kwargs)

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: str | None = None) -> None:
        print(f"raybench {installed_version()}")
        parser.exit()


def installed_version() -> str:
    """The version of the installed raybench distribution; a source tree run without installing has none."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("raybench")
    except PackageNotFoundError:
        return "(not installed: no distribution metadata)"


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(prog="raybench",
                           description="Hyperparameter search and benchmarking under distribution shift.")
    parser.add_argument("--version", action=VersionAction, help="print the installed raybench's version and exit")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=OneLineParser)

    p_list = sub.add_parser("list", help="list registered algorithms, datasets or models, or every setting with its "
                                         "type, default and allowed range")
    p_list.add_argument("what", choices=["algorithms", "datasets", "models", "settings", "spaces"])
    p_list.add_argument("algorithm", nargs="?", help="settings: only this algorithm's hyperparameters (default: every "
                                                     "algorithm's)")
    add_spaces_flag(p_list, "with `list spaces`: ")
    add_plugin_flags(p_list)
    p_list.set_defaults(run=cmd_list)

    p_train = sub.add_parser("train", help="train one config locally (no Ray)")
    p_train.add_argument("--dataset", default="digits-shift")
    p_train.add_argument("--algorithm", default="erm")
    p_train.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                         help="a trainer setting (lr, batch_size, unlabeled_ratio, ...) or an algorithm hyperparameter")
    p_train.add_argument("--epochs", type=positive_int)
    p_train.add_argument("--seed", type=seed_int, default=0)
    p_train.add_argument("--output", type=nonblank("a folder"), help="directory for the checkpoint (state.pt, best_model.pt) and result.json")
    add_plugin_flags(p_train)
    p_train.set_defaults(run=cmd_train)
    add_probe_parsers(sub)
    add_sweep_parser(sub)
    add_benchmark_parser(sub)
    add_space_parser(sub)
    add_data_parser(sub)
    add_export_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """`raybench ARGV`: parse, hand over to the subcommand, and end as every raybench command ends
    (raybench.exits: a bad input in one line with exit 2, never a traceback)."""
    words = list(sys.argv[1:] if argv is None else argv)
    return run_command(lambda: _run_subcommand(words))


def add_plugin_flags(parser: argparse.ArgumentParser) -> None:
    """`--plugin` on every command that turns names into algorithms, datasets, models or search spaces (the
    sweep declares its own, as a SweepOptions field that a benchmark passes on and a resume repeats)."""
    parser.add_argument("--plugin", action="append", default=[], metavar="MODULE|PATH",
                        help="a module, .py file or package folder that registers algorithms, datasets, models or "
                             "search spaces (repeatable; also $RAYBENCH_PLUGINS and the raybench.plugins entry points)")


def _run_subcommand(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    args.argv = argv  # the words after `raybench`, as typed: a sweep or benchmark repeats them in its resume line
    load_plugins_or_refuse(getattr(args, "plugin", ()))  # installed plug-ins' entry points, whatever the command
    run: Callable[[argparse.Namespace], int] = args.run
    return ended_by_a_full_disk(lambda: run(args))


def ended_by_a_full_disk(body: Callable[[], int]) -> int:
    """A command whose disk filled up (StorageFull, naming the flag and its folder) ends in one line with exit
    74, sysexits' EX_IOERR, as a sweep does: the input was good, a write was not, and whatever it wrote is whole."""
    from raybench.exits import one_short_line
    from raybench.paths import StorageFull

    try:
        return body()
    except StorageFull as err:
        print(f"raybench: {one_short_line(str(err))}; free space and run it again", file=sys.stderr)
        return 74


if __name__ == "__main__":
    sys.exit(main())
