"""The closed word lists of raybench's commands and files, each declared here once and read everywhere else.

No torch, Ray or MLflow: the command line builds its parser from these before any of them loads, and the registries
(the samplers, the selection rules) are built from them, so a word a flag accepts is always one the code behind it
knows. Adding a selection rule that is "the best value of one split" is one line here. The output formats are the
one list kept elsewhere: their registry (raybench.report.renderers.FORMATS) is their definition.
"""
from __future__ import annotations

from dataclasses import dataclass

EXECUTORS = ("train", "function")  # how a trial runs: a Ray Train TorchTrainer, or a plain Tune function
SAMPLERS = ("random", "tpe")  # Optuna's samplers a search draws its configs with (raybench.sweep.sampling)
SCHEDULERS = ("fifo", "asha")  # every trial to its end, or ASHA's early stops
# The two stages of a sweep, each a Tune experiment of its own: the search over configs, then the selected config's
# seed replicates. Their runs in MLflow carry the word as their stage tag (raybench.tracking.names).
SEARCH_STAGE = "search"
REPLICATE_STAGE = "replicate"


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

# The output formats are not listed here: each is a class registered by name in raybench.report.renderers.FORMATS,
# with its file suffix, and `results --format`, `compare --format` and a benchmark's files read that registry.
