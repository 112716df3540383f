"""Verification of a SpuCoMNIST base (`spuco-digits`, `spuco-fashion`): SpuCo's Table 2 pattern and more.

Four parts, each printing a markdown table of mean ± sample std (ddof=1) over 3 seeds, scored at each
run's best validation worst-group epoch, on the group-balanced test split:

- `pattern`: ERM, GB and GroupDRO at large magnitude with the dataset's defaults. SpuCo Table 2 reports
  ERM 0.0 worst-group / 99.5 average, GB 76.8, GroupDRO 74.8 on SpuCoMNIST.
- `trend`: ERM at large, medium and small magnitude (<base>-magnitude-*); worst-group should rise.
- `verify`: the pattern's rows plus JTT, then ERM at small magnitude: what a new or resized base is
  checked with (a method stuck near ERM, or ERM not improving at small magnitude, needs a reason).
- `table`: every method plus ERM as a real sweep (`raybench sweep SPACE --dataset <base>`) through
  the function executor on a private local Ray: `--trials` random configs of search_spaces/<method>.yaml
  selected by validation worst-group accuracy, then 3 seed replicates of the selected one.

The fixed-config parts also print a timing table: wall seconds per run, the epoch selected, and the
trainer's throughput (training images per second with evaluation time taken out, and evaluation images
per second), so a part can be sized to a time budget before it is run.

    .venv/bin/python benchmarks/spuco_check.py --part pattern|trend|verify|table [--base spuco-fashion]
        [--seeds 3] [--epochs N] [--workers 1] [--json out.json]
"""
from __future__ import annotations

import argparse
import json
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any, Optional

from seed_table import seed_table

from raybench.trainer.callbacks import Callback, StageReport

BASES = ("spuco-digits", "spuco-fashion")
Row = tuple[str, str, str]  # (label, algorithm, dataset)
METHODS = ("erm", "cb", "gb", "groupdro", "jtt", "eiil", "spare", "ssa", "dfr", "dispel")
COLUMNS = (("test/worst_group_acc", "test worst-group"), ("test/avg_acc", "test average"),
           ("test/acc", "test acc (balanced)"), ("val/worst_group_acc", "val worst-group"))


def pattern_rows(base: str) -> tuple[Row, ...]:
    return (("ERM", "erm", base), ("GB", "gb", base), ("GroupDRO", "groupdro", base))


def trend_rows(base: str) -> tuple[Row, ...]:
    return tuple((f"ERM, {m} magnitude", "erm", f"{base}-magnitude-{m}") for m in ("large", "medium", "small"))


def verify_rows(base: str) -> tuple[Row, ...]:
    return pattern_rows(base) + (("JTT", "jtt", base), ("ERM, small magnitude", "erm", f"{base}-magnitude-small"))


PARTS = {"pattern": pattern_rows, "trend": trend_rows, "verify": verify_rows}
HISTORY_KEYS = ("val/worst_group_acc", "test/worst_group_acc", "test/avg_acc")


def run_one(label: str, algorithm: str, dataset_name: str, seed: int, epochs: Optional[int]) -> dict[str, Any]:
    import torch

    torch.set_num_threads(1)  # one process per core beats two processes fighting over threads
    from raybench.data import load_dataset
    from raybench.trainer import TrainConfig, Trainer

    dataset = load_dataset(dataset_name)
    start = time.perf_counter()
    flat = {"dataset": dataset_name, "algorithm": algorithm, "seed": seed, **({"epochs": epochs} if epochs else {})}
    stages = StageSeconds()
    trainer = Trainer(TrainConfig.from_flat(flat), callbacks=[stages], dataset=dataset)
    eval_seconds = time_evaluation(trainer)
    result = trainer.fit()
    seconds = time.perf_counter() - start
    epochs_run = len(result.history)
    trained = epochs_run * trainer.steps_per_epoch * trainer.labeled_bs
    evaluated = epochs_run * sum(len(dataset.split(s)) for s in dataset.eval_splits)
    row = {"label": label, "seed": seed, "best_epoch": result.best_epoch, "epochs": epochs_run, "seconds": seconds,
           "stage_seconds": stages.seconds,
           "train_images_per_s": trained / max(seconds - eval_seconds[0] - stages.seconds, 1e-9),
           "eval_images_per_s": evaluated / max(eval_seconds[0], 1e-9),
           "history": {k: [h[k] for h in result.history] for k in HISTORY_KEYS},
           **{k: result.best_metrics[k] for k, _ in COLUMNS}}
    print(f"{label} seed {seed}: best epoch {result.best_epoch}, " + ", ".join(
        f"{title} {100 * row[k]:.1f}" for k, title in COLUMNS) + f"; {seconds:.0f} s", flush=True)
    return row


class StageSeconds(Callback):
    """Adds up the seconds of earlier stages trained in this run (JTT's reference), so throughput excludes them."""

    def __init__(self) -> None:
        self.seconds = 0.0

    def on_stage(self, report: StageReport) -> None:
        if not report.cached:
            self.seconds += report.seconds


def time_evaluation(trainer: Any) -> list[float]:
    """Wrap the trainer's per-epoch evaluation to add up its seconds, so training throughput excludes it."""
    total = [0.0]
    evaluate = trainer._evaluate

    def timed(algorithm: Any) -> dict[str, float]:
        started = time.perf_counter()
        out = evaluate(algorithm)
        total[0] += time.perf_counter() - started
        return out

    trainer._evaluate = timed
    return total


def run_fixed(rows: tuple[Row, ...], seeds: int, workers: int, epochs: Optional[int]) -> list[dict[str, Any]]:
    jobs = [(label, algorithm, dataset, seed, epochs) for label, algorithm, dataset in rows for seed in range(seeds)]
    with ProcessPoolExecutor(max_workers=workers) as pool:
        return list(pool.map(run_one, *zip(*jobs)))


def timing_table(runs: list[dict[str, Any]]) -> str:
    """Per row label: mean wall seconds per run, selected epochs, and the trainer's images per second."""
    lines = ["| run | s per run (mean, min-max) | selected epochs | train images/s | eval images/s |", "|---" * 5 + "|"]
    for label in dict.fromkeys(r["label"] for r in runs):
        mine = [r for r in runs if r["label"] == label]
        secs = [r["seconds"] for r in mine]
        lines.append(
            f"| {label} | {sum(secs) / len(secs):.0f} ({min(secs):.0f}-{max(secs):.0f}) | "
            f"{', '.join(str(r['best_epoch']) for r in mine)} of {mine[0]['epochs']} | "
            f"{sum(r['train_images_per_s'] for r in mine) / len(mine):.0f} | "
            f"{sum(r['eval_images_per_s'] for r in mine) / len(mine):.0f} |")
    return "\n".join(lines)


def run_sweeps(methods: tuple[str, ...], base: str, trials: int, seeds: int, max_steps: int,
               storage: Path) -> list[dict[str, Any]]:
    """One real sweep per method on a private local Ray, results read from each sweep's summary."""
    from raybench.sweep.runner import SweepOptions, prepare, run_sweep

    rows = []
    for method in methods:
        options = SweepOptions(space=method, dataset=base, trials=trials, replicates=seeds, seed=0,
                               executor="function", max_concurrent=2, storage=str(storage),
                               tracking_uri=f"sqlite:///{storage}/mlflow.db", name=f"spuco-{method}", resume=True,
                               extra_fixed={"max_steps_per_epoch": max_steps})
        start = time.perf_counter()
        summary = run_sweep(prepare(options))
        cells = summary["replicates"]["summary"]
        rows.append({"method": method, "seconds": time.perf_counter() - start,
                     "selected": summary["selected"]["sampled"] if summary["selected"] else None,
                     **{key: cells.get(f"best/{key}", {}) for key, _ in COLUMNS}})
        print(f"{method}: {sweep_row(rows[-1])}  ({rows[-1]['seconds']:.0f} s)", flush=True)
    return rows


def sweep_row(row: dict[str, Any]) -> str:
    cells = [f"{100 * row[k]['mean']:.1f} ± {100 * row[k]['std']:.1f}" if row[k] else "-" for k, _ in COLUMNS]
    return f"| {row['method']} | " + " | ".join(cells) + " |"


def sweep_table(rows: list[dict[str, Any]]) -> str:
    header = ["| method | " + " | ".join(title for _, title in COLUMNS) + " |", "|---" * (len(COLUMNS) + 1) + "|"]
    return "\n".join(header + [sweep_row(r) for r in rows])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--part", choices=(*PARTS, "table"), required=True)
    parser.add_argument("--base", choices=BASES, default="spuco-digits", help="the SpuCoMNIST base to check")
    parser.add_argument("--epochs", type=int, default=None, help="epochs per run (default: the dataset's)")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--trials", type=int, default=3, help="random configs per method (table)")
    parser.add_argument("--max-steps", type=int, default=150, help="steps per epoch cap for the table's sweeps")
    parser.add_argument("--methods", default=",".join(METHODS))
    parser.add_argument("--storage", default=None, help="where the table's sweeps live (default: a temp dir)")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    started = time.perf_counter()
    if args.part == "table":
        storage = Path(args.storage or tempfile.mkdtemp(prefix="spuco-table-")).resolve()
        rows = run_sweeps(tuple(args.methods.split(",")), args.base, args.trials, args.seeds, args.max_steps, storage)
        text = sweep_table(rows)
    else:
        rows = run_fixed(PARTS[args.part](args.base), args.seeds, args.workers, args.epochs)
        text = seed_table(rows, COLUMNS) + "\n\n" + timing_table(rows)
    print(text)
    print(f"\n{args.base} {args.part}: {time.perf_counter() - started:.0f} s wall on {args.workers} workers")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2, default=str))


if __name__ == "__main__":
    main()
