"""A model checkpoint back as a ready module, and scored on its dataset as the trainer scores it.

`rebuild_model` needs only the file: its `ModelRecord` (raybench.checkpoints) names the registered model, its
build arguments, the algorithm that shaped it and the run's settings, so no sweep, Ray cluster or MLflow store is
involved. The module takes what the trainer fed the model: a batch through the dataset's plain view
(`dataset.views.plain(x)`), which `evaluate_split` applies for you.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from raybench.algorithms import AlgorithmContext, build_algorithm
from raybench.checkpoints import ModelRecord, ModelRecordError, load_state_dict_into, model_file, read_model_file
from raybench.data import ShiftDataset, Task, TaskKind, Views, load_dataset
from raybench.models import FeaturizerHead, ModelSpec, build_model
from raybench.registry import UnknownNameError
from raybench.trainer.config import ConfigError, TrainConfig
from raybench.trainer.loop import channels_last_for, predict_split, prefetch_depth, score_split

CPU = torch.device("cpu")


def rebuild_model(path: Path) -> tuple[FeaturizerHead, ModelRecord]:
    """The model a `best_model.pt` (or a checkpoint folder holding one) was saved from, on the CPU in eval mode,
    with the record of what built it.

    The weights must fit the rebuilt model exactly (every key and shape). A bare state dict, written before
    checkpoints carried their record, still loads as weights wherever weights are read, but cannot be rebuilt:
    a ModelRecordError says so in one line, as it names a damaged record's key.
    """
    file = model_file(Path(path))
    weights, record = read_model_file(file)
    if record is None:
        raise ModelRecordError(f"model checkpoint {str(file)!r} holds weights only, no model record (written before "
                               f"checkpoints carried one): it still loads as weights (features_from, "
                               f"teacher_checkpoint, raybench probe) but cannot be rebuilt on its own")
    model = load_state_dict_into(shaped_model(record, str(file)), weights, str(file))
    return model.eval(), record


def shaped_model(record: ModelRecord, source: str = "model record") -> FeaturizerHead:
    """A fresh model as the run's trainer built it: the registered model from its spec, in the run's memory
    layout, then shaped by the run's algorithm (Noisy Student's dropout head, the NeWT probe's head), so the
    saved weights load whole. Anything the record names that this process lacks (an algorithm or model of a
    plug-in not imported, a model folder not on this machine) is a ModelRecordError naming `source`."""
    config = record_config(record, source)
    recorded = Path(record.model_weights) if record.model_weights else None
    weights = recorded if recorded is not None and recorded.exists() else None  # the checkpoint replaces weights
    try:
        model = build_model(record.model, ModelSpec(record.input_shape, record.n_outputs, weights, record.layout))
    except (ValueError, OSError, UnknownNameError) as err:
        missing = f" (its model_weights {record.model_weights!r} is not on this machine)" if recorded and not weights else ""
        raise ModelRecordError(f"{source}: cannot rebuild model {record.model!r}{missing}: {err}") from None
    if channels_last_for(config.memory_format, CPU):
        model = model.to(memory_format=torch.channels_last)
    return build_algorithm(record.algorithm, model, config.typed_hparams, algorithm_context(record, source)).model


def record_config(record: ModelRecord, source: str = "model record") -> TrainConfig:
    """The run's TrainConfig from the record's flat settings; settings this raybench cannot parse (an algorithm
    of a plug-in not imported here) are a ModelRecordError naming the setting."""
    try:
        return TrainConfig.from_flat(dict(record.settings))
    except ConfigError as err:
        raise ModelRecordError(f"{source}: model record key 'settings' does not parse here: {err}") from None


def algorithm_context(record: ModelRecord, source: str = "model record") -> AlgorithmContext:
    """What the run's algorithm was told about its dataset, enough to shape the model. Building an algorithm
    views no inputs, so its views here refuse to be called rather than stand in for the dataset's."""
    try:
        kind = TaskKind(record.task)
    except ValueError:
        raise ModelRecordError(f"{source}: model record key 'task' is {record.task!r}, not one of "
                               f"{', '.join(k.value for k in TaskKind)}") from None
    return AlgorithmContext(task=Task(kind, record.n_outputs), views=Views(_unviewed, _unviewed, _unviewed),
                            n_domains=record.n_domains, total_steps=0, n_groups=record.n_groups)


def _unviewed(x: Any) -> Any:
    raise RuntimeError("a rebuilt model's algorithm only shapes the model; apply the dataset's own views")


def record_dataset(record: ModelRecord, data_dir: Path | None = None) -> ShiftDataset:
    """The dataset the record's run trained on: its registered name and data seed, read from `data_dir`, else
    from the run's own data dir where this machine has it, else from the default location; at the run's
    `input_size` if it set one."""
    config = record_config(record)
    if data_dir is None and config.data_dir and Path(config.data_dir).is_dir():
        data_dir = Path(config.data_dir)
    dataset = load_dataset(record.dataset, data_dir, record.data_seed)
    return dataset.at_input_size(config.input_size) if config.input_size else dataset


def evaluate_split(model: torch.nn.Module, record: ModelRecord, split: str, data_dir: Path | None = None,
                   dataset: ShiftDataset | None = None) -> dict[str, float]:
    """The metrics of `model` on split `split` of the record's dataset (`dataset` if given, else read as
    `record_dataset` reads it), computed by the trainer's own evaluation: the same batching, view and metrics,
    keyed as every epoch logs them (`test/acc`, ...). On the device the model's weights are on.

    Every row of the split is scored: where a run reported a split on part of its rows only (DFR's `val`, scored
    on the half its head was not fit on), the logged number and this one differ by design."""
    data = dataset if dataset is not None else record_dataset(record, data_dir)
    if tuple(data.input_shape) != record.input_shape or data.task.n_outputs != record.n_outputs:
        raise ValueError(f"dataset {data.name!r} has inputs {tuple(data.input_shape)} and {data.task.n_outputs} "
                         f"outputs; the model was built for {record.input_shape} and {record.n_outputs}")
    if split not in data.eval_splits:
        raise ValueError(f"split {split!r}: expected one of {', '.join(data.eval_splits)} (the labeled splits of "
                         f"{data.name!r})")
    config = record_config(record)
    device = next(model.parameters(), torch.empty(0)).device

    def predict(scorer: torch.nn.Module, rows: Any, view: Any) -> Any:
        return predict_split(scorer, rows, view, device, config.eval_batch_size, prefetch_depth(config.prefetch, rows))

    return score_split(model, data, split, data.split(split), predict)
