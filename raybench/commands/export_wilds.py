"""`raybench export wilds SWEEP... --out DIR`: finished sweeps as WILDS leaderboard submission files.

For each sweep (one per dataset), every finished replicate's selected checkpoint (its best-validation epoch's
`best_model.pt`) is rebuilt from the file alone (raybench.rebuild) and run over the whole of each of the
leaderboard's evaluation splits by the trainer's own prediction loop (the same batching and plain view every
epoch was scored with), one row per example in the split's order, which is the wilds subset's
(`get_subset(split).indices`, checked). The rows are written in the leaderboard's names and encodings
(raybench.report.wilds_files, which cites the authors' code) under `DIR/<dataset>/`, the folder the authors'
`examples/evaluate.py` reads for that dataset; each file is then read back as evaluate.py reads it, scored by the
dataset's own `eval()`, and aggregated as evaluate.py aggregates it into `DIR/<dataset>_results.json`.

Why the files are named by replicate index: evaluate.py reads `seed:0` .. `seed:N-1` (N = 10 for camelyon17,
5 for civilcomments, 3 otherwise), while a raybench replicate's seed is derived from the selected trial
(raybench.sweep.outcome.replicate_seeds); the K-th finished replicate, in the sweep's order, is `seed:K`, and the
command prints which seed that was. Poverty's replicates are folds instead (`fold:A` .. `fold:E`, each its own
country split); raybench reads poverty as the wilds package builds it by default, fold A
(raybench.data.wilds.adapter.load_wilds passes no fold; wilds/datasets/poverty_dataset.py:153), so a poverty
sweep's one replicate is `fold:A`, and a sweep of several (all fold A) is refused: their files would share a name.

Where the checkpoints are: a sweep's replicates are one Tune experiment under its storage,
`<storage>/<name>-replicate-<selected trial id>` (raybench.sweep.runner, `spec("replicate", ..., f"-{trial_id}")`);
each run's completed record, `completed/<trial id>-seed<seed>.json` there, names the folder its last checkpoint
was persisted in (`checkpoint_path`), whose `best_model.pt` holds the weights of its best epoch so far, so of its
selected epoch once it finished. A record written before function trials kept that path is found by the Tune
trial folder whose `params.json` has the replicate's seed (its last `checkpoint_*`). Every file found is checked
against the replicate by its ModelRecord (dataset, seed, epoch) when it is read, with weights_only=True.

Every check that needs no model or data comes first (the sweep's summary, its dataset, its state, its replicates,
their splits, their checkpoint files, the output folder): a refusal is one line and exit status 2 before
anything heavy is loaded. Files are written into a hidden folder inside DIR and moved into place per dataset
when all of them are whole, so an export that fails leaves DIR as it was.
"""
from __future__ import annotations

import json
import shutil
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from raybench.exits import UsageError
from raybench.paths import staging_inside
from raybench.records import RecordError, SweepSummary, TrialRecord, TrialStatus
from raybench.report.wilds_files import (
    BOARDS,
    EVALUATE_SCRIPT,
    Board,
    aggregate,
    fold_name,
    results_name,
    results_text,
    same_number,
    seed_name,
)

POVERTY_FOLD = "A"  # the fold raybench's poverty is read with: wilds' default (poverty_dataset.py:153)
REPLICATE_STAGE = "replicate"  # the stage name in the replicate experiment's folder (raybench.sweep.runner)
COMPLETED = "completed"  # the stage's completed-run records (raybench.sweep.ray_trial.CompletedRuns)
CHECKPOINT_PATH = "checkpoint_path"  # where a completed record names its last checkpoint (raybench.sweep.ray_worker)
BEST_MODEL = "best_model.pt"  # raybench.checkpoints.BEST_MODEL_FILE (not imported: it imports torch)
STAGING_PREFIX = ".raybench-export-"


@dataclass(frozen=True)
class ExportRequest:
    """What `raybench export wilds` was asked: the sweeps by name under `storage`, the output folder, the device
    the models predict on (auto: a GPU when there is one, as the trainer chooses), and whether files already in
    `out` for a sweep's dataset are replaced."""

    sweeps: tuple[str, ...]
    out: Path
    storage: Path = Path("runs")
    device: str = "auto"
    force: bool = False


@dataclass(frozen=True)
class Replicate:
    """One finished replicate to export: its leaderboard name (`seed:K`, `fold:A`), raybench's seed for it, the
    epoch it was selected at and its checkpoint file."""

    name: str
    seed: int
    best_epoch: int
    checkpoint: Path


@dataclass(frozen=True)
class SweepPlan:
    """A sweep that passed every cheap check: its summary, its dataset's leaderboard files and its replicates;
    `left_out` says which replicates did not finish (the sweep's own summary leaves them out too)."""

    summary: SweepSummary
    board: Board
    replicates: tuple[Replicate, ...]
    left_out: tuple[str, ...] = ()


@dataclass
class DatasetExport:
    """What one sweep's export wrote: the dataset's folder of prediction files, its results file, how many rows
    each split has, the aggregated results, and the notes to show (fewer replicates than evaluate.py reads, a
    metric the files give otherwise than the sweep logged it)."""

    plan: SweepPlan
    folder: Path
    results_file: Path
    files: list[Path] = field(default_factory=list)
    rows: dict[str, int] = field(default_factory=dict)
    results: dict[str, dict[str, float]] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)


# ----- the cheap checks ----------------------------------------------------------------------------------------
def plan_export(request: ExportRequest) -> list[SweepPlan]:
    """Every sweep checked from its files alone, or a UsageError naming what is missing."""
    plans = [plan_sweep(request.storage, name) for name in request.sweeps]
    check_one_sweep_per_dataset(plans)
    check_out_folder(request, plans)
    return plans


def plan_sweep(storage: Path, name: str) -> SweepPlan:
    """One sweep's summary, dataset, replicates, splits and checkpoint files, in that order of checking."""
    summary = read_finished_summary(storage, name)
    board = leaderboard_of(summary)
    runs = [run for run in summary.replicates.runs if run.status == TrialStatus.OK]
    if not runs or summary.selected is None:
        raise UsageError(f"export wilds: sweep {name!r} has no finished replicates: the leaderboard takes the "
                         f"predictions of seed replicates of the selected config (`raybench sweep ... --replicates N`)")
    check_splits(summary, board)
    names = replicate_names(summary, board, runs)
    stage = replicate_folder(storage, summary)
    replicates = tuple(Replicate(label, run.seed, int(run.best_epoch or 0), find_checkpoint(stage, summary, run))
                       for label, run in zip(names, runs))
    left_out = tuple(f"seed {run.seed} ({run.status.value}{': ' + run.failure_reason if run.failure_reason else ''})"
                     for run in summary.replicates.runs if run.status != TrialStatus.OK)
    return SweepPlan(summary, board, replicates, left_out)


def read_finished_summary(storage: Path, name: str) -> SweepSummary:
    """The sweep's results/summary.json under `storage`, finished; a UsageError for one that is absent, damaged
    or not finished."""
    from raybench.commands.benchmark import DamagedSummary, summary_named

    try:
        summary = summary_named(storage, name)
    except (DamagedSummary, RecordError) as err:
        raise UsageError(f"export wilds: sweep {name!r}: {err}") from None
    if summary is None:
        raise UsageError(f"export wilds: sweep {name!r}: no results at {storage / name / 'results' / 'summary.json'} "
                         f"(a sweep's name as `raybench sweep` named it, under --storage {storage})")
    if not summary.finished:
        raise UsageError(f"export wilds: sweep {name!r} is {summary.state.value}, not finished: "
                         f"`raybench sweep ... --resume` finishes it")
    return summary


def leaderboard_of(summary: SweepSummary) -> Board:
    board = BOARDS.get(summary.dataset)
    if board is None:
        raise UsageError(f"export wilds: sweep {summary.name!r} is on {summary.dataset}, which is no WILDS "
                         f"leaderboard dataset (an embedded or plug-in dataset); the leaderboard takes "
                         f"{', '.join(sorted(BOARDS))}")
    return board


def check_splits(summary: SweepSummary, board: Board) -> None:
    """Every split and metric the leaderboard scores must be among what the sweep's replicates reported: a
    dataset read without one of its splits (an empty one is left out) cannot fill the leaderboard's files."""
    reported = summary.replicates.summary
    for split in board.splits:
        missing = [f"best/{split}/{metric}" for metric in board.metrics if f"best/{split}/{metric}" not in reported]
        if missing:
            raise UsageError(f"export wilds: sweep {summary.name!r} on {board.dataset}: its replicates report no "
                             f"{split} split ({', '.join(missing)} missing); the leaderboard's {board.dataset} "
                             f"splits are {', '.join(board.splits)}")


def replicate_names(summary: SweepSummary, board: Board, runs: Sequence[TrialRecord]) -> list[str]:
    """The leaderboard's name of each replicate: `seed:K` for the K-th, or for poverty its fold."""
    if not board.by_fold:
        return [seed_name(index) for index in range(len(runs))]
    if len(runs) > 1:
        raise UsageError(f"export wilds: sweep {summary.name!r} on poverty: the leaderboard's replicates are the "
                         f"folds {', '.join(board.replicates)}, each its own country split, but raybench reads "
                         f"poverty at wilds' default fold {POVERTY_FOLD} only, so its {len(runs)} seed replicates "
                         f"would all be {fold_name(POVERTY_FOLD)}; a sweep with --replicates 1 exports that fold")
    return [fold_name(POVERTY_FOLD)]


def replicate_folder(storage: Path, summary: SweepSummary) -> Path:
    assert summary.selected is not None
    return storage / f"{summary.name}-{REPLICATE_STAGE}-{summary.selected.trial_id}"


def find_checkpoint(stage: Path, summary: SweepSummary, run: TrialRecord) -> Path:
    """The replicate's `best_model.pt`: where its completed record says its last checkpoint is (moved along with
    the storage folder if that moved), else the last checkpoint of the Tune trial folder with its seed."""
    if not stage.is_dir():
        raise UsageError(f"export wilds: sweep {summary.name!r}: its replicates' folder {str(stage)!r} is not there "
                         f"(the sweep's --storage keeps each replicate's checkpoints; was it moved or cleaned?)")
    for folder in (*recorded_checkpoints(stage, run), *trial_checkpoints(stage, run.seed)):
        if (folder / BEST_MODEL).is_file():
            return folder / BEST_MODEL
    raise UsageError(f"export wilds: sweep {summary.name!r}: replicate seed {run.seed} kept no {BEST_MODEL} under "
                     f"{str(stage)!r} (neither its completed record's checkpoint nor a Tune trial folder with its seed)")


def recorded_checkpoints(stage: Path, run: TrialRecord) -> list[Path]:
    """The checkpoint folder the run's completed record names, and the same path under `stage` when the storage
    folder was moved since."""
    path = stage / COMPLETED / f"{run.trial_id}-seed{run.seed}.json"
    try:
        recorded = json.loads(path.read_text()).get(CHECKPOINT_PATH)
    except (OSError, ValueError, AttributeError):
        return []
    if not isinstance(recorded, str) or not recorded:
        return []
    folder = Path(recorded)
    parts = folder.parts
    moved = [stage.joinpath(*parts[parts.index(stage.name) + 1:])] if stage.name in parts else []
    return [folder, *moved]


def trial_checkpoints(stage: Path, seed: int) -> list[Path]:
    """The checkpoint folders of the Tune function trials in `stage` whose config has `seed`, latest first."""
    found = []
    for params in sorted(stage.glob("*/params.json")):
        try:
            config = json.loads(params.read_text())
        except (OSError, ValueError):
            continue
        if isinstance(config, dict) and config.get("seed") == seed:
            found += sorted(params.parent.glob("checkpoint_*"), reverse=True)
    return found


def check_one_sweep_per_dataset(plans: Sequence[SweepPlan]) -> None:
    seen: dict[str, str] = {}
    for plan in plans:
        dataset, name = plan.summary.dataset, plan.summary.name
        if dataset in seen:
            raise UsageError(f"export wilds: sweeps {seen[dataset]!r} and {name!r} are both on {dataset}: the "
                             f"leaderboard takes one set of {dataset} files; export them into different --out folders")
        seen[dataset] = name


def check_out_folder(request: ExportRequest, plans: Sequence[SweepPlan]) -> None:
    """`--out` must be a folder raybench can write, and hold no earlier export of these datasets unless --force:
    evaluate.py picks files by name, so a stale file beside new ones would be read as one of them."""
    from raybench.file_kinds import not_a_file
    from raybench.paths import writable_dir_problem

    problem = writable_dir_problem(request.out)
    if problem:
        raise UsageError(f"--out: {problem}")
    for plan in plans:
        folder, results = dataset_paths(request.out, plan.board)
        kind = not_a_file(results)
        if kind is not None:
            raise UsageError(f"--out: {str(results)!r} is {kind}; expected a results file raybench may write, or none")
        if folder.exists() and not folder.is_dir():
            raise UsageError(f"--out: {str(folder)!r} is a file; expected the {plan.board.dataset} folder, or none")
        taken = (folder.is_dir() and any(folder.iterdir())) or results.exists()
        if taken and not request.force:
            raise UsageError(f"--out: {str(folder)!r} or {results.name} already holds an export of "
                             f"{plan.board.dataset}; --force replaces them")


def dataset_paths(out: Path, board: Board) -> tuple[Path, Path]:
    """`DIR/<dataset>/`, the folder evaluate.py reads for the dataset (evaluate.py:41), and `DIR/<dataset>_results.json`."""
    return out / board.dataset, out / results_name(board.dataset)


# ----- the export ------------------------------------------------------------------------------------------------
def export_sweeps(request: ExportRequest, say: Callable[[str], None] = lambda line: None) -> list[DatasetExport]:
    """Plan every sweep (refusing before anything heavy), then export each; `say` hears what is being done."""
    plans = plan_export(request)
    device = export_device(request.device)
    with staging_inside(request.out, STAGING_PREFIX) as staging:
        return [export_sweep(plan, request.out, staging, device, say) for plan in plans]


def export_device(name: str) -> Any:
    """The torch device the models predict on; a GPU named that this machine lacks is one line."""
    from raybench.trainer import ConfigError, TrainConfig
    from raybench.trainer.loop import choose_device

    try:
        TrainConfig.from_flat({"device": name}).check_device_available()
    except ConfigError as err:
        raise UsageError(f"--device: {err.detail}") from None
    return choose_device(name)


def export_sweep(plan: SweepPlan, out: Path, staging: Path, device: Any, say: Callable[[str], None]) -> DatasetExport:
    """One sweep's files, written under `staging` and moved into `out` once all are whole."""
    from raybench.paths import storage_writes

    board = plan.board
    folder, results_file = dataset_paths(out, board)
    staged = staging / board.dataset
    staged.mkdir()
    done = DatasetExport(plan, folder, results_file)
    per_replicate = []
    with storage_writes(out, f"the {board.dataset} leaderboard files"):
        datasets = DatasetCache()
        for replicate in plan.replicates:
            say(f"{board.dataset}: replicate {replicate.name} (seed {replicate.seed}, epoch {replicate.best_epoch + 1}) "
                f"from {replicate.checkpoint}")
            per_replicate.append(export_replicate(plan, replicate, datasets, staged, device, done))
        done.results = aggregate(board, per_replicate)
        (staging / results_file.name).write_text(results_text(done.results))
        done.notes += replicate_count_notes(plan) + summary_notes(plan, done.results)
        move_into_place(staged, staging / results_file.name, folder, results_file)
    done.files = [folder / path.name for path in done.files]
    return done


def export_replicate(plan: SweepPlan, replicate: Replicate, datasets: DatasetCache, staged: Path, device: Any,
                     done: DatasetExport) -> dict[str, Any]:
    """One replicate's prediction file per split, each read back and scored as evaluate.py does; its scores."""
    from raybench.report.wilds_files import (
        UnwritablePredictions,
        evaluate_replicate,
        leaderboard_predictions,
        read_predictions,
        write_predictions,
    )

    board = plan.board
    model, record = rebuilt_replicate(plan, replicate)
    dataset = datasets.of(record, board)
    model.to(device)
    scores: dict[str, Any] = {}
    for split in board.splits:
        outputs = predict_rows(model, record, dataset, split, device)
        try:
            y_pred = leaderboard_predictions(board, outputs)
        except UnwritablePredictions as err:
            raise UsageError(f"export wilds: {board.dataset} replicate {replicate.name} (seed {replicate.seed}) on "
                             f"{split}: {err}") from None
        path = staged / board.file_name(split, replicate.name)
        write_predictions(path, y_pred)
        done.files.append(path)
        done.rows[split] = len(y_pred)
        scores[split] = evaluate_replicate(board, dataset.wilds_dataset, split, read_predictions(path))
    return scores


def rebuilt_replicate(plan: SweepPlan, replicate: Replicate) -> tuple[Any, Any]:
    """The replicate's model from its checkpoint (weights_only=True), checked to be that replicate's selected
    epoch on the sweep's dataset."""
    from raybench.models.base import UnreadableWeightsError
    from raybench.rebuild import rebuild_model

    try:
        model, record = rebuild_model(replicate.checkpoint)
    except UnreadableWeightsError as err:  # ModelRecordError too: a damaged record, a plug-in not loaded
        raise UsageError(f"export wilds: sweep {plan.summary.name!r} replicate seed {replicate.seed}: {err}") from None
    recorded_seed = record.settings.get("seed")
    problem = (f"is on {record.dataset}, not {plan.summary.dataset}" if record.dataset != plan.summary.dataset
               else f"was trained with seed {recorded_seed}, not {replicate.seed}" if recorded_seed != replicate.seed
               else f"holds epoch {record.epoch + 1}, not its selected epoch {replicate.best_epoch + 1}"
               if record.epoch != replicate.best_epoch else None)
    if problem:
        raise UsageError(f"export wilds: sweep {plan.summary.name!r} replicate seed {replicate.seed}: its checkpoint "
                         f"{str(replicate.checkpoint)!r} {problem}")
    return model, record


class DatasetCache:
    """The dataset each record's run read (its name, data seed and input size), loaded once per sweep and checked
    to hold the leaderboard's splits in the wilds subsets' order."""

    def __init__(self) -> None:
        self.loaded: dict[tuple[Any, ...], Any] = {}

    def of(self, record: Any, board: Board) -> Any:
        from raybench.rebuild import record_config, record_dataset

        key = (record.dataset, record.data_seed, record_config(record).input_size)
        if key not in self.loaded:
            try:
                dataset = record_dataset(record)
            except FileNotFoundError as err:  # the WILDS files are not where the run read them
                raise UsageError(f"export wilds: {record.dataset}: {err} (set $RAYBENCH_WILDS_ROOT to the WILDS "
                                 f"root; `raybench data check {record.dataset}` says what is missing)") from None
            check_dataset_splits(dataset, board)
            self.loaded[key] = dataset
        return self.loaded[key]


def check_dataset_splits(dataset: Any, board: Board) -> None:
    """The loaded dataset's wilds object has exactly the leaderboard's evaluation splits, and raybench's split of
    each holds the wilds subset's rows in its order: the rows a prediction file lists, one by one."""
    import numpy as np

    wilds_dataset = getattr(dataset, "wilds_dataset", None)
    if wilds_dataset is None:
        raise UsageError(f"export wilds: dataset {dataset.name!r} is not read through the wilds package here")
    splits = tuple(split for split in wilds_dataset.split_dict if split != "train")
    if splits != board.splits:
        raise UsageError(f"export wilds: {board.dataset}: the wilds dataset's evaluation splits are "
                         f"{', '.join(splits)}; the leaderboard's ({EVALUATE_SCRIPT}) are {', '.join(board.splits)}")
    for split in board.splits:
        rows = getattr(dataset.split(split).x, "indices", None) if split in dataset.splits else None
        if rows is None or not np.array_equal(np.asarray(rows), wilds_dataset.get_subset(split).indices):
            raise UsageError(f"export wilds: {board.dataset}: raybench's {split} split does not hold the wilds "
                             f"subset's rows in its order, so its predictions could not be the leaderboard's rows")


def predict_rows(model: Any, record: Any, dataset: Any, split: str, device: Any) -> Any:
    """The model's outputs on every row of `split`, in order, as the trainer scores a split (its prediction loop,
    the plain view, the run's eval batch size)."""
    from raybench.rebuild import record_config
    from raybench.trainer.loop import predict_split, prefetch_depth

    config = record_config(record)
    rows = dataset.split(split)
    return predict_split(model, rows, dataset.views.plain, device, config.eval_batch_size,
                         prefetch_depth(config.prefetch, rows))


def move_into_place(staged: Path, staged_results: Path, folder: Path, results_file: Path) -> None:
    """The dataset's finished folder and results file in place of what `--out` held for it (--force)."""
    if folder.is_dir():
        shutil.rmtree(folder)
    staged.rename(folder)
    staged_results.replace(results_file)


# ----- what the export says ---------------------------------------------------------------------------------------
def replicate_count_notes(plan: SweepPlan) -> list[str]:
    """When the sweep has fewer (or more) replicates than evaluate.py reads, or some did not finish."""
    board, count = plan.board, len(plan.replicates)
    notes = [f"{board.dataset}: left out replicate {what}, as the sweep's summary leaves it out"
             for what in plan.left_out]
    if count < len(board.replicates):
        notes.append(f"{board.dataset}: {EVALUATE_SCRIPT} reads {len(board.replicates)} replicates "
                     f"({board.replicates[0]} .. {board.replicates[-1]}), as the leaderboard asks; this sweep "
                     f"has {count}, so it stops at {board.replicates[count]}")
    elif count > len(board.replicates):
        notes.append(f"{board.dataset}: {EVALUATE_SCRIPT} reads the first {len(board.replicates)} of these "
                     f"{count} replicates; {board.dataset}_results.json here averages all {count}")
    return notes


def summary_notes(plan: SweepPlan, results: dict[str, dict[str, float]]) -> list[str]:
    """Where the files' scores differ from what the sweep's replicates logged (a model predicting on another
    device than it trained on, or an algorithm scored on part of a split, as DFR is on val)."""
    notes = []
    logged = plan.summary.replicates.summary
    for split, cells in results.items():
        for metric in plan.board.metrics:
            cell = logged[f"best/{split}/{metric}"]
            for stat, key in (("mean", metric), ("std", f"{metric}_std")):
                if not same_number(cells[key], float(cell[stat]), 1e-6):
                    notes.append(f"{plan.board.dataset} {split} {metric}: {stat} {cells[key]:.6g} from the files, "
                                 f"{float(cell[stat]):.6g} as the sweep's replicates logged it")
    return notes


def report_lines(exports: Sequence[DatasetExport]) -> list[str]:
    """One block per dataset: where its files are, how many rows each split has, and which seed each name is."""
    lines = []
    for done in exports:
        board, plan = done.plan.board, done.plan
        rows = ", ".join(f"{split} {done.rows[split]}" for split in board.splits)
        lines.append(f"{board.dataset} (sweep {plan.summary.name}): {len(done.files)} prediction files in "
                     f"{done.folder} ({len(plan.replicates)} replicates x {len(board.splits)} splits; rows: {rows}), "
                     f"results in {done.results_file}")
        lines += [f"  {replicate.name}: raybench seed {replicate.seed}, epoch {replicate.best_epoch + 1}"
                  for replicate in plan.replicates]
    return lines
