"""The one training loop every algorithm runs in.

An epoch is one pass over the labeled training split; the unlabeled split is cycled beside it, each
batch holding `labeled = B - int(k/(k+1) B)` labeled and `int(k/(k+1) B)` unlabeled examples. Gradients
are accumulated over `grad_accum` batches per optimiser step. After every epoch all labeled evaluation
splits are scored, the best model by the selection metric is kept (for a multi-round method, the best of
its last round), callbacks are told, and training stops early after `patience` epochs without improvement.
Every epoch's metrics carry the run's budget under `budget/` (raybench/budget.py): what it planned, beside the
WILDS rule's, and what it ran so far. Nothing here imports Ray or MLflow: the sweep plugs in through `Callback`.

Pretext mode (the pre-training stage of SwAV and masked LM, `Algorithm.is_pretext`): an epoch is one pass
over the unlabeled split, no labeled batch is drawn and no labeled split is scored; each epoch reports the
algorithm's pretext numbers, and the final weights are what the stage hands on.
"""
from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor, nn
from torch.nn.parallel import DistributedDataParallel

import raybench
from raybench.algorithms import (
    ALGORITHMS,
    Algorithm,
    AlgorithmContext,
    RoundContext,
    SamplingPlan,
    ScoredRows,
    StageModel,
    build_algorithm,
)
from raybench.budget import Spent
from raybench.checkpoints import (
    BEST_MODEL_FILE,
    STATE_FILE,
    ModelRecord,
    atomic_save,
    load_state_dict_into,
    read_model_checkpoint,
    read_trial_state,
    write_model_checkpoint,
)
from raybench.data import ShiftDataset, Split, default_data_dir, load_dataset
from raybench.data.base import Batch, TaskKind, move_to
from raybench.data.prefetch import Prefetcher, is_lazy, pinned
from raybench.models import FeaturizerHead, ModelSpec, build_model
from raybench.report_keys import (
    COLLAPSE_FACT,
    CONVERGENCE_FACT,
    PSEUDO_FACT,
    SELECTION_BEST,
    SELECTION_BLIND,
    STAGE_WEIGHTS_FACT,
)
from raybench.trainer.batches import balanced_batches, cycle_batches, epoch_batches, multiset_batches, weighted_batches
from raybench.trainer.callbacks import Callback, EpochReport, StageReport
from raybench.trainer.config import ConfigError, TrainConfig
from raybench.trainer.health import PseudoLabelHealth, class_prior, convergence_note
from raybench.trainer.optim import GuardedStep, Schedule, build_optimizer, build_schedule
from raybench.trainer.rng import capture_rng, derived_seed, preserved_rng, restore_rng, seed_everything, seeded_rng
from raybench.trainer.stages import StageCache, stage_key


class DivergenceError(RuntimeError):
    """The loss became NaN or infinite. No weight was updated with it or after it: the step was skipped on the device
    (`GuardedStep`), and this is raised at the next point where the host reads the device anyway."""


class DivergenceWatch:
    """The first non-finite loss of an epoch, noticed on the device, so a step never waits for the GPU to say
    whether its loss was finite (`bool(loss.isfinite())` would, every step). The host reads it at the epoch's end
    or every `divergence_check_every` steps; until then `seen` cancels every optimiser step on the device."""

    def __init__(self, device: torch.device) -> None:
        self.seen = torch.zeros((), dtype=torch.bool, device=device)
        self.first_step = torch.full((), -1, dtype=torch.long, device=device)
        self.loss = torch.zeros((), dtype=torch.float32, device=device)

    def observe(self, finite: Tensor, loss: Tensor, step: int) -> None:
        first = ~finite & ~self.seen
        self.first_step = torch.where(first, step, self.first_step)
        self.loss = torch.where(first, loss.detach().float(), self.loss)
        self.seen = self.seen | first

    def first_divergence(self) -> tuple[int, float] | None:
        """(step, loss) of the first non-finite loss, or None: one read of the device."""
        if not bool(self.seen):
            return None
        return int(self.first_step), float(self.loss)


@dataclass
class FitResult:
    best_epoch: int
    best_metrics: dict[str, float]
    final_metrics: dict[str, float]
    history: list[dict[str, float]]
    info: dict[str, str]
    best_model: FeaturizerHead
    final_state: dict[str, Tensor] = field(default_factory=dict)


@dataclass
class _Progress:
    """Everything besides weights that a resumed run needs to continue exactly.

    The best-so-far fields cover the current round only: a multi-round method (Noisy Student) selects
    among its last round's epochs, earlier rounds only produce that round's teacher.
    """

    round: int = 0
    epoch: int = 0
    best_value: float = float("-inf")
    best_epoch: int = -1
    best_metrics: dict[str, float] = field(default_factory=dict)
    history: list[dict[str, float]] = field(default_factory=list)
    spent: Spent = field(default_factory=Spent)
    info: dict[str, str] = field(default_factory=dict)

    def start_round(self, round_index: int, epochs_per_round: int) -> None:
        self.round, self.epoch = round_index, round_index * epochs_per_round
        self.best_value, self.best_epoch, self.best_metrics = float("-inf"), -1, {}

    def round_values(self, metric: str, epochs_per_round: int) -> list[float]:
        """The selection metric at each epoch of the current round so far."""
        first = self.round * epochs_per_round
        return [h[metric] for h in self.history if h["epoch"] >= first]


@dataclass(frozen=True)
class Shard:
    """This process's place in data-parallel training (Ray Train sets up the process group)."""

    rank: int = 0
    world_size: int = 1

    @classmethod
    def current(cls) -> Shard:
        if dist.is_available() and dist.is_initialized():
            return cls(dist.get_rank(), dist.get_world_size())
        return cls()

    def take(self, index: Tensor) -> Tensor:
        """This rank's share of a global batch; every rank draws the same global batch from the same generator."""
        return index[self.rank::self.world_size] if self.world_size > 1 else index

    def finite_everywhere(self, loss: Tensor) -> Tensor:
        """Whether the loss is finite on every rank, as a device tensor the host does not read: every rank then
        skips the same updates and stops at the same check, instead of one leaving DDP's next all-reduce waiting."""
        finite = torch.isfinite(loss.detach()).to(torch.int32)
        if self.world_size > 1:
            dist.all_reduce(finite, op=dist.ReduceOp.MIN)
        return finite.bool()

    def any_rank(self, flag: bool, device: torch.device) -> bool:
        """Whether any rank says yes, so all ranks act together (one rank leaving the loop alone would leave
        the others waiting in DDP's next all-reduce)."""
        said = torch.tensor(int(flag), dtype=torch.int32, device=device)
        if self.world_size > 1:
            dist.all_reduce(said, op=dist.ReduceOp.MAX)
        return bool(said)


def choose_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def channels_last_for(memory_format: str, device: torch.device) -> bool:
    """Whether models are built with channels-last convolution weights (the `memory_format` setting; auto: on a
    CPU). Only 4-D weights change layout; inputs stay as the data gives them, and the first convolution's output
    follows its weights, so every later convolution runs channels-last. A forward pass gives the same values up
    to float rounding; training carries that rounding forward, so a run is as deterministic in either layout but
    reproduces a run of the other only closely (`memory_format=contiguous` reproduces runs from before the
    setting). The speed is measured in benchmarks/settings_ab.py; the benchmarks that race the trainer against a
    hand-written loop give that loop the same layout."""
    return memory_format == "channels_last" or (memory_format == "auto" and device.type == "cpu")


def compile_model(model: FeaturizerHead, mode: str) -> None:
    """torch.compile the model's parts in place (`nn.Module.compile`: its state_dict keys stay as they are, so
    checkpoints load into an eager model); `mode` is the `compile` setting, "none" leaves it eager."""
    if mode == "none":
        return
    for part in model.compile_parts():
        part.compile(mode=mode)


def epoch_means(sums: Mapping[str, Tensor], steps: int) -> dict[str, float]:
    """An epoch's logs as `train/<name>` means per step, read from the device once: a vector log (pseudo-labels
    per class) becomes one metric per entry, `train/<name>/<i>`."""
    means: dict[str, float] = {}
    for key, total in sums.items():
        if total.dim() == 0:
            means[f"train/{key}"] = float(total) / steps
        else:
            means.update({f"train/{key}/{i}": value / steps for i, value in enumerate(total.tolist())})
    return means


class Trainer:
    """Trains one config on one dataset; `fit()` returns the best model and its metrics."""

    def __init__(
        self,
        config: TrainConfig,
        callbacks: Sequence[Callback] = (),
        dataset: ShiftDataset | None = None,
        shard: Shard | None = None,
    ) -> None:
        self.dataset = dataset or load_dataset(config.dataset, config.data_dir, config.data_seed)
        if config.input_size:
            self.dataset = self.dataset.at_input_size(config.input_size)
        self.config = config.resolve(self.dataset)
        self.callbacks = list(callbacks)
        self.stopped_on_request = False
        self.shard = shard or Shard.current()
        self.device = choose_device(self.config.device)
        if self.device.type == "cuda" and self.shard.world_size > 1:
            self.device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        if self.config.image_decoding == "device":
            self.dataset = self._decoding_on_device(self.dataset)
        self.train_split = self.dataset.split("train")
        algorithm_cls = ALGORITHMS.get(self.config.algorithm)
        self.pretext = algorithm_cls.is_pretext(self.config.typed_hparams)
        self.uses_unlabeled = algorithm_cls.uses_unlabeled or self.pretext
        self.unlabeled_split: Split | None = (
            self.dataset.split(self.config.unlabeled_split) if self.uses_unlabeled else None
        )
        epoch = self.config.epoch_plan(self.dataset)
        self.labeled_bs, self.unlabeled_bs, self.steps_per_epoch = epoch.labeled_batch, epoch.unlabeled_batch, epoch.steps
        self.budget = self.config.budget(self.dataset)
        self.progress = _Progress()
        self._prior: tuple[float, ...] | None = None  # the labeled training set's class shares, once counted
        self.best_state: dict[str, Tensor] | None = None  # the best epoch of the current round
        self.previous_round_state: dict[str, Tensor] | None = None  # the last round's best: the next teacher
        self.final_state: dict[str, Tensor] = {}
        # Seconds of training steps, and of those the time blocked on reading a batch (benchmarks/data_path.py).
        self.train_s = self.data_wait_s = 0.0
        self._check_model_files()

    # ----- building -------------------------------------------------------------------------
    def new_model(self) -> FeaturizerHead:
        """A fresh model; a missing or unusable `model_weights` is a ConfigError naming the file."""
        weights = Path(self.config.model_weights) if self.config.model_weights else None
        spec = ModelSpec(self.dataset.input_shape, self.dataset.task.n_outputs, weights, self.dataset.input_layout)
        try:
            model = build_model(self.config.model, spec)
        except (ValueError, OSError) as err:
            raise ConfigError("model_weights", str(err)) from None
        return model.to(memory_format=torch.channels_last) if self.channels_last else model

    def _decoding_on_device(self, dataset: ShiftDataset) -> ShiftDataset:
        """The dataset reading encoded files on the host and decoding them where the model trains."""
        try:
            return dataset.decoding_on(self.device)
        except ValueError as err:
            raise ConfigError("image_decoding", str(err)) from None

    @property
    def channels_last(self) -> bool:
        return channels_last_for(self.config.memory_format, self.device)

    def _check_model_files(self) -> None:
        """Read every model file the algorithm's settings name (Noisy Student's `teacher_checkpoint`) now,
        so a missing, truncated, foreign or unsafe file fails before any training, not after a stage."""
        algorithm = ALGORITHMS.get(self.config.algorithm)
        for setting, path in algorithm.model_files(self.config.typed_hparams).items():
            self.load_model(path, setting)

    def _new_algorithm(self) -> Algorithm:
        context = AlgorithmContext(
            task=self.dataset.task,
            views=self.dataset.views,
            n_domains=self.dataset.n_domains,
            total_steps=self.steps_per_epoch * self.config.epochs,
            n_groups=self.dataset.n_groups,
        )
        return build_algorithm(self.config.algorithm, self.new_model(), self.config.typed_hparams, context).to(self.device)

    def _new_optimizer(self, algorithm: Algorithm) -> tuple[torch.optim.Optimizer, Schedule]:
        cfg = self.config
        try:
            optimizer = build_optimizer(cfg.optimizer, algorithm.param_groups(cfg.lr), cfg.weight_decay, cfg.momentum,
                                        cfg.optimizer_impl, self.device)
        except ValueError as err:
            key, _, detail = str(err).partition(": ")
            raise ConfigError(key, detail) from None
        self.guarded_step = GuardedStep(optimizer)
        optimizer_steps = -(-self.steps_per_epoch // cfg.grad_accum) * cfg.epochs
        return optimizer, build_schedule(cfg.scheduler, optimizer, optimizer_steps, self.dataset.defaults.scheduler_gamma)

    def _autocast(self) -> Any:
        return autocast_on(self.device)

    # ----- services offered to multi-round algorithms ----------------------------------------
    def predict(self, model: nn.Module, split: Split, view: Callable[[Any], Any]) -> Any:
        """Outputs of `model` (eval mode) on a whole split, in order, as float32 on the CPU (a tensor, or
        one record per example for a detector)."""
        return predict_split(model, split, view, self.device, self.config.eval_batch_size, self._prefetch_depth(split))

    # ----- the data path --------------------------------------------------------------------
    def _prefetch_depth(self, *splits: Split | None) -> int:
        return prefetch_depth(self.config.prefetch, *splits)

    def _pinned_batch(self, batch: Batch) -> Batch:
        if self.device.type != "cuda":
            return batch
        return dataclasses.replace(batch, x=pinned(batch.x), y=pinned(batch.y), domain=batch.domain.pin_memory(),
                                   group=batch.group.pin_memory())

    def _step_ids(self, batches: Iterator[Tensor] | None,
                  unlabeled: Iterator[Tensor] | None) -> Iterator[tuple[Tensor | None, Tensor | None]]:
        """This rank's (labeled, unlabeled) example ids of each step of the epoch, drawn in step order."""
        for _ in range(self.steps_per_epoch):
            yield (self.shard.take(next(batches)) if batches else None,
                   self.shard.take(next(unlabeled)) if unlabeled else None)

    def _on_device(self, batch: Batch | None) -> Batch | None:
        return None if batch is None else batch.to(self.device)

    def _read_step(self, ids: tuple[Tensor | None, Tensor | None]) -> tuple[Batch | None, Batch | None]:
        labeled, unlabeled = ids
        return (None if labeled is None else self._pinned_batch(self.train_split.take(labeled)),
                None if unlabeled is None else self._pinned_batch(self.unlabeled_split.take(unlabeled)))

    def load_model(self, path: str, setting: str) -> FeaturizerHead:
        """A raybench model checkpoint (`best_model.pt`, or a checkpoint folder holding one) that the
        setting `setting` names; anything else is a ConfigError on that setting naming the file."""
        model = self.new_model()  # outside the try: a bad `model_weights` is that setting's error, not this one's
        try:
            return read_model_checkpoint(Path(path), model).to(self.device)
        except (ValueError, OSError) as err:
            raise ConfigError(setting, str(err)) from None

    def _round_predict(self, round_index: int) -> Callable[[nn.Module, Split, Callable[[Any], Any]], Any]:
        """`predict` under streams seeded by (seed, round) without the rank: a random view (Noisy Student's
        teacher labelling through the weak view) then draws the same on every DDP rank, so all ranks train on
        identical pseudo-labels, and the run's own training stream does not move."""
        def predict(model: nn.Module, split: Split, view: Callable[[Any], Any]) -> Any:
            with seeded_rng(derived_seed(self.config.seed, round_index)):
                return self.predict(model, split, view)

        return predict

    def train_stage(self, name: str, overrides: Mapping[str, Any], dataset: ShiftDataset | None = None,
                    identity: Mapping[str, Any] | None = None, use_final: bool = True) -> StageModel:
        """Train an earlier stage with this same trainer, or load it if any run trained it before.

        The stage starts from the dataset's defaults, not from this run's sampled values, so trials that
        differ only in their own hyperparameters share it; `overrides` set what the method decides (e.g.
        JTT's T_r). It trains in this process alone (no DDP): under data parallelism the first rank trains
        it while the others wait on the cache lock, then load it. `use_final` hands on the weights after
        the last epoch (what JTT, Spare and DFR use) instead of the best epoch's.
        """
        cfg = self.config
        base = TrainConfig(
            dataset=cfg.dataset, model=cfg.model, model_weights=cfg.model_weights, seed=cfg.seed,
            max_steps_per_epoch=cfg.max_steps_per_epoch, epoch_fraction=cfg.epoch_fraction, data_dir=cfg.data_dir,
            data_seed=cfg.data_seed,
            device=cfg.device, eval_batch_size=cfg.eval_batch_size, stage_cache=cfg.stage_cache,
            input_size=cfg.input_size, memory_format=cfg.memory_format, compile=cfg.compile,
            optimizer_impl=cfg.optimizer_impl, divergence_check_every=cfg.divergence_check_every,
            image_decoding=cfg.image_decoding, prefetch=cfg.prefetch,
        )
        stage_config = TrainConfig.from_flat({**base.to_flat(), **overrides})
        trainer = Trainer(stage_config, dataset=dataset or self.dataset, shard=Shard())
        key = stage_key(trainer.config.to_flat(), {"stage": name, "dataset": trainer.dataset.name, **(identity or {})})

        def make() -> tuple[dict[str, Tensor], dict[str, Any]]:
            started = time.perf_counter()
            with preserved_rng():  # a cache hit and a miss must leave this run on the same random stream
                result = trainer.fit()
            weights = result.final_state if use_final else _cpu_state(result.best_model)
            return weights, {
                "stage": name, "config": trainer.config.to_flat(), "best_epoch": result.best_epoch,
                "best_metrics": result.best_metrics, "final_metrics": result.final_metrics,
                "history": result.history, "seconds": time.perf_counter() - started,
            }

        cache = self._stage_cache()
        entry = cache.get_or_make(key, make)
        metrics = entry.summary["final_metrics"] if use_final else entry.summary["best_metrics"]
        facts = {"config": str(entry.summary["config"]), STAGE_WEIGHTS_FACT: str(cache.weights_file(key))}
        self._stage(StageReport(name=name, key=key, cached=entry.cached, metrics=metrics,
                                history=entry.summary["history"], facts=facts, seconds=entry.summary["seconds"]))
        model = load_state_dict_into(trainer.new_model(), entry.state).to(self.device)
        return StageModel(model=model, key=key, cached=entry.cached, metrics=metrics)

    def _stage_cache(self) -> StageCache:
        """`stage_cache` if set (a sweep puts it in its storage), else `<data dir>/stages`."""
        default = Path(self.config.data_dir) if self.config.data_dir else default_data_dir()
        return StageCache(Path(self.config.stage_cache) if self.config.stage_cache else default / "stages")

    def report_stage(self, name: str, metrics: Mapping[str, float], facts: Mapping[str, str]) -> None:
        """A stage that trains nothing (group inference, last-layer refit): its numbers and facts."""
        self._stage(StageReport(name=name, key="", cached=False, metrics=dict(metrics), history=[], facts=dict(facts)))

    def _stage(self, report: StageReport) -> None:
        for callback in self.callbacks:
            callback.on_stage(report)

    def _round_context(self, round_index: int) -> RoundContext:
        previous = None
        if round_index > 0 and self.previous_round_state is not None:
            previous = load_state_dict_into(self.new_model(), self.previous_round_state).to(self.device)
        return RoundContext(
            round=round_index,
            unlabeled=self.unlabeled_split,
            previous_model=previous,
            load_model=self.load_model,
            predict=self._round_predict(round_index),
            train=self.train_split,
            split=self.dataset.split,
            seed=self.config.seed,
            dataset=self.dataset,
            train_stage=self.train_stage,
            report_stage=self.report_stage,
            lr=self.config.lr,
            weight_decay=self.config.weight_decay,
            batch_size=self.config.batch_size,
        )

    # ----- the loop ---------------------------------------------------------------------------
    def fit(self, resume_from: Path | None = None) -> FitResult:
        try:
            return self._fit(resume_from)
        finally:
            self.dataset.release_readers()  # no decode threads outlive the run, whichever way it ends

    def _fit(self, resume_from: Path | None) -> FitResult:
        seed_everything(self.config.seed + self.shard.rank)  # same init is broadcast by DDP; augmentations differ
        resumed = self._load_state(Path(resume_from)) if resume_from else None
        if resumed is not None:
            self._tell_info(dict(self.progress.info))  # callbacks of a resumed run still learn earlier facts
        while True:
            round_index = self.progress.round
            algorithm = self._new_algorithm()
            generators = self._generators()
            if resumed is not None:
                algorithm.load_state_dict(resumed["algorithm"])
            elif self.progress.epoch == round_index * self.config.epochs:
                self._info(algorithm.begin_round(self._round_context(round_index)))
            self._size_epochs(algorithm)
            compile_model(algorithm.model, self.config.compile)
            optimizer, schedule = self._new_optimizer(algorithm)
            if resumed is not None:
                self._restore(resumed, optimizer, schedule, generators)
                resumed = None
            self._train_round(algorithm, optimizer, schedule, generators, last_round=round_index + 1 >= algorithm.rounds)
            if self.stopped_on_request or self.progress.round + 1 >= algorithm.rounds:
                break
            self.previous_round_state, self.best_state = self.best_state, None
            self.progress.start_round(self.progress.round + 1, self.config.epochs)
        self._flag_blind_selection()
        self.final_state = _cpu_state(algorithm.model)
        return self._result()

    def _size_epochs(self, algorithm: Algorithm) -> None:
        """The round's steps per epoch (and planned budget): over |train|, or over the examples the
        algorithm's sampling plan says an epoch covers (JTT's upsampled set), known once its round began."""
        plan = None if self.pretext else algorithm.sampling(self.train_split)
        examples = plan.epoch_examples if plan is not None else None
        self.steps_per_epoch = self.config.epoch_plan(self.dataset, examples).steps
        self.budget = self.config.budget(self.dataset, examples)

    def _generators(self) -> dict[str, torch.Generator]:
        return {
            "labeled": torch.Generator().manual_seed(self.config.seed),
            "unlabeled": torch.Generator().manual_seed(self.config.seed + 1),
        }

    def _train_round(self, algorithm: Algorithm, optimizer: torch.optim.Optimizer, schedule: Schedule,
                     generators: dict[str, torch.Generator], last_round: bool) -> None:
        round_end = (self.progress.round + 1) * self.config.epochs
        if not algorithm.trains_by_gradient:  # a closed-form refit (DFR): evaluate once, nothing to train
            round_end = min(round_end, self.progress.epoch + 1)
        forward = self._parallel(algorithm)
        while self.progress.epoch < round_end:
            train_logs: dict[str, float] = {}
            if algorithm.trains_by_gradient:
                unlabeled = self._unlabeled_stream(generators["unlabeled"])
                train_logs = self._train_epoch(algorithm, forward, optimizer, schedule, generators["labeled"], unlabeled)
                schedule.step_epoch()
            metrics = {**train_logs, **self._evaluate(algorithm), "lr": optimizer.param_groups[0]["lr"],
                       **self.budget.metrics(), **self.progress.spent.metrics(len(self.train_split))}
            is_best = self._record(algorithm, metrics)
            self._report_pseudo_labels()
            self.progress.epoch += 1
            stops_early = bool(self.config.patience) and metrics["epochs_since_best"] >= self.config.patience
            if last_round and (stops_early or self.progress.epoch >= round_end):
                self._flag_blind_selection()  # before the run's last report, which is what a sweep keeps
                if not stops_early:  # patience ending a run says its metric had stopped rising
                    self._flag_late_best()
            report = EpochReport(
                epoch=self.progress.epoch - 1, round=self.progress.round, metrics=dict(self.progress.history[-1]),
                best_metrics=dict(self.progress.best_metrics), is_best=is_best,
                write_checkpoint=lambda d, a=algorithm, o=optimizer, s=schedule, g=generators: self._write(d, a, o, s, g),
            )
            for callback in self.callbacks:
                callback.on_epoch_end(report)
            if self.shard.any_rank(any(callback.should_stop() for callback in self.callbacks), self.device):
                self.stopped_on_request = True  # a scheduler's request (ASHA): this run ends here, every round
                return
            if stops_early:
                self.progress.epoch = round_end
                self._info({f"early_stopped_round_{self.progress.round}": f"after epoch {report.epoch}"})

    def _unlabeled_stream(self, generator: torch.Generator) -> Iterator[Tensor] | None:
        """A fresh shuffled stream each epoch, so a run resumed from an epoch checkpoint continues exactly."""
        if self.unlabeled_split is None:
            return None
        if self.pretext:  # the epoch is this one pass
            return epoch_batches(len(self.unlabeled_split), self.unlabeled_bs, generator)
        return cycle_batches(len(self.unlabeled_split), self.unlabeled_bs, generator)

    def _parallel(self, algorithm: Algorithm) -> nn.Module:
        """DDP around the algorithm when several workers train together; the algorithm itself otherwise."""
        if self.shard.world_size == 1 or not any(p.requires_grad for p in algorithm.parameters()):
            return algorithm  # DDP refuses a module with nothing to train (newt_probe's closed-form probe)
        return DistributedDataParallel(algorithm, device_ids=[self.device.index] if self.device.type == "cuda" else None)

    def _train_epoch(self, algorithm: Algorithm, forward: nn.Module, optimizer: torch.optim.Optimizer,
                     schedule: Schedule, generator: torch.Generator, unlabeled: Iterator[Tensor] | None) -> dict[str, float]:
        algorithm.train()
        round_epoch = self.progress.epoch - self.progress.round * self.config.epochs
        sums: dict[str, Tensor] = {}
        batches = None if self.pretext else self._labeled_batches(algorithm.sampling(self.train_split), generator)
        optimizer.zero_grad(set_to_none=True)
        depth = self._prefetch_depth(None if self.pretext else self.train_split,
                                     self.unlabeled_split if unlabeled else None)
        started = time.perf_counter()
        self.watch, every = DivergenceWatch(self.device), self.config.divergence_check_every
        with Prefetcher(self._step_ids(batches, unlabeled), self._read_step, depth) as steps:
            for i, (labeled, unlabeled_batch) in enumerate(steps):
                self._train_step(algorithm, forward, optimizer, schedule, sums, round_epoch * self.steps_per_epoch + i,
                                 self._on_device(labeled), self._on_device(unlabeled_batch))
                if every and (i + 1) % every == 0:
                    self._raise_if_diverged()
            self.data_wait_s += steps.wait_s
        self._raise_if_diverged()
        self.train_s += time.perf_counter() - started
        return epoch_means(sums, self.steps_per_epoch)

    def _raise_if_diverged(self) -> None:
        """DivergenceError naming the epoch and step of the epoch's first non-finite loss, if there was one (a
        read of the device: at the epoch's end, or every `divergence_check_every` steps)."""
        diverged = self.watch.first_divergence()
        if diverged is not None:
            step, loss = diverged
            raise DivergenceError(
                f"loss is {loss} at epoch {self.progress.epoch}, step {step} ({self.config.algorithm}, "
                f"lr={self.config.lr}); no weights were updated with it or after it"
            )

    def _train_step(self, algorithm: Algorithm, forward: nn.Module, optimizer: torch.optim.Optimizer, schedule: Schedule,
                    sums: dict[str, Tensor], step: int, labeled: Batch | None, unlabeled_batch: Batch | None) -> None:
        accum, i = self.config.grad_accum, step % self.steps_per_epoch
        if self.config.compile == "reduce-overhead":
            torch.compiler.cudagraph_mark_step_begin()  # CUDA graphs: the last step's outputs may be overwritten now
        with self._autocast():
            out = forward(labeled, unlabeled_batch, step)
        self.watch.observe(self.shard.finite_everywhere(out.loss), out.loss, step)
        (out.loss / accum).backward()
        spent = self.progress.spent
        spent.steps += 1
        spent.labeled_examples += self.labeled_bs if labeled is not None else 0
        spent.unlabeled_examples += self.unlabeled_bs if unlabeled_batch is not None else 0
        if (i + 1) % accum == 0 or i + 1 == self.steps_per_epoch:
            self._optimizer_step(algorithm, optimizer)
            schedule.step_batch()
            spent.optimizer_steps += 1
        for key, value in {"loss/total": out.loss.detach(), **out.logs}.items():
            sums[key] = sums[key] + value.float() if key in sums else value.float()

    def _labeled_batches(self, plan: SamplingPlan | None, generator: torch.Generator) -> Iterator[Tensor]:
        """The epoch's global labeled batches: a uniform shuffle, or the algorithm's sampling plan."""
        steps, size = self.steps_per_epoch, self.labeled_bs
        plan = plan or self._dataset_sampling()
        if plan is None:
            return epoch_batches(len(self.train_split), size, generator)
        if plan.balance_by is not None:
            return balanced_batches(plan.balance_by, size, steps, generator)
        if plan.weights is not None:
            return weighted_batches(plan.weights, size, steps, generator)
        assert plan.indices is not None
        return multiset_batches(plan.indices, size, steps, generator)

    def _dataset_sampling(self) -> SamplingPlan | None:
        """The dataset's own default sampler (CivilComments: class-balanced labeled batches), if it has one."""
        key = self.dataset.defaults.balance_labeled_by
        if key is None:
            return None
        values = {"y": self.train_split.y, "domain": self.train_split.domain, "group": self.train_split.group}[key]
        return SamplingPlan(balance_by=torch.as_tensor(values).view(len(self.train_split), -1)[:, 0].long())

    def _optimizer_step(self, algorithm: Algorithm, optimizer: torch.optim.Optimizer) -> None:
        """Clip and step on the device; an update after a non-finite loss is cancelled there (`GuardedStep`)."""
        if self.config.grad_clip:
            nn.utils.clip_grad_norm_(algorithm.parameters(), self.config.grad_clip)
        self.guarded_step.step(self.watch.seen)
        optimizer.zero_grad(set_to_none=True)

    def _evaluate(self, algorithm: Algorithm) -> dict[str, float]:
        """Every labeled evaluation split, restricted to the rows the algorithm may be scored on (DFR chooses its
        head on part of `val`: it is scored, and so selected, on the rest only, by the model it chose there)."""
        metrics: dict[str, float] = {}
        if self.pretext:  # a pretext stage is judged by its own numbers; labels are not its business
            return metrics
        restricted = algorithm.scored_rows()
        for name in self.dataset.eval_splits:
            split, scorer = self.dataset.split(name), algorithm.scoring_model()
            if name in restricted:
                split, scorer = rows_of(split, restricted[name]), restricted[name].model or scorer
            metrics.update(score_split(scorer, self.dataset, name, split, self.predict))
        if restricted:
            self._info({"selection_note": "; ".join(rows.note for rows in restricted.values())})
        return metrics

    def _record(self, algorithm: Algorithm, metrics: dict[str, float]) -> bool:
        """Update best-so-far bookkeeping; returns whether this epoch is the new best (ties keep the earlier)."""
        p, name = self.progress, self.config.selection_metric
        value = -metrics["train/loss/total"] if self.pretext else metrics[name]  # pretext: its stage keeps the final weights
        is_best = value > p.best_value
        if is_best:
            p.best_value, p.best_epoch = value, p.epoch
            self.best_state = _cpu_state(algorithm.model)
        metrics.update({
            "epoch": float(p.epoch),
            SELECTION_BEST: p.best_value,
            "epochs_since_best": float(p.epoch - p.best_epoch),
        })
        p.history.append(dict(metrics))
        if is_best:
            p.best_metrics = dict(metrics)
        return is_best

    def _flag_blind_selection(self) -> None:
        """Tell callbacks when the selection metric had one value at every epoch (two or more) of the round
        selection chooses from: the kept epoch was then chosen by nothing. Called for the run's final report
        and at its end; a metric that moved at any epoch never raises the flag."""
        if self.pretext:
            return
        values = self.progress.round_values(self.config.selection_metric, self.config.epochs)
        if len(values) >= 2 and all(v == values[0] for v in values):
            self._info({"selection_blind": SELECTION_BLIND})

    def _flag_late_best(self) -> None:
        """Tell callbacks when a run that ran its whole last round scored its best epoch in the round's late
        epochs (raybench.trainer.health): the number is the budget's, not the method's."""
        if self.pretext:
            return
        first = self.progress.round * self.config.epochs
        note = convergence_note(self.progress.best_epoch - first, self.progress.epoch - first)
        if note:
            self._info({CONVERGENCE_FACT: note})

    def _report_pseudo_labels(self) -> None:
        """The selected epoch's pseudo-labels in words, and whether they collapsed onto a class, for runs whose
        algorithm logs them (raybench.algorithms.base.pseudo_label_logs): updated as the selected epoch moves."""
        if self.pretext:
            return
        health = PseudoLabelHealth.of(self.progress.best_metrics, self._class_prior(), self.steps_per_epoch)
        if health is not None:
            self._info({PSEUDO_FACT: health.describe(), COLLAPSE_FACT: health.collapse or ""})

    def _class_prior(self) -> tuple[float, ...]:
        """The labeled training set's class shares (classification; none otherwise), counted once."""
        if self._prior is None:
            task = self.dataset.task
            labels = self.train_split.y.tolist() if task.kind is TaskKind.CLASSIFICATION else []
            self._prior = class_prior(labels, task.n_outputs) if labels else ()
        return self._prior

    def _info(self, facts: dict[str, str]) -> None:
        """Record facts and tell callbacks about those that are new or changed."""
        changed = {k: v for k, v in facts.items() if self.progress.info.get(k) != v}
        self.progress.info.update(changed)
        self._tell_info(changed)

    def _tell_info(self, facts: dict[str, str]) -> None:
        if not facts:
            return
        for callback in self.callbacks:
            callback.on_info(facts)

    def _result(self) -> FitResult:
        p = self.progress
        # The model as the algorithm shapes it (Noisy Student's dropout head, the NeWT probe's pipeline head),
        # so the best state loads whole into it.
        best_model = self._new_algorithm().model.cpu()
        if self.best_state is not None:
            load_state_dict_into(best_model, self.best_state)
        return FitResult(
            best_epoch=p.best_epoch, best_metrics=p.best_metrics, final_metrics=p.history[-1] if p.history else {},
            history=p.history, info=p.info, best_model=best_model, final_state=self.final_state,
        )

    # ----- checkpoints ------------------------------------------------------------------------
    def _write(self, directory: Path, algorithm: Algorithm, optimizer: torch.optim.Optimizer, schedule: Schedule,
               generators: dict[str, torch.Generator]) -> None:
        """Write `state.pt` (resume exactly from the end of the last epoch) and `best_model.pt`."""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        state = {  # only tensors, dicts, lists and primitives: read back with weights_only=True
            "config": self.config.to_flat(),
            "progress": dataclasses.asdict(self.progress),
            "algorithm": algorithm.state_dict(),
            "optimizer": optimizer.state_dict(),
            "scheduler": schedule.scheduler.state_dict() if schedule.scheduler else None,
            "generators": {k: g.get_state() for k, g in generators.items()},
            "rng": capture_rng(),
            "best_state": self.best_state,
        }
        atomic_save(state, directory / STATE_FILE)
        if self.best_state is not None:
            write_model_checkpoint(directory / BEST_MODEL_FILE, self.best_state, self.model_record())

    def model_record(self) -> ModelRecord:
        """What built this run's model, for its `best_model.pt`: the file alone then rebuilds it (raybench.rebuild)."""
        cfg, dataset = self.config, self.dataset
        return ModelRecord(
            model=str(cfg.model), input_shape=tuple(int(n) for n in dataset.input_shape),
            n_outputs=int(dataset.task.n_outputs), layout=dataset.input_layout, model_weights=cfg.model_weights or "",
            task=dataset.task.kind.value, n_domains=dataset.n_domains, n_groups=dataset.n_groups,
            dataset=cfg.dataset, data_seed=cfg.data_seed, algorithm=cfg.algorithm, settings=cfg.to_flat(),
            epoch=self.progress.best_epoch, raybench_version=raybench.__version__,
        )

    def _load_state(self, directory: Path) -> dict[str, Any]:
        """`state.pt`, read with weights_only=True: a file holding pickled code is refused, never run."""
        state = read_trial_state(directory)
        progress = dict(state["progress"])
        self.progress = _Progress(**{**progress, "spent": Spent(**progress.get("spent", {}))})
        self.best_state = state["best_state"]
        return state

    def _restore(self, state: dict[str, Any], optimizer: torch.optim.Optimizer, schedule: Schedule,
                 generators: dict[str, torch.Generator]) -> None:
        optimizer.load_state_dict(state["optimizer"])
        if schedule.scheduler is not None and state["scheduler"] is not None:
            schedule.scheduler.load_state_dict(state["scheduler"])
        for key, generator in generators.items():
            generator.set_state(state["generators"][key])
        restore_rng(state["rng"])


def autocast_on(device: torch.device) -> Any:
    """bfloat16 autocast on a GPU, none on a CPU: how the trainer trains and evaluates."""
    return torch.autocast("cuda", dtype=torch.bfloat16) if device.type == "cuda" else nullcontext()


def prefetch_depth(prefetch: int, *splits: Split | None) -> int:
    """How many batches are read ahead: `prefetch` when any input is read from disk; tensors already in
    memory are indexed on demand (a thread would only add a hand-off to a microsecond read)."""
    return prefetch if any(s is not None and is_lazy(s.x) for s in splits) else 0


@torch.no_grad()
def predict_split(model: nn.Module, split: Split, view: Callable[[Any], Any], device: torch.device,
                  batch_size: int, depth: int = 0) -> Any:
    """Outputs of `model` (eval mode) on a whole split through `view`, `batch_size` rows at a time with `depth`
    batches read ahead, in order, as float32 on the CPU (a tensor, or one record per example for a detector).
    The trainer's `predict`, as a function: a rebuilt checkpoint is scored by the same loop (raybench.rebuild)."""
    was_training = model.training
    model.eval()
    outputs = []
    slices = (slice(start, start + batch_size) for start in range(0, len(split), batch_size))
    read = (lambda rows: pinned(split.x[rows])) if device.type == "cuda" else (lambda rows: split.x[rows])
    with Prefetcher(slices, read, depth) as chunks:
        for chunk in chunks:
            with autocast_on(device):
                outputs.append(model(view(move_to(chunk, device))))
    model.train(was_training)
    return outputs_to_cpu(concat_outputs(outputs))  # one copy to the host: batch after batch is queued without a wait


def score_split(model: nn.Module, dataset: ShiftDataset, name: str, split: Split,
                predict: Callable[[nn.Module, Split, Callable[[Any], Any]], Any]) -> dict[str, float]:
    """The metrics of `dataset`'s evaluation split `name` (its rows `split`) as every epoch reports them: the
    outputs `predict` gives for `model` on the plain view, scored by the dataset's own metrics."""
    return dataset.evaluate(name, predict(model, split, dataset.views.plain), split)


def outputs_to_cpu(outputs: Any) -> Any:
    """Model outputs as float32 on the CPU: a tensor, or a detector's list of {boxes, labels, scores}."""
    if isinstance(outputs, Tensor):
        return outputs.float().cpu()
    return [{k: v.cpu().float() if v.is_floating_point() else v.cpu() for k, v in record.items()} for record in outputs]


def concat_outputs(chunks: list[Any]) -> Any:
    if chunks and isinstance(chunks[0], Tensor):
        return torch.cat(chunks)
    return [record for chunk in chunks for record in chunk]


def rows_of(split: Split, rows: ScoredRows) -> Split:
    """The split restricted to `rows`, in their order."""
    batch = split.take(rows.rows)
    return Split(split.name, batch.x, batch.y, batch.domain, batch.group)


def _cpu_state(model: nn.Module) -> dict[str, Tensor]:
    return {k: v.detach().to("cpu", copy=True) for k, v in model.state_dict().items()}
