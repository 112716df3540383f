"""`TrainConfig`: one flat, typed record of everything that defines a training run.

Flat on purpose: a Tune trial config, a `--set key=value` list and a YAML search space all map onto it
directly. Keys that are not fields are the algorithm's hyperparameters, validated against its
`Hparams` dataclass. Unset fields (None) take the dataset's defaults in `resolve`.
"""
from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Mapping, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from raybench.algorithms import ALGORITHMS
from raybench.algorithms.base import Hparams, coerce
from raybench.budget import Budget, ProtocolRule, epoch_steps, plan
from raybench.data.base import ShiftDataset
from raybench.errors import ConfigError
from raybench.models import MODELS, ModelSpec, build_model
from raybench.settings import (
    AT_LEAST_ONE,
    AT_LEAST_TWO,
    COUNT,
    NON_NEGATIVE,
    POSITIVE,
    SEED,
    Allowed,
    FieldType,
    find_problem,
    setting,
)
from raybench.trainer.optim import OPTIMIZER_IMPLS, OPTIMIZERS, SCHEDULES, impl_problem

DEVICE_PATTERN = re.compile(r"cuda(?::(\d+))?")
MAX_INPUT_SIZE = 16_384  # px a side: WILDS reads at most 448 (iWildCam); past this no image fits in memory
DEVICE_PATTERN_TEXT = r"auto|cpu|" + DEVICE_PATTERN.pattern
MEMORY_FORMATS = ("auto", "channels_last", "contiguous")
COMPILE_MODES = ("none", "default", "reduce-overhead")  # torch.compile's modes the trainer offers
IMAGE_DECODINGS = ("host", "device")


@dataclass
class TrainConfig:
    """Every field below is one setting; `setting(...)` declares its range (checked in `validate`) and help line."""

    dataset: str = setting("digits-shift", help="a registered dataset (raybench list datasets)")
    algorithm: str = setting("erm", help="a registered algorithm (raybench list algorithms)")
    model: str | None = setting(None, help="a registered model (raybench list models); none: the dataset's")
    model_weights: str | None = setting(None, help="pretrained weights of the model (a local file or folder); "
                                                      "none: the dataset's for its default model")
    optimizer: str | None = setting(None, allowed=Allowed(choices=tuple(OPTIMIZERS)),
                                       help="none: the dataset's")
    lr: float | None = setting(None, allowed=POSITIVE, help="learning rate; none: the dataset's")
    weight_decay: float | None = setting(None, allowed=NON_NEGATIVE, help="none: the dataset's")
    momentum: float | None = setting(None, allowed=NON_NEGATIVE, help="SGD and LARS momentum; none: the dataset's")
    scheduler: str | None = setting(None, allowed=Allowed(choices=tuple(k for k in SCHEDULES if k is not None)),
                                       help="learning-rate schedule; none: the dataset's (often constant)")
    batch_size: int | None = setting(None, allowed=AT_LEAST_TWO, help="labeled + unlabeled examples per step; "
                                                                           "none: the dataset's")
    unlabeled_ratio: int | None = setting(None, allowed=AT_LEAST_ONE, help="k: k unlabeled per labeled example in a "
                                                                              "batch; none: the dataset's")
    unlabeled_split: str | None = setting(None, help="the split unlabeled batches come from; a+b: several joined, "
                                                        "all_unlabeled: every one; none: the dataset's")
    epochs: int | None = setting(None, allowed=AT_LEAST_ONE, help="passes over the labeled data; none: the "
                                                                     "dataset's")
    grad_accum: int = setting(1, allowed=AT_LEAST_ONE, help="batches accumulated per optimiser step")
    grad_clip: float | None = setting(None, allowed=NON_NEGATIVE, help="gradient-norm clip; 0: no clipping; none: "
                                                                          "the dataset's")
    patience: int | None = setting(None, allowed=AT_LEAST_ONE, help="early stopping: epochs without a better "
                                                                       "selection metric; none: never stop early")
    seed: int = setting(0, allowed=SEED, help="seeds the model, the batches and the augmentation")
    epoch_fraction: float | None = setting(None, allowed=Allowed(low=0.0, high=1.0, low_open=True),
                                              help="each epoch covers this share of the labeled training data, for "
                                                   "every method alike: the fair way to shorten runs (the WILDS "
                                                   "budget ratios hold); none: whole epochs")
    max_steps_per_epoch: int | None = setting(None, allowed=AT_LEAST_ONE,
                                                 help="smoke runs only: cut every epoch at N steps, whatever the "
                                                      "method (breaks the protocol's budget ratios; see "
                                                      "epoch_fraction)")
    selection_metric: str | None = setting(None, help="split/metric that picks the best epoch; none: the dataset's")
    data_dir: str | None = setting(None, help="where datasets are cached; none: $RAYBENCH_DATA_DIR or the default")
    data_seed: int = setting(0, allowed=SEED, help="seeds the generated datasets (digits-shift, spuco-*)")
    stage_cache: str | None = setting(None, help="folder where earlier stages (reference models, pre-training) "
                                                    "are cached")
    device: str = setting("auto", allowed=Allowed(pattern=DEVICE_PATTERN_TEXT, words="auto, cpu or cuda[:N]"),
                          help="auto: a GPU when there is one")
    eval_batch_size: int = setting(512, allowed=AT_LEAST_ONE, help="examples per evaluation batch")
    memory_format: str = setting("auto", allowed=Allowed(choices=MEMORY_FORMATS),
                                 help="how convolution weights are laid out in memory; auto: channels_last on a "
                                      "CPU (oneDNN's faster layout for convolutions), contiguous on a GPU")
    compile: str = setting("none", allowed=Allowed(choices=COMPILE_MODES),
                           help="torch.compile the model's featurizer and head; reduce-overhead adds CUDA graphs, for "
                                "small launch-bound batches on a GPU; none: eager")
    optimizer_impl: str = setting("auto", allowed=Allowed(choices=OPTIMIZER_IMPLS),
                                  help="PyTorch's implementation of sgd/adam/adamw; auto: fused where PyTorch has it "
                                       "(it skips a non-finite update on the device), else foreach")
    divergence_check_every: int = setting(0, allowed=COUNT,
                                          help="steps between the host's reads of the device's non-finite-loss flag; "
                                               "0: at each epoch's end (a bad update is skipped on the device either "
                                               "way)")
    image_decoding: str = setting("host", allowed=Allowed(choices=IMAGE_DECODINGS),
                                  help="where a WILDS dataset's JPEG files are decoded: host threads, or the training "
                                       "device (nvJPEG on a GPU)")
    prefetch: int = setting(2, allowed=COUNT, help="batches read ahead of the step computing when inputs "
                                                            "come from disk; 0: read on demand")
    input_size: int | None = setting(None, allowed=Allowed(low=8, limit=MAX_INPUT_SIZE), help="images read and models built at N x N "
                                                                           "(WILDS datasets); none: the dataset's")
    hparams: dict[str, Any] = field(default_factory=dict)
    _parsed: ClassVar[tuple[str, dict[str, Any], Hparams] | None] = None  # typed_hparams' memo, set per instance

    @property
    def typed_hparams(self) -> Hparams:
        """The algorithm's typed hyperparameters, parsed once: the checks, the epoch plan, the budget and the trainer
        all read them, and a parse coerces and range-checks every field. The memo is kept only while `algorithm`
        and `hparams` still hold what it was parsed from. ValueError for a value its field refuses."""
        memo = self._parsed
        if memo is not None and memo[0] == self.algorithm and memo[1] == self.hparams:
            return memo[2]
        parsed = ALGORITHMS.get(self.algorithm).Hparams.from_dict(self.hparams, self.algorithm)
        self._parsed = (self.algorithm, dict(self.hparams), parsed)
        return parsed

    @classmethod
    def field_names(cls) -> list[str]:
        return [f.name for f in dataclasses.fields(cls) if f.name != "hparams"]

    @classmethod
    def from_flat(cls, values: dict[str, Any]) -> TrainConfig:
        """Split a flat dict into fields and algorithm hyperparameters, coercing and validating both."""
        types = {f.name: f.type for f in dataclasses.fields(cls)}
        known = {k: v for k, v in values.items() if k in types and k != "hparams"}
        given = values.get("hparams", {})
        if not isinstance(given, Mapping):  # `--set hparams=x`: the algorithm's settings go by their own names
            raise ConfigError("hparams", f"expected a mapping of hyperparameters, got a {type(given).__name__}")
        hparams = {**given, **{k: v for k, v in values.items() if k not in types}}
        fields = {}
        for key, value in known.items():
            refuse_non_scalar(key, value, types[key])
            refuse_bool(key, value, types[key])
            try:
                fields[key] = coerce(value, types[key], key)
            except ValueError as err:
                raise ConfigError(key, str(err).partition(": ")[2]) from None
        config = cls(**fields, hparams=hparams)
        config.validate()
        return config

    def to_flat(self) -> dict[str, Any]:
        flat = {k: getattr(self, k) for k in self.field_names()}
        return {**flat, **self.hparams}

    def validate(self) -> None:
        """Range checks and a dry parse of the hyperparameters, so errors appear before any work."""
        if self.algorithm not in ALGORITHMS:
            raise ConfigError("algorithm", f"expected one of {', '.join(ALGORITHMS.names())}, got {self.algorithm!r}")
        types = {f.name: f.type for f in dataclasses.fields(self)}
        for key in self.field_names():
            refuse_non_scalar(key, getattr(self, key), types[key])
            refuse_bool(key, getattr(self, key), types[key])
        problem = find_problem(self)  # the ranges declared on the fields
        if problem:
            raise ConfigError(problem.name, problem.detail)
        for key in self.field_names():  # float settings declared without a range
            refuse_non_finite(key, getattr(self, key))
        impl = impl_problem(self.optimizer, self.optimizer_impl) if self.optimizer else None
        if impl:
            raise ConfigError("optimizer_impl", impl)
        hparam_types = {f.name: f.type for f in dataclasses.fields(ALGORITHMS.get(self.algorithm).Hparams)}
        for key, value in self.hparams.items():
            if key not in hparam_types:
                known = ", ".join(hparam_types) or "(none)"
                raise ConfigError(key, f"not a setting of the trainer nor a hyperparameter of {self.algorithm!r} (its hyperparameters: {known})")
            refuse_non_scalar(key, value, hparam_types[key])
            refuse_bool(key, value, hparam_types[key])
            try:
                coerced = coerce(value, hparam_types[key], key)
            except ValueError as err:
                raise ConfigError(key, str(err).partition(": ")[2]) from None
            refuse_non_finite(key, coerced)
        try:  # the ranges declared on its fields and its own checks (e.g. DFR's C grid), before any work
            self.typed_hparams  # noqa: B018  parsed for its checks (and kept for every later reader)
        except ValueError as err:
            key, _, detail = str(err).partition(": ")
            raise ConfigError(key, detail) from None

    def check_device_available(self) -> None:
        """Refuse a `cuda[:N]` device this machine lacks, in one line, before any data is read.

        Not part of `validate`: a sweep driver may lack the GPUs its Ray workers have, so only the process
        that trains (`raybench train`) should call this.
        """
        match = DEVICE_PATTERN.fullmatch(self.device)
        if match is None:
            return
        import torch

        if not torch.cuda.is_available():
            raise ConfigError("device", f"expected a CUDA GPU for {self.device!r}, got none on this machine "
                                        f"(torch.cuda.is_available() is False)")
        index, count = int(match.group(1) or 0), torch.cuda.device_count()
        if index >= count:
            plural = "s" if count != 1 else ""
            raise ConfigError("device", f"expected a GPU index below {count} ({count} CUDA device{plural} here), "
                                        f"got {self.device!r}")

    def resolve(self, dataset: ShiftDataset) -> TrainConfig:
        """A copy with every unset field taken from the dataset's defaults."""
        defaults = dataset.defaults
        filled = {
            name: getattr(defaults, name)
            for name in ("model", "optimizer", "lr", "weight_decay", "momentum", "scheduler", "batch_size",
                         "unlabeled_ratio", "unlabeled_split", "epochs", "grad_clip")
            if getattr(self, name) is None
        }
        if self.scheduler is None and defaults.scheduler is None:  # the method's own, as the authors' code has it
            filled["scheduler"] = ALGORITHMS.get(self.algorithm).default_scheduler
        if self.model_weights is None and filled.get("model", self.model) == defaults.model:
            filled["model_weights"] = defaults.model_weights  # the default model's weights, never another model's
        if self.selection_metric is None:
            filled["selection_metric"] = dataset.selection_metric
        hparams = {**_augment_default(self.algorithm, dataset), **defaults.algorithm_hparams.get(self.algorithm, {}),
                   **self.hparams}
        resolved = dataclasses.replace(self, **filled, hparams=hparams)
        resolved.validate()
        resolved.check_against(dataset)
        return resolved

    def check_against(self, dataset: ShiftDataset) -> None:
        algorithm = ALGORITHMS.get(self.algorithm)
        reason = algorithm.inapplicable_reason(self.typed_hparams,
                                               dataset.task.kind, dataset.capabilities)
        if reason:
            raise ConfigError("algorithm", f"{self.algorithm!r} cannot run on {dataset.name!r}: {reason}")
        if algorithm.dataset_settings and self.algorithm not in dataset.defaults.algorithm_hparams:
            raise ConfigError("algorithm", f"{self.algorithm!r} cannot run on {dataset.name!r}: the dataset declares no "
                                           f"{self.algorithm} settings ({algorithm.dataset_settings}; datasets.yaml "
                                           f"algorithm_hparams.{self.algorithm} for WILDS datasets)")
        if self.input_size is not None:
            try:
                dataset.at_input_size(self.input_size)
            except ValueError as err:
                raise ConfigError("input_size", str(err)) from None
        if self.image_decoding == "device":
            import torch

            try:
                dataset.decoding_on(torch.device("cpu"))
            except ValueError as err:
                raise ConfigError("image_decoding", str(err)) from None
        if self.model not in MODELS:
            raise ConfigError("model", f"expected one of {', '.join(MODELS.names())}, got {self.model!r}")
        needed = ALGORITHMS.get(self.algorithm).models
        if needed is not None and self.model not in needed:
            raise ConfigError("model", f"{self.algorithm!r} runs on {' or '.join(sorted(needed))}, got {self.model!r}")
        split, _, metric = (self.selection_metric or "").partition("/")
        if split not in dataset.eval_splits or metric not in dataset.metric_names:
            options = [f"{s}/{m}" for s in dataset.eval_splits for m in dataset.metric_names]
            raise ConfigError("selection_metric", f"expected one of {', '.join(options)}, got {self.selection_metric!r}")
        if ALGORITHMS.get(self.algorithm).uses_unlabeled and not dataset.has_split(self.unlabeled_split):
            options = ", ".join(s for s in dataset.splits if not dataset.splits[s].labeled)
            joins = " (or several joined by '+', e.g. a+b, or all_unlabeled for every one)" if options else ""
            why = f" (unlabeled data {dataset.info['unlabeled']})" if "unlabeled" in dataset.info else ""
            raise ConfigError("unlabeled_split", f"expected one of {options or '(none)'}{joins}, got {self.unlabeled_split!r}{why}")

    def check_model_builds(self, dataset: ShiftDataset) -> None:
        """Build the model once, reading its weights, so a missing or wrong `model_weights` (e.g. the text
        datasets' transformers folder) is one line before Ray starts, not a failed trial on a cluster."""
        shape = dataset.at_input_size(self.input_size).input_shape if self.input_size else dataset.input_shape
        weights = Path(self.model_weights) if self.model_weights else None
        try:
            build_model(str(self.model), ModelSpec(shape, dataset.task.n_outputs, weights, dataset.input_layout))
        except (ValueError, OSError) as err:
            raise ConfigError("model_weights", str(err)) from None

    def epoch_plan(self, dataset: ShiftDataset, epoch_examples: int | None = None) -> EpochPlan:
        """Batch sizes and steps of one epoch of this (resolved) config on `dataset`, as the trainer runs it:
        a pass over the training split, or over `epoch_examples` when the algorithm's sampling says so."""
        algorithm = ALGORITHMS.get(self.algorithm)
        if algorithm.is_pretext(self.typed_hparams):  # every row unlabeled, and an epoch is one pass over them
            assert self.batch_size is not None and self.unlabeled_split is not None
            steps = epoch_steps(len(dataset.split(self.unlabeled_split)), self.batch_size, None, self.max_steps_per_epoch)
            return EpochPlan(0, self.batch_size, steps, pretext=True)
        labeled, unlabeled = self.batch_sizes(algorithm.uses_unlabeled)
        examples = epoch_examples or len(dataset.split("train"))
        steps = epoch_steps(examples, labeled, self.epoch_fraction, self.max_steps_per_epoch)
        return EpochPlan(labeled, unlabeled, steps, pretext=False)

    def budget(self, dataset: ShiftDataset, epoch_examples: int | None = None) -> Budget:
        """What this (resolved) config plans to train, beside what the WILDS rule gives its method at the same
        epoch share (raybench/budget.py): known before any step, so `space show` can print it."""
        algorithm = ALGORITHMS.get(self.algorithm)
        rounds = algorithm.rounds_for(self.typed_hparams)
        epoch = self.epoch_plan(dataset, epoch_examples)
        n_labeled, epochs = len(dataset.split("train")), int(self.epochs or 1)
        if epoch.pretext:  # a pre-training stage has its own budget: the one it plans
            protocol = epoch.steps * epochs * rounds
        else:
            rule = ProtocolRule(erm_epochs=dataset.defaults.epochs, uses_unlabeled=algorithm.uses_unlabeled,
                                unlabeled_ratio=int(self.unlabeled_ratio or 1), factor=algorithm.ratio_epochs_factor,
                                rounds=rounds)
            protocol = rule.steps(n_labeled, epoch.labeled_batch, self.epoch_fraction)
        erm = ProtocolRule(dataset.defaults.epochs, uses_unlabeled=False, unlabeled_ratio=1, factor=1.0, rounds=1)
        erm_steps = erm.steps(n_labeled, int(self.batch_size or 1), self.epoch_fraction)
        return plan(epoch.steps, epochs, rounds, self.grad_accum, epoch.labeled_batch, epoch.unlabeled_batch,
                    n_labeled, protocol, erm_steps)

    def batch_sizes(self, uses_unlabeled: bool) -> tuple[int, int]:
        """(labeled, unlabeled) per batch: unlabeled = int(k/(k+1) B), labeled = B - unlabeled (WILDS 2.0 App. D)."""
        assert self.batch_size is not None and self.unlabeled_ratio is not None
        if not uses_unlabeled:
            return self.batch_size, 0
        k = self.unlabeled_ratio
        unlabeled = int(k / (k + 1) * self.batch_size)
        return self.batch_size - unlabeled, unlabeled


@dataclass(frozen=True)
class EpochPlan:
    """One epoch's shape: labeled and unlabeled rows a batch, and steps (a pretext epoch passes the unlabeled split)."""

    labeled_batch: int
    unlabeled_batch: int
    steps: int
    pretext: bool


def numeric_kind(annotation: Any) -> str | None:
    """"int" or "float" when `coerce` would turn a value into that number type, else None (as coerce reads types)."""
    kind = str(annotation).replace("typing.", "")
    base = next((t for t in ("bool", "int", "float", "str") if t in kind), "str")
    return base if base in ("int", "float") else None


def refuse_non_scalar(key: str, value: Any, annotation: Any) -> None:
    """A list or mapping (YAML `[a, b]`, `{a: 1}`) where one name or number belongs: `coerce` would turn it into
    its text ("['a']") and the mistake would surface as a failed trial on the cluster, or not at all."""
    container = isinstance(value, (Mapping, AbstractSet)) or (isinstance(value, Sequence)
                                                              and not isinstance(value, str))
    if container:
        kind = FieldType.of(annotation)
        raise ConfigError(key, f"expected one value ({kind.text}), got a {type(value).__name__} "
                               f"({_short(repr(value))})")


def _short(text: str, length: int = 60) -> str:
    return text if len(text) <= length else f"{text[:length]}... ({len(text):,} characters)"


def refuse_bool(key: str, value: Any, annotation: Any) -> None:
    """A YAML `true` where a number belongs is a typo, not 1: `coerce` alone would quietly turn it into 1 or 1.0."""
    kind = numeric_kind(annotation)
    if kind and isinstance(value, bool):
        raise ConfigError(key, f"expected {kind} (true/false is not a number), got {value!r}")


def refuse_non_finite(key: str, value: Any) -> None:
    """inf or nan (YAML `.inf`, `--set x=nan`) would pass range checks or poison training silently."""
    if isinstance(value, float) and not math.isfinite(value):
        raise ConfigError(key, f"expected a finite number, got {value!r}")


def _augment_default(algorithm: str, dataset: ShiftDataset) -> dict[str, Any]:
    """Where a dataset has no strong augmentation (text, graphs, detection), an algorithm's `augment`
    defaults to off, as in the paper; asking for it explicitly is still an error (check_against)."""
    fields = {f.name for f in dataclasses.fields(ALGORITHMS.get(algorithm).Hparams)}
    if "augment" in fields and "strong_augmentation" not in dataset.capabilities:
        return {"augment": False}
    return {}
