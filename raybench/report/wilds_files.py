"""The WILDS leaderboard's files, as the authors' own code writes and reads them: names, encodings, results.

A submission is one prediction file per (dataset, evaluation split, replicate), which the authors'
`examples/evaluate.py` finds by name, reads, scores with the dataset's own `eval()` and aggregates into
`{dataset}_results.json`. Everything here follows that code, at p-lambda/wilds commit
472677590de351857197a9bf24958838c39c272b (wilds 2.0.0, the version raybench installs; its `wilds/` files are
byte-identical to the installed package's), where it and any page disagree:

- names: `{dataset}_split:{split}_{replicate}_epoch:best_pred.csv`, the replicate `seed:{seed}`, or `fold:{fold}` for
  poverty (examples/utils.py:284-309 `save_pred`, `get_replicate_str`, `get_pred_prefix`; examples/train.py:221-229
  `save_pred_if_needed` adds `epoch:best_pred`); evaluate.py:84-95 finds a file by that prefix ending in .csv or
  .pth. Which replicates it reads: evaluate.py:72-82 (`fold:A`..`fold:E` for poverty, `seed:0`..`seed:9` for
  camelyon17, `seed:0`..`seed:4` for civilcomments, `seed:0`..`seed:2` otherwise).
- splits: every split of the dataset's `split_dict` but train, in its order (evaluate.py:130-132). The split dicts:
  wilds/datasets/amazon_dataset.py:199-205 (the official `user` scheme), camelyon17_dataset.py:84-89 (no id_test),
  fmow_dataset.py:71, globalwheat_dataset.py:190-196, iwildcam_dataset.py:62, poverty_dataset.py:160;
  civilcomments and ogb-molpcba keep WILDSDataset.DEFAULT_SPLITS (wilds_dataset.py:16, :212-218). A split's rows
  are `get_subset(split)`'s, in index order (wilds_dataset.py:71-72, `np.where` of the split mask).
- encodings: a tensor is written by `pd.DataFrame(y_pred.numpy()).to_csv(path, index=False, header=False)` and a list
  of dicts by `torch.save` as .pth (utils.py:284-293). What y_pred is per dataset is its `process_outputs_function`
  (examples/configs/datasets.py): `multiclass_logits_to_pred`, the class index per row, for amazon (:30), camelyon17
  (:77), civilcomments (:130), fmow (:228), iwildcam (:258) (and rxrx1, :422, which raybench does not run); none,
  the model's outputs as they are, for ogb-molpcba (:286: its 128 tasks' binary logits, which
  ogbmolpcba_dataset.py:107-119 `eval` takes), poverty (:344: the regression value, one column) and globalwheat
  (:451: per image its detections' boxes, labels and scores, read by DetectionAccuracy,
  wilds/common/metrics/all_metrics.py:358-363).
- reading: evaluate.py:227-245 `get_predictions` parses each non-empty CSV line with `ast.literal_eval` (a line of
  several values is a tuple: one row of ogb-molpcba) into `torch.from_numpy(np.array(...))`; globalwheat's .pth is
  `torch.load`ed (evaluate.py:217-224). Scoring: evaluate.py:194-214 `evaluate_replicate` adds a last axis when the
  shapes differ (poverty's one value per line against its (N, 1) targets) and returns `eval(...)[0]`.
- results: per split, per metric of evaluate.py:97-119 `get_metrics` (in that order), `{metric}_std` as
  `np.std(values, ddof=1)` then `{metric}` as `np.mean(values)` over the replicates (evaluate.py:174-184), dumped
  with `json.dump(..., indent=4)` to `{dataset}_results.json` (evaluate.py:186-189).

Only numpy at import; torch and pandas are imported where a file is written or read.
"""
from __future__ import annotations

import ast
import json
import math
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Any

import numpy as np

from raybench.paths import write_atomically

WILDS_REPOSITORY = "p-lambda/wilds"
WILDS_COMMIT = "472677590de351857197a9bf24958838c39c272b"
EVALUATE_SCRIPT = "examples/evaluate.py"
BEST_EPOCH = "epoch:best_pred"  # examples/train.py:228-229: the selected epoch's predictions


class Encoding(str, Enum):
    """What one row of a prediction file holds (examples/configs/datasets.py `process_outputs_function`)."""

    CLASS_INDEX = "class index"  # multiclass_logits_to_pred: argmax over the classes
    VALUE = "regression value"  # poverty's one output, as the model gives it
    TASK_LOGITS = "per-task logits"  # ogb-molpcba's 128 binary logits, as the model gives them
    DETECTIONS = "detections"  # globalwheat: boxes, labels and scores per image, a .pth file


@dataclass(frozen=True)
class Board:
    """One dataset's leaderboard files: its evaluation splits in `split_dict` order, the metrics evaluate.py
    aggregates, the replicates it reads (`seed:0`.. or `fold:A`..) and how a prediction row is written."""

    dataset: str
    splits: tuple[str, ...]
    metrics: tuple[str, ...]
    replicates: tuple[str, ...]
    encoding: Encoding

    @property
    def by_fold(self) -> bool:
        """Its replicates are folds of the data (poverty), not seeds."""
        return self.replicates[0].startswith("fold:")

    @property
    def suffix(self) -> str:
        return ".pth" if self.encoding is Encoding.DETECTIONS else ".csv"

    def file_name(self, split: str, replicate: str) -> str:
        """`{dataset}_split:{split}_{replicate}_epoch:best_pred.csv` (.pth for globalwheat)."""
        return f"{self.dataset}_split:{split}_{replicate}_{BEST_EPOCH}{self.suffix}"

    def prefix_of(self, name: str) -> bool:
        """Whether `name` is a file evaluate.py could take for this dataset (its prefix and a .csv/.pth end)."""
        return name.startswith(f"{self.dataset}_split:") and name.endswith((".csv", ".pth"))


def seeds(count: int) -> tuple[str, ...]:
    return tuple(f"seed:{seed}" for seed in range(count))


def seed_name(index: int) -> str:
    """The leaderboard's name of a dataset's `index`-th replicate (0-based) when replicates are seeds."""
    return f"seed:{index}"


def fold_name(fold: str) -> str:
    return f"fold:{fold}"


RESULTS_SUFFIX = "_results.json"
VAL_TEST = ("val", "test")
ALL_FOUR = ("val", "test", "id_val", "id_test")
BOARDS: dict[str, Board] = {board.dataset: board for board in (
    Board("amazon", ("val", "id_val", "test", "id_test"), ("10th_percentile_acc", "acc_avg"), seeds(3),
          Encoding.CLASS_INDEX),
    Board("camelyon17", ("id_val", "test", "val"), ("acc_avg",), seeds(10), Encoding.CLASS_INDEX),
    Board("civilcomments", VAL_TEST, ("acc_wg", "acc_avg"), seeds(5), Encoding.CLASS_INDEX),
    Board("fmow", ("id_val", "id_test", "val", "test"), ("acc_worst_region", "acc_avg"), seeds(3),
          Encoding.CLASS_INDEX),
    Board("globalwheat", ALL_FOUR, ("detection_acc_avg_dom",), seeds(3), Encoding.DETECTIONS),
    Board("iwildcam", ALL_FOUR, ("F1-macro_all", "acc_avg"), seeds(3), Encoding.CLASS_INDEX),
    Board("ogb-molpcba", VAL_TEST, ("ap",), seeds(3), Encoding.TASK_LOGITS),
    Board("poverty", ("id_val", "id_test", "val", "test"), ("r_wg", "r_all"),
          tuple(fold_name(fold) for fold in "ABCDE"), Encoding.VALUE),
)}


def results_name(dataset: str) -> str:
    return f"{dataset}{RESULTS_SUFFIX}"


# ----- one replicate's predictions on one split --------------------------------------------------------------
class UnwritablePredictions(ValueError):
    """Predictions the leaderboard's reader could not read back (a NaN or infinite output: pandas writes them as
    an empty field or `inf`, which `ast.literal_eval` refuses); the message says which."""


def leaderboard_predictions(board: Board, outputs: Any) -> Any:
    """What the authors' training loop saves as y_pred for `board`'s dataset, from a model's outputs on a split
    (float32 on the CPU: a tensor, or one {boxes, labels, scores} record per image for a detector)."""
    if board.encoding is Encoding.DETECTIONS:
        return [{key: record[key] for key in ("boxes", "labels", "scores")} for record in outputs]
    if board.encoding is Encoding.CLASS_INDEX:
        return outputs.argmax(dim=-1)
    values = outputs.reshape(len(outputs), -1) if board.encoding is Encoding.VALUE else outputs
    finite = values.isfinite()
    if not bool(finite.all()):
        row = int((~finite).reshape(len(values), -1).any(dim=1).nonzero()[0, 0])
        raise UnwritablePredictions(f"row {row} holds {values[row].flatten()[~finite[row].flatten()][0].item()}, "
                                    f"which the leaderboard's CSV reader cannot parse")
    return values


def write_predictions(path: Path, y_pred: Any) -> None:
    """`save_pred` (examples/utils.py:284-293): a tensor as headerless, indexless CSV, a list as a .pth; all or
    nothing (raybench.paths.write_atomically)."""
    import torch

    if torch.is_tensor(y_pred):
        import pandas as pd

        frame = pd.DataFrame(y_pred.numpy())
        write_atomically(path, lambda tmp: frame.to_csv(tmp, index=False, header=False))
    elif isinstance(y_pred, (dict, list)):
        write_atomically(path, lambda tmp: torch.save(y_pred, tmp))
    else:
        raise TypeError(f"expected a tensor or a list of detections, got {type(y_pred).__name__}")


def read_predictions(path: Path) -> Any:
    """A prediction file as evaluate.py reads it: a CSV's non-empty lines through `ast.literal_eval` into one
    array (evaluate.py:227-245), a .pth through `torch.load` (evaluate.py:220), here with weights_only=True."""
    import torch

    if Path(path).suffix == ".pth":
        return torch.load(path, map_location="cpu", weights_only=True)
    lines = Path(path).read_text().splitlines(keepends=True)
    return torch.from_numpy(np.array([ast.literal_eval(line.rstrip()) for line in lines if line.rstrip()]))


def evaluate_replicate(board: Board, wilds_dataset: Any, split: str, y_pred: Any) -> dict[str, Any]:
    """The dataset's own `eval` of one replicate's predictions on `split`, as evaluate.py:194-224 calls it."""
    subset = wilds_dataset.get_subset(split)
    metadata = subset.metadata_array
    if board.encoding is Encoding.DETECTIONS:
        targets = [subset.dataset.y_array[idx] for idx in subset.indices]
        return wilds_dataset.eval(y_pred, targets, metadata)[0]
    targets = subset.y_array
    if y_pred.shape != targets.shape:
        y_pred = y_pred.unsqueeze(-1)
    return wilds_dataset.eval(y_pred, targets, metadata)[0]


# ----- the replicates together -------------------------------------------------------------------------------
Scores = Mapping[str, Mapping[str, Any]]  # split -> eval() results of one replicate


def aggregate(board: Board, replicates: Sequence[Scores]) -> dict[str, dict[str, float]]:
    """evaluate.py:174-184: per split and metric, the sample std (ddof=1) and the mean over the replicates. One
    replicate has no sample std: NaN, as numpy gives it (its warning silenced)."""
    aggregated: dict[str, dict[str, float]] = {}
    for split in board.splits:
        aggregated[split] = {}
        for metric in board.metrics:
            values = [replicate[split][metric] for replicate in replicates]
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", RuntimeWarning)
                aggregated[split][f"{metric}_std"] = float(np.std(values, ddof=1))
            aggregated[split][metric] = float(np.mean(values))
    return aggregated


def results_text(aggregated: Mapping[str, Mapping[str, float]]) -> str:
    """`{dataset}_results.json` as evaluate.py:188-189 writes it (`json.dump(..., indent=4)`: NaN as NaN)."""
    return json.dumps(aggregated, indent=4)


def same_number(a: float, b: float, tolerance: float = 1e-9) -> bool:
    """Equal up to float rounding (the mean and std of numpy and of pandas may differ in the last bits); two NaNs
    (one replicate's std) are the same."""
    if math.isnan(a) or math.isnan(b):
        return math.isnan(a) and math.isnan(b)
    return abs(a - b) <= tolerance * max(1.0, abs(a), abs(b))
