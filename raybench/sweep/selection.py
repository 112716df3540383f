"""Model selection strategies: which metric picks a trial's best epoch and the sweep's best config.

`ood_val` (default, WILDS protocol) uses the dataset's OOD-validation metric; `id_val` its
in-distribution twin; `oracle` peeks at the OOD test split and exists for analysis only.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from raybench.data import ShiftDataset
from raybench.registry import Registry


@dataclass(frozen=True)
class Selection:
    name: str
    label: str
    metric: Callable[[ShiftDataset], str]


def _on_split(split: str) -> Callable[[ShiftDataset], str]:
    def metric(dataset: ShiftDataset) -> str:
        name = dataset.selection_metric.partition("/")[2]
        if split not in dataset.eval_splits:
            raise ValueError(f"dataset {dataset.name!r} has no {split!r} split to select on")
        return f"{split}/{name}"

    return metric


SELECTIONS: Registry[Selection] = Registry("selection strategy")
SELECTIONS.register("ood_val")(Selection("ood_val", "OOD validation (WILDS protocol)", lambda d: d.selection_metric))
SELECTIONS.register("id_val")(Selection("id_val", "ID validation", _on_split("id_val")))
SELECTIONS.register("oracle")(Selection("oracle", "ORACLE: OOD test (analysis only, not a valid protocol)", _on_split("test")))
