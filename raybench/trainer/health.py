"""Two checks on what a run's selected epoch can be trusted for, made where the run's history is: whether it had
converged, and whether the pseudo-labels that trained it had collapsed onto a class.

Both are facts the trainer reports about itself (`info/not_converged`, `info/pseudo_labels`,
`info/pseudo_labels_collapsed`), as it reports a blind selection; the sweep carries them into each trial's record,
and `results` and `compare` mark the rows (docs/concepts/selection.md states both rules).

- **Convergence.** WILDS 2.0 sets each dataset's epochs "with some upwards adjustments ... if we found that the
  best hyperparameter configuration had not converged on the validation set" (App. D). A run that ran its whole
  budget and scored its best epoch in the last `LATE_SHARE` of its epochs was still improving when the budget
  ended: its number says what the budget allowed, not what the method reaches.
- **Pseudo-label health.** A self-training method whose teacher (or whose own confident predictions) labels
  nearly every unlabeled row with one class learns that class: its accuracy then says nothing about the method.
  Each epoch's kept pseudo-labels are counted per class on the device (`PSEUDO_CLASSES`); a class holding more
  than its limit share (twice its share of the labeled training set, or halfway from that share to all of
  them, whichever is smaller, so that a binary task can collapse too) at the selected epoch is a collapse.
"""
from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from raybench.report_keys import PSEUDO_CLASSES, PSEUDO_KEPT

LATE_SHARE = 0.10  # a best epoch in the last 10 % of a run's epochs: not converged
MIN_JUDGED_PER_CLASS = 5  # an epoch with fewer kept pseudo-labels than 5 per class is too thin to call a collapse


def late_epochs(epochs: int) -> int:
    """How many of a round's last epochs count as late: ceil(10 %), at least one (of 10 epochs the last; of 30
    the last 3)."""
    return max(1, math.ceil(LATE_SHARE * epochs))


def convergence_note(best_round_epoch: int, round_epochs: int) -> str | None:
    """Why a run that ran all `round_epochs` of its round had not converged, or None: its best epoch (0-based in
    the round) fell in the round's late epochs. A round of one epoch (a closed-form refit) has nothing to say."""
    if round_epochs < 2 or best_round_epoch < round_epochs - late_epochs(round_epochs):
        return None
    return (f"best epoch {best_round_epoch + 1} of {round_epochs} is in its last {LATE_SHARE:.0%} of epochs: "
            f"the selection metric was still rising when the budget ended")


def class_prior(labels: Sequence[int], n_classes: int) -> tuple[float, ...]:
    """Each class's share of the labeled training set: what a healthy pseudo-labeller is measured against."""
    counts = [0] * n_classes
    for label in labels:
        counts[int(label)] += 1
    total = max(sum(counts), 1)
    return tuple(c / total for c in counts)


def collapse_limit(prior: float) -> float:
    """The largest share a class may hold of the kept pseudo-labels before they count as collapsed onto it."""
    return min(2.0 * prior, (1.0 + prior) / 2.0)


@dataclass(frozen=True)
class PseudoLabelHealth:
    """One epoch's pseudo-labels, from its train metrics: the share of unlabeled rows kept and each class's kept
    labels (mean per step; `steps` gives the epoch's total)."""

    kept: float | None
    counts: tuple[float, ...]
    prior: tuple[float, ...]
    steps: int

    @classmethod
    def of(cls, metrics: Mapping[str, float], prior: Sequence[float], steps: int) -> PseudoLabelHealth | None:
        """From one epoch's metrics (`train/pseudo/kept`, `train/pseudo/classes/<c>`), None when it has none."""
        counts = tuple(float(metrics.get(f"train/{PSEUDO_CLASSES}/{c}", 0.0)) for c in range(len(prior)))
        kept = metrics.get(f"train/{PSEUDO_KEPT}")
        if kept is None and not any(f"train/{PSEUDO_CLASSES}/" in key for key in metrics):
            return None
        return cls(None if kept is None else float(kept), counts, tuple(prior), steps)

    @property
    def labelled(self) -> int:
        """The epoch's kept pseudo-labels."""
        return round(sum(self.counts) * self.steps)

    @property
    def top(self) -> tuple[int, float]:
        """(class, its share of the kept pseudo-labels) of the most frequent class."""
        total = sum(self.counts)
        best = max(range(len(self.counts)), key=lambda c: self.counts[c])
        return best, (self.counts[best] / total if total > 0 else 0.0)

    @property
    def judged(self) -> bool:
        return bool(self.prior) and self.labelled >= MIN_JUDGED_PER_CLASS * len(self.prior)

    @property
    def collapse(self) -> str | None:
        """Why these pseudo-labels count as collapsed, or None."""
        if not self.judged:
            return None
        label, share = self.top
        limit = collapse_limit(self.prior[label])
        if share <= limit:
            return None
        return (f"class {label} holds {share:.1%} of the {self.labelled:,} kept pseudo-labels at the selected epoch, "
                f"against {self.prior[label]:.1%} of the labeled training set (limit {limit:.1%})")

    def describe(self) -> str:
        """One line for the trial's record: `kept 54.2 % of unlabeled rows; 9,120 labels, most class 7 (14.1 %,
        prior 10.0 %)`."""
        parts = [] if self.kept is None else [f"kept {self.kept:.1%} of unlabeled rows"]
        if self.prior:
            label, share = self.top
            parts.append(f"{self.labelled:,} labels, most class {label} ({share:.1%}, prior {self.prior[label]:.1%})"
                         + ("" if self.judged else "; too few to judge a collapse"))
        return "; ".join(parts)
