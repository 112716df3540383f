"""The contract every algorithm meets, and the only thing that differs between algorithms.

An algorithm owns a `FeaturizerHead` (plus any extra modules, e.g. DANN's discriminator) and turns
one labeled batch and, if it uses unlabeled data, one unlabeled batch into a loss and a few logged
numbers (`objective`). Epochs, accumulation, optimisers, evaluation, checkpoints and reporting belong
to the one trainer (`Trainer` in raybench/trainer/loop.py), so an algorithm file stays the size of its loss function.

Hyperparameters are a dataclass per algorithm (`Hparams`), so their names, types, defaults and allowed ranges
(`raybench.settings.setting`) are declared once and validated before anything runs.
"""
from __future__ import annotations

import dataclasses
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from raybench.data.base import Batch, ShiftDataset, Split, Task, TaskKind, Views
from raybench.models.base import FeaturizerHead
from raybench.report_keys import PSEUDO_CLASSES, PSEUDO_KEPT
from raybench.settings import check_allowed


@dataclass
class Hparams:
    """Base of every algorithm's hyperparameters; subclasses add typed fields with defaults, declared with
    `setting(...)` where a value has a range (checked here) or a suggested search distribution (`space new`).
    Checks that relate several fields, or parse a field (a grid of numbers), stay in `__post_init__`."""

    @classmethod
    def from_dict(cls, values: dict[str, Any], algorithm: str) -> Hparams:
        known = {f.name: f for f in dataclasses.fields(cls)}
        unknown = sorted(set(values) - set(known))
        if unknown:
            raise ValueError(
                f"algorithm {algorithm!r} has no hyperparameter {unknown[0]!r}; "
                f"its hyperparameters are: {', '.join(known) or '(none)'}"
            )
        hparams = cls(**{k: coerce(v, known[k].type, f"{algorithm}.{k}") for k, v in values.items()})
        check_allowed(hparams)
        return hparams


def coerce(value: Any, annotation: Any, where: str) -> Any:
    """Turn a CLI string or YAML scalar into the annotated type, with one clear message when it can't."""
    kind = str(annotation).replace("typing.", "")
    optional = "Optional" in kind or "None" in kind
    if value is None or (optional and isinstance(value, str) and value.lower() in ("none", "null", "")):
        if optional:
            return None
        raise ValueError(f"{where}: expected a value of type {kind}, got None")
    base = next((t for t in ("bool", "int", "float", "str") if t in kind), "str")
    try:
        if base == "bool":
            if isinstance(value, bool):
                return value
            if str(value).lower() in ("1", "true", "yes", "on"):
                return True
            if str(value).lower() in ("0", "false", "no", "off"):
                return False
            raise ValueError
        if base == "int":
            if isinstance(value, float) and not value.is_integer():
                raise ValueError
            return int(value)
        return {"float": float, "str": str}[base](value)
    except (TypeError, ValueError):
        raise ValueError(f"{where}: expected {base}, got {value!r}") from None


@dataclass
class StepOutput:
    """The loss to minimise and detached numbers to log (averaged over the epoch by the trainer)."""

    loss: Tensor
    logs: dict[str, Tensor] = field(default_factory=dict)


@dataclass
class AlgorithmContext:
    """What an algorithm may know about its run, handed over by the trainer."""

    task: Task
    views: Views
    n_domains: int
    total_steps: int
    n_groups: int = 0


@dataclass(frozen=True)
class SamplingPlan:
    """How the trainer draws the labeled training batches of an epoch (an epoch stays |train| // B steps).

    Exactly one field is set:
    - `balance_by`: a key per example (class or group); every batch holds equal counts of each key
      (SpuCo's CB and GB), the remainder of B going to randomly chosen keys;
    - `weights`: importance sampling with replacement, P(i) proportional to weights[i] (Spare);
    - `indices`: a multiset of example indices (JTT's upsampled set), drawn without replacement in a
      fresh random order each epoch.
    `epoch_examples`, when set, is how many examples one epoch covers instead of |train| (JTT: the whole
    upsampled set, as SpuCo's CustomSampleERM iterates its sampler's indices); the trainer sizes the
    round's epochs, schedule and planned budget from it, so the extra compute shows in the budget.
    """

    balance_by: Tensor | None = None
    weights: Tensor | None = None
    indices: Tensor | None = None
    epoch_examples: int | None = None

    def __post_init__(self) -> None:
        if sum(v is not None for v in (self.balance_by, self.weights, self.indices)) != 1:
            raise ValueError("a SamplingPlan sets exactly one of balance_by, weights, indices")
        if self.epoch_examples is not None and self.epoch_examples < 1:
            raise ValueError(f"epoch_examples: expected None or at least 1, got {self.epoch_examples}")


BALANCE_DRAWS = ("expected", "exact")


def balanced_plan(keys: Tensor, draw: str) -> SamplingPlan:
    """Batches that weigh every key (class or group) equally, drawn as `draw` says.

    - "expected", SpuCo's draw: |train| indices per epoch with replacement, example i with probability
      proportional to 1 / |key(i)|, so a batch is balanced only in expectation (CB, GB and GroupDRO alike:
      src/spuco/robust_train/class_balance_batch_erm.py:66-85, group_balance_batch_erm.py:73-92 and
      group_dro.py:132-151 at 91842463a577b0a90b4f829fec367308f3052e9f; Sec. 3.1.1 says only "balanced").
    - "exact": every batch holds equal counts of each key, the remainder going to random keys.
    """
    if draw == "exact":
        return SamplingPlan(balance_by=keys)
    counts = torch.bincount(keys)
    return SamplingPlan(weights=1.0 / counts[keys].double())


@dataclass
class StageModel:
    """A model produced by an earlier stage (e.g. a reference ERM model) and what is known about it."""

    model: FeaturizerHead
    key: str
    cached: bool
    metrics: dict[str, float]


@dataclass(frozen=True)
class ScoredRows:
    """The rows of an evaluation split an algorithm may be scored on, because it fit something on the others
    (DFR's last layer on part of `val`); `note` says so in words for the run's `selection_note`. `model`, when
    set, is what scores those rows instead of the algorithm's scoring model (DFR: the chosen setting's own
    fit, as its final head has seen every val row)."""

    rows: Tensor
    note: str
    model: nn.Module | None = None


@dataclass
class RoundContext:
    """Services the trainer offers multi-round and multi-stage algorithms at the start of each round.

    `previous_model` is the best model of the previous round; `load_model(path, setting)` reads a raybench
    model checkpoint that the hyperparameter `setting` names (an unusable file is an error on that setting);
    `predict` runs a model over a split, its random views seeded by (seed, round) alone, so every
    data-parallel rank draws the same. `train_stage(name, overrides, dataset, identity, use_final)` trains
    an earlier stage (a reference model, a group predictor, a teacher) with the one trainer at the dataset's
    defaults, cached on disk by the hash of its own config so trials that share it train it once;
    `report_stage(name, metrics, facts)` records a stage that trains nothing (group inference). `lr`,
    `weight_decay` and `batch_size` are this run's own, for a stage that shares them (JTT's reference model).
    """

    round: int
    unlabeled: Split | None
    previous_model: FeaturizerHead | None
    load_model: Callable[[str, str], FeaturizerHead]
    predict: Callable[[nn.Module, Split, Callable[[Tensor], Tensor]], Tensor]
    train: Split | None = None
    split: Callable[[str], Split] | None = None
    seed: int = 0
    dataset: ShiftDataset | None = None
    train_stage: Callable[..., StageModel] | None = None
    report_stage: Callable[[str, Mapping[str, float], Mapping[str, str]], None] | None = None
    lr: float | None = None
    weight_decay: float | None = None
    batch_size: int | None = None


def masked_bce(outputs: Tensor, y: Tensor) -> Tensor:
    """Binary cross-entropy over the known (non-NaN) labels only, as OGB multi-label tasks need: the mean over
    a mask, since selecting the known entries would make the host wait for their number."""
    known = ~torch.isnan(y)
    losses = F.binary_cross_entropy_with_logits(outputs, torch.where(known, y, 0.0), reduction="none")
    return torch.where(known, losses, 0.0).sum() / known.sum()


def _detector_owns_loss(outputs: Tensor, y: Tensor) -> Tensor:
    raise TypeError("detection losses come from the detector itself (FeaturizerHead.fit_loss), not from its outputs")


SUPERVISED_LOSSES: dict[TaskKind, Callable[[Tensor, Tensor], Tensor]] = {
    TaskKind.CLASSIFICATION: F.cross_entropy,
    TaskKind.REGRESSION: lambda out, y: F.mse_loss(out.squeeze(-1), y.float()),
    TaskKind.MULTILABEL: masked_bce,
    TaskKind.DETECTION: _detector_owns_loss,
}


# What a dataset may offer that some algorithms need (ShiftDataset.capabilities), in words for errors.
CAPABILITIES: dict[str, str] = {
    "strong_augmentation": "strong augmentation (RandAugment-style views, which text, graphs and detection lack here)",
    "features": "a feature vector to align (a detector has none)",
    "text": "raw text a BERT-family tokenizer reads (masked-LM pre-training)",
}



class Algorithm(nn.Module, ABC):
    """Base class: subclasses set `Hparams`, `uses_unlabeled`, `supported_tasks` and implement `objective`."""

    Hparams: ClassVar[type[Hparams]] = Hparams
    uses_unlabeled: ClassVar[bool] = False
    # Detection is opt-in: a detector computes its own losses, and only ERM, Pseudo-Label and Noisy Student
    # were adapted to it by WILDS 2.0.
    supported_tasks: ClassVar[frozenset[TaskKind]] = frozenset(TaskKind) - {TaskKind.DETECTION}
    name: ClassVar[str] = ""
    # The stages a multi-stage method runs in order (each a nested MLflow run); the last is the trial itself.
    stages: ClassVar[tuple[str, ...]] = ("train",)
    # False for methods that only refit a head in closed form (DFR, Dispel): the trainer then evaluates once.
    trains_by_gradient: ClassVar[bool] = True
    # Dataset capabilities needed whatever the settings (FixMatch: strong augmentation; CORAL, DANN: features).
    requires: ClassVar[frozenset[str]] = frozenset()
    # The registered models it runs on, when it needs a particular architecture (e-Mix and ShED edit a DABS
    # transformer's token embeddings); None: any model. Checked with the config, before any data is read.
    models: ClassVar[frozenset[str] | None] = None
    # What a dataset must declare in its `algorithm_hparams` under this method's name before it may run there
    # (SwAV: its multi-crop views, K and pre-training budget); None: nothing. WILDS ran such methods on named
    # datasets only, and their settings differ per dataset, so a dataset without them is refused, not guessed.
    dataset_settings: ClassVar[str | None] = None
    # For methods that use unlabeled data: the factor of their search space's `ratio_epochs` rule, epochs =
    # ceil(factor x E / (k + 1)) (WILDS 2.0 App. D), which `raybench space new` writes. Noisy Student's is 1 per
    # teacher-student iteration, as its shipped space has it.
    ratio_epochs_factor: ClassVar[float] = 2.0
    # The learning-rate schedule (a name in raybench.trainer.optim.SCHEDULES) this method trains with when neither
    # the config nor the dataset sets one; None: constant. The authors' code gives Pseudo-Label, FixMatch and Noisy
    # Student 'scheduler': 'FixMatchLR' (p-lambda/wilds examples/configs/algorithm.py lines 57, 68, 78), applied by
    # populate_defaults (examples/configs/utils.py lines 89-93) after the dataset's defaults (lines 77-80), and
    # populate_config fills only a key that is unset or None (lines 151-153): a dataset's own scheduler wins (fmow,
    # poverty: StepLR), a dataset's None does not (camelyon17, iwildcam, globalwheat). The model's defaults come
    # later (utils.py lines 100-104), so DistilBERT's linear schedule (examples/configs/model.py line 10) does not
    # replace it on civilcomments and amazon there. The paper's text names no schedule for these methods; the code
    # is followed.
    default_scheduler: ClassVar[str | None] = None
    # What a budget planned before the run cannot know (JTT: its epochs cover an upsampled set whose size the
    # reference stage decides); `space show` prints it under the budget table. None: the plan is exact.
    budget_note: ClassVar[str | None] = None

    @classmethod
    def requirements(cls, hparams: Hparams) -> frozenset[str]:
        """What a dataset must offer for these settings: `augment=True` needs strong augmentation."""
        return cls.requires | (frozenset({"strong_augmentation"}) if getattr(hparams, "augment", False) else frozenset())

    @classmethod
    def inapplicable_reason(cls, hparams: Hparams, task: TaskKind, capabilities: frozenset[str]) -> str | None:
        """Why this algorithm cannot run on a dataset of this task and these capabilities; None if it can."""
        if task not in cls.supported_tasks:
            allowed = ", ".join(sorted(k.value for k in cls.supported_tasks))
            return f"it supports {allowed} tasks, not {task.value}"
        missing = sorted(cls.requirements(hparams) - capabilities)
        if missing:
            return "it needs " + " and ".join(CAPABILITIES[m] for m in missing)
        return None

    def __init__(self, model: FeaturizerHead, hparams: Hparams, context: AlgorithmContext) -> None:
        super().__init__()
        if context.task.kind not in self.supported_tasks:
            allowed = ", ".join(sorted(k.value for k in self.supported_tasks))
            raise ValueError(f"algorithm {self.name!r} supports {allowed} tasks, not {context.task.kind.value}")
        self.model = model
        self.hparams = hparams
        self.context = context

    @abstractmethod
    def objective(self, labeled: Batch, unlabeled: Batch | None, step: int) -> StepOutput:
        """The loss for one (labeled, unlabeled) batch pair at global step `step`."""

    def forward(self, labeled: Batch, unlabeled: Batch | None, step: int) -> StepOutput:
        return self.objective(labeled, unlabeled, step)

    def supervised_loss(self, outputs: Tensor, y: Tensor) -> Tensor:
        return SUPERVISED_LOSSES[self.context.task.kind](outputs, y)

    def param_groups(self, lr: float) -> list[dict[str, Any]]:
        """Optimiser parameter groups; DANN overrides this for its three learning rates."""
        return [{"params": [p for p in self.parameters() if p.requires_grad], "lr": lr}]

    @classmethod
    def is_pretext(cls, hparams: Hparams) -> bool:
        """Whether these settings train a pretext task (SwAV, masked LM pre-training): the trainer then runs
        an epoch as one pass over the unlabeled split, draws no labeled batch and keeps the final weights."""
        return False

    @classmethod
    def rounds_for(cls, hparams: Hparams) -> int:
        """How many train-from-scratch rounds the trainer runs at these settings (Noisy Student's teacher-student
        iterations); a class method, so a run's budget is known before anything is built."""
        return 1

    @property
    def rounds(self) -> int:
        return self.rounds_for(self.hparams)

    def begin_round(self, context: RoundContext) -> dict[str, str]:
        """Called before each round; returns facts worth logging (e.g. where the teacher came from)."""
        return {}

    @classmethod
    def model_files(cls, hparams: Hparams) -> dict[str, str]:
        """Model checkpoints these settings name, by setting (Noisy Student's `teacher_checkpoint`): the trainer
        reads each when it is built, so a bad file fails before any training."""
        return {}

    def scored_rows(self) -> Mapping[str, ScoredRows]:
        """Evaluation splits this algorithm may be scored on only in part, by split name; the trainer reports
        (and a sweep selects on) those rows alone. Called at every evaluation, also after a resume, so what it
        depends on must be in the state dict."""
        return {}

    def sampling(self, train: Split) -> SamplingPlan | None:
        """How to draw labeled batches; None is a uniform shuffle. Called at every epoch, also after a resume,
        so whatever it depends on must be in the state dict (buffers or extra state)."""
        return None

    def scoring_model(self) -> nn.Module:
        """What the trainer scores evaluation splits with (plain view in, outputs out): the model itself, unless
        the algorithm computes its outputs more cheaply (a frozen featurizer's remembered features)."""
        return self.model

    @torch.no_grad()
    def predict(self, x: Tensor) -> Tensor:
        return self.scoring_model()(self.context.views.plain(x))

    def view(self, x: Tensor, strong: bool) -> Tensor:
        views = self.context.views
        return views.strong(x) if strong else views.plain(x)


def pseudo_label_loss(logits: Tensor, targets_logits: Tensor, threshold: float) -> tuple[Tensor, dict[str, Tensor]]:
    """CE on examples whose detached max softmax passes `threshold`, times the kept fraction.

    Returns (loss, logs): the loss is exactly 0 when no example passes; the logs are the kept fraction and the
    kept pseudo-labels per class (`pseudo_label_logs`), what the trainer judges a collapse by.
    """
    probs = torch.softmax(targets_logits.detach().float(), dim=-1)
    confidence, labels = probs.max(dim=-1)
    mask = (confidence >= threshold).float()
    per_example = F.cross_entropy(logits, labels, reduction="none")
    return (per_example * mask).sum() / max(len(mask), 1), pseudo_label_logs(labels, mask, probs.shape[-1])


def pseudo_label_logs(labels: Tensor, kept: Tensor, n_classes: int) -> dict[str, Tensor]:
    """A batch's pseudo-label health, on the device: the share of rows kept (`kept` is 1 or 0 per row) and the
    kept labels per class, counted with index_add (bincount would read its size from the host)."""
    counts = torch.zeros(n_classes, device=labels.device).index_add_(0, labels, kept.float())
    return {PSEUDO_KEPT: kept.float().mean(), PSEUDO_CLASSES: counts}
