"""`--budget`: a sweep that stops drawing configs when its compute budget cannot fit another trial.

A budget is wall-clock time (`90m`, `2h`) or GPU-hours (`12gpu-h`: each run's seconds times the GPUs it held,
W&B's and Tune's users ask for one as ray-project/ray#21038 does). What a sweep has spent is counted from its
runs' own completed records (ray_trial.CompletedRuns: `time/wall_s`, `time/gpu_s` and when the run started), in
every stage folder of the sweep, so a SIGINT, a SIGTERM or a killed driver loses none of it and a `--resume`
goes on from what was spent. Wall-clock is the time at least one of the sweep's runs was running (the union of
their intervals): the time a sweep sat interrupted between a signal and its resume is not spent.

Before the search hands out a config it asks `SpendGate.may_draw`: the next trial fits if what is spent, what
the running trials will still spend, that trial and the replicates the selected config will need all fit, at
the cost per trial measured so far (the mean over the sweep's finished search runs). Until one has finished
there is no cost to judge by, and the first trials are drawn. Once the gate says no it writes why into the
stage's folder (CUT_FILE), which the runner reads: the search then ended by its budget, not by a signal, and
the summary says how many configs were cut.
"""
from __future__ import annotations

import json
import math
import re
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from raybench.paths import write_text_atomically
from raybench.sweep.extension import stage_folders

WALL, GPU = "wall-clock", "GPU"
CUT_FILE = "budget-cut.json"  # in a search stage's folder: the gate stopped drawing there
BUDGET_KEY = "budget"  # summary.report's record of --budget
_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0}
_PATTERN = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)\s*(s|m|h|gpu-h)\s*$", re.IGNORECASE)
BUDGET_WORDS = "a wall-clock budget such as 90m or 2h (also s), or GPU-hours such as 12gpu-h"


@dataclass(frozen=True)
class SpendLimit:
    """A budget as given: `seconds` of wall-clock, or GPU-seconds for the GPU unit."""

    seconds: float
    unit: str
    text: str

    def words(self) -> str:
        return f"{self.text} of {'GPU time' if self.unit == GPU else 'wall-clock'}"


def parse_spend_limit(text: str) -> SpendLimit:
    """`2h`, `90m`, `30s` or `12gpu-h`; ValueError naming what was expected otherwise (argparse shows it)."""
    found = _PATTERN.match(str(text))
    if found is None or float(found.group(1)) <= 0:
        raise ValueError(f"expected {BUDGET_WORDS}, got {text!r}")
    amount, unit = float(found.group(1)), found.group(2).lower()
    if unit == "gpu-h":
        return SpendLimit(amount * 3600.0, GPU, str(text).strip())
    return SpendLimit(amount * _UNITS[unit], WALL, str(text).strip())


def budget_text(text: str) -> str:
    """The --budget flag's parser: the amount as given once it parses (argparse shows the error otherwise)."""
    import argparse

    try:
        return parse_spend_limit(text).text
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


@dataclass(frozen=True)
class RunCost:
    """One finished run as its completed record has it: when it started and what it used."""

    start: float
    wall_s: float
    gpu_s: float
    search: bool  # a search trial (its cost is the cost per trial), not a replicate

    @classmethod
    def of(cls, record: dict[str, Any], search: bool) -> RunCost | None:
        """None for a record without its timing (a failure record written before the trial's end)."""
        try:
            wall = float(record["time/wall_s"])
            started = float(record["time/trainer_started_at"]) - float(record.get("time/startup_s", 0.0))
            gpu = float(record.get("time/gpu_s", 0.0))
        except (KeyError, TypeError, ValueError):
            return None
        if not all(math.isfinite(v) for v in (wall, started, gpu)):
            return None
        return cls(started, wall, gpu, search)

    def spend(self, unit: str) -> float:
        return self.gpu_s if unit == GPU else self.wall_s


def union_seconds(intervals: Iterable[tuple[float, float]]) -> float:
    """Seconds covered by at least one of the intervals."""
    covered, end = 0.0, -math.inf
    for start, stop in sorted(intervals):
        if stop <= end:
            continue
        covered += stop - max(start, end)
        end = stop
    return covered


def sweep_runs(storage: Path, name: str) -> list[RunCost]:
    """Every finished run of sweep `name` under `storage`: its search (and extensions) and its replicates."""
    runs = []
    for folder in (stage / "completed" for stage in stage_folders(storage, name)):
        search = folder.parent.name.startswith(f"{name}-search")
        for path in sorted(folder.glob("*.json")):
            try:
                record = json.loads(path.read_text())
            except (OSError, ValueError):
                continue
            cost = RunCost.of(record, search) if isinstance(record, dict) else None
            if cost is not None:
                runs.append(cost)
    return runs


@dataclass
class SpendGate:
    """Whether the search may draw another config (this module's docstring says by which rule). `runs` reads the
    sweep's finished runs; the gate keeps the trials it let start, and when, until Tune says each ended."""

    limit: SpendLimit
    runs: Callable[[], list[RunCost]]
    replicates: int  # runs the selected config still needs after the search
    concurrency: int  # trials at once: replicates run in ceil(replicates / concurrency) waves of wall-clock
    gpus_per_trial: float
    cut_file: Path
    clock: Callable[[], float] = time.time
    running: dict[str, float] = field(default_factory=dict)

    def started(self, trial_id: str) -> None:
        self.running[trial_id] = self.clock()

    def ended(self, trial_id: str) -> None:
        self.running.pop(trial_id, None)

    def may_draw(self, drawn: int) -> bool:
        """True when another trial fits; else the cut is written (once) and False. `drawn`: configs handed out."""
        finished = self.runs()
        costs = [run.spend(self.limit.unit) for run in finished if run.search]
        if not costs:
            return True
        per_trial = sum(costs) / len(costs)
        spent = self.spent(finished)
        needed = spent + self.still_running(per_trial) + per_trial + self.replicate_reserve(per_trial)
        if needed <= self.limit.seconds:
            return True
        self.write_cut(BudgetCut(self.limit.text, self.limit.unit, drawn, round(spent, 1), round(per_trial, 1),
                                 self.replicates))
        return False

    def spent(self, finished: list[RunCost]) -> float:
        """What the sweep has spent by now: its finished runs, and the running trials so far."""
        now = self.clock()
        if self.limit.unit == GPU:
            return sum(run.gpu_s for run in finished) + sum((now - t) * self.gpus_per_trial
                                                             for t in self.running.values())
        intervals = [(run.start, run.start + run.wall_s) for run in finished]
        return union_seconds(intervals + [(t, now) for t in self.running.values()])

    def still_running(self, per_trial: float) -> float:
        """GPU-seconds the running trials will still hold at the measured cost; in wall-clock they run beside
        the next trial, so nothing."""
        if self.limit.unit != GPU:
            return 0.0
        now = self.clock()
        return sum(max(per_trial - (now - t) * self.gpus_per_trial, 0.0) for t in self.running.values())

    def replicate_reserve(self, per_trial: float) -> float:
        if self.limit.unit == GPU:
            return per_trial * self.replicates
        return per_trial * math.ceil(self.replicates / max(self.concurrency, 1))

    def write_cut(self, cut: BudgetCut) -> None:
        if not self.cut_file.exists():
            self.cut_file.parent.mkdir(parents=True, exist_ok=True)
            write_text_atomically(self.cut_file, json.dumps(asdict(cut)) + "\n")


@dataclass(frozen=True)
class BudgetCut:
    """Where the gate stopped the search: after `drawn` configs, having spent `spent_s` at `per_trial_s` a trial,
    with `replicates` runs kept back for the selected config."""

    budget: str
    unit: str
    drawn: int
    spent_s: float
    per_trial_s: float
    replicates: int


def read_cut(stage_folder: Path) -> BudgetCut | None:
    try:
        return BudgetCut(**json.loads((stage_folder / CUT_FILE).read_text()))
    except (OSError, ValueError, TypeError):
        return None


def budget_record(limit: SpendLimit | None, asked: int, cut: BudgetCut | None, runs: list[RunCost]) -> dict[str, Any]:
    """What summary.json keeps of --budget: the budget, what the whole sweep spent and what the search cut."""
    if limit is None:
        return {}
    spent = (sum(run.gpu_s for run in runs) if limit.unit == GPU
             else union_seconds((run.start, run.start + run.wall_s) for run in runs))
    record: dict[str, Any] = {"budget": limit.text, "unit": limit.unit, "limit_s": limit.seconds,
                              "spent_s": round(spent, 1), "trials_asked": asked}
    if cut is not None:
        record.update(trials_drawn=cut.drawn, trials_cut=asked - cut.drawn, per_trial_s=cut.per_trial_s,
                      replicates_kept=cut.replicates)
    return {BUDGET_KEY: record}


def budget_words(report: dict[str, Any]) -> list[str]:
    """The line `results` prints about --budget, from summary.report."""
    found = report.get(BUDGET_KEY)
    if not isinstance(found, dict):
        return []
    spent = float(found.get("spent_s", 0))
    shown = f"{spent / 3600:.3g} GPU-hours" if found.get("unit") == GPU else f"{spent:.1f} s of wall-clock"
    line = f"Budget: {found.get('budget')}; spent {shown} (counted from the runs' records)"
    if "trials_cut" in found:
        line += (f"; the search drew {found['trials_drawn']} of {found['trials_asked']} configs, "
                 f"{found['trials_cut']} cut: the next would not fit at {found['per_trial_s']:g} s a trial with "
                 f"{found['replicates_kept']} replicate runs kept back")
    return [line]
