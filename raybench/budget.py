"""A run's training budget, counted the way the WILDS 2.0 protocol counts it, and the protocol's own rule.

WILDS 2.0 App. D gives a method with unlabeled data `ceil(factor x E / (k + 1))` epochs (factor 2, Noisy
Student 1 per teacher-student iteration), where an epoch is one pass over the labeled data at
`B / (k + 1)` labeled examples a batch. So such a method takes about 2x ERM's steps (batches of B rows) at
every ratio k, while it passes over the labeled data only ceil(2E / (k + 1)) times. A shortened run keeps those ratios only if it shortens every method's epoch by the same
share of the labeled data (`epoch_fraction`); a flat cap on steps per epoch (`max_steps_per_epoch`) cuts
the unlabeled methods' longer epochs far more than ERM's, and is for smoke runs only.

`Budget` is what a run plans before its first step; the trainer counts what it actually ran beside it
(`Spent`), and both travel in every epoch's metrics under `budget/`, so results, MLflow and `compare`
can show, and check, what each method got.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

BUDGET_PREFIX = "budget/"


def epoch_steps(n: int, batch_size: int, epoch_fraction: float | None, cap: int | None) -> int:
    """Steps of one epoch: full batches over `epoch_fraction` of the `n` examples, then the smoke cap."""
    covered = math.ceil(epoch_fraction * n) if epoch_fraction else n
    steps = max(covered // batch_size, 1)
    return min(steps, cap) if cap else steps


@dataclass(frozen=True)
class ProtocolRule:
    """What the WILDS rule gives one method: `epochs` per round (ERM's E, or ceil(factor x E / (k + 1)) with
    unlabeled data) over `rounds` rounds, each epoch a pass over `epoch_fraction` of the labeled data."""

    erm_epochs: int
    uses_unlabeled: bool
    unlabeled_ratio: int
    factor: float
    rounds: int

    @property
    def epochs(self) -> int:
        if not self.uses_unlabeled:
            return self.erm_epochs
        return max(1, math.ceil(self.factor * self.erm_epochs / (self.unlabeled_ratio + 1)))

    def steps(self, n_labeled: int, labeled_batch: int, epoch_fraction: float | None) -> int:
        """The protocol's steps for this method: its epochs x rounds, each uncapped at its labeled batch."""
        return self.epochs * self.rounds * epoch_steps(n_labeled, labeled_batch, epoch_fraction, None)


class StepRatios:
    """The two ratios a budget is judged by, for any record with `steps`, `protocol_steps` and `erm_steps`."""

    steps: float
    protocol_steps: float
    erm_steps: float

    @property
    def protocol_ratio(self) -> float:
        """1.0 when the run gets exactly what the protocol gives it; a flat per-epoch cap makes it smaller."""
        return self.steps / self.protocol_steps if self.protocol_steps else float("nan")

    @property
    def erm_ratio(self) -> float:
        """About 2 for a method with unlabeled data at the protocol's budget, 1 for one without."""
        return self.steps / self.erm_steps if self.erm_steps else float("nan")


@dataclass(frozen=True)
class Budget(StepRatios):
    """What a run plans: `steps` batches (labeled + unlabeled rows each), `optimizer_steps` after gradient
    accumulation, the labeled and unlabeled examples those batches hold, the passes over the labeled split
    that makes, `protocol_steps`, the steps the WILDS rule gives this method at the same epoch share, and
    `erm_steps`, what it gives ERM there (full batches of labeled rows, the dataset's epochs)."""

    steps: int
    optimizer_steps: int
    labeled_examples: int
    unlabeled_examples: int
    labeled_passes: float
    protocol_steps: int
    erm_steps: int

    def metrics(self) -> dict[str, float]:
        return {f"{BUDGET_PREFIX}planned_{name}": float(value) for name, value in (
            ("steps", self.steps), ("optimizer_steps", self.optimizer_steps),
            ("labeled_examples", self.labeled_examples), ("unlabeled_examples", self.unlabeled_examples),
            ("labeled_passes", self.labeled_passes), ("protocol_steps", self.protocol_steps),
            ("erm_steps", self.erm_steps))}


def plan(steps_per_epoch: int, epochs: int, rounds: int, grad_accum: int, labeled_batch: int, unlabeled_batch: int,
         n_labeled: int, protocol_steps: int, erm_steps: int) -> Budget:
    """The budget of `rounds` x `epochs` epochs of `steps_per_epoch` steps; accumulation steps the optimiser
    every `grad_accum` batches and at each epoch's end (as the loop does)."""
    steps = steps_per_epoch * epochs * rounds
    labeled = steps * labeled_batch
    return Budget(steps=steps, optimizer_steps=math.ceil(steps_per_epoch / grad_accum) * epochs * rounds,
                  labeled_examples=labeled, unlabeled_examples=steps * unlabeled_batch,
                  labeled_passes=labeled / n_labeled if n_labeled else 0.0, protocol_steps=protocol_steps,
                  erm_steps=erm_steps)


@dataclass
class Spent:
    """What the loop actually ran so far (resumable: part of the trainer's progress). Examples count the global
    batch, every data-parallel rank's rows together."""

    steps: int = 0
    optimizer_steps: int = 0
    labeled_examples: int = 0
    unlabeled_examples: int = 0

    def metrics(self, n_labeled: int) -> dict[str, float]:
        passes = self.labeled_examples / n_labeled if n_labeled else 0.0
        return {f"{BUDGET_PREFIX}steps": float(self.steps), f"{BUDGET_PREFIX}optimizer_steps": float(self.optimizer_steps),
                f"{BUDGET_PREFIX}labeled_examples": float(self.labeled_examples),
                f"{BUDGET_PREFIX}unlabeled_examples": float(self.unlabeled_examples),
                f"{BUDGET_PREFIX}labeled_passes": passes}


def ratio_text(ratio: float) -> str:
    """A budget ratio that never reads 0.00: two places from 0.1 up, two significant digits below."""
    return f"{ratio:.2f}" if ratio >= 0.1 or ratio == 0 else f"{ratio:.2g}"
