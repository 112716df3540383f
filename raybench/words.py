"""The closed word lists of raybench's commands and files, each declared here once and read everywhere else.

No torch, Ray or MLflow: the command line builds its parser from these before any of them loads, and the registries
(the samplers, the selection rules, the formats) are built from them, so a word a flag accepts is always one the
code behind it knows. Adding a selection rule that is "the best value of one split" is one line here.
"""
from __future__ import annotations

from dataclasses import dataclass

EXECUTORS = ("train", "function")  # how a trial runs: a Ray Train TorchTrainer, or a plain Tune function
SAMPLERS = ("random", "tpe")  # Optuna's samplers a search draws its configs with (raybench.sweep.sampling)
SCHEDULERS = ("fifo", "asha")  # every trial to its end, or ASHA's early stops


@dataclass(frozen=True)
class SelectionRule:
    """What picks a trial's best epoch and a sweep's best config: the best value of one split's selection metric.

    `split` None is the dataset's own selection split (its OOD validation, or SpuCo's val); `analysis_only`, a rule
    that peeks at the split results are reported on, labelled wherever it is shown and never ranked with others."""

    name: str
    split: str | None
    analysis_only: bool = False


SELECTION_RULES: dict[str, SelectionRule] = {rule.name: rule for rule in (
    SelectionRule("ood_val", None),  # the WILDS protocol's, the default
    SelectionRule("id_val", "id_val"),
    SelectionRule("oracle", "test", analysis_only=True),
)}

RESULT_FORMATS = ("table", "csv", "json")  # `raybench results --format`
# `raybench compare --format`, with the file suffix a benchmark writes each one under
COMPARE_FORMATS: dict[str, str] = {"table": "txt", "csv": "csv", "json": "json", "markdown": "md", "latex": "tex"}
