"""Files a run writes and reads: `state.pt` (resume exactly), `best_model.pt` (a model), safely.

Every file is read with `torch.load(..., weights_only=True)`: a checkpoint can come from another
machine or another person (a sweep's storage, a `teacher_checkpoint`), and a full unpickle would run
whatever code it names. So everything written holds only tensors, dicts, lists, tuples and primitives.

`best_model.pt` holds the best epoch's weights beside a `ModelRecord` (which model, built how, on which
dataset, with which settings), so the file alone rebuilds the model (raybench.rebuild). Files from before
it carried a record, bare state dicts, still read as weights everywhere.
"""
from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from raybench.models import FeaturizerHead
from raybench.models.base import (
    CHECKPOINT_FORMAT,
    CHECKPOINT_WEIGHTS,
    UnreadableWeightsError,
    as_state_dict,
    is_model_checkpoint,
    read_state_dict,
    read_weights_only,
)
from raybench.paths import write_atomically

STATE_FILE = "state.pt"
BEST_MODEL_FILE = "best_model.pt"
STAGE_MODEL_FILE = "model.pt"  # a stage-cache entry's weights (raybench.trainer.stages)
# What a trial state must hold to be resumed (see Trainer._write).
STATE_KEYS = ("config", "progress", "algorithm", "optimizer", "scheduler", "generators", "rng", "best_state")
MODEL_CHECKPOINT_VERSION = 1  # the value under CHECKPOINT_FORMAT in a best_model.pt this raybench writes
CHECKPOINT_RECORD = "record"
SCALARS = (str, int, float, bool, type(None))
_WHOLE_KEYS = frozenset({"n_outputs", "n_domains", "n_groups", "data_seed", "epoch"})  # ModelRecord's int fields


class ModelRecordError(UnreadableWeightsError):
    """A model checkpoint whose record is missing or damaged, so it cannot be rebuilt; the message names the file
    and the key. Its weights may still load (`read_state_dict`)."""


@dataclass(frozen=True)
class ModelRecord:
    """What built a checkpoint's weights, saved beside them so the file alone rebuilds the model.

    `model` is the registered model name and `input_shape`, `n_outputs`, `layout` and `model_weights` the
    `ModelSpec` it was built from (the last: the pretrained file or folder the run named, "" for none; a text
    model's folder also holds its architecture and tokenizer). `task`, `n_domains` and `n_groups` are what the
    algorithm was told about the dataset when it shaped the model (Noisy Student's dropout head, the NeWT probe's
    standardising head). `settings` is the run's resolved TrainConfig as a flat dict (`TrainConfig.to_flat`),
    `epoch` the epoch (counted over every round) whose weights these are.
    """

    model: str
    input_shape: tuple[int, ...]
    n_outputs: int
    layout: str
    model_weights: str
    task: str
    n_domains: int
    n_groups: int
    dataset: str
    data_seed: int
    algorithm: str
    settings: Mapping[str, Any] = field(default_factory=dict)
    epoch: int = -1
    raybench_version: str = ""

    def to_dict(self) -> dict[str, Any]:
        """Plain strings, numbers, lists and dicts only: the record loads with weights_only=True."""
        data = {f.name: getattr(self, f.name) for f in fields(self)}
        return {**data, "input_shape": list(self.input_shape), "settings": dict(self.settings)}

    @classmethod
    def from_dict(cls, data: Any) -> ModelRecord:
        """The record `to_dict` wrote; a missing key or a value of the wrong type is one ModelRecordError naming it."""
        if not isinstance(data, Mapping):
            raise ModelRecordError(f"the model record is a {type(data).__name__}, not a mapping")
        values = {f.name: _record_value(data, f.name) for f in fields(cls)}
        record = cls(**{**values, "input_shape": tuple(values["input_shape"]), "settings": dict(values["settings"])})
        if record.settings.get("algorithm", record.algorithm) != record.algorithm:
            raise ModelRecordError(f"model record key 'algorithm' is {record.algorithm!r} but its settings say "
                                   f"{record.settings['algorithm']!r}")
        return record


def _record_value(data: Mapping[str, Any], key: str) -> Any:
    """`data[key]` checked against the type ModelRecord declares for it."""
    if key not in data:
        raise ModelRecordError(f"model record key {key!r} is missing")
    value = data[key]
    if key == "input_shape":
        ok = isinstance(value, (list, tuple)) and len(value) > 0 and all(_whole(v) and v > 0 for v in value)
        words = "a non-empty list of positive whole numbers"
    elif key == "settings":
        ok = isinstance(value, Mapping) and all(isinstance(k, str) and isinstance(v, SCALARS) for k, v in value.items())
        words = "a mapping of setting names to plain values"
    elif key in _WHOLE_KEYS:
        ok, words = _whole(value), "a whole number"
    else:
        ok, words = isinstance(value, str), "a string"
    if not ok:
        raise ModelRecordError(f"model record key {key!r} should be {words}, got {value!r:.80}")
    return value


def _whole(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def write_model_checkpoint(path: Path, weights: Mapping[str, Tensor], record: ModelRecord) -> None:
    """Write `best_model.pt`: the weights and the record of what built them, all or nothing."""
    atomic_save({CHECKPOINT_FORMAT: MODEL_CHECKPOINT_VERSION, CHECKPOINT_RECORD: record.to_dict(),
                 CHECKPOINT_WEIGHTS: dict(weights)}, Path(path))


def read_model_file(path: Path) -> tuple[dict[str, Tensor], ModelRecord | None]:
    """The weights of a model checkpoint (file or folder) and its record, read once with weights_only=True; the
    record is None for a bare state dict (a file from before checkpoints carried one). A damaged record, or one
    from a newer raybench, is a ModelRecordError naming the file."""
    file = model_file(path)
    loaded = read_weights_only(file, "model checkpoint")
    weights = as_state_dict(loaded, file, "model checkpoint")
    if not is_model_checkpoint(loaded):
        return weights, None
    version = loaded[CHECKPOINT_FORMAT]
    if version > MODEL_CHECKPOINT_VERSION:
        raise ModelRecordError(f"model checkpoint {str(file)!r} has format {version}, newer than this raybench reads "
                               f"(up to {MODEL_CHECKPOINT_VERSION}): read it with the raybench that wrote it")
    try:
        return weights, ModelRecord.from_dict(loaded.get(CHECKPOINT_RECORD))
    except ModelRecordError as err:
        raise ModelRecordError(f"model checkpoint {str(file)!r}: {err}") from None


def atomic_save(obj: Any, path: Path) -> None:
    """`torch.save` all or nothing (raybench.paths.write_atomically): a run killed mid-write never leaves half a
    checkpoint, and a write that fails (a full disk, a folder where the file belongs) leaves no temporary file.
    torch's writer says a full disk as a RuntimeError without an errno; it is raised as the OSError (ENOSPC)
    naming `path`, which the callers turn into one line naming their folder."""
    write_atomically(Path(path), functools.partial(torch.save, obj))


def read_trial_state(directory: Path) -> dict[str, Any]:
    """The `state.pt` in `directory`; a missing, unreadable or unsafe file is an error naming it, never executed."""
    path = Path(directory) / STATE_FILE
    state = read_weights_only(path, "trial state")
    missing = [k for k in STATE_KEYS if not isinstance(state, Mapping) or k not in state]
    if missing:
        raise UnreadableWeightsError(f"trial state {str(path)!r} is not a raybench trial state: it lacks {missing}")
    return dict(state)


def model_file(path: Path) -> Path:
    """A model checkpoint given as a file, or as a trial's checkpoint folder holding `best_model.pt`."""
    path = Path(path)
    return path / BEST_MODEL_FILE if path.is_dir() else path


def read_model_checkpoint(path: Path, model: FeaturizerHead) -> FeaturizerHead:
    """`model` with the weights of a raybench model checkpoint (file or folder), which must fit it exactly."""
    file = model_file(path)
    return load_state_dict_into(model, read_state_dict(file, "model checkpoint"), str(file))


def load_state_dict_into(model: FeaturizerHead, state: Mapping[str, Tensor], source: str = "state") -> FeaturizerHead:
    """Load a saved model, mapping a Noisy Student head (Dropout, Linear) onto a plain Linear head and back.

    Keys and shapes are compared first, so a checkpoint of another architecture is one line naming
    `source` (an UnreadableWeightsError) instead of torch's page of missing and unexpected keys.
    """
    own = model.state_dict()
    if "head.weight" in own and "head.1.weight" in state:
        state = {k.replace("head.1.", "head."): v for k, v in state.items()}
    elif "head.1.weight" in own and "head.weight" in state:
        state = {k.replace("head.", "head.1.") if k.startswith("head.") else k: v for k, v in state.items()}
    check_fits(own, state, source)
    model.load_state_dict(state)
    return model


def check_fits(own: Mapping[str, Tensor], state: Mapping[str, Tensor], source: str) -> None:
    missing = [k for k in own if k not in state]
    unexpected = [k for k in state if k not in own]
    reshaped = [f"{k} {tuple(state[k].shape)} vs {tuple(own[k].shape)}" for k in own
                if k in state and state[k].shape != own[k].shape]
    if missing or unexpected or reshaped:
        problems = [f"{len(found)} {what}, e.g. {found[:2]}" for what, found in (
            ("keys of the model missing", missing), ("unexpected keys", unexpected), ("shapes differ", reshaped)) if found]
        raise UnreadableWeightsError(f"{source!r} holds a model of another architecture: {'; '.join(problems)}")
