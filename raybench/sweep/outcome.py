"""What a sweep's trials come to, as the sweep itself needs it: the selected trial, the replicates' seeds and
summary, the compute used, whether the selection could see, and how far the reported row can be trusted.

The protocol (raybench.sweep.runner) decides by these; the report floor (raybench.report) shows them. Pure
Python and pandas, from typed records (raybench.records)."""
from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import pandas as pd

from raybench.budget import StepRatios
from raybench.records import SweepSummary, TrialRecord, TrialStatus, is_finite_number
from raybench.report_keys import BEST_PREFIX, CLOCK_STAMPS, CPU_S, GPU_S, SELECTION_BLIND, WALL_S

# What a run used, as its driver and workers report it (raybench/sweep/ray_backend.py), by total name.
COMPUTE_KEYS = {"wall_s": WALL_S, "cpu_s": CPU_S, "gpu_s": GPU_S}


@dataclass(frozen=True)
class BudgetSummary(StepRatios):
    """What a run planned to train (raybench/budget.py), read back from its `budget/` metrics, or their
    means over a sweep's replicates. `steps` are batches; `spent_steps` what the run ran (early stopping ends
    some runs before their plan)."""

    steps: float
    optimizer_steps: float
    labeled_examples: float
    unlabeled_examples: float
    labeled_passes: float
    protocol_steps: float
    erm_steps: float
    spent_steps: float

    FIELDS = ("steps", "optimizer_steps", "labeled_examples", "unlabeled_examples", "labeled_passes",
              "protocol_steps", "erm_steps")

    @classmethod
    def from_metrics(cls, values: Mapping[str, Any]) -> BudgetSummary | None:
        """From a run's metrics (numbers) or a replicate summary (cells with a mean); None when not recorded."""
        def number(key: str) -> float | None:
            value = values.get(key)
            value = value.get("mean") if isinstance(value, dict) else value
            return float(value) if is_finite_number(value) else None

        planned = {name: number(f"budget/planned_{name}") for name in cls.FIELDS}
        if any(v is None for v in planned.values()):
            return None
        return cls(**planned, spent_steps=number("budget/steps") or 0.0)  # type: ignore[arg-type]

    def text(self) -> str:
        return (f"{self.steps:.0f} steps ({self.optimizer_steps:.0f} optimizer steps), {self.labeled_examples:.0f} "
                f"labeled + {self.unlabeled_examples:.0f} unlabeled examples, {self.labeled_passes:.2f} labeled passes; "
                f"{self.erm_ratio:.2f}x ERM's steps, {self.protocol_ratio:.2f}x the protocol's")

    def short(self) -> str:
        return f"{self.steps:.0f} st, {self.labeled_passes:.1f} lp, {self.erm_ratio:.2f}x ERM"


def replicate_seeds(trial_id: str, count: int) -> list[int]:
    """K seeds derived from the selected trial's identity, so re-running a sweep repeats them exactly."""
    return [int(hashlib.sha256(f"{trial_id}/replicate/{i}".encode()).hexdigest()[:8], 16) for i in range(count)]


def select_best(trials: list[TrialRecord]) -> TrialRecord | None:
    """The finished trial (run to its end or stopped early) with the highest selection value at its best
    epoch; ties go to the earlier-sampled trial."""
    candidates = [t for t in trials if t.status.selectable and is_finite_number(t.selection_value)]
    if not candidates:
        return None
    return max(candidates, key=lambda t: (t.selection_value, -t.order))



def summarize(replicates: list[TrialRecord]) -> dict[str, dict[str, float]]:
    """Mean and sample std (ddof=1) of every metric at each replicate's best-validation epoch; `n` counts
    the finite values that went into them (a NaN metric is left out of all three)."""
    ok = [r.metrics for r in replicates if r.status == TrialStatus.OK]
    keys = sorted({k for m in ok for k in m} - CLOCK_STAMPS)  # moments, whose mean means nothing
    summary = {}
    for key in keys:
        values = pd.Series([m[key] for m in ok if key in m and is_finite_number(m[key])], dtype="float64")
        if values.empty:
            continue
        summary[key] = {"mean": float(values.mean()), "std": float(values.std(ddof=1)) if len(values) > 1 else float("nan"),
                        "n": len(values)}
    return summary


def compute_totals(runs: list[TrialRecord]) -> dict[str, float]:
    """What a stage's runs used, summed over all of them: failed and interrupted runs used compute too.
    wall_s is trial-seconds (each run's own wall time), cpu_s its workers' process time, gpu_s the GPUs it
    held times its wall time."""
    totals: dict[str, float] = {"runs": float(len(runs))}
    for name, key in COMPUTE_KEYS.items():
        totals[name] = float(sum(r.metrics.get(key, 0.0) for r in runs if is_finite_number(r.metrics.get(key))))
    return totals


def blindness(trials: list[TrialRecord]) -> str | None:
    """One line when trials' selection metric never moved: that selection picked by chance, not by merit."""
    # Trials that ran to their end: one stopped early (ASHA) ended right after a report, before the check.
    finished = [t for t in trials if t.status == TrialStatus.OK]
    blind = [t for t in finished if t.selection_blind]
    if len(blind) == len(finished) and blind:
        return f"every trial's {SELECTION_BLIND}"
    if blind:
        return f"{len(blind)} of {len(finished)} trials: {SELECTION_BLIND}"
    return tied_trials(finished)


@dataclass(frozen=True)
class RowHealth:
    """What the sweep's reported row (its selected config's replicates; the selected trial where none finished)
    can be trusted for: how many peaked in their late epochs, and how many trained on collapsed pseudo-labels
    (raybench.trainer.health has both rules). Not converged when most of them peaked late: on a plateau one run in
    ten peaks late by chance. Collapsed when any did: a collapse is an event, not noise."""

    runs: int = 0
    late: int = 0
    collapsed: int = 0
    late_reason: str = ""
    collapse_reason: str = ""

    @classmethod
    def of(cls, summary: SweepSummary) -> RowHealth:
        runs = [r for r in summary.replicates.runs if r.status == TrialStatus.OK]
        if not runs and summary.selected is not None:
            runs = [summary.selected]
        late = [r for r in runs if r.not_converged]
        collapsed = [r for r in runs if r.pseudo_labels_collapsed]
        return cls(len(runs), len(late), len(collapsed), late[0].not_converged or "" if late else "",
                   collapsed[0].pseudo_labels_collapsed or "" if collapsed else "")

    @property
    def not_converged(self) -> bool:
        return self.runs > 0 and 2 * self.late > self.runs

    def flags(self) -> list[str]:
        """`not converged (3/3 peaked late)`, `pseudo-labels collapsed (1/3)`: what a row's reader must see."""
        flags = [f"not converged ({self.late}/{self.runs} peaked late)"] if self.not_converged else []
        return flags + ([f"pseudo-labels collapsed ({self.collapsed}/{self.runs})"] if self.collapsed else [])

    def findings(self) -> list[tuple[str, str]]:
        """(kind, detail) for each flag, with the first flagged run's own reason: a results page writes
        `kind: detail`, a comparison puts the row's name between them."""
        found = []
        if self.not_converged:
            detail = (f"{self.late} of {self.runs} runs of the selected config peaked late ({self.late_reason}); "
                      f"raise the epochs (sweep --converge)")
            found.append(("Not converged", detail))
        if self.collapsed:
            detail = f"in {self.collapsed} of {self.runs} runs of the selected config ({self.collapse_reason})"
            found.append(("Pseudo-labels collapsed", detail))
        return found

    def notices(self) -> list[str]:
        """The findings as lines of a sweep's own results."""
        return [f"{kind}: {detail}" for kind, detail in self.findings()]


def tied_trials(finished: list[TrialRecord]) -> str | None:
    """One line when two or more finished trials all scored the same selection value: the search then kept
    the first by order, not by merit, however well each trial's own epochs were chosen."""
    values = [t.selection_value for t in finished]
    if len(values) < 2 or any(v is None for v in values) or len(set(values)) > 1:
        return None
    return f"all {len(values)} trials scored the same selection value ({values[0]:.4f}): choosing among them is blind"


RANK_SPLIT = "test"  # the held-out test split: OOD test on a shift, the test split of a group benchmark


def ranking_key(columns: list[Mapping[str, Any]]) -> str:
    """The report column methods are ranked and tested on (a dataset's report columns, as summary.report keeps
    them): the first on the test split, else the last one."""
    keys = [str(column["key"]) for column in columns]
    return next((key for key in keys if key.startswith(f"{RANK_SPLIT}/")), keys[-1])


def replicate_values(runs: list[TrialRecord], key: str) -> tuple[float, ...]:
    """The finite values of `best/<key>` over the replicates that ran to their end, as summarize takes them for
    the mean and std."""
    values = [r.metrics.get(f"{BEST_PREFIX}{key}") for r in runs if r.status == TrialStatus.OK]
    return tuple(float(v) for v in values if is_finite_number(v))
