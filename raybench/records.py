"""What a sweep writes down once and every part reads back: a trial's record and the sweep's summary.json.

`collect` (raybench/sweep/ray_collect.py) makes a TrialRecord per trial and the runner one SweepSummary per sweep;
results, compare, plots, report, tracking and the benchmark read their typed fields, so a key is spelled in one
place and a misspelt one fails where it is read, not as a missing cell. The JSON is the one raybench has always
written, key for key and in the same order, so files, MLflow artifacts and `results --format json` do not change.

Reading is lenient where history asks for it. A record or summary written before a key existed loads with that
key's default, and to_json writes the default back, except where absence says something (see SweepSummary.to_json).
What no reader can use is a RecordError naming the key: a summary without its name, dataset, algorithm, selection,
trials or replicates, a record without its trial id or status, a status or state this raybench does not know.

The ground floor: the standard library and raybench.report_keys only, so every layer may import it.
"""
from __future__ import annotations

import json
import math
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, fields
from enum import Enum
from typing import Any, ClassVar, TypeVar

from raybench.report_keys import SCHEMA_VERSION, SUMMARY_SCHEMA


def is_finite_number(value: Any) -> bool:
    """A metric value that counts: a real, finite number. Records also hold None, NaN, inf, bools and strings
    (a failed trial's value, a tag read back); every mean, selection and plot leaves those out by this one rule."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)



class RecordError(ValueError):
    """A stored record that is not shaped like one; the message names the key and what was expected."""


# ----- a record's text, read without trusting it --------------------------------------------------------------
# The deepest nesting of lists and mappings a record may have. Every record raybench writes stays under 10
# levels; json.loads recurses once per level, so a file nested 100,000 deep would end it in a RecursionError.
MAX_RECORD_DEPTH = 64
_STRING_OR_BRACKET = re.compile(r'"(?:[^"\\]|\\.)*"?|[\[\]{}]', re.DOTALL)


def nesting_depth(text: str, stop_after: int = MAX_RECORD_DEPTH) -> int:
    """The deepest nesting of `[` and `{` in JSON text, outside its strings; a loop, not a recursion, which
    stops once past `stop_after` (so a hostile file costs no more than a sound one)."""
    depth = deepest = 0
    for match in _STRING_OR_BRACKET.finditer(text):
        token = match.group()
        if token in "[{":
            depth += 1
            deepest = max(deepest, depth)
            if deepest > stop_after:
                break
        elif token in "]}":
            depth -= 1
    return deepest


def loads_record(text: str, max_depth: int = MAX_RECORD_DEPTH) -> Any:
    """A record's JSON text as Python values; a RecordError when it is nested deeper than `max_depth` (judged
    before parsing) or is not JSON."""
    if nesting_depth(text, max_depth) > max_depth:
        raise RecordError(f"nested deeper than {max_depth} levels, as no record raybench writes is")
    try:
        return json.loads(text)
    except (ValueError, RecursionError) as err:
        raise RecordError(f"not JSON ({err})") from None


def measurements_in(data: Any) -> Iterator[float]:
    """Every fractional number in parsed JSON (what was measured: metrics, times, means; counts, seeds and ids
    are whole numbers), walked with a stack rather than a recursion."""
    stack = [data]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
        elif isinstance(item, float):
            yield item


def summary_numbers_problem(data: Mapping[str, Any]) -> str | None:
    """Why a summary's numbers cannot be a sweep's results, or None. A replicate cell is the mean of finite
    values (raybench.sweep.outcome.summarize leaves NaN out), so its mean is finite, its std finite or NaN (one value), its count
    at least 1; a selected trial was selected on a finite value; and a summary whose measurements are all NaN or
    infinite holds no result at all (the sweep's wall time alone is finite)."""
    replicates = data.get("replicates")
    cells = replicates.get("summary") if isinstance(replicates, dict) else None
    for key, cell in (cells or {}).items() if isinstance(cells, dict) else ():
        problem = _cell_problem(cell)
        if problem:
            return f"'replicates.summary.{key}' {problem}"
    selected = data.get("selected")
    value = selected.get("selection_value") if isinstance(selected, dict) else None
    if _is_number(value) and not math.isfinite(value):
        return f"'selected.selection_value' is {value}, but a trial is selected on a finite value"
    measured = list(measurements_in(data))
    if measured and not any(math.isfinite(number) for number in measured):
        return "its numbers are all NaN or infinite"
    return None


def _cell_problem(cell: Any) -> str | None:
    if not isinstance(cell, dict):
        return "is not a mapping of mean, std and n"
    mean, std, n = cell.get("mean"), cell.get("std"), cell.get("n")
    if not _is_number(mean) or not math.isfinite(mean):
        return f"has the mean {mean!r}, expected a finite number"
    if std is not None and (not _is_number(std) or math.isinf(std)):
        return f"has the std {std!r}, expected a finite number or NaN"
    if not _is_number(n) or not math.isfinite(n) or n < 1 or n != int(n):
        return f"has the count n {n!r}, expected a whole number >= 1"
    return None


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


class Words(str, Enum):
    """An enum whose members are the words stored for them: equal to those strings, and printed, formatted and
    serialised as them, so JSON, CSV, MLflow tags and f-strings read as they did when they were literals."""

    def __str__(self) -> str:  # format() and f-strings use it too, since it is overridden
        return str(self.value)


W = TypeVar("W", bound=Words)


def parse(kind: type[W], value: Any, key: str) -> W:
    """The member of `kind` a stored value names; a RecordError naming `key` for a value this raybench does not
    know."""
    try:
        return kind(value)
    except (ValueError, TypeError):
        known = ", ".join(repr(member.value) for member in kind)
        raise RecordError(f"{key!r} is {value!r}, expected one of {known}") from None


class TrialStatus(Words):
    """How a trial (or replicate) ended: its record's `status`."""

    OK = "ok"  # ran to its end
    FAILED = "failed"  # raised, or finished no epoch
    INTERRUPTED = "interrupted"  # a signal stopped the sweep before its driver recorded the run finished
    STOPPED = "stopped early"  # an early-stopping scheduler (ASHA) ended it

    @property
    def selectable(self) -> bool:
        """A run that finished, to its end or stopped early, can be selected on its best epoch."""
        return self in (TrialStatus.OK, TrialStatus.STOPPED)


class SweepState(Words):
    """Where a sweep stands. Its summary says FINISHED or the stage a signal interrupted; its parent run's state tag
    (raybench.tracking) says RUNNING, FINISHED, INTERRUPTED, FAILED, or DRIVER_GONE for a driver that died."""

    FINISHED = "finished"
    RUNNING = "running"
    INTERRUPTED = "interrupted"
    FAILED = "failed"
    DRIVER_GONE = "driver-gone"
    INTERRUPTED_SEARCH = "interrupted during the search"
    INTERRUPTED_REPLICATES = "interrupted during the replicates"

    @classmethod
    def interrupted_during(cls, stage: str) -> SweepState:
        """The summary's state when a signal stopped `stage` (search or replicates)."""
        return cls(f"interrupted during the {stage}")


class PairState(Words):
    """Where one (dataset, search space) pair of a benchmark stands, in its benchmark.json."""

    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"
    FAILED = "failed"
    INTERRUPTED = "interrupted"


# What every reader of a summary relies on, by key and type: a summary without them is damaged, not a sweep.
SUMMARY_SHAPE: dict[str, type] = {"name": str, "dataset": str, "algorithm": str, "selection": dict,
                                  "trials": list, "replicates": dict}


def _required(data: Mapping[str, Any], key: str, kind: type, where: str = "") -> Any:
    value = data.get(key)
    if not isinstance(value, kind):
        raise RecordError(f"{where + key!r} missing or not a {kind.__name__}")
    return value


def _optional(data: Mapping[str, Any], key: str, kind: type, where: str = "") -> Any:
    """The value of an optional key, None when absent or null; a RecordError when it has another type."""
    value = data.get(key)
    if value is not None and not isinstance(value, kind):
        raise RecordError(f"{where + key!r} is not a {kind.__name__}")
    return value


def _optional_number(data: Mapping[str, Any], key: str, where: str = "") -> float | None:
    """An optional real number, as a float: JSON writes 1.0 back as 1 in some hands (a script, another tool)."""
    value = data.get(key)
    if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))):
        raise RecordError(f"{where + key!r} is not a number")
    return None if value is None else float(value)


@dataclass(frozen=True)
class TrialRecord:
    """One trial or replicate as the sweep's driver saw it end: identity, sampled config, outcome, and the metrics
    at its best epoch. The fields are collect()'s keys, in its order."""

    order: int  # Tune's creation index: a tie in selection goes to the earlier trial
    trial_id: str  # the config's identity (raybench.sweep.space.trial_id)
    seed: int
    sampled: dict[str, Any]  # what the searcher drew, before the space's derivations
    status: TrialStatus
    failure_reason: str | None = None
    selection_value: float | None = None  # the selection metric at its best epoch; None unless selectable
    best_epoch: float | None = None
    selection_blind: bool = False  # its selection metric never moved
    selection_note: str | None = None  # which rows the selection metric was measured on, where not its split's
    metrics: dict[str, float] = field(default_factory=dict)  # best/, time/ and budget/ values
    checkpoint: str | None = None  # a path on the driver's machine: summary.json leaves it out
    node: str | None = None  # the Ray node its last epoch ran on
    epochs_run: float | None = None  # epochs it trained, every round counted (best_epoch is 0-based among them)
    not_converged: str | None = None  # why its best epoch came too late (raybench.trainer.health); None: it did not
    pseudo_labels: str | None = None  # its selected epoch's pseudo-labels in words (self-training methods only)
    pseudo_labels_collapsed: str | None = None  # why those count as collapsed onto one class; None: they do not

    # Written only when set, so a record from before the health fields existed writes back as it was stored
    WRITTEN_WHEN_SET: ClassVar[tuple[str, ...]] = ("epochs_run", "not_converged", "pseudo_labels",
                                                   "pseudo_labels_collapsed")

    def to_json(self, public: bool = False) -> dict[str, Any]:
        """The record as a dict, key for key as collect() has always made it; `public` leaves out the checkpoint
        path, as summary.json holds a record."""
        data = {f.name: getattr(self, f.name) for f in fields(self) if not (public and f.name == "checkpoint")}
        data.update(status=self.status.value, sampled=dict(self.sampled), metrics=dict(self.metrics))
        return {k: v for k, v in data.items() if v is not None or k not in self.WRITTEN_WHEN_SET}

    @classmethod
    def from_json(cls, data: Any, where: str = "trial") -> TrialRecord:
        """A stored record. Only its trial id and status are required: the other keys take their defaults, as in a
        summary written before selection_blind, selection_note, node and the health fields existed (checkpoint is never
        stored)."""
        if not isinstance(data, dict):
            raise RecordError(f"{where!r} missing or not a dict")
        return cls(order=data.get("order", 0), trial_id=_required(data, "trial_id", str, f"{where}."),
                   seed=data.get("seed", 0), sampled=dict(_optional(data, "sampled", dict, f"{where}.") or {}),
                   status=parse(TrialStatus, data.get("status"), f"{where}.status"),
                   failure_reason=data.get("failure_reason"), selection_value=data.get("selection_value"),
                   best_epoch=data.get("best_epoch"), selection_blind=bool(data.get("selection_blind", False)),
                   selection_note=data.get("selection_note"),
                   metrics=dict(_optional(data, "metrics", dict, f"{where}.") or {}),
                   checkpoint=data.get("checkpoint"), node=data.get("node"), epochs_run=data.get("epochs_run"),
                   not_converged=data.get("not_converged") or None, pseudo_labels=data.get("pseudo_labels") or None,
                   pseudo_labels_collapsed=data.get("pseudo_labels_collapsed") or None)


def _importances(data: Mapping[str, Any]) -> Importances | None:
    found = _optional(data, "importances", dict)
    return None if found is None else Importances.from_json(found)


def _attempts(data: Mapping[str, Any]) -> list[ConvergenceAttempt] | None:
    found = _optional(data, "attempts", list)
    return None if found is None else [ConvergenceAttempt.from_json(a, f"attempts[{i}]") for i, a in enumerate(found)]


def _records(data: list[Any], where: str) -> list[TrialRecord]:
    return [TrialRecord.from_json(item, f"{where}[{i}]") for i, item in enumerate(data)]


@dataclass(frozen=True)
class Selection:
    """How a sweep chose its config: the strategy's name, the metric it ranks on and what the dataset calls it."""

    strategy: str = ""
    metric: str = ""
    label: str = ""
    analysis_only: bool | None = None  # None: written before summaries said so (the strategy's registration says)

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {"strategy": self.strategy, "metric": self.metric, "label": self.label}
        if self.analysis_only is not None:
            data["analysis_only"] = self.analysis_only
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Selection:
        return cls(data.get("strategy", ""), data.get("metric", ""), data.get("label", ""), data.get("analysis_only"))


@dataclass
class Replicates:
    """The selected config run again on other seeds: the seeds, how many finished, each run, and per metric the
    mean, sample std and count over the finished ones (raybench.sweep.outcome.summarize)."""

    seeds: list[int] = field(default_factory=list)
    ok: int = 0
    runs: list[TrialRecord] = field(default_factory=list)
    summary: dict[str, dict[str, float]] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {"seeds": list(self.seeds), "ok": self.ok, "runs": [r.to_json(public=True) for r in self.runs],
                "summary": dict(self.summary)}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Replicates:
        where = "replicates."
        return cls(seeds=list(_optional(data, "seeds", list, where) or []), ok=data.get("ok", 0),
                   runs=_records(_optional(data, "runs", list, where) or [], "replicates.runs"),
                   summary=dict(_optional(data, "summary", dict, where) or {}))


@dataclass(frozen=True)
class StoredRun:
    """Where a summary read back from the tracking store stands: its parent run and what its status and tags say.
    Added by raybench.tracking when it reads a summary (`results --format json` shows it), never written to disk.
    `state` is the store's words: a SweepState value unless a tag was set by hand."""

    run_id: str | None = None
    status: str | None = None  # MLflow's: RUNNING, FINISHED, KILLED, FAILED
    state_line: str | None = None  # the line `raybench results` prints above the table
    state: str | None = None

    KEYS: ClassVar[dict[str, str]] = {"run_id": "mlflow_run_id", "status": "mlflow_status", "state_line": "state_line", "state": "tracking_state"}

    def to_json(self) -> dict[str, Any]:
        return {key: getattr(self, name) for name, key in self.KEYS.items() if getattr(self, name) is not None}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> StoredRun | None:
        found = {name: data[key] for name, key in cls.KEYS.items() if key in data}
        return cls(**found) if found else None


@dataclass(frozen=True)
class ParamImportance:
    """One searched hyperparameter: how it was rated and its importance, or why it has none."""

    name: str
    scale: str  # log, linear or categorical: the scale it was rated on
    share: float | None = None  # its part of the summed main effects (the shares add to 1); None when not rated
    main_effect: float | None = None  # the fraction of the forest's variance its main effect explains alone
    reason: str | None = None  # why it was not rated

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "scale": self.scale, "share": self.share, "main_effect": self.main_effect,
                "reason": self.reason}

    @classmethod
    def from_json(cls, data: Any, where: str) -> ParamImportance:
        if not isinstance(data, dict):
            raise RecordError(f"{where!r} missing or not a dict")
        return cls(_required(data, "name", str, f"{where}."), _required(data, "scale", str, f"{where}."),
                   _optional_number(data, "share", f"{where}."), _optional_number(data, "main_effect", f"{where}."),
                   _optional(data, "reason", str, f"{where}."))


@dataclass(frozen=True)
class Importances:
    """What raybench.report.importance.importances found for one sweep: the evaluator, which trials it counted,
    each searched hyperparameter (rated ones first, most important first), how much of the metric's variance the
    main effects explain, and the caveats a reader must know before trusting the numbers (`notes`)."""

    metric: str
    evaluator: str
    n_trials: int  # the trials counted
    n_search_trials: int  # every search trial, counted or not
    params: tuple[ParamImportance, ...]
    explained: float | None = None  # the main effects' summed fraction of the forest's variance; None: none rated
    notes: tuple[str, ...] = ()

    @property
    def shares(self) -> dict[str, float]:
        """Each rated hyperparameter's share, most important first: the column `compare` shows."""
        return {p.name: p.share for p in self.params if p.share is not None}

    @property
    def counted_line(self) -> str:
        return (f"counted {self.n_trials} of {self.n_search_trials} trials: those that finished (to their end or "
                f"stopped early) with a finite {self.metric}")

    @property
    def explained_line(self) -> str | None:
        if self.explained is None:
            return None
        return (f"shares of the summed main effects; the main effects explain {100 * self.explained:.0f}% of the "
                "forest's variance, the rest is interactions and noise")

    def to_json(self) -> dict[str, Any]:
        """The fields `results --format json` (and `compare --format json`) carry under `importances`."""
        return {"metric": self.metric, "evaluator": self.evaluator, "n_trials": self.n_trials,
                "n_search_trials": self.n_search_trials, "explained": self.explained,
                "params": [p.to_json() for p in self.params], "notes": list(self.notes)}

    @classmethod
    def from_json(cls, data: Any, where: str = "importances") -> Importances:
        if not isinstance(data, dict):
            raise RecordError(f"{where!r} is not a dict")
        params = _required(data, "params", list, f"{where}.")
        return cls(_required(data, "metric", str, f"{where}."), _required(data, "evaluator", str, f"{where}."),
                   _required(data, "n_trials", int, f"{where}."), _required(data, "n_search_trials", int, f"{where}."),
                   tuple(ParamImportance.from_json(p, f"{where}.params[{i}]") for i, p in enumerate(params)),
                   _optional_number(data, "explained", f"{where}."),
                   tuple(str(note) for note in _optional(data, "notes", list, f"{where}.") or []))


@dataclass(frozen=True)
class ConvergenceAttempt:
    """An earlier sweep of the same (dataset, method) that this one supersedes under the convergence rule
    (`sweep --converge`): its name, the factor its epochs were raised by, its selected config's replicate budget in
    words, and why it was not enough (its selected config peaked late)."""

    name: str
    epochs_scale: float
    budget: str
    reason: str

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "epochs_scale": self.epochs_scale, "budget": self.budget, "reason": self.reason}

    @classmethod
    def from_json(cls, data: Any, where: str = "attempts") -> ConvergenceAttempt:
        if not isinstance(data, dict):
            raise RecordError(f"{where!r} is not a mapping")
        return cls(name=_required(data, "name", str, f"{where}."), epochs_scale=float(data.get("epochs_scale", 1.0)),
                   budget=str(data.get("budget", "")), reason=str(data.get("reason", "")))


@dataclass(kw_only=True)
class SweepSummary:
    """A sweep's results/summary.json: what it searched and how it selected, every trial, the selected one, its
    replicates and what the sweep used. Fields in the file's key order; `tracking` and `mlflow` are set once the
    sweep has recorded them, `stored` only on a summary read back from the tracking store."""

    name: str
    state: SweepState = SweepState.FINISHED
    selection_blind: str | None = None  # why the selection could not tell its configs apart (raybench.sweep.outcome.blindness)
    dataset: str
    algorithm: str
    space: str = ""  # the search space as given on the command line
    space_scales: dict[str, str] = field(default_factory=dict)  # each searched setting's plot axis
    raybench_version: str = ""
    schema_version: int = SUMMARY_SCHEMA  # 0: written before summaries carried a version (the same keys)
    selection: Selection
    metric_names: list[str] = field(default_factory=list)
    report: dict[str, Any] | None = None  # split labels and report columns; None: written before it was recorded
    trials: list[TrialRecord]
    selected: TrialRecord | None = None
    replicates: Replicates
    wall_seconds: float = 0.0
    compute: dict[str, dict[str, float]] | None = None  # per stage (search, replicates): runs, wall_s, cpu_s, gpu_s
    tracking: dict[str, float] | None = None  # what the driver asked of the MLflow store (TrackingStats)
    mlflow: dict[str, str] | None = None  # the parent run: experiment_id, run_id
    # Which hyperparameters mattered, as the sweep rated them when it wrote this summary, so `results` and
    # `compare --stats` read them instead of fitting fANOVA's forest again; None: written before they were kept
    importances: Importances | None = None
    # The convergence rule (`--converge`): the factor every config's epochs were raised by (None: as the space
    # says), and the earlier, shorter sweeps of the same pair that this one supersedes (None: it supersedes none)
    epochs_scale: float | None = None
    attempts: list[ConvergenceAttempt] | None = None
    stored: StoredRun | None = None

    # Keys written only when they have a value: a summary that lacked them (written before they existed, or before
    # the sweep recorded them) writes back without them. Every other key is always written.
    WRITTEN_WHEN_SET = ("report", "compute", "tracking", "mlflow", "importances", "epochs_scale", "attempts")

    def to_json(self) -> dict[str, Any]:
        """The summary as raybench has always written it, key for key and in order; schema_version is left out of
        a version-0 summary, so a summary read from a file writes back as that file."""
        data: dict[str, Any] = {
            "name": self.name, "state": self.state.value, "selection_blind": self.selection_blind,
            "dataset": self.dataset, "algorithm": self.algorithm, "space": self.space,
            "space_scales": dict(self.space_scales), "raybench_version": self.raybench_version,
            SCHEMA_VERSION: self.schema_version, "selection": self.selection.to_json(),
            "metric_names": list(self.metric_names), "report": self.report,
            "trials": [t.to_json(public=True) for t in self.trials],
            "selected": self.selected.to_json(public=True) if self.selected else None,
            "replicates": self.replicates.to_json(), "wall_seconds": self.wall_seconds, "compute": self.compute,
            "tracking": self.tracking, "mlflow": self.mlflow,
            "importances": self.importances.to_json() if self.importances else None,
            "epochs_scale": self.epochs_scale,
            "attempts": None if self.attempts is None else [a.to_json() for a in self.attempts]}
        if not self.schema_version:
            del data[SCHEMA_VERSION]
        data = {k: v for k, v in data.items() if v is not None or k not in self.WRITTEN_WHEN_SET}
        return {**data, **(self.stored.to_json() if self.stored else {})}

    @classmethod
    def from_json(cls, data: Any) -> SweepSummary:
        """A parsed summary.json, of this schema or an older one (a missing key takes its default). Which versions
        a reader accepts is raybench.tracking.read_summary_text's to say: this reads the keys whatever the version."""
        if not isinstance(data, dict):
            raise RecordError(f"a JSON {type(data).__name__}, not a mapping")
        for key, kind in SUMMARY_SHAPE.items():
            _required(data, key, kind)
        selected = data.get("selected")
        return cls(
            name=data["name"], state=parse(SweepState, data.get("state", SweepState.FINISHED.value), "state"),
            selection_blind=data.get("selection_blind"), dataset=data["dataset"], algorithm=data["algorithm"],
            space=data.get("space") or "", space_scales=dict(_optional(data, "space_scales", dict) or {}),
            raybench_version=data.get("raybench_version", ""), schema_version=data.get(SCHEMA_VERSION, 0),
            selection=Selection.from_json(data["selection"]), metric_names=list(data.get("metric_names") or []),
            report=_optional(data, "report", dict), trials=_records(data["trials"], "trials"),
            selected=None if selected is None else TrialRecord.from_json(selected, "selected"),
            replicates=Replicates.from_json(data["replicates"]), wall_seconds=data.get("wall_seconds", 0.0),
            compute=_optional(data, "compute", dict), tracking=_optional(data, "tracking", dict),
            mlflow=_optional(data, "mlflow", dict), importances=_importances(data),
            epochs_scale=_optional_number(data, "epochs_scale"), attempts=_attempts(data),
            stored=StoredRun.from_json(data))

    @property
    def finished(self) -> bool:
        return self.state == SweepState.FINISHED

    @property
    def recorded_importances(self) -> Importances | None:
        """The importances this summary keeps, if they were rated over its own trials and selection metric: None
        when it keeps none, or when its trials or metric were changed after they were rated."""
        found = self.importances
        if found is None or found.n_search_trials != len(self.trials) or found.metric != self.selection.metric:
            return None
        return found

    @property
    def state_line(self) -> str | None:
        """Where the sweep stands, as the tracking store says (None for a summary not read from the store)."""
        return self.stored.state_line if self.stored else None
