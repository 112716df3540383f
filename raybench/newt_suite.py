"""A NeWT-style task suite: many small binary tasks cut from one domain, each scored by NeWT's probe.

Why: NeWT (Van Horn et al., 2021) judges a representation by what a linear probe reads off it on many small,
natural tasks, reported per task cluster, instead of by one large benchmark whose average hides which
distinctions a featurizer makes. Here the tasks are every pair of digits (45) in the OOD-test domain of
digits-shift (`test`, the MNIST-M-style textures), so the suite asks which digit distinctions a featurizer
keeps under a shift it was not trained on.

Clusters group tasks by the stroke families of their two digits (`STROKE_FAMILIES`): loops {0, 6, 8, 9}
(closed strokes), lines {1, 4, 7} (straight strokes), curves {2, 3, 5} (open curves). A task's cluster is its
family pair, families in alphabetical order: "loops-within" (both digits in loops, 6 tasks), "lines-within"
(3), "curves-within" (3), "curves-vs-lines" (9), "curves-vs-loops" (12), "lines-vs-loops" (12). Within-family
tasks are the fine-grained ones, as NeWT's appearance clusters are.

Data: each task draws, per class, 2 x `per_class` examples of the domain without replacement, with a generator
seeded by (seed, first digit, second digit), so a task's draw neither depends on the others nor on their order;
the first half is the task's train set, the second its test set. Train and test are disjoint examples. NeWT
uses 50-100 per class per split; digits-shift's test domain holds 93-107 per digit, so the default
`per_class` is the most it allows up to 50 (46 at data seed 0). digits-shift renders each base digit about
twice in this split (fresh texture, colours and jitter each time), so the same handwritten digit may occur in
a task's train and test under two renderings, as it may in the dataset's own id_val and id_test.

Features are computed once for every example of the domain by the featurizer `raybench train --algorithm
newt_probe` would use with the same settings (the trainer builds the model, `features_from` fills it: see
raybench/algorithms/frozen.py), on the plain view in eval mode; each task then fits NeWT's probe
(`fit_newt_probe`: GridSearchCV over C with stratified folds on its train set, refit on all of it) and is
scored by accuracy on its test set. A cluster's score is the mean over its tasks, the overall score the mean
over all tasks.
"""
from __future__ import annotations

import itertools
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import numpy as np
from sklearn.exceptions import ConvergenceWarning

from raybench.algorithms.frozen import RANDOM, featurizer_source
from raybench.algorithms.groups import parse_grid
from raybench.algorithms.newt_probe import NEWT_C_GRID, NeWTHparams, fit_newt_probe
from raybench.data.base import ShiftDataset
from raybench.trainer import ConfigError, TrainConfig, Trainer
from raybench.trainer.rng import seeded_rng

DOMAIN_SPLIT = "test"  # digits-shift's OOD-test domain, ood-test-mnistm
NEWT_MAX_PER_CLASS = 50  # the default takes as many examples per class as the domain allows, up to NeWT's 50
PROBE = "newt_probe"


@dataclass(frozen=True)
class Families:
    """Classes grouped into named families; a pair of classes belongs to the cluster of its two families."""

    members: Mapping[str, tuple[int, ...]]

    def __post_init__(self) -> None:
        classes = [c for family in self.members.values() for c in family]
        if len(classes) != len(set(classes)):
            raise ValueError(f"families: expected every class in exactly one family, got {dict(self.members)}")

    @property
    def classes(self) -> tuple[int, ...]:
        return tuple(sorted(c for family in self.members.values() for c in family))

    def family(self, label: int) -> str:
        return next(name for name, family in self.members.items() if label in family)

    def cluster(self, first: int, second: int) -> str:
        """"<family>-within" for two classes of one family, else "<a>-vs-<b>" with the families sorted."""
        a, b = sorted((self.family(first), self.family(second)))
        return f"{a}-within" if a == b else f"{a}-vs-{b}"


# Digits by stroke family (see the module docstring).
STROKE_FAMILIES = Families({"loops": (0, 6, 8, 9), "lines": (1, 4, 7), "curves": (2, 3, 5)})
# The datasets the suite has clusters for, and their families: what `--dataset` accepts.
SUITE_FAMILIES: dict[str, Families] = {"digits-shift": STROKE_FAMILIES}


@dataclass(frozen=True)
class PairTask:
    """One binary task: tell `first` from `second` (first < second)."""

    first: int
    second: int
    cluster: str

    @property
    def name(self) -> str:
        return f"{self.first}-vs-{self.second}"


def suite_tasks(families: Families) -> list[PairTask]:
    """Every pair of the families' classes, in (first, second) order, each with its cluster."""
    return [PairTask(a, b, families.cluster(a, b)) for a, b in itertools.combinations(families.classes, 2)]


@dataclass(frozen=True)
class TaskDraw:
    """A task's train and test examples, as row indices into the domain split."""

    task: PairTask
    train: np.ndarray
    test: np.ndarray


def most_per_class(y: np.ndarray, classes: Sequence[int]) -> int:
    """The largest `per_class` every class can fill twice (train and test) without reusing an example."""
    return min(int(np.sum(y == c)) for c in classes) // 2


def draw_task(task: PairTask, y: np.ndarray, per_class: int, seed: int) -> TaskDraw:
    """`per_class` train and `per_class` test examples of each of the task's classes, disjoint, drawn by a
    generator of (seed, pair) alone, so a task's examples do not depend on which other tasks run."""
    rng = np.random.default_rng([seed, task.first, task.second])
    train, test = [], []
    for label in (task.first, task.second):
        chosen = rng.permutation(np.flatnonzero(y == label))[:2 * per_class]
        if len(chosen) < 2 * per_class:
            raise ConfigError("per_class", f"expected at most {len(chosen) // 2} (class {label} has {len(chosen)} "
                                           f"examples for train and test), got {per_class}")
        train.append(chosen[:per_class])
        test.append(chosen[per_class:])
    return TaskDraw(task, np.sort(np.concatenate(train)), np.sort(np.concatenate(test)))


@dataclass(frozen=True)
class DomainFeatures:
    """Frozen features of every example of the domain split, their labels, and what made them."""

    z: np.ndarray  # (n, d) float64
    y: np.ndarray  # (n,) int
    model: str  # the registered model, resolved (the dataset's default when none was named)
    source: str  # where the featurizer's weights came from, in words
    config: TrainConfig = field(repr=False)  # the resolved newt_probe config the features were made under


def probe_config(dataset: ShiftDataset, model: str | None, features_from: str, seed: int,
                 c_grid: str = NEWT_C_GRID, folds: int = 3) -> TrainConfig:
    """The config of `raybench train --algorithm newt_probe` with these settings: it validates them (model name,
    C grid, folds) exactly as that command does, and builds the same model."""
    flat: dict[str, Any] = {"dataset": dataset.name, "algorithm": PROBE, "seed": seed,
                            "features_from": features_from, "c_grid": c_grid, "folds": folds}
    if model is not None:
        flat["model"] = model
    return TrainConfig.from_flat(flat)


def domain_features(dataset: ShiftDataset, config: TrainConfig, split: str = DOMAIN_SPLIT) -> DomainFeatures:
    """Features of every example of `split`, once, by the featurizer a newt_probe run of `config` uses.

    The trainer builds the model (the dataset's default model and its weights when none is named) right after
    seeding every stream with the run's seed, so the model is built here under that same seed: "random"
    features are then exactly the probe run's. `features_from` fills the featurizer as in the probe; the
    trainer's `predict` runs it in eval mode on the plain view, batched, on the run's device.
    """
    trainer = Trainer(config, dataset=dataset)
    with seeded_rng(trainer.config.seed):
        model = trainer.new_model()
    source = featurizer_source(model, str(trainer.config.hparams["features_from"]), trainer.config.seed)
    model.to(trainer.device)
    part = dataset.split(split)
    assert part.y is not None, f"the suite's domain split {split!r} must be labeled"
    z = trainer.predict(model.featurizer, part, dataset.views.plain)
    return DomainFeatures(z.double().numpy(), part.y.numpy(), str(trainer.config.model), source, trainer.config)


@dataclass(frozen=True)
class TaskResult:
    """One task's probe: its test accuracy, the chosen C and that C's cross-validated accuracy on train."""

    task: str
    first: int
    second: int
    cluster: str
    accuracy: float
    best_c: float
    cv_accuracy: float
    n_train: int
    n_test: int
    unconverged_fits: int  # liblinear fits (of all folds and Cs) that stopped at max_iter


def score_task(draw: TaskDraw, features: DomainFeatures, grid: Sequence[float], folds: int, seed: int) -> TaskResult:
    """NeWT's probe on the task's train examples, scored on its test examples. Convergence warnings are
    counted, not printed: 45 tasks x every C would bury the table, and the count says as much."""
    z, y = features.z, features.y
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ConvergenceWarning)
        probe = fit_newt_probe(z[draw.train], y[draw.train], grid, folds, seed)
    unconverged = sum(issubclass(w.category, ConvergenceWarning) for w in caught)
    accuracy = float(probe.pipeline.score(z[draw.test], y[draw.test]))
    task = draw.task
    return TaskResult(task.name, task.first, task.second, task.cluster, accuracy, probe.best_c, probe.best_accuracy,
                      len(draw.train), len(draw.test), unconverged)


@dataclass(frozen=True)
class SuiteSettings:
    """What a suite run is asked for; `model` and `per_class` None mean the dataset's default model and the
    most examples per class the domain allows, up to NeWT's 50."""

    dataset: str
    features_from: str = RANDOM
    model: str | None = None
    seed: int = 0
    per_class: int | None = None
    c_grid: str = NEWT_C_GRID
    folds: int = 3


@dataclass(frozen=True)
class SuiteResult:
    """A finished suite: the settings as run (model and per_class resolved), the featurizer's origin, and
    one record per task."""

    settings: SuiteSettings
    features_source: str
    tasks: list[TaskResult]

    @property
    def name(self) -> str:
        s = self.settings
        origin = s.features_from if s.features_from == RANDOM else "checkpoint"
        return f"newt-suite-{s.dataset}-{s.model}-{origin}-seed{s.seed}"

    @property
    def clusters(self) -> list[str]:
        """The clusters present: within-family ones first (the fine-grained tasks), then by name."""
        return sorted({t.cluster for t in self.tasks}, key=lambda c: (not c.endswith("-within"), c))

    @property
    def cluster_means(self) -> dict[str, float]:
        """Mean test accuracy over each cluster's tasks (unweighted: every task counts once)."""
        return {c: float(np.mean([t.accuracy for t in self.tasks if t.cluster == c])) for c in self.clusters}

    @property
    def overall_mean(self) -> float:
        """Mean over all tasks, not over clusters: the clusters hold 3 to 12 tasks."""
        return float(np.mean([t.accuracy for t in self.tasks]))

    def summary(self) -> dict[str, Any]:
        """Everything the final JSON line says."""
        return {**asdict(self.settings), "domain_split": DOMAIN_SPLIT, "features_source": self.features_source,
                "n_tasks": len(self.tasks), "cluster_means": self.cluster_means, "overall_mean": self.overall_mean,
                "tasks": [asdict(t) for t in self.tasks]}

    def table(self) -> str:
        """Cluster means and the overall mean, one line each, for a person to read."""
        s = self.settings
        lines = [(f"NeWT-style suite on {s.dataset} ({DOMAIN_SPLIT} domain): {len(self.tasks)} binary tasks, "
                 f"{s.per_class} train + {s.per_class} test examples per class; model {s.model}, "
                 f"features from {self.features_source}"),
                 f"{'cluster':<18} {'tasks':>5} {'mean acc':>9}"]
        for cluster, mean in self.cluster_means.items():
            count = sum(t.cluster == cluster for t in self.tasks)
            lines.append(f"{cluster:<18} {count:>5} {mean:>9.4f}")
        lines.append(f"{'overall':<18} {len(self.tasks):>5} {self.overall_mean:>9.4f}")
        unconverged = sum(t.unconverged_fits for t in self.tasks)
        if unconverged:
            lines.append(f"({unconverged} of the probes' liblinear fits stopped at max_iter before converging)")
        return "\n".join(lines)


def run_suite(dataset: ShiftDataset, settings: SuiteSettings, families: Families = STROKE_FAMILIES) -> SuiteResult:
    """Features once, then every task of `families` drawn, probed and scored. A bad setting (model, checkpoint,
    per_class, C grid, folds) is a ConfigError naming it, raised before any probe is fit."""
    config = probe_config(dataset, settings.model, settings.features_from, settings.seed, settings.c_grid,
                          settings.folds)
    features = domain_features(dataset, config)
    per_class = check_per_class(settings.per_class, features.y, families, settings.folds)
    hparams = features.config.typed_hparams
    assert isinstance(hparams, NeWTHparams)  # probe_config's algorithm is PROBE
    grid = parse_grid(hparams.c_grid, "c_grid")
    draws = [draw_task(task, features.y, per_class, settings.seed) for task in suite_tasks(families)]
    tasks = [score_task(draw, features, grid, hparams.folds, settings.seed) for draw in draws]
    return SuiteResult(replace(settings, model=features.model, per_class=per_class), features.source, tasks)


# ----- the suite in MLflow -----------------------------------------------------------------------------------
SUITE_STAGE = "newt_suite"  # the `stage` tag of a suite's parent run
SUITE_TASK_STAGE = "newt_task"  # and of each task's run under it


def suite_params(result: SuiteResult) -> dict[str, Any]:
    """What a suite run was asked for, as the parent run's params (model and per_class as run)."""
    s = result.settings
    return {"dataset": s.dataset, "model": s.model, "features_from": s.features_from, "seed": s.seed,
            "per_class": s.per_class, "c_grid": s.c_grid, "folds": s.folds, "n_tasks": len(result.tasks)}


def suite_metrics(result: SuiteResult) -> dict[str, float]:
    """The suite's headline numbers: mean test accuracy per cluster (`accuracy/<cluster>`) and overall."""
    return {**{f"accuracy/{cluster}": mean for cluster, mean in result.cluster_means.items()},
            "accuracy/overall": result.overall_mean}


def task_params(task: TaskResult) -> dict[str, Any]:
    return {"pair": task.task, "first": task.first, "second": task.second, "cluster": task.cluster,
            "n_train": task.n_train, "n_test": task.n_test}


def task_metrics(task: TaskResult) -> dict[str, float]:
    return {"accuracy": task.accuracy, "best_c": task.best_c, "cv_accuracy": task.cv_accuracy,
            "unconverged_fits": task.unconverged_fits}


def log_task_suite(uri: str, result: SuiteResult, experiment: str | None = None) -> str:
    """A finished suite as one parent run (settings, cluster and overall means) with one nested run per task
    (its pair, cluster, accuracy, chosen C, cross-validated accuracy), in `experiment` (raybench's by default);
    returns the parent's run id. Every run is new: a suite takes a minute, so a re-run is a fresh measurement,
    not a resumption; a failure half way marks the parent FAILED (RunWriter.log_run_group). MLflow is imported
    here, when the suite has run, not when the command starts."""
    from raybench.tracking import EXPERIMENT, STAGE_TAG, RunRecord, RunWriter, base_tags

    s = result.settings
    parent = RunRecord(result.name, suite_params(result), suite_metrics(result), {
        **base_tags(s.dataset, PROBE), STAGE_TAG: SUITE_STAGE, "model": str(s.model),
        "features_source": result.features_source[:5000]})
    tasks = [RunRecord(f"{task.task} ({task.cluster})", task_params(task), task_metrics(task),
                       {STAGE_TAG: SUITE_TASK_STAGE, "cluster": task.cluster}, key=f"{result.name}/{task.task}")
             for task in result.tasks]
    return RunWriter(uri, experiment or EXPERIMENT).log_run_group(parent, tasks)


def check_per_class(per_class: int | None, y: np.ndarray, families: Families, folds: int) -> int:
    """`per_class`, or the default (the most the domain allows, up to NeWT's 50); it must fill train and test
    without reusing an example, and every cross-validation fold needs an example of each class."""
    most = most_per_class(y, families.classes)
    if per_class is None:
        per_class = min(NEWT_MAX_PER_CLASS, most)
    if not folds <= per_class <= most:
        raise ConfigError("per_class", f"expected an integer from {folds} (the probe's folds) to {most} (half the "
                                       f"fewest examples of a class in the {DOMAIN_SPLIT} split), got {per_class}")
    return per_class
