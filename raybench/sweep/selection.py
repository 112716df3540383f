"""Model selection strategies: which metric picks a trial's best epoch and the sweep's best config.

`ood_val` (default, WILDS protocol) uses the dataset's OOD-validation metric; `id_val` its
in-distribution twin; `oracle` peeks at the OOD test split and exists for analysis only.
"""
from __future__ import annotations

from dataclasses import dataclass

from raybench.data import ShiftDataset
from raybench.labels import selection_label
from raybench.registry import Registry
from raybench.words import SELECTION_RULES


@dataclass(frozen=True)
class SelectionStrategy:
    name: str
    split: str | None  # None: the dataset's own selection split (its OOD validation, or SpuCo's val)
    # Peeks at the data the result is reported on: labelled wherever it is shown, never ranked with the others.
    analysis_only: bool = False

    def metric(self, dataset: ShiftDataset) -> str:
        if self.split is None:
            return dataset.selection_metric
        if self.split not in dataset.eval_splits:
            raise ValueError(f"dataset {dataset.name!r} has no {self.split!r} split to select on")
        return f"{self.split}/{dataset.selection_metric.partition('/')[2]}"

    def label(self, dataset: ShiftDataset) -> str:
        return selection_label(self.metric(dataset), dataset.split_labels, self.analysis_only)


SELECTIONS: Registry[SelectionStrategy] = Registry("selection strategy")
for _rule in SELECTION_RULES.values():  # declared in raybench.words, where the command line reads them too
    SELECTIONS.register(_rule.name)(SelectionStrategy(_rule.name, _rule.split, _rule.analysis_only))
