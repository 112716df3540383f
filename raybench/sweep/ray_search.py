"""A stage's Tune experiment: what creates its trials (Optuna's search, `DistinctOptunaSearch`; the grid of
replicate seeds; a benchmark's trial queue, `QueuedSearch`), what stops them early (`CooperativeASHA`), and the
experiment fitted or resumed (`run_search`, `run_replicates`, `_fit_or_resume`) into a `StageResult`. Part of the
Ray backend (ray_backend.py says which module does what).

`RunSpec` is one stage as the sweep runs it; `make_trainable` binds ray_trial's trainables to it. Tune pickles
what this module hands it (the searcher, the scheduler) into its experiment state by module and name: ray_backend
still exposes each under its old name, so an experiment saved before the backend was split resumes.
"""
from __future__ import annotations

import contextlib
import dataclasses
import functools
import os
import signal
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

import optuna
from ray import tune
from ray.tune.schedulers import AsyncHyperBandScheduler, TrialScheduler
from ray.tune.search import BasicVariantGenerator, ConcurrencyLimiter, SearchAlgorithm, Searcher, SearchGenerator
from ray.tune.search.optuna import OptunaSearch

from raybench.records import TrialRecord
from raybench.report_keys import SELECTION_BEST
from raybench.sweep import state_seal
from raybench.sweep.atomic_storage import atomic_local_filesystem
from raybench.sweep.extension import REPLAYED_SAMPLERS
from raybench.sweep.ray_callbacks import FULL_STORAGE, StorageWatch
from raybench.sweep.ray_cluster import DRIVER_RESOURCE
from raybench.sweep.ray_trial import (
    TIMING_REPORT,
    CompletedRuns,
    EarlyStopping,
    Resources,
    StopRequests,
    TrainPath,
    TrialSpec,
    function_trial,
    train_driver,
)
from raybench.sweep.ray_worker import EPOCHS_DONE, FAILURE_KEY
from raybench.sweep.sampling import SAMPLERS, config_key, first_unseen, optuna_distribution
from raybench.sweep.space import ResolvedSpace
from raybench.sweep.spending import SpendGate
from raybench.sweep.trial_slots import TrialSlots


@dataclass(frozen=True)
class RunSpec:
    """One Tune experiment: where it lives, how many trials, how they run and whom to tell."""

    name: str
    storage: Path
    stage: str
    executor: str
    resources: Resources
    max_concurrent: int
    callbacks: tuple[Any, ...] = ()
    train_path: TrainPath = dataclasses.field(default_factory=lambda: DEFAULT_TRAIN_PATH)
    early_stopping: EarlyStopping | None = None  # None: every trial runs all of its epochs (FIFO)
    trial_slots: Path | None = None  # a benchmark's trial queue on a cluster at --address (QueuedSearch)
    plugins: tuple[str, ...] = ()  # module names every trial imports before it builds anything

    @property
    def stop_requests(self) -> StopRequests:
        return StopRequests(self.storage / self.name / "stop_requests")

    @cached_property
    def completed(self) -> CompletedRuns:
        """The stage's completed-run records, the one store its trials write and its callbacks and `collect`
        read (a frozen dataclass without slots keeps a cached_property's value in its __dict__)."""
        return CompletedRuns(self.storage / self.name / "completed")

    def with_callbacks(self, *callbacks: Any) -> RunSpec:
        """The same stage told to `callbacks`, which read its records and so are made after it: its completed-run
        store is the one they were given, not a copy."""
        spec = dataclasses.replace(self, callbacks=callbacks)
        spec.__dict__["completed"] = self.completed
        return spec


DEFAULT_TRAIN_PATH = TrainPath()


# ----- early stopping: Tune's ASHA decides, the trial itself stops (StopRequests) -----------------------------
class CooperativeASHA(AsyncHyperBandScheduler):
    """Tune's ASHA, counting rungs in epochs on the best selection value so far, whose STOP becomes a stop
    request (StopRequests) the trial honours after its epoch rather than a kill."""

    def __init__(self, rule: EarlyStopping, requests: StopRequests) -> None:
        super().__init__(time_attr=EPOCHS_DONE, metric=SELECTION_BEST, mode="max", max_t=rule.max_epochs,
                         grace_period=rule.grace_period, reduction_factor=rule.reduction_factor, stop_last_trials=False)
        self.rule, self.requests = rule, requests

    def on_trial_result(self, tune_controller: Any, trial: Any, result: dict) -> str:
        if result.get(TIMING_REPORT) or result.get("replayed") or FAILURE_KEY in result:
            return TrialScheduler.CONTINUE  # not an epoch: the run's closing report, a record, a failure
        decision = super().on_trial_result(tune_controller, trial, result)
        if decision == TrialScheduler.STOP and int(result[EPOCHS_DONE]) < self.rule.max_epochs:
            self.requests.ask(trial.trial_id)
        return TrialScheduler.CONTINUE


# ----- the trials: what ray_trial.py runs, built here ----------------------------------------------------------
def trial_spec(space: ResolvedSpace, spec: RunSpec) -> TrialSpec:
    """What each trial of the stage is told: values and ray_trial's types only, so that Tune's pickle of the
    trainable names nothing of this module (a trial process would import it, Optuna and all, to unpickle it)."""
    return TrialSpec(space, spec.stage, spec.completed, spec.stop_requests, spec.storage / spec.name / "train",
                     spec.resources, spec.train_path, spec.early_stopping, spec.plugins)


def make_trainable(space: ResolvedSpace, spec: RunSpec) -> Any:
    """The Tune trainable for `spec.executor`, with its resource request: ray_trial's trainable bound to the
    stage's TrialSpec. Tune names the trainable (its trial folders, and what `Tuner.restore` checks) by the
    function's name, `train_driver` or `function_trial`, as when they were closures here."""
    resources = spec.resources
    trial = trial_spec(space, spec)
    if spec.executor == "train":
        return tune.with_resources(functools.partial(train_driver, trial),
                                   {"cpu": 0, DRIVER_RESOURCE: 1, **dict(resources.per_trial)})
    if resources.workers != 1:
        raise ValueError("--executor function runs single-worker trials; use --executor train for several workers")
    return tune.with_resources(functools.partial(function_trial, trial),
                               {"cpu": resources.cpus_per_worker, "gpu": resources.gpus_per_worker,
                                **dict(resources.custom), **dict(resources.per_trial)})



# ----- search spaces -> Optuna ----------------------------------------------------------------------------
class DistinctOptunaSearch(OptunaSearch):
    """Tune's OptunaSearch that does not hand out the same config twice.

    On a discrete space (SpuCo's lr x weight-decay grid) a random sampler repeats itself, and a repeat
    is a trial spent learning nothing new. A repeated draw is told to Optuna as pruned and drawn again,
    up to MAX_REDRAWS times; only when the space seems exhausted does the repeat run (a finished one is
    then replayed from its record, not retrained). The set of configs handed out is part of the
    searcher's saved state (OptunaSearch pickles its __dict__), so a resumed sweep keeps it.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._handed_out: set[str] = set()

    def suggest(self, trial_id: str) -> dict | str | None:
        """The next config, or FINISHED once the running fit's --budget cannot fit another trial (SpendGate)."""
        def reject() -> None:
            self._ot_study.tell(self._ot_trials.pop(trial_id), state=optuna.trial.TrialState.PRUNED)

        gate = _SPEND_GATE[-1] if _SPEND_GATE else None
        if gate is not None and not gate.may_draw(len(self._handed_out)):
            return Searcher.FINISHED
        config = first_unseen(lambda: super(DistinctOptunaSearch, self).suggest(trial_id), reject, self._handed_out)
        if gate is not None and config is not None:
            gate.started(trial_id)
        return config

    def on_trial_complete(self, trial_id: str, result: dict | None = None, error: bool = False) -> None:
        super().on_trial_complete(trial_id, result=result, error=error)
        if _SPEND_GATE:
            _SPEND_GATE[-1].ended(trial_id)

    def handed_out(self, config: dict[str, Any]) -> None:
        """Count `config` as handed out already (a trial run by an earlier experiment of the same search)."""
        self._handed_out.add(config_key(config))


_SPEND_GATE: list[SpendGate] = []  # the running fit's --budget (one fit at a time in a process), for the searcher


@contextlib.contextmanager
def spending_watched(gate: SpendGate | None) -> Iterator[None]:
    """`gate` judges every config the fit's searcher hands out, also the searcher Tune restores from its state."""
    if gate is not None:
        _SPEND_GATE.append(gate)
    try:
        yield
    finally:
        if gate is not None:
            _SPEND_GATE.remove(gate)


# ----- experiments -------------------------------------------------------------------------------------------
def _run_config(spec: RunSpec) -> tune.RunConfig:
    return tune.RunConfig(
        name=spec.name, storage_path=str(spec.storage), callbacks=[*spec.callbacks, StorageWatch(spec.storage)],
        storage_filesystem=atomic_local_filesystem(),  # Tune's state and checkpoints whole or not at all
        failure_config=tune.FailureConfig(max_failures=spec.resources.max_failures if spec.executor == "function" else 0),
        verbose=0,
    )


def _reuse_actors(spec: RunSpec) -> bool:
    return spec.executor == "function" or spec.train_path.reuse_driver


def _scheduler(spec: RunSpec) -> TrialScheduler | None:
    """ASHA when the search stops trials early; None is Tune's FIFO (every trial runs to its end)."""
    return CooperativeASHA(spec.early_stopping, spec.stop_requests) if spec.early_stopping else None


@dataclass(frozen=True)
class StageResult:
    """A stage's Tune experiment as it ended: Tune's results, and whether a stop signal ended it."""

    grid: tune.ResultGrid
    signalled: bool  # Tune caught a stop signal during fit (SIGINT, or a SIGTERM raybench.exits.Signals made one)


def _fit_or_resume(spec: RunSpec, trainable: Any, make_tuner: Callable[[], tune.Tuner], resume: bool) -> StageResult:
    """Fit a new or restored experiment. Tune turns a Ctrl-C into a normal return and leaves its own SIGINT
    handler installed when no signal came: whose handler is installed after fit tells whether one came, and the
    caller's is put back either way, so a Ctrl-C between stages is not swallowed."""
    path = str(spec.storage / spec.name)
    slots = TrialSlots.of_this_process(spec.trial_slots) if spec.trial_slots is not None else None
    try:
        if resume:
            state_seal.require_sealed(Path(path))  # checked by the driver already; again just before Tune reads it
        if resume and tune.Tuner.can_restore(path, storage_filesystem=atomic_local_filesystem()):
            if slots is not None:
                slots.take_for_restored(restored_trial_ids(path))
            tuner = tune.Tuner.restore(path, trainable=trainable, resume_unfinished=True, resume_errored=False,
                                       storage_filesystem=atomic_local_filesystem(), restart_errored=False)
        else:
            tuner = make_tuner()
        with sigint_watched_for_the_fit() as handler:
            try:
                grid = tuner.fit()
                signalled = tune_caught_a_signal(handler)
            except Exception as err:
                full = FULL_STORAGE.pop(str(spec.storage), None)
                if full is not None:  # Tune tripped over what the full folder did to it
                    raise full from err
                raise
    finally:
        if slots is not None:
            slots.give_back_all()
    full = FULL_STORAGE.pop(str(spec.storage), None)
    if full is not None:  # StorageWatch stopped the experiment: its unfinished trials resume from their checkpoints
        raise full
    return StageResult(grid, signalled)


def restored_trial_ids(path: str) -> list[str]:
    """The trials a resume starts again without asking the search for them: every one neither finished nor
    errored (restored with resume_unfinished=True, resume_errored=False: tune_controller._requeue_restored_trials)."""
    trials = tune.ExperimentAnalysis(path, storage_filesystem=atomic_local_filesystem()).trials
    return [trial.trial_id for trial in trials if trial.status not in ("TERMINATED", "ERROR")]


_SIGINT_HANDLER_BEFORE_FIT: list[Any] = []  # this process's running fit's (one at a time), for QueuedSearch


@contextlib.contextmanager
def sigint_watched_for_the_fit() -> Iterator[Any]:
    """The SIGINT handler in place before a fit, put back after it. While the fit runs, QueuedSearch reads it to
    tell whether Tune's handler has caught a stop signal, whenever that came: before the search's first request
    for a trial as well as during its wait for a slot."""
    handler = signal.getsignal(signal.SIGINT)
    _SIGINT_HANDLER_BEFORE_FIT.append(handler)
    try:
        yield handler
    finally:
        _SIGINT_HANDLER_BEFORE_FIT.remove(handler)
        signal.signal(signal.SIGINT, handler)


def tune_caught_a_signal(handler_before_fit: Any) -> bool:
    """Whether Tune's fit was ended by a stop signal. Tune installs its own SIGINT handler for the fit and
    puts back the one it found only when that handler runs (ray/tune/tune.py, `_setup_signal_catching`); with
    TUNE_DISABLE_SIGINT_HANDLER it installs none, and a Ctrl-C is a KeyboardInterrupt instead of a return.

    Trials alone cannot tell: a trial whose actor Tune had just started when the signal came is ended by
    Tune's clean-up as terminated or errored, without a report or a completed record."""
    if int(os.getenv("TUNE_DISABLE_SIGINT_HANDLER", "0")):
        return False
    return signal.getsignal(signal.SIGINT) is handler_before_fit


def run_search(space: ResolvedSpace, spec: RunSpec, trials: int, sampler: str, seed: int, resume: bool,
               gate: SpendGate | None = None) -> StageResult:
    """Random (or TPE) search with Optuna through Tune's OptunaSearch; trials select on `selection/best`.
    A space whose every searched setting was fixed (`--set`) has one config: it runs once, unsearched."""
    trainable = make_trainable(space, spec)
    optuna.logging.set_verbosity(optuna.logging.WARNING)  # not "A new study created in memory" on the console
    searcher = DistinctOptunaSearch(
        space={name: optuna_distribution(p) for name, p in space.search.items()},
        metric=SELECTION_BEST, mode="max", sampler=SAMPLERS[sampler](seed),
    ) if space.search else None

    def make_tuner() -> tune.Tuner:
        search, limit = _search_algorithm(searcher, spec)
        return tune.Tuner(
            trainable,
            tune_config=tune.TuneConfig(search_alg=search, num_samples=trials if searcher else 1,
                                        max_concurrent_trials=limit, scheduler=_scheduler(spec),
                                        reuse_actors=_reuse_actors(spec)),
            run_config=_run_config(spec),
        )

    with spending_watched(gate):
        return _fit_or_resume(spec, trainable, make_tuner, resume)


def run_extension(space: ResolvedSpace, spec: RunSpec, earlier: list[TrialRecord], count: int, sampler: str,
                  seed: int, resume: bool, gate: SpendGate | None = None) -> StageResult:
    """The next `count` configs of a search whose first trials (`earlier`, in order) already ran, as their own
    Tune experiment (raybench.sweep.extension says why). A resumed extension restores its own searcher."""
    trainable = make_trainable(space, spec)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    searcher = replayed_searcher(space, sampler, seed, earlier)

    def make_tuner() -> tune.Tuner:
        search, limit = _search_algorithm(searcher, spec)
        return tune.Tuner(
            trainable,
            tune_config=tune.TuneConfig(search_alg=search, num_samples=count, max_concurrent_trials=limit,
                                        scheduler=_scheduler(spec), reuse_actors=_reuse_actors(spec)),
            run_config=_run_config(spec),
        )

    with spending_watched(gate):
        return _fit_or_resume(spec, trainable, make_tuner, resume)


def replayed_searcher(space: ResolvedSpace, sampler: str, seed: int,
                      earlier: list[TrialRecord]) -> DistinctOptunaSearch:
    """A fresh searcher standing where the search's own stood after `earlier`. The random sampler is asked for
    the same configs again, draw for draw (repeats redrawn as then), so its next draw is config N+1 of the same
    seeded stream. TPE's draws depend on results and on the order they came in, which no replay can repeat:
    each earlier trial is told to it with its result (Tune's add_evaluated_point), and it draws from there."""
    searcher = DistinctOptunaSearch(
        space={name: optuna_distribution(p) for name, p in space.search.items()},
        metric=SELECTION_BEST, mode="max", sampler=SAMPLERS[sampler](seed))
    for index, trial in enumerate(earlier):
        if sampler in REPLAYED_SAMPLERS:
            replay_id = f"replayed-{index}"
            searcher.suggest(replay_id)
            searcher.on_trial_complete(replay_id, _told_result(trial), error=trial.selection_value is None)
            searcher.handed_out(trial.sampled)  # as run, should a resumed earlier search have drawn otherwise
        else:
            value = trial.selection_value
            searcher.add_evaluated_point(dict(trial.sampled), value if value is not None else 0.0,
                                         error=value is None)
            searcher.handed_out(trial.sampled)
    return searcher


def _told_result(trial: TrialRecord) -> dict[str, Any] | None:
    return {SELECTION_BEST: trial.selection_value} if trial.selection_value is not None else None


def run_replicates(space: ResolvedSpace, spec: RunSpec, sampled: dict[str, Any], seeds: list[int],
                   resume: bool) -> StageResult:
    """The selected sampled config once per seed, each seed its own trial."""
    trainable = make_trainable(space, spec)

    def make_tuner() -> tune.Tuner:
        search, limit = _search_algorithm(None, spec)
        return tune.Tuner(
            trainable,
            param_space={**sampled, "seed": tune.grid_search(seeds)},
            tune_config=tune.TuneConfig(search_alg=search, max_concurrent_trials=limit,
                                        reuse_actors=_reuse_actors(spec)),
            run_config=_run_config(spec),
        )

    return _fit_or_resume(spec, trainable, make_tuner, resume)


def _search_algorithm(searcher: Any, spec: RunSpec) -> tuple[Any, int | None]:
    """What creates a stage's trials, and the `max_concurrent_trials` Tune is given with it. Without a trial queue:
    the searcher (None: Tune's grid and random variants) and the stage's own limit, which Tune applies. In a
    benchmark's queue at --address, Tune would ignore that limit beside a search algorithm that is not a bare
    Searcher, so the same limit is applied inside QueuedSearch's wrapped algorithm and Tune is given none."""
    if spec.trial_slots is None:
        return searcher, spec.max_concurrent
    inner = (SearchGenerator(ConcurrencyLimiter(searcher, max_concurrent=spec.max_concurrent)) if searcher is not None
             else BasicVariantGenerator(max_concurrent=spec.max_concurrent))
    return QueuedSearch(inner, TrialSlots.of_this_process(spec.trial_slots)), None


class QueuedSearch(SearchAlgorithm):
    """A stage's search algorithm (Optuna's, or the grid of replicate seeds) behind a benchmark's trial queue
    (trial_slots.py): Tune gets a new trial only while this driver holds a free slot for it, and the slot is
    freed when Tune ends the trial however it ends (finished, stopped, errored, removed), so the running
    trials of all the benchmark's sweeps never exceed its cap, and a slot one sweep leaves idle is another's.

    Tune asks for new trials on every step of its loop; a sweep with no trial of its own left to run asks once
    a second, for up to 10 minutes, inside one step (TuneController._update_trial_queue), so that is where a
    sweep whose slots others hold waits. Tune checks for a stop signal only between steps: once its handler
    has caught one (it then puts back the handler it found, as `tune_caught_a_signal` reads), this search says
    it is finished, which ends that wait at once, and the stage ends as interrupted, resumable.
    The trials Tune restores on a `--resume` were created before, and Tune starts them without asking: the sweep
    takes their slots before it restores them (`_fit_or_resume`, TrialSlots.take_for_restored), and this search,
    unpickled from the experiment state as the same process's slots, frees each when Tune ends its trial."""

    PENDING = "(next trial)"

    def __init__(self, inner: SearchAlgorithm, slots: TrialSlots) -> None:
        super().__init__()
        self.inner, self.slots = inner, slots

    def next_trial(self) -> Any:
        if not self.slots.take(self.PENDING):
            return None
        trial = self.inner.next_trial()
        if trial is None:
            self.slots.give_back(self.PENDING)
        else:
            self.slots.hand_over(self.PENDING, trial.trial_id)
        return trial

    def on_trial_complete(self, trial_id: str, result: dict | None = None, error: bool = False) -> None:
        try:
            self.inner.on_trial_complete(trial_id, result=result, error=error)
        finally:
            self.slots.give_back(trial_id)

    def on_trial_result(self, trial_id: str, result: dict) -> None:
        self.inner.on_trial_result(trial_id, result)

    # Everything else is the wrapped algorithm's own.
    @property
    def searcher(self) -> Any:
        """The wrapped Searcher, where Tune looks for the ConcurrencyLimiter that sizes how many trials it lets
        wait for resources at once (tune_controller._get_max_pending_trials); none for the grid: one at a time."""
        return getattr(self.inner, "searcher", None)

    @property
    def metric(self) -> Any:
        return self.inner.metric

    @property
    def total_samples(self) -> int:
        return self.inner.total_samples

    def set_search_properties(self, metric: str | None, mode: str | None, config: dict, **spec: Any) -> bool:
        return self.inner.set_search_properties(metric, mode, config, **spec)

    def add_configurations(self, experiments: Any) -> None:
        self.inner.add_configurations(experiments)

    def is_finished(self) -> bool:
        return self.inner.is_finished() or self._stop_signalled()

    @staticmethod
    def _stop_signalled() -> bool:
        """Whether the running fit's Tune handler has caught a stop signal (it then puts back the handler found
        before the fit). Tune installs its handler before it first asks for a trial; a signal that came before
        this search's first request is seen too (reading the handler at that request instead missed it, and
        the sweep waited out Tune's 10 minutes: a test's Ctrl-C under a loaded machine)."""
        return bool(_SIGINT_HANDLER_BEFORE_FIT) and tune_caught_a_signal(_SIGINT_HANDLER_BEFORE_FIT[-1])

    def set_finished(self) -> None:
        self.inner.set_finished()

    def has_checkpoint(self, dirpath: str) -> bool:
        return self.inner.has_checkpoint(dirpath)

    def save_to_dir(self, dirpath: str, **kwargs: Any) -> None:
        self.inner.save_to_dir(dirpath, **kwargs)

    def restore_from_dir(self, dirpath: str) -> None:
        self.inner.restore_from_dir(dirpath)



def cut_short(stage: StageResult) -> bool:
    """A signal (Ctrl-C, SIGTERM) stopped the stage, or Tune ended its loop with trials it had not finished:
    interrupted, even when every run it started wrote its completed record before `collect` looked."""
    grid = stage.grid
    return stage.signalled or grid.num_terminated + grid.num_errors < len(grid)
