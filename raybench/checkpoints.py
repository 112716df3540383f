"""Files a run writes and reads: `state.pt` (resume exactly), `best_model.pt` (a model), safely.

Every file is read with `torch.load(..., weights_only=True)`: a checkpoint can come from another
machine or another person (a sweep's storage, a `teacher_checkpoint`), and a full unpickle would run
whatever code it names. So everything written holds only tensors, dicts, lists, tuples and primitives.
"""
from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from raybench.models import FeaturizerHead
from raybench.models.base import UnreadableWeightsError, read_state_dict, read_weights_only

STATE_FILE = "state.pt"
BEST_MODEL_FILE = "best_model.pt"
STAGE_MODEL_FILE = "model.pt"  # a stage-cache entry's weights (raybench.trainer.stages)
# What a trial state must hold to be resumed (see Trainer._write).
STATE_KEYS = ("config", "progress", "algorithm", "optimizer", "scheduler", "generators", "rng", "best_state")


def atomic_save(obj: Any, path: Path) -> None:
    """Write to a temp file, then rename: a run killed mid-write never leaves half a checkpoint."""
    tmp = path.with_name(path.name + ".tmp")
    torch.save(obj, tmp)
    os.replace(tmp, path)


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
