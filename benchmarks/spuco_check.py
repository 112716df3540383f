"""Verification on `spuco-digits`: SpuCo's Table 2 pattern, the magnitude trend, and all nine methods.

Three parts, each printing a markdown table of mean ± sample std (ddof=1) over 3 seeds, scored at each
run's best validation worst-group epoch, on the group-balanced test split:

- `pattern`: ERM, GB and GroupDRO at large magnitude with the dataset's defaults. SpuCo Table 2 reports
  ERM 0.0 worst-group / 99.5 average, GB 76.8, GroupDRO 74.8 on SpuCoMNIST.
- `trend`: ERM at large, medium and small magnitude (spuco-digits-magnitude-*); worst-group should rise.
- `table`: every method plus ERM as a real sweep (`raybench sweep SPACE --dataset spuco-digits`) through
  the function executor on a private local Ray: `--trials` random configs of search_spaces/<method>.yaml
  selected by validation worst-group accuracy, then 3 seed replicates of the selected one.

    .venv/bin/python benchmarks/spuco_check.py --part pattern|trend|table [--seeds 3] [--json out.json]
"""
from __future__ import annotations

import argparse
import json
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

from seed_table import seed_table

PATTERN = (("ERM", "erm", "spuco-digits"), ("GB", "gb", "spuco-digits"), ("GroupDRO", "groupdro", "spuco-digits"))
TREND = tuple((f"ERM, {m} magnitude", "erm", f"spuco-digits-magnitude-{m}") for m in ("large", "medium", "small"))
METHODS = ("erm", "cb", "gb", "groupdro", "jtt", "eiil", "spare", "ssa", "dfr", "dispel")
COLUMNS = (("test/worst_group_acc", "test worst-group"), ("test/avg_acc", "test average"),
           ("test/acc", "test acc (balanced)"), ("val/worst_group_acc", "val worst-group"))


def run_one(label: str, algorithm: str, dataset_name: str, seed: int) -> dict[str, Any]:
    import torch

    torch.set_num_threads(1)  # one process per core beats two processes fighting over threads
    from raybench.data import load_dataset
    from raybench.trainer import TrainConfig, Trainer

    dataset = load_dataset(dataset_name)
    start = time.perf_counter()
    config = TrainConfig.from_flat({"dataset": dataset_name, "algorithm": algorithm, "seed": seed})
    result = Trainer(config, dataset=dataset).fit()
    return {"label": label, "seed": seed, "best_epoch": result.best_epoch, "seconds": time.perf_counter() - start,
            **{k: result.best_metrics[k] for k, _ in COLUMNS}}


def run_fixed(rows: tuple[tuple[str, str, str], ...], seeds: int, workers: int) -> list[dict[str, Any]]:
    jobs = [(label, algorithm, dataset, seed) for label, algorithm, dataset in rows for seed in range(seeds)]
    with ProcessPoolExecutor(max_workers=workers) as pool:
        return list(pool.map(run_one, *zip(*jobs)))


def run_sweeps(methods: tuple[str, ...], trials: int, seeds: int, max_steps: int, storage: Path) -> list[dict[str, Any]]:
    """One real sweep per method on a private local Ray, results read from each sweep's summary."""
    from raybench.sweep.runner import SweepOptions, prepare, run_sweep

    rows = []
    for method in methods:
        options = SweepOptions(space=method, dataset="spuco-digits", trials=trials, replicates=seeds, seed=0,
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
    parser.add_argument("--part", choices=("pattern", "trend", "table"), required=True)
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
        rows = run_sweeps(tuple(args.methods.split(",")), args.trials, args.seeds, args.max_steps, storage)
        text = sweep_table(rows)
    else:
        rows = run_fixed(PATTERN if args.part == "pattern" else TREND, args.seeds, args.workers)
        text = seed_table(rows, COLUMNS)
    print(text)
    print(f"\n{args.part}: {time.perf_counter() - started:.0f} s wall on {args.workers} workers")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2, default=str))


if __name__ == "__main__":
    main()
