"""A sweep, start to finish: validate -> search -> select -> replicate -> summarise -> record.

This is the WILDS 2.0 protocol (App. D) as one function. It knows the order of things; Ray lives in
ray_backend, MLflow in raybench.tracking, tables in results. Everything a user can get wrong is
checked before Ray starts.
"""
from __future__ import annotations

import argparse
import concurrent.futures
import dataclasses
import gc
import importlib
import shlex
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, TypeVar

import raybench
from raybench.data import DATASETS, ShiftDataset, load_dataset
from raybench.flag_types import AUTO
from raybench.labels import selection_label
from raybench.paths import (
    HeldLock,
    LockBusy,
    StorageFull,
    UnsafeLockFile,
    disk_full_error,
    file_lock_problem,
    inside,
    lock_busy,
    name_problem,
    take_lock,
    writable_dir_problem,
)
from raybench.plugins import module_names as plugin_modules
from raybench.plugins import runtime_env_modules
from raybench.records import (
    ConvergenceAttempt,
    Replicates,
    Selection,
    SweepState,
    SweepSummary,
    TrialRecord,
    TrialStatus,
)
from raybench.sweep import options as sweep_options
from raybench.sweep import outcome, progress, state_seal
from raybench.sweep.converge import DEFAULT_ATTEMPTS, Attempt, ConvergeRule, run_until_converged, scale_text
from raybench.sweep.errors import OptionError, SweepBusy, SweepExists, SweepInterrupted
from raybench.sweep.extension import (
    REPLAYED_SAMPLERS,
    REPLICATE_COUNTS,
    SEARCH_COUNTS,
    ExtentError,
    extension_record,
    extension_suffix,
    planned_extents,
    read_extents,
    supersessions,
    write_extents,
)
from raybench.sweep.local_cluster import check_local_cluster
from raybench.sweep.options import (  # SweepOptions is imported from here too
    DEFAULT_REPLICATES_CAP,
    SCHEDULERS,
    SweepOptions,
    cluster_address,
)
from raybench.sweep.outcome import ranking_key
from raybench.sweep.progress import StageProgress, duration
from raybench.sweep.seed_rules import SequentialRule
from raybench.sweep.selection import SELECTIONS
from raybench.sweep.space import (
    OWN_FLAGS,
    Param,
    ResolvedSpace,
    SearchSpace,
    SpaceError,
    command_line_overrides,
    load_space,
    midpoints,
    sweep_space,
)
from raybench.sweep.spending import (
    CUT_FILE,
    BudgetCut,
    SpendGate,
    SpendLimit,
    budget_record,
    parse_spend_limit,
    read_cut,
    sweep_runs,
)
from raybench.tracking import (
    LOCK_TAG,
    PROCESS_STATS,
    RESUME_TAG,
    RUN_FAILED,
    RUN_FINISHED,
    RUN_KILLED,
    SUPERSEDED_TAG,
    TRIAL_JOURNAL,
    RecordedSweep,
    SweepTracker,
    TrackingError,
    TrialRunWriter,
    base_tags,
    check_reachable,
    check_uri,
    default_tracking_uri,
    find_recorded_sweep,
    flatten,
    is_new_sqlite_store,
    load_sweep_results,
    read_summary_text,
    redact_uri,
    storage_problem,
)
from raybench.words import REPLICATE_STAGE, SEARCH_STAGE

STAGE_TITLES = {SEARCH_STAGE: "search", REPLICATE_STAGE: "replicates"}
T = TypeVar("T")


class SweepRecorder(Protocol):
    """What writes a sweep's record at its end (and at an interruption): its tables, pages and figures, on disk
    and on the parent run. raybench.report.record.SWEEP_RECORD is the one raybench uses; the process that runs the
    sweep (raybench.commands.sweep, raybench.api) hands it in, so that the sweep floor never imports the report
    floor above it."""

    def modules(self, trials: int, searched: bool) -> tuple[str, ...]:
        """The modules the record will import, to import beside Ray's start while a core is idle."""

    def record(self, prepared: Prepared, tracker: SweepTracker, summary: SweepSummary, trials: list[TrialRecord],
               replicates: list[TrialRecord], selected: TrialRecord | None) -> None:
        """Write the record of `summary`; a full --storage is one StorageFull naming the file."""


def announce(line: str) -> None:
    """A line on the console, at once, through the process's progress display (the sweep's own lines; Ray's go
    to its logs)."""
    progress.say(line)


@dataclass
class Prepared:
    """Everything checked and resolved before any cluster work."""

    options: SweepOptions
    name: str
    space: ResolvedSpace
    algorithm: str
    selection_metric: str
    selection_label: str
    metric_names: list[str]
    tracking_uri: str
    storage: Path
    epochs: int  # a trial's length, where ASHA's last rung lies
    report: dict[str, Any]  # what result tables call the splits and which cells a comparison shows
    # The convergence rule's earlier attempts this sweep supersedes (raybench.sweep.converge); its summary names them
    attempts: list[ConvergenceAttempt] = dataclasses.field(default_factory=list)
    replicate_rule: SequentialRule | None = None  # --replicates auto: add seeds until decided against the baseline
    baseline_values: tuple[float, ...] = ()  # the baseline sweep's replicate values on the ranking column
    # The trial counts the search runs to: (--trials,), or those of a search that --resume --trials extends
    extents: tuple[int, ...] = ()
    replicate_extents: tuple[int, ...] = ()  # the same for the selected config's replicates (--replicates)
    # --replicates auto: the baseline sweep's own options, to add seeds to it as to this one; None where it cannot
    # be grown from here (baseline_growth_note says why)
    baseline_options: SweepOptions | None = None
    baseline_growth_note: str = ""
    spend_limit: SpendLimit | None = None  # --budget
    budget_cut: BudgetCut | None = None  # where --budget stopped the search drawing


def dataset_for_trials(options: SweepOptions, space: SearchSpace) -> ShiftDataset:
    """The dataset the trials will read: `data_dir` and `data_seed` from --set, else the space's fixed values, as
    TrainConfig resolves them. The driver binds the space to this one, so a sweep on a WILDS root given only by
    --set data_dir (or a generated dataset of another seed) is checked against what its trials load."""
    chosen = {**space.fixed, **options.extra_fixed}
    data_dir = chosen.get("data_dir")
    try:
        data_seed = int(chosen.get("data_seed", 0))
    except (TypeError, ValueError):
        raise OptionError(f"--set data_seed: expected a whole number, got {chosen['data_seed']!r}") from None
    try:
        return load_dataset(options.dataset, Path(str(data_dir)) if data_dir else None, data_seed)
    except FileNotFoundError as err:  # WILDS data is never downloaded during a run
        raise OptionError(f"--dataset {options.dataset}: {err}") from None


def prepare(options: SweepOptions, space: SearchSpace | None = None) -> Prepared:
    """Validate the space, the dataset, the options and the tracking server; raises with a clear message.
    `space`: a space the caller parsed already (the Python API's mapping or object), else `options.space` is read."""
    _load_plugins(options.plugins)
    check_options(options)
    space = space if space is not None else load_space(options.space, options.spaces)
    DATASETS.get(options.dataset)  # an unknown name is refused before a phase line says it is loading
    began = time.monotonic()
    announce(f"dataset {options.dataset}: loading")
    dataset = dataset_for_trials(options, space)
    announce(f"dataset {options.dataset}: ready in {duration(time.monotonic() - began)}")
    selection = SELECTIONS.get(options.selection)
    metric = selection.metric(dataset)
    trials = options.trials if options.trials is not None else (2 if options.smoke else 10)
    default_replicates = replicates_by_default(options.smoke, dataset)
    auto = options.replicates == AUTO
    replicates = default_replicates if options.replicates in (None, AUTO) else options.replicates
    options = dataclasses.replace(options, trials=trials, replicates=replicates)
    rule = replicate_rule(options) if auto else None
    overrides = command_line_overrides(options.smoke, options.extra_fixed)
    resolved = sweep_space(space, dataset, overrides)
    storage = Path(options.storage).resolve()
    # Reference models of multi-stage methods, shared by every trial and sweep under this storage.
    resolved.fixed.update({"selection_metric": metric, "seed": options.seed, "stage_cache": str(storage / "stage_cache"),
                           **overrides})
    resolved = resolved.with_epochs_scale(options.epochs_scale)  # an attempt of the convergence rule: every config alike
    from raybench.trainer import TrainConfig

    dry_run = TrainConfig.from_flat(resolved.materialize(midpoints(resolved))).resolve(dataset)  # one full config
    dry_run.check_model_builds(dataset)
    check_last_attempt(options, resolved, dataset)
    if options.scheduler == "asha" and options.grace_period >= dry_run.epochs:
        raise OptionError(f"--grace-period: a trial runs {dry_run.epochs} epoch(s), so ASHA can only stop it with a grace "
                          f"period under that, got {options.grace_period}")
    if not resolved.search and options.trials > 1:
        raise OptionError(f"--trials: nothing is left to search in {space.path} (--set fixed every searched setting), "
                          f"so expected 1, got {options.trials}")
    uri = options.tracking_uri or default_tracking_uri()
    check_uri(uri)
    name = options.sweep_name(space.algorithm)
    try:
        busy = lock_busy(sweep_lock_path(storage, name))
    except UnsafeLockFile as err:
        raise OptionError(f"--storage: {err}") from None
    if busy is not None:  # a live driver explains an existing (or not yet existing) sweep better than its folders
        raise sweep_busy(name, busy)
    _check_storage_for(name, storage, options.resume, uri)
    layout = report_layout(dataset)
    baseline = baseline_values(options, uri, ranking_key(layout["columns"])) if rule is not None else ()
    grown_from, growth_note = baseline_options(options, uri) if rule is not None else (None, "")
    check_local_cluster(options)  # last: it may import Ray's resource module, which the start needs next anyway
    return Prepared(options, name, resolved, space.algorithm, metric, selection.label(dataset), list(dataset.metric_names), uri, storage,
                    dry_run.epochs, layout, replicate_rule=rule, baseline_values=baseline,
                    spend_limit=parse_spend_limit(options.budget) if options.budget else None,
                    baseline_options=grown_from, baseline_growth_note=growth_note)


def replicates_by_default(smoke: bool, dataset: ShiftDataset) -> int:
    """The replicates a sweep runs without --replicates: 2 with --smoke, else the dataset's count (camelyon17: 10,
    as the paper) or 3."""
    return 2 if smoke else (dataset.defaults.replicates or 3)


def replicate_rule(options: SweepOptions) -> SequentialRule:
    """--replicates auto's rule: from the dataset's replicate count to --replicates-cap, one seed per look."""
    try:
        return SequentialRule(first=options.replicates, cap=options.replicates_cap)
    except ValueError:
        raise OptionError(f"--replicates-cap: expected at least the first look's {options.replicates} replicates "
                          f"(the dataset's count, and at least 2), got {options.replicates_cap}") from None


def baseline_values(options: SweepOptions, uri: str, key: str) -> tuple[float, ...]:
    """The baseline sweep's replicate values on the ranking column `key`, read from the store before any
    cluster work: a missing, unfinished or other-dataset baseline is one line naming --baseline."""
    try:
        summary = load_sweep_results(uri, options.baseline)
    except (TrackingError, ValueError) as err:
        raise OptionError(f"--baseline: {err}") from None
    if summary.dataset != options.dataset:
        raise OptionError(f"--baseline: sweep {options.baseline!r} ran on {summary.dataset}, this one on "
                          f"{options.dataset}; expected a sweep on the same dataset")
    values = outcome.replicate_values(summary.replicates.runs, key)
    if len(values) < 2:
        raise OptionError(f"--baseline: sweep {options.baseline!r} has {len(values)} finished replicate(s) with a "
                          f"{key} value; a test needs at least 2")
    return values


def baseline_options(options: SweepOptions, uri: str) -> tuple[SweepOptions | None, str]:
    """The baseline sweep's options for a resume that adds seeds to it (--replicates auto grows both sides): read
    back from the command that resumes it, on this sweep's cluster and store; (None, why not) where it cannot be
    grown from here. Checked before any cluster work: its command must parse and its space be found."""
    recorded = find_recorded_sweep(uri, options.baseline)
    if recorded is None:  # baseline_values refused it already; a sweep gone since then grows nothing
        return None, "it is not in the store"
    if recorded.params.get("baseline", "None") not in ("None", ""):
        return None, "it is a --replicates auto sweep itself, whose looks are its own"
    words = shlex.split(recorded.resume_command or "")
    if words[:2] != ["raybench", "sweep"] or not recorded.storage:
        return None, "it recorded no `raybench sweep` command to resume it with (the Python API ran it)"
    parser = argparse.ArgumentParser(prog="raybench sweep", add_help=False, exit_on_error=False)
    sweep_options.add_arguments(parser)
    try:
        grown = sweep_options.from_namespace(parser.parse_args(words[2:]), resume_command=recorded.resume_command)
        load_space(grown.space, grown.spaces)
    except (argparse.ArgumentError, SystemExit, OptionError, SpaceError) as err:
        return None, f"its command does not resume it from here ({err})"
    return dataclasses.replace(grown, resume=True, storage=recorded.storage, tracking_uri=uri, address=options.address,
                               quiet=options.quiet, progress_every=options.progress_every), ""


def grow_baseline(prepared: Prepared, recorder: SweepRecorder, count: int) -> tuple[float, ...]:
    """Resume the baseline sweep with `count` replicates (extend_replicates), in this driver and on its Ray, and
    its replicate values on the ranking column after."""
    assert prepared.baseline_options is not None
    announce(f"replicates: adding seeds to the baseline {prepared.options.baseline}, up to {count}")
    grown = run_sweep(prepare(dataclasses.replace(prepared.baseline_options, replicates=count)), recorder)
    return outcome.replicate_values(grown.replicates.runs, ranking_key(prepared.report["columns"]))


def _load_plugins(flags: tuple[str, ...]) -> None:
    """The sweep's plug-ins, imported before the space and the names it holds are read (a plug-in may define
    both); one OptionError naming the plug-in that cannot be used."""
    from raybench.plugins import PluginError, load_plugins

    try:
        load_plugins(flags)
    except PluginError as err:
        raise OptionError(f"--plugin: {err}") from None


def report_layout(dataset: ShiftDataset) -> dict[str, Any]:
    """Stored with the summary, so `results` and `compare` label a dataset's splits right without loading it."""
    return {"split_labels": dict(dataset.split_labels),
            "columns": [dataclasses.asdict(column) for column in dataset.report_columns()]}


def check_options(options: SweepOptions) -> None:
    """Every option that can be judged without the cluster: one OptionError naming the flag."""
    sweep_options.check_values(options)  # the Python API's values, held to the flags' own bounds
    if options.name is not None and name_problem(options.name):
        raise OptionError(f"--name: {name_problem(options.name)}")
    for key in options.extra_fixed:
        if key in OWN_FLAGS:
            raise OptionError(f"--set {key}: a sweep sets this through {OWN_FLAGS[key]}, so that its labels, tags and "
                              f"selection say what was trained")
    if options.executor == "function" and options.workers_per_trial != 1:
        raise OptionError(f"--workers-per-trial: --executor function runs single-worker trials, got "
                          f"{options.workers_per_trial}; use --executor train for several workers")
    if options.scheduler not in SCHEDULERS:
        raise OptionError(f"--scheduler: expected one of {', '.join(SCHEDULERS)}, got {options.scheduler!r}")
    if options.grace_period < 1:
        raise OptionError(f"--grace-period: expected a whole number of epochs >= 1, got {options.grace_period}")
    if not options.reduction_factor > 1:
        raise OptionError(f"--reduction-factor: expected a number > 1, got {options.reduction_factor:g}")
    problem = writable_dir_problem(Path(options.storage)) or file_lock_problem(Path(options.storage))
    if problem:
        raise OptionError(f"--storage: {problem}")
    check_converge(options)
    check_replicates_auto(options)


def check_replicates_auto(options: SweepOptions) -> None:
    """--replicates auto decides against a baseline sweep; --baseline and --replicates-cap mean nothing without it."""
    if options.replicates == AUTO and options.baseline is None:
        raise OptionError("--replicates auto: expected --baseline SWEEP, the finished sweep to tell this one apart from")
    if options.replicates != AUTO:
        given = "--baseline" if options.baseline is not None else "--replicates-cap" \
            if options.replicates_cap != DEFAULT_REPLICATES_CAP else None
        if given:
            raise OptionError(f"{given}: only with --replicates auto")


def check_converge(options: SweepOptions) -> None:
    """--converge-attempts means nothing without --converge; and every attempt's name must be a sweep name, so
    that a later attempt is not refused only after the first ones trained (judged at the first attempt: a later
    one's name is one of those)."""
    if options.converge is None:
        if options.converge_attempts is not None:
            raise OptionError(f"--converge-attempts: expected only with --converge FACTOR (it caps the attempts of "
                              f"the convergence rule), got {options.converge_attempts} without it")
        return
    if options.epochs_scale != 1:
        return
    for name in converge_rule(options).names(options.sweep_name("")):
        if name_problem(name):
            raise OptionError(f"--converge: its attempt {name!r} cannot name a sweep ({name_problem(name)}); "
                              f"give a shorter --name")


def check_last_attempt(options: SweepOptions, resolved: ResolvedSpace, dataset: ShiftDataset) -> None:
    """With --converge, the first attempt dry-runs the last one's config too (the midpoint config, as prepare's
    own dry run): epochs raised past what a config takes are refused now, not after the attempts before it
    trained."""
    if options.converge is None or options.epochs_scale != 1:
        return
    from raybench.trainer import ConfigError, TrainConfig

    rule = converge_rule(options)
    scale = rule.scale(rule.attempts)
    raised = resolved.with_epochs_scale(scale)
    try:
        TrainConfig.from_flat(raised.materialize(midpoints(raised))).resolve(dataset)
    except ConfigError as err:
        raise OptionError(f"--converge: its last attempt, {rule.name(options.sweep_name(''), rule.attempts)!r}, "
                          f"trains every config's epochs x{scale_text(scale)}, more than a config takes ({err}); "
                          f"give fewer --converge-attempts or a smaller factor") from None


def converge_rule(options: SweepOptions) -> ConvergeRule:
    """The convergence rule --converge and --converge-attempts ask for."""
    assert options.converge is not None
    return ConvergeRule(options.converge, options.converge_attempts or DEFAULT_ATTEMPTS)


def _check_storage_for(name: str, storage: Path, resume: bool, uri: str) -> None:
    """The sweep's folders stay inside --storage; a new sweep never lands on an old one, and --resume needs one,
    or at least the parent run: a stop between the parent's creation and Tune's first folder leaves only that."""
    folders = [storage / f"{name}-search", storage / name]
    if not all(inside(storage, folder) for folder in folders):
        raise OptionError(f"--name: {name!r} would write outside --storage {str(storage)!r}")
    exists = bool(sweep_options.started_folders(storage, name))  # as the interrupted line judges a resume
    if exists and not resume:
        raise SweepExists(f"--name: a sweep named {name!r} already exists under {storage}; "
                          f"pass --resume to continue it, or another --name")
    if resume and not exists and not recorded_in_store(uri, name):
        raise OptionError(f"--resume: no sweep named {name!r} under {storage} to resume; leave out --resume to start it")
    _check_state_sealed([*folders, *storage.glob(f"{name}-replicate*")] if resume else [])


def recorded_in_store(uri: str, name: str) -> bool:
    """Whether the tracking store already holds sweep `name`'s parent run; read only, and never a new store."""
    if is_new_sqlite_store(uri):
        return False
    try:
        return find_recorded_sweep(uri, name) is not None
    except Exception:  # noqa: BLE001  (run_sweep meets the store again, and names what is wrong with it)
        return False


def _check_state_sealed(folders: list[Path]) -> None:
    """The resume key can be read (a new sweep seals its state with it), and on a resume every file of Tune's
    saved state under the sweep's folders was sealed with it: Tune's restore unpickles them."""
    try:
        state_seal.state_key()
        for folder in folders:
            if folder.is_dir():
                state_seal.require_sealed(folder)
    except state_seal.UnsealedState as err:
        raise OptionError(str(err)) from None
    except (state_seal.StateKeyError, OSError) as err:
        raise OptionError(f"{state_seal.STATE_KEY_ENV}: {err}") from None


# ----- one driver per sweep, and a sweep is what it was started as -----------------------------------------
LOCK_FOLDER = ".raybench-locks"  # under --storage; a sweep name never starts with a dot, so no sweep lands here

# The recorded params (see _sweep_params) a --resume may not change, with the flag that sets each: the options
# declared fixed_on_resume (raybench.sweep.options), then what _sweep_params derives from them. They decide what is
# trained and what is selected, and Tune's restore keeps the search it started (its sample count, its searcher's
# seed and space), so a changed value would be ignored or would break the restored search. The others only say
# where and how fast it runs (--address, --max-concurrent, --cpus-per-worker, --storage ...) and may change. A
# space is compared by its content (algorithm, search, derived, fixed), not its spelling.
RESUME_FIXED: dict[str, str] = {**sweep_options.fixed_on_resume(),
                                "selection_metric": sweep_options.flag_words("selection"),
                                "algorithm": f"{sweep_options.flag_words('space')} (its algorithm)"}
SPACE_CONTENT: dict[str, str] = {"space.searched": "SPACE (the settings it searches)",
                                 "space.lr_center": "SPACE (its lr centre)"}
# Recorded params whose name says which setting of the space they are, and the words that name it.
SPACE_SETTINGS = {"space.fixed.": "the fixed setting {} (SPACE or --set)", "space.search.": "SPACE (its search of {})",
                  "space.derived.": "SPACE (its derivation of {})"}
# Recorded under space.fixed but set by a flag that may change (--storage may name the same folder another way).
RESUME_FREE_FIXED = {"space.fixed.stage_cache"}
NOT_RECORDED = "(not set)"


def sweep_lock_path(storage: Path, name: str) -> Path:
    return storage / LOCK_FOLDER / f"{name}.lock"


def take_sweep_lock(prepared: Prepared) -> HeldLock:
    """The sweep's lock on --storage, held by its driver until it ends: a second driver of the same sweep (two
    starts at once, or a --resume while it runs) is refused, naming the live one. A lock whose driver died is
    free (flock dies with its process) and is taken over, with a line saying so."""
    path = sweep_lock_path(prepared.storage, prepared.name)
    try:
        lock = take_lock(path)
    except LockBusy as busy:
        raise sweep_busy(prepared.name, busy) from None
    except UnsafeLockFile as err:
        raise OptionError(f"--storage: {err}") from None
    except OSError as err:
        if disk_full_error(err) is not None:
            raise StorageFull(prepared.storage, "the sweep lock", disk_full_error(err).errno) from None
        raise OptionError(f"--storage: cannot take the sweep lock {str(path)!r} ({err.strerror or err})") from None
    if lock.previous is not None:
        announce(f"sweep {prepared.name}: taking over the lock of a driver that is gone ({lock.previous.words()})")
    return lock


def sweep_busy(name: str, busy: LockBusy) -> SweepBusy:
    holder = busy.holder.words() if busy.holder else "its host and pid not written"
    return SweepBusy(f"--name: sweep {name!r} is being run by another live driver ({holder}; lock "
                     f"{str(busy.path)!r}); wait for it to end, or stop it first")


def check_recorded(prepared: Prepared, recorded: RecordedSweep | None) -> None:
    """A new sweep never reuses the parent run of an existing one (in any --storage), and a --resume continues
    the sweep the tracking store recorded, with the flags it recorded: one line naming what differs."""
    opts, store = prepared.options, redact_uri(prepared.tracking_uri)
    if recorded is not None and not opts.resume:
        raise SweepExists(f"--name: a sweep named {prepared.name!r} already exists in the tracking store {store} "
                          f"(run {recorded.run_id}); pass --resume (with its --storage{' ' + recorded.storage if recorded.storage else ''}) "
                          f"to continue it, or another --name")
    if recorded is not None and storage_problem(prepared.name, recorded.storage, prepared.storage):
        raise OptionError(storage_problem(prepared.name, recorded.storage, prepared.storage))
    if recorded is None and opts.resume:
        raise OptionError(f"--resume: sweep {prepared.name!r} has folders under {prepared.storage} but no parent run in "
                          f"the tracking store {store}; resume it with the --tracking-uri it was started with")
    if recorded is not None:
        changed = changed_flag(recorded.params, flatten(_sweep_params(prepared)))
        if changed is not None:
            raise OptionError(changed)


def changed_flag(recorded: dict[str, str], given: dict[str, str]) -> str | None:
    """The first flag whose value differs from the sweep's recorded one, as one line; None if none does.

    Flags first, then fixed settings (--set), then the space's search: a `--set lr=...` is then named as
    such, not as the search that lost `lr`. Only keys the sweep recorded are judged (an older raybench
    recorded fewer): where the record predates `space.searched`, the space's name as given stands in for
    its content."""
    content_recorded = "space.searched" in recorded
    keys = [key for key in RESUME_FIXED if key in recorded] + ([] if content_recorded else ["space"])
    names = {*recorded, *given} - RESUME_FREE_FIXED
    keys += sorted(key for key in names if key.startswith("space.fixed."))
    if content_recorded:
        keys += [key for key in SPACE_CONTENT if key in recorded]
        keys += sorted(key for key in names if key.startswith(("space.search.", "space.derived.")))
    for key in keys:
        was, now = recorded.get(key, NOT_RECORDED), given.get(key, NOT_RECORDED)
        if _same_value(was, now):
            continue
        why = ("a resume continues the recorded sweep unchanged: give the flags it was started with, or start "
               "a new sweep with another --name")
        return f"--resume: {_flag_of(key)} was {was} when this sweep started, got {now}; {why}"
    return None


def _flag_of(key: str) -> str:
    """The flag (or file) a recorded param comes from, as the user would name it."""
    if key == "space":
        return "SPACE"
    for prefix, words in SPACE_SETTINGS.items():
        if key.startswith(prefix):
            return words.format(key.removeprefix(prefix))
    return {**RESUME_FIXED, **SPACE_CONTENT}[key]


def _same_value(was: str, now: str) -> bool:
    """Equal as recorded text, or as numbers (`1e-3` and `0.001`), or as words up to case (`none`, `None`)."""
    if was == now or was.lower() == now.lower():
        return True
    try:
        return float(was) == float(now)
    except ValueError:
        return False


def finished_summary(prepared: Prepared, recorded: RecordedSweep | None) -> SweepSummary | None:
    """The results of a sweep that already finished, by its parent run and by its summary under --storage;
    None while there is anything left to do (a resume then continues it)."""
    if recorded is None or recorded.state.state != SweepState.FINISHED or recorded.status != RUN_FINISHED:
        return None
    path = prepared.storage / prepared.name / "results" / "summary.json"
    try:
        summary = read_summary_text(path.read_text(), prepared.name, recorded.run_id)
    except OSError:  # not there, or unreadable: run it again
        return None
    except ValueError as err:  # not JSON, nested too deep, not a summary, another sweep's (RecordError): run it again
        announce(f"sweep {prepared.name}: {path} is damaged ({err}); resuming writes it anew")
        return None
    return summary if summary.finished else None


def _param_text(param: Param) -> str:
    """A searched setting's distribution as a recorded param: what a resume's space must still search."""
    if param.values:
        return f"{param.distribution}({', '.join(map(str, param.values))})"
    return f"{param.distribution}[{param.low}, {param.high}]"


def sweep_until_converged(options: SweepOptions, space: SearchSpace | None = None,
                          say: Callable[[str], None] = announce, *,
                          recorder: SweepRecorder) -> tuple[SweepSummary, str]:
    """(the sweep's summary, its tracking URI): one sweep, or with --converge the attempts of the convergence rule
    (raybench.sweep.converge), each prepared and run as its own sweep, until one converged or the cap; the last
    one's summary is the result. Every check of an attempt is made before its own cluster work, and those that
    can be judged for all attempts at once (their names) by the first attempt's (check_converge)."""
    if options.converge is None:
        prepared = prepare(options, space)
        return run_sweep(prepared, recorder), prepared.tracking_uri
    uris: list[str] = []

    def run_attempt(attempt: Attempt) -> SweepSummary:
        prepared = prepare(attempt_options(options, attempt), space)
        prepared.attempts = list(attempt.earlier)
        uris.append(prepared.tracking_uri)
        return run_sweep(prepared, recorder)

    summary = run_until_converged(options.sweep_name(""), converge_rule(options), run_attempt, say)
    return summary, uris[-1]


def attempt_options(options: SweepOptions, attempt: Attempt) -> SweepOptions:
    """The options of one attempt: the sweep as asked, under the attempt's name with its epochs scale. A
    `--resume` resumes a later attempt only where it started (it may never have: the earlier attempt converged,
    or the resume is what applies the rule to a finished sweep); else the attempt starts."""
    if attempt.number == 1:
        return options
    chosen = dataclasses.replace(options, name=attempt.name, epochs_scale=attempt.epochs_scale)
    uri = options.tracking_uri or default_tracking_uri()
    started = sweep_options.resume_accepted(chosen) or recorded_in_store(uri, attempt.name)
    return dataclasses.replace(chosen, resume=options.resume and started)


def run_sweep(prepared: Prepared, recorder: SweepRecorder) -> SweepSummary:
    """Run a prepared sweep to the end; returns the summary that is also written to disk and MLflow.

    First, before anything but the lock file is written: the sweep's lock (one driver per sweep), then the
    tracking store's record of it (a new sweep never takes over an existing one; a resume keeps its flags).
    A resume of a sweep that already finished returns its results and changes nothing.

    Raises SweepInterrupted when a signal cut it short: the parent run and every child still running are
    then marked KILLED, the partial results are written, and `--resume` continues exactly there."""
    check_reachable(prepared.tracking_uri)  # an HTTP server that does not answer: refused before the lock file
    with take_sweep_lock(prepared) as lock:
        recorded = find_recorded_sweep(prepared.tracking_uri, prepared.name)
        check_recorded(prepared, recorded)
        if not extend_if_asked(prepared, recorded) and (finished := finished_summary(prepared, recorded)) is not None:
            announce(f"sweep {prepared.name}: already finished; nothing to resume (its results, as recorded)")
            return finished
        return _run_locked(prepared, lock, recorder)


def recorded_counts(prepared: Prepared, recorded: RecordedSweep | None, field: str,
                    key: str = SEARCH_COUNTS) -> tuple[int, ...]:
    """The counts the recorded sweep ran `field` to (trials: its search, SEARCH_COUNTS; replicates: its selected
    config's, REPLICATE_COUNTS); a new sweep's is the option as given."""
    given = getattr(prepared.options, field)
    if recorded is None:
        return (given,)
    try:
        started_with = int(recorded.params.get(field, given))
    except ValueError:
        started_with = given
    return read_extents(prepared.storage, prepared.name, started_with, key)


def extend_if_asked(prepared: Prepared, recorded: RecordedSweep | None) -> bool:
    """Set the search's and the replicates' extents; True when this run extends the recorded sweep, whose new
    counts are then written before anything runs (a signal in the extension leaves it resumable as such)."""
    grew_replicates = extend_replicates(prepared, recorded)
    before = recorded_counts(prepared, recorded, "trials")
    try:
        prepared.extents = planned_extents(before, prepared.options.trials)
    except ExtentError as err:
        raise OptionError(str(err)) from None
    if prepared.extents == before:
        return grew_replicates
    if not prepared.space.search:
        raise OptionError(f"--trials: sweep {prepared.name!r} searches nothing (one config), so it cannot be "
                          f"extended; expected --trials {before[-1]}")
    last = prepared.storage / f"{prepared.name}-{SEARCH_STAGE}{extension_suffix(before[-1]) if len(before) > 1 else ''}"
    cut = read_cut(last)
    if cut is not None:
        raise OptionError(f"--trials: sweep {prepared.name!r}'s search was cut by its --budget at {cut.drawn} of "
                          f"{before[-1]} configs, so it has no next config to extend from; expected --trials "
                          f"{before[-1]} (a resume then finishes it as it stands)")
    write_extents(prepared.storage, prepared.name, prepared.extents)
    drawn = (f"configs {before[-1] + 1}..{prepared.extents[-1]} of the same seeded stream"
             if prepared.options.sampler in REPLAYED_SAMPLERS else
             f"{prepared.options.sampler} told the {before[-1]} trials' results first")
    announce(f"sweep {prepared.name}: extending its search from {before[-1]} to {prepared.extents[-1]} trials ({drawn})")
    return True


def extend_replicates(prepared: Prepared, recorded: RecordedSweep | None) -> bool:
    """--resume --replicates N above the count a finished sweep ran: seeds N_before+1..N of the selected config's
    seed stream (outcome.replicate_seeds), in their own experiment; fewer is refused."""
    before = recorded_counts(prepared, recorded, "replicates", REPLICATE_COUNTS)
    try:
        prepared.replicate_extents = planned_extents(before, prepared.options.replicates, "--replicates",
                                                     "this sweep's selected config ran {} replicates")
    except ExtentError as err:
        raise OptionError(str(err)) from None
    if prepared.replicate_extents == before:
        return False
    write_extents(prepared.storage, prepared.name, prepared.replicate_extents, REPLICATE_COUNTS)
    announce(f"sweep {prepared.name}: adding replicates, from {before[-1]} to {prepared.replicate_extents[-1]} seeds "
             f"of its selected config")
    return True


def _run_locked(prepared: Prepared, lock: HeldLock, recorder: SweepRecorder) -> SweepSummary:
    """The sweep itself, by the driver holding `lock`, which its parent run names (LOCK_TAG)."""
    opts = prepared.options
    resume_command = opts.resume_command
    tracker: SweepTracker | None = None
    if opts.parent_run or not is_new_sqlite_store(prepared.tracking_uri):
        tracker = SweepTracker(prepared.tracking_uri, opts.experiment)  # fails fast when the server is unreachable
    if opts.parent_run:
        try:
            # A benchmark's sweep is resumed by resuming the benchmark: its own command would name the
            # benchmark's private Ray, gone with it.
            resume_command = tracker.check_parent_run(opts.parent_run) or resume_command
        except TrackingError as err:  # before Ray starts, naming the flag
            raise OptionError(f"--parent-run: {err}") from None
    ray_session = RaySession(opts)
    modules = recorder.modules(opts.trials or 0, bool(prepared.space.search))
    # A cluster at --address is judged only once joined (check_resources): a new store is made after that, so a
    # refused request leaves none behind. A private Ray's request was judged before the start (prepare).
    joining = cluster_address(opts.address) is not None
    new_tracker = ray_session.start_beside(
        lambda: _ready_for_the_end(prepared.tracking_uri, opts.experiment, tracker is None and not joining, modules))
    try:
        backend = ray_session.backend
        resources = backend.Resources(opts.workers_per_trial, opts.cpus_per_worker, opts.gpus_per_worker,
                                      opts.max_failures, custom=opts.worker_resources,
                                      per_trial=opts.trial_resources)
        backend.check_resources(resources, opts.executor, opts.autoscaling)
        tracker = tracker or new_tracker or SweepTracker(prepared.tracking_uri, opts.experiment)
        tags = base_tags(opts.dataset, prepared.algorithm)
        if resume_command:
            tags[RESUME_TAG] = resume_command
        tracker.start_sweep(prepared.name, params=_sweep_params(prepared), tags=tags, parent_run=opts.parent_run,
                            storage=prepared.storage, resuming=opts.resume)
        tracker.set_tags(tracker.parent_id, {LOCK_TAG: f"{lock.path} (host {lock.holder.host}, pid {lock.holder.pid})"})
        try:
            summary = _search_and_replicate(prepared, tracker, ray_session, resources, tags, recorder)
        except BaseException as err:
            tracker.end_sweep(RUN_KILLED if isinstance(err, (KeyboardInterrupt, SweepInterrupted)) else RUN_FAILED,
                              note=str(err))
            raise
        tracker.end_sweep(RUN_FINISHED)
    finally:
        ray_session.stop()
    return summary


def _ready_for_the_end(tracking_uri: str, experiment: str, new_store: bool,
                       modules: tuple[str, ...]) -> SweepTracker | None:
    """What runs beside Ray's start: a new store's tracker (MLflow's schema migrations), and the imports of the
    sweep's record (`modules`), seconds of one core that its end would otherwise spend with every trial slot idle."""
    tracker = SweepTracker(tracking_uri, experiment) if new_store else None
    for module in modules:
        try:
            importlib.import_module(module)
        except ImportError:  # the record says what is missing where it needs it (an importance's reason)
            pass
    return tracker


class RaySession:
    """The sweep's hold on Ray: joined or started once every check that can refuse the sweep has passed, and
    let go as soon as the last stage's trials are collected. Ray's start and stop each leave a core mostly idle
    while its processes come and go (benchmarks/README.md, "A sweep's fixed start"), so the sweep's own work
    that needs no Ray runs beside them: a new SQLite store's schema migrations beside the start, the results,
    tables and figures beside the stop."""

    def __init__(self, options: SweepOptions) -> None:
        self.options = options
        self.backend: Any = None
        self.connected = False  # this session joined or started Ray, so it disconnects again
        self._stopping: threading.Thread | None = None

    def start(self) -> None:
        from raybench.sweep import ray_backend  # Ray is imported only once everything is valid

        self.backend = ray_backend
        address = cluster_address(self.options.address)
        began = time.monotonic()
        if ray_backend.already_connected():  # a library caller's, or the driver's own (a baseline grown beside it)
            announce("Ray: the Ray this process holds already")
        else:
            announce(f"Ray: joining the cluster at {sweep_options.shown_address(address)}" if address else
                     "Ray: starting a private Ray on this machine")
        self.connected = ray_backend.connect(address, driver_slots=max(self.options.max_concurrent, 1) * 2,
                                             py_modules=runtime_env_modules())
        announce(f"Ray: ready in {duration(time.monotonic() - began)}{ray_backend.capacity_words()}")

    def start_beside(self, work: Callable[[], T]) -> T:
        """Start Ray while `work` runs in another thread; its result, or its error once Ray is let go again."""
        with concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="raybench-beside-ray") as pool:
            pending = pool.submit(work)
            self.start()  # a failed start leaves with the pool, which first waits for `work` to end
            try:
                return pending.result()
            except BaseException:
                self.stop()
                raise

    def stop_in_background(self) -> None:
        """Let Ray go in another thread: every trial has ended and been collected, nothing else asks Ray.

        No Ray object may be freed on this thread while Ray shuts down in the other: Ray's core worker then ends
        the whole process ("The core worker has already been shutdown ... The process will exit", exit status 1),
        after the sweep had recorded everything. A sweep whose trial failed (a divergence) did so in most runs
        on a fast machine: Tune's objects for it sit in reference cycles, which Python's collector frees
        whenever it next runs. So the stage's objects are out of scope (_stage_records) and cycles are collected
        here first, while Ray is still up."""
        if self.connected and self._stopping is None:
            gc.collect()
            self._stopping = threading.Thread(target=self.backend.shutdown, name="raybench-ray-shutdown")
            self._stopping.start()

    def stop(self) -> None:
        """Let Ray go (a library caller may run several sweeps in one process: Ray is left as found)."""
        if self._stopping is not None:
            self._stopping.join()
        elif self.connected:
            self.backend.shutdown()
        self.connected = False


def _search_and_replicate(prepared: Prepared, tracker: SweepTracker, ray_session: RaySession, resources: Any,
                          tags: dict[str, str], recorder: SweepRecorder) -> SweepSummary:
    opts = prepared.options
    backend = ray_session.backend
    started = time.time()
    tracking_before = dataclasses.replace(PROCESS_STATS)

    words = selection_label(prepared.selection_metric, prepared.report["split_labels"], analysis_only=False)

    def spec(stage: str, total: int, suffix: str = "", early_stopping: Any = None) -> Any:
        name = f"{prepared.name}-{stage}{suffix}"
        run = backend.RunSpec(name, prepared.storage, stage, opts.executor, resources, opts.max_concurrent,
                              early_stopping=early_stopping,
                              trial_slots=Path(opts.trial_slots) if opts.trial_slots else None,
                              plugins=plugin_modules())
        records = backend.RunRecords(run.completed, prepared.space, stage)
        callback = backend.TrackingCallback(tracker, prepared.space, stage, tags, records,
                                            journal=prepared.storage / name / TRIAL_JOURNAL, resuming=opts.resume)
        shown = backend.ProgressCallback(StageProgress(STAGE_TITLES[stage], total, words), records)
        return run.with_callbacks(callback, shown)

    asha = backend.EarlyStopping(opts.grace_period, opts.reduction_factor, prepared.epochs) if opts.scheduler == "asha" else None
    trials: list[TrialRecord] = []
    budget_cut: BudgetCut | None = None
    for earlier, count in zip((0, *prepared.extents), prepared.extents or (opts.trials,)):
        more, cut_short, budget_cut = _search_stage(prepared, backend, spec, asha, trials, earlier, count)
        trials += more
        drawn = min(count, budget_cut.drawn) if budget_cut else count
        _raise_if_interrupted(prepared, tracker, recorder, "search", trials, drawn, started, cut_short)
        if budget_cut is not None:  # the last stage: a search cut by its budget is never extended (extend_if_asked)
            announce(f"search: the budget ({prepared.spend_limit.words() if prepared.spend_limit else ''}) fits no "
                     f"more trials: {budget_cut.drawn} of {opts.trials} configs drawn, {opts.trials - budget_cut.drawn} "
                     f"cut, at {budget_cut.per_trial_s:g} s a trial with {budget_cut.replicates} replicate runs kept")
            break
    prepared.budget_cut = budget_cut
    selected = outcome.select_best(trials)
    for change in supersessions(trials, prepared.extents):
        announce(f"search: the selection changed with the extension to {change.trials} trials: {change.words()}")
        tracker.set_tags(tracker.parent_id, {SUPERSEDED_TAG: change.words()})
    replicates: list[TrialRecord] = []
    seeds: list[int] = []
    counts = [count for count in prepared.replicate_extents or (opts.replicates,) if count > 0]
    if selected is not None and counts:
        announce(f"replicates: {counts[-1]} seeds of trial {selected.trial_id} (best of the search, "
                 f"{words} {selected.selection_value:.4f}), elapsed {duration(time.time() - started)}")

        def look(new_seeds: list[int], total: int) -> tuple[list[TrialRecord], bool]:
            """One replicate experiment per selected trial id (a resume that selects another trial never reuses
            them): its first count's NAME-replicate-<id>, and each later count's own ...-to<count>."""
            suffix = f"-{selected.trial_id}" + (f"-to{total}" if total > counts[0] else "")
            run = spec(REPLICATE_STAGE, len(new_seeds), suffix)
            return _stage_records(backend, lambda: backend.run_replicates(
                prepared.space, run, selected.sampled, new_seeds, opts.resume), prepared.space, run)

        def check(runs: list[TrialRecord], ran: list[int], cut: bool) -> None:
            _raise_if_interrupted(prepared, tracker, recorder, "replicates", runs, len(ran), started, cut, trials,
                                  selected, ran)

        for earlier, count in zip((0, *counts), counts):
            new = outcome.replicate_seeds(selected.trial_id, count)[earlier:]
            more, cut_short = look(new, count)
            replicates, seeds = replicates + more, seeds + new
            check(replicates, seeds, cut_short)
        if prepared.replicate_rule is not None:
            grow = (lambda count: grow_baseline(prepared, recorder, count)) if prepared.baseline_options else None
            replicates, seeds = replicates_until_settled(prepared, selected, replicates, seeds, look, check, grow)
    ray_session.stop_in_background()  # every trial is collected: the record below needs no Ray
    announce("results: writing the summary, the tables and the figures")
    summary = _summary(prepared, trials, selected, replicates, seeds, time.time() - started)
    summary.tracking = PROCESS_STATS.since(tracking_before).as_dict()
    recorder.record(prepared, tracker, summary, trials, replicates, selected)
    return summary


def _search_stage(prepared: Prepared, backend: Any, spec: Callable[..., Any], asha: Any, trials: list[TrialRecord],
                  earlier: int, count: int) -> tuple[list[TrialRecord], bool, BudgetCut | None]:
    """The search's trials from `earlier` to `count`, whether Tune cut the stage short, and where --budget stopped
    it drawing: the sweep's own search, or an extension of it (its trials numbered after the earlier ones, so ties
    and extents read the order they were drawn in)."""
    opts = prepared.options
    if earlier == 0:
        run = spec(SEARCH_STAGE, count if prepared.space.search else 1, early_stopping=asha)
    else:
        run = spec(SEARCH_STAGE, count - earlier, extension_suffix(count), early_stopping=asha)
    gate = spend_gate(prepared, run.name)

    def stage() -> Any:
        if earlier == 0:
            return backend.run_search(prepared.space, run, count, opts.sampler, opts.seed, opts.resume, gate)
        return backend.run_extension(prepared.space, run, list(trials), count - earlier, opts.sampler, opts.seed,
                                     opts.resume, gate)

    records, cut_short = _stage_records(backend, stage, prepared.space, run)
    return ([dataclasses.replace(r, order=r.order + earlier) for r in records], cut_short,
            read_cut(prepared.storage / run.name))


def spend_gate(prepared: Prepared, stage: str) -> SpendGate | None:
    """--budget's judge of the search stage `stage` (raybench.sweep.spending), counting every run of the sweep."""
    opts, limit = prepared.options, prepared.spend_limit
    if limit is None:
        return None
    return SpendGate(limit, lambda: sweep_runs(prepared.storage, prepared.name), opts.replicates,
                     opts.max_concurrent, opts.workers_per_trial * opts.gpus_per_worker,
                     prepared.storage / stage / CUT_FILE)


def replicates_until_settled(prepared: Prepared, selected: TrialRecord, replicates: list[TrialRecord],
                             seeds: list[int], look: Callable[[list[int], int], tuple[list[TrialRecord], bool]],
                             check: Callable[[list[TrialRecord], list[int], bool], None],
                             grow: Callable[[int], tuple[float, ...]] | None = None
                             ) -> tuple[list[TrialRecord], list[int]]:
    """--replicates auto: after the first replicates, one more seed per look (each its own Tune experiment,
    NAME-replicate-<trial>-to<n>, so a resume restores every look it started) until the rule decides the
    comparison with the baseline on the ranking column, or the cap. The seeds are the selected trial's
    (replicate_seeds): the first n of n + 1 are the n already run, so a resume repeats every look exactly.
    `grow` (count -> the baseline's values) adds seeds to the baseline sweep the same way (grow_baseline): before
    each decision the baseline has at least as many replicates as this sweep."""
    rule = prepared.replicate_rule
    assert rule is not None
    key = ranking_key(prepared.report["columns"])

    def level_baseline(count: int) -> None:  # each side as many seeds, before each decision
        if grow is not None and len(prepared.baseline_values) < count:
            prepared.baseline_values = grow(count)

    level_baseline(len(seeds))
    while (wanted := rule.next_count(len(seeds), outcome.replicate_values(replicates, key),
                                     prepared.baseline_values)) is not None:
        new = outcome.replicate_seeds(selected.trial_id, wanted)[len(seeds):]
        announce(f"replicates: not yet told apart from {prepared.options.baseline} on {key}; seed {wanted} of at "
                 f"most {rule.cap}")
        level_baseline(wanted)
        more, cut_short = look(new, wanted)
        replicates, seeds = replicates + more, seeds + new
        check(replicates, seeds, cut_short)
    decided = rule.decided(outcome.replicate_values(replicates, key), prepared.baseline_values)
    announce(f"replicates: {len(seeds)} seeds, {'decided' if decided else 'not decided at the cap'} against "
             f"{prepared.options.baseline} ({rule.words()})")
    return replicates, seeds


def _stage_records(backend: Any, run_stage: Callable[[], Any], space: ResolvedSpace,
                   spec: Any) -> tuple[list[TrialRecord], bool]:
    """Run one Tune stage; its trials as plain records, and whether it was cut short. Tune's own objects (its
    trials and their results, some of them holding Ray objects) stay in this frame, so they are freed here, on this
    thread, while Ray is up: freed while `ray.shutdown` runs in the stopping thread, one ended the driver inside
    Ray's core worker with exit status 1 (RaySession.stop_in_background)."""
    stage = run_stage()
    TrialRunWriter.drain_all()  # every run of the stage in the store before anything reads them
    return backend.collect(stage.grid, space, spec), backend.cut_short(stage)


def _raise_if_interrupted(prepared: Prepared, tracker: SweepTracker, recorder: SweepRecorder, stage: str, runs: list[TrialRecord],
                          expected: int, started: float, cut_short: bool, trials: list[TrialRecord] | None = None,
                          selected: TrialRecord | None = None, seeds: list[int] | None = None) -> None:
    """Tune returns normally after a Ctrl-C; a stage that Tune cut short, or with unfinished or missing runs, is
    an interrupted one. Its partial results are written (marked interrupted), then SweepInterrupted is raised."""
    done = sum(r.status != TrialStatus.INTERRUPTED for r in runs)
    if not cut_short and done >= expected and len(runs) >= expected:
        return
    if stage == "search":
        trials, selected, seeds, replicates = runs, None, [], []
    else:
        replicates = runs
    summary = _summary(prepared, trials or [], selected, replicates, seeds or [], time.time() - started,
                       state=SweepState.interrupted_during(stage))
    recorder.record(prepared, tracker, summary, trials or [], replicates, None)
    raise SweepInterrupted(prepared.name, stage, done, expected)


def _sweep_params(prepared: Prepared) -> dict[str, Any]:
    opts = dataclasses.asdict(prepared.options)
    opts.pop("extra_fixed")
    opts.pop("resume_command")
    opts.pop("parent_run")
    opts["tracking_uri"] = redact_uri(prepared.tracking_uri)
    opts["address"] = redact_uri(opts["address"])
    space = prepared.space
    return {**opts, "selection_metric": prepared.selection_metric, "algorithm": prepared.algorithm,
            "space.searched": ",".join(sorted(space.search)) or "(none)",
            "space.search": {name: _param_text(param) for name, param in space.search.items()},
            "space.derived": {name: str(rule) for name, rule in space.derived.items()},
            "space.fixed": space.fixed, "space.lr_center": space.lr_center}


def space_scales(space: ResolvedSpace) -> dict[str, str]:
    """How each searched hyperparameter is sampled, as a plot axis: log, linear or categorical."""
    return {name: param.scale for name, param in space.search.items()}


REPLICATE_RULE_KEY = "replicate_rule"  # summary.report's record of --replicates auto


def replicate_rule_record(prepared: Prepared, replicates: list[TrialRecord]) -> dict[str, Any]:
    """What summary.json keeps of --replicates auto: the rule, the baseline, the replicates run and whether the
    comparison was decided; nothing for a fixed count."""
    rule = prepared.replicate_rule
    if rule is None:
        return {}
    key = ranking_key(prepared.report["columns"])
    decided = rule.decided(outcome.replicate_values(replicates, key), prepared.baseline_values)
    return {REPLICATE_RULE_KEY: {"rule": rule.words(), "baseline": prepared.options.baseline, "column": key,
                                 "replicates": len(replicates), "cap": rule.cap, "decided": decided,
                                 "baseline_replicates": len(prepared.baseline_values),
                                 "baseline_grown": prepared.baseline_options is not None,
                                 "baseline_not_grown": prepared.baseline_growth_note or None}}


def _summary(prepared: Prepared, trials: list[TrialRecord], selected: TrialRecord | None,
             replicates: list[TrialRecord], seeds: list[int], seconds: float,
             state: SweepState = SweepState.FINISHED) -> SweepSummary:
    """The sweep's summary.json as it stands: finished, or partial with the stage a signal interrupted."""
    strategy = prepared.options.selection
    return SweepSummary(
        name=prepared.name, state=state, selection_blind=outcome.blindness(trials), dataset=prepared.options.dataset,
        algorithm=prepared.algorithm, space=str(prepared.options.space), space_scales=space_scales(prepared.space),
        raybench_version=raybench.__version__,
        selection=Selection(strategy, prepared.selection_metric, prepared.selection_label,
                            SELECTIONS.get(strategy).analysis_only),
        metric_names=prepared.metric_names, report={**prepared.report, **replicate_rule_record(prepared, replicates),
                                                    **extension_record(prepared.extents, trials),
                                                    **budget_record(prepared.spend_limit, prepared.options.trials,
                                                                    prepared.budget_cut,
                                                                    sweep_runs(prepared.storage, prepared.name))},
        trials=trials, selected=selected,
        replicates=Replicates(seeds, sum(r.status == TrialStatus.OK for r in replicates), replicates,
                              outcome.summarize(replicates)),
        wall_seconds=round(seconds, 1),
        compute={"search": outcome.compute_totals(trials), "replicates": outcome.compute_totals(replicates)},
        epochs_scale=None if prepared.options.epochs_scale == 1 else prepared.options.epochs_scale,
        attempts=list(prepared.attempts) or None)


