"""The per-dataset facts of datasets.yaml, parsed into typed records and checked when raybench loads.

A wrong entry fails with one line naming the file, the dataset, the key and what was expected, so a
user adding a dataset (or a value) sees the mistake before any cluster work starts.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from raybench.data.base import TaskKind, TrainDefaults

SPEC_FILE = Path(__file__).with_name("datasets.yaml")
INPUT_KINDS = ("image", "multispectral", "text", "graph", "detection")
DEFAULT_FIELDS = ("model", "optimizer", "lr", "weight_decay", "momentum", "scheduler", "batch_size", "epochs", "grad_clip")
REQUIRED = ("task", "inputs", "input_shape", "domain_fields", "selection", "metrics", "unlabeled_split", "defaults", "search")
OPTIONAL = ("algorithm_hparams", "augment", "balance_labeled_by")
BALANCE_KEYS = (None, "y", "domain", "group")  # what the trainer can balance labeled batches by


class SpecError(ValueError):
    def __init__(self, path: Path, key: str, value: Any, expected: str) -> None:
        super().__init__(f"{path}: {key}: expected {expected}, got {value!r}")


@dataclass(frozen=True)
class WildsSpec:
    name: str
    task: TaskKind
    n_outputs: int
    inputs: str
    input_shape: tuple[int, ...]
    domain_fields: tuple[str, ...]
    selection: str
    metrics: tuple[str, ...]
    unlabeled_split: str
    defaults: TrainDefaults
    crop_pad: int = 0
    cutout: int = 0


def load_specs(path: Path = SPEC_FILE) -> dict[str, WildsSpec]:
    data = yaml.safe_load(path.read_text())
    if not isinstance(data, dict):
        raise SpecError(path, "(top level)", type(data).__name__, "a mapping of dataset names")
    return {name: parse_spec(name, entry, path) for name, entry in data.items()}


def parse_spec(name: str, entry: Any, path: Path) -> WildsSpec:
    if not isinstance(entry, dict):
        raise SpecError(path, name, entry, "a mapping")
    for key in REQUIRED:
        if key not in entry:
            raise SpecError(path, f"{name}.{key}", None, "a value (required)")
    unknown = sorted(set(entry) - set(REQUIRED) - set(OPTIONAL))
    if unknown:
        raise SpecError(path, f"{name}.{unknown[0]}", entry[unknown[0]], f"one of {', '.join(REQUIRED + OPTIONAL)}")
    task = _task(name, entry["task"], path)
    if entry["inputs"] not in INPUT_KINDS:
        raise SpecError(path, f"{name}.inputs", entry["inputs"], f"one of {', '.join(INPUT_KINDS)}")
    augment = entry.get("augment") or {}
    return WildsSpec(
        name=name, task=task[0], n_outputs=task[1], inputs=entry["inputs"],
        input_shape=tuple(_ints(entry["input_shape"], f"{name}.input_shape", path)),
        domain_fields=tuple(_strings(entry["domain_fields"], f"{name}.domain_fields", path)),
        selection=str(entry["selection"]), metrics=tuple(_strings(entry["metrics"], f"{name}.metrics", path)),
        unlabeled_split=str(entry["unlabeled_split"]),
        defaults=_defaults(name, entry, path),
        crop_pad=int(augment.get("crop_pad", 0)), cutout=int(augment.get("cutout", 0)),
    )


def _task(name: str, value: Any, path: Path) -> tuple[TaskKind, int]:
    kinds = [k.value for k in TaskKind]
    if not isinstance(value, dict) or value.get("kind") not in kinds:
        raise SpecError(path, f"{name}.task.kind", value, f"one of {', '.join(kinds)}")
    n = value.get("n_outputs")
    if not isinstance(n, int) or n < 1:
        raise SpecError(path, f"{name}.task.n_outputs", n, "a positive integer")
    return TaskKind(value["kind"]), n


def _ints(value: Any, key: str, path: Path) -> list[int]:
    if not isinstance(value, list) or not value or not all(isinstance(v, int) and v > 0 for v in value):
        raise SpecError(path, key, value, "a list of positive integers")
    return value


def _strings(value: Any, key: str, path: Path) -> list[str]:
    if not isinstance(value, list) or not value or not all(isinstance(v, str) for v in value):
        raise SpecError(path, key, value, "a non-empty list of names")
    return value


def _defaults(name: str, entry: dict, path: Path) -> TrainDefaults:
    values = entry["defaults"]
    if not isinstance(values, dict) or "model" not in values:
        raise SpecError(path, f"{name}.defaults", values, "a mapping with at least `model`")
    unknown = sorted(set(values) - set(DEFAULT_FIELDS))
    if unknown:
        raise SpecError(path, f"{name}.defaults.{unknown[0]}", values[unknown[0]], f"one of {', '.join(DEFAULT_FIELDS)}")
    hparams = entry.get("algorithm_hparams") or {}
    if not isinstance(hparams, dict) or not all(isinstance(v, dict) for v in hparams.values()):
        raise SpecError(path, f"{name}.algorithm_hparams", hparams, "a mapping of algorithm -> {hyperparameter: value}")
    search = _search(name, entry["search"], path)
    balance = entry.get("balance_labeled_by")
    if balance not in BALANCE_KEYS:
        raise SpecError(path, f"{name}.balance_labeled_by", balance, f"one of {', '.join(str(k) for k in BALANCE_KEYS[1:])}")
    return TrainDefaults(**values, unlabeled_ratio=3, unlabeled_split=entry["unlabeled_split"], algorithm_hparams=hparams,
                         balance_labeled_by=entry.get("balance_labeled_by"), **search)


def _search(name: str, value: Any, path: Path) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise SpecError(path, f"{name}.search", value, "a mapping with max_batch_size and replicates")
    for key in ("max_batch_size", "replicates"):
        if not isinstance(value.get(key), int) or value[key] < 1:
            raise SpecError(path, f"{name}.search.{key}", value.get(key), "a positive integer")
    center = value.get("lr_center")
    if center is not None and not (isinstance(center, (int, float)) and center > 0):
        raise SpecError(path, f"{name}.search.lr_center", center, "a positive number")
    unknown = sorted(set(value) - {"max_batch_size", "replicates", "lr_center"})
    if unknown:
        raise SpecError(path, f"{name}.search.{unknown[0]}", value[unknown[0]], "one of max_batch_size, replicates, lr_center")
    return {"max_batch_size": value["max_batch_size"], "replicates": value["replicates"],
            "lr_center": None if center is None else float(center)}
