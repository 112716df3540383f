"""Each trial of a stage as a typed TrialRecord (`collect`), and the trials' completed records as the sweep's
callbacks read them while the stage runs (`RunRecords`). Part of the Ray backend (ray_backend.py says which module
does what).

One source for a trial's record. A trial that ran to its end writes its completed record (ray_trial.CompletedRuns)
atomically as its last act: its last report whole (what Tune was sent, with every worker's CPU-seconds summed in and
the path its checkpoint was persisted at), its timing, and whether a scheduler stopped it early. Every field of a
TrialRecord that a trial's results decide is read from that record alone (`trial_results`), however much of it
reached Tune: a signal can stop Tune's loop after a run wrote its record and before its last reports reached Tune.
Tune's Result is read for what only Tune knows: the config it sampled for the trial, the order it created the trial
in, and the error of a trial that raised.

By design two kinds of trial leave no record, and only for them does Tune's last result stand in:
- one that raised: a crash past its retries, or a Train-executor run that diverged or met an unreadable input (its
  driver raises TrialFailed with the reason instead of recording the run): `failed`, with its reason;
- one a signal stopped before its driver recorded it finished: `interrupted`, its epochs so far shown, never selected.
"""
from __future__ import annotations

import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

from raybench.budget import BUDGET_PREFIX
from raybench.records import TrialRecord, TrialStatus
from raybench.report_keys import (
    BEST_PREFIX,
    BLIND_INFO,
    COLLAPSE_INFO,
    CONVERGENCE_INFO,
    NODE,
    NOTE_INFO,
    PSEUDO_INFO,
    SELECTION_BEST,
    TIME_PREFIX,
)
from raybench.sweep.ray_trial import STOPPED_KEY, CompletedRuns
from raybench.sweep.ray_worker import CHECKPOINT_PATH_KEY, EPOCHS_DONE, FAILURE_KEY
from raybench.sweep.space import ResolvedSpace, RunIdentity

if TYPE_CHECKING:
    from ray import tune

    from raybench.sweep.ray_search import RunSpec


class RunRecords:
    """The runs of one stage as the sweep's callbacks see them: each Tune trial's RunIdentity, made at its first
    event and shared by the callbacks that hold these records, and its completed-run record (CompletedRuns: its
    timing and whether it was stopped early), read when the trial completes.

    Tune pickles the callbacks, and these records with them: the identities are rebuilt, not saved."""

    def __init__(self, completed: CompletedRuns, space: ResolvedSpace, stage: str) -> None:
        self.completed, self.space, self.stage = completed, space, stage
        self._identities: dict[str, RunIdentity] = {}

    def __getstate__(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if k != "_identities"}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update({**state, "_identities": {}})

    def identity(self, trial: Any) -> RunIdentity:
        """The run the Tune trial stands for (its config and key)."""
        if trial.trial_id not in self._identities:
            self._identities[trial.trial_id] = RunIdentity.of(self.space, trial.config, self.stage)
        return self._identities[trial.trial_id]

    def for_trial(self, trial: Any) -> dict[str, Any]:
        return self.completed.load(self.identity(trial).key) or {}


# ----- how a failure reads --------------------------------------------------------------------------------------
def _last_line(text: str) -> str | None:
    """An error's last non-blank line (the exception message), not the whole remote traceback."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1] if lines else None


def error_reason(trial: Any) -> str:
    """Why a failed Tune trial failed, in one line: the last line of its error file."""
    path = trial.error_file
    text = Path(path).read_text() if path and Path(path).is_file() else ""
    return _last_line(text) or "unknown error"


# ----- results back to typed records --------------------------------------------------------------------------
def trial_results(result: Any, record: dict[str, Any] | None) -> dict[str, Any]:
    """The one source of a trial's results (its metrics, best epoch, epochs, node, facts, checkpoint, timing): its
    completed record when it wrote one, else, for a trial that by design left none (it raised, or a signal
    interrupted it: see this module's docstring), the last result Tune received from it.

    Nothing is merged. The record holds the run's last report as Tune was sent it, plus what only the trial knew
    at its end (its timing, whether it was stopped early); Tune's copy adds only its bookkeeping, which no field
    reads, and may lack the last reports altogether."""
    return record if record is not None else dict(result.metrics or {})


def _order(result: Any, fallback: int) -> int:
    """The trial's creation index, which Tune writes into its folder name: <trainable>_<id>_<index>_<params>.
    Tune's to know: its trial id is in every result it received."""
    tune_id = str((result.metrics or {}).get("trial_id", ""))
    found = re.search(rf"{re.escape(tune_id)}_(\d+)", Path(result.path).name) if tune_id and result.path else None
    return int(found.group(1)) if found else fallback


def _reason(result: Any, results: dict[str, Any], finished: bool) -> str | None:
    """Why the trial failed, or None: the failure it reported (a divergence, an unreadable input), else the error
    Tune caught (Tune's word wins over a record: the trial raised after writing it), else, for a finished trial,
    that it finished no epoch."""
    if FAILURE_KEY in results:
        return str(results[FAILURE_KEY])
    if result.error is not None:
        return _last_line(str(result.error)) or type(result.error).__name__
    if not finished:
        return None
    if SELECTION_BEST not in results:
        return "no epoch finished"
    return None


def _checkpoint_path(result: Any, results: dict[str, Any]) -> str | None:
    """Where the trial's last checkpoint was persisted, as its results name it (both executors' trials record it).
    Tune's own checkpoint of the trial stands in where they name none: a function trial's result that Tune holds
    (its reports carry no path), a function trial's failure record, and a record written by a raybench whose
    function trials did not yet record the path (a sweep resumed across versions)."""
    if results.get(CHECKPOINT_PATH_KEY):
        return str(results[CHECKPOINT_PATH_KEY])
    return result.checkpoint.path if result.checkpoint is not None else None


def _status(reason: str | None, record: dict[str, Any] | None) -> TrialStatus:
    if reason:
        return TrialStatus.FAILED
    if record is None:
        return TrialStatus.INTERRUPTED
    return TrialStatus.STOPPED if record.get(STOPPED_KEY) else TrialStatus.OK


def _measured(results: dict[str, Any]) -> dict[str, float]:
    """The numbers a TrialRecord keeps: its best-epoch metrics, timing and budget."""
    return {k: v for k, v in results.items()
            if k.startswith((BEST_PREFIX, TIME_PREFIX, BUDGET_PREFIX)) and isinstance(v, (int, float))}


def trial_record(result: Any, run: RunIdentity, index: int, record: dict[str, Any] | None) -> TrialRecord:
    """One trial as a TrialRecord: its identity from Tune's Result, everything it measured from `trial_results`."""
    results = trial_results(result, record)
    reason = _reason(result, results, record is not None)
    status = _status(reason, record)
    return TrialRecord(
        order=_order(result, index),
        trial_id=run.trial_id,
        seed=run.config.get("seed", 0),
        sampled=dict(result.config or {}),
        status=status,
        failure_reason=reason,
        selection_value=results.get(SELECTION_BEST) if status.selectable else None,
        best_epoch=results.get("best_epoch"),
        selection_blind=bool(results.get(BLIND_INFO)),
        selection_note=results.get(NOTE_INFO),
        metrics=_measured(results),
        checkpoint=_checkpoint_path(result, results),
        node=results.get(NODE),
        epochs_run=results.get(EPOCHS_DONE),
        not_converged=results.get(CONVERGENCE_INFO) or None,
        pseudo_labels=results.get(PSEUDO_INFO) or None,
        pseudo_labels_collapsed=results.get(COLLAPSE_INFO) or None,
    )


def collect(grid: tune.ResultGrid, space: ResolvedSpace, spec: RunSpec) -> list[TrialRecord]:
    """One record per trial: identity, sampled config, status and reason, metrics at its best epoch.

    A trial counts as finished only when its driver wrote its completed record: one that Tune stopped
    on an interrupt has reported some epochs but is `interrupted`, never `ok`."""
    records = []
    for index, result in enumerate(grid):
        run = RunIdentity.of(space, dict(result.config or {}), spec.stage)
        records.append(trial_record(result, run, index, spec.completed.load(run.key)))
    return sorted(records, key=lambda r: r.order)
