"""What result tables call splits and metrics: shared by the datasets that declare them and by the tables of
summaries written before a summary carried its own labels. No torch here, so `raybench results` stays quick."""
from __future__ import annotations

from collections.abc import Mapping

# WILDS-shaped shifts: `val` and `test` are the OOD domains.
SHIFT_SPLIT_LABELS: Mapping[str, str] = {"id_val": "ID val", "val": "OOD val", "test": "OOD test", "id_test": "ID test"}
# Group-robustness benchmarks (SpuCo): one distribution, so `val` and `test` are plain validation and test.
GROUP_SPLIT_LABELS: Mapping[str, str] = {"val": "val", "test": "test"}
METRIC_LABELS: Mapping[str, str] = {"worst_group_acc": "worst-group acc", "avg_acc": "average acc"}
REPORT_SPLITS: tuple[str, ...] = ("id_test", "test")  # the splits of a paper's table (WILDS Table 2: ID, OOD)


def column_label(split: str, metric: str, split_labels: Mapping[str, str]) -> str:
    """`OOD test acc`, `test worst-group acc`."""
    return f"{split_labels.get(split, split)} {METRIC_LABELS.get(metric, metric)}"


ORACLE_NOTE = "ORACLE: selected on the test split, analysis only, not a valid protocol"


def selection_label(metric: str, split_labels: Mapping[str, str], analysis_only: bool) -> str:
    """What picked a sweep's config, in its dataset's words: `OOD val acc`, `val worst-group acc`, or `OOD test acc
    (ORACLE: ...)`. One wording for the sweep's own summary and for `raybench compare`."""
    split, _, name = metric.partition("/")
    words = column_label(split, name, split_labels)
    return f"{words} ({ORACLE_NOTE})" if analysis_only else words
