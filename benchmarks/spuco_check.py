"""Verification of a SpuCoMNIST base (`spuco-digits`, `spuco-fashion`): SpuCo's Table 2 pattern and more.

Four parts, each printing a markdown table of mean ± sample std (ddof=1) over 3 seeds, scored at each
run's best validation worst-group epoch, on the group-balanced test split:

- `pattern`: ERM, GB and GroupDRO at large magnitude with the dataset's defaults. SpuCo Table 2 reports
  ERM 0.0 worst-group / 99.5 average, GB 76.8, GroupDRO 74.8 on SpuCoMNIST.
- `trend`: ERM at large, medium and small magnitude (<base>-magnitude-*); worst-group should rise.
- `verify`: the pattern's rows plus JTT, then ERM at small magnitude: what a new or resized base is
  checked with (a method stuck near ERM, or ERM not improving at small magnitude, needs a reason).
- `paper`: SpuCo's Table 2 magnitude rows (ERM, GroupDRO, GB, JTT) plus DFR at large, medium and small
  magnitude, each at the paper's fixed settings (App. C.3: all 50 epochs, the best on val worst-group, no early
  stop unless `--patience N`), beside the paper's figures, with each cell's
  selected epochs, whether its selection could see (no blind flag, every val group >= 10 images) and the
  group counts of every split. `--smoke` cuts every cell to a few steps (CI runs it).
- `table`: every method plus ERM as a real sweep (`raybench sweep SPACE --dataset <base>`) through
  the function executor on a private local Ray: `--trials` random configs of raybench/search_spaces/<method>.yaml
  selected by validation worst-group accuracy, then 3 seed replicates of the selected one.

The fixed-config parts also print a timing table: wall seconds per run, the epoch selected, and the
trainer's throughput (training images per second with evaluation time taken out, and evaluation images
per second), so a part can be sized to a time budget before it is run.

    .venv/bin/python benchmarks/spuco_check.py --part pattern|trend|verify|table|paper [--base spuco-fashion]
        [--seeds 3] [--epochs N] [--workers 1] [--magnitudes large,medium,small] [--patience N] [--smoke]
        [--json out.json]
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

# SpuCo App. C.3, SpuCoMNIST: (lr, weight decay) per magnitude; GB uses GroupDRO's; JTT adds its inference epochs
# T_r and upsamples by 800 at every magnitude.
PAPER_SETTINGS: dict[str, dict[str, dict[str, float]]] = {
    "erm": {"large": {"lr": 1e-3, "weight_decay": 1e-2}, "medium": {"lr": 1e-4, "weight_decay": 1e-2},
            "small": {"lr": 1e-3, "weight_decay": 5e-4}},
    "groupdro": {"large": {"lr": 1e-2, "weight_decay": 1e-2}, "medium": {"lr": 1e-3, "weight_decay": 5e-3},
                 "small": {"lr": 1e-3, "weight_decay": 5e-4}},
    "jtt": {"large": {"lr": 1e-3, "weight_decay": 1e-2, "reference_epochs": 2, "upsample": 800},
            "medium": {"lr": 1e-3, "weight_decay": 1e-2, "reference_epochs": 20, "upsample": 800},
            "small": {"lr": 1e-4, "weight_decay": 1e-2, "reference_epochs": 20, "upsample": 800}},
}
PAPER_SETTINGS["gb"] = PAPER_SETTINGS["groupdro"]
# The paper's budget for them: LeNet, SGD with momentum 0.9, batch 32, 50 epochs, best epoch on val worst-group.
# No patience: the authors' "50 epochs with early stopping" (App. C.3) is SpuCo's BaseRobustTrain.train
# (src/spuco/robust_train/base_robust_train.py:42-50 at 91842463a577b0a90b4f829fec367308f3052e9f), which trains
# every one of num_epochs and keeps the model of the best val worst-group epoch (strict >, the earliest on ties);
# SpuCo stops no run early. `--patience N` adds raybench's early stop to every cell (the table first published
# in benchmarks/README.md used 5, which ended GroupDRO's medium runs after 7-13 of the 50 epochs).
PAPER_BUDGET = {"batch_size": 32, "epochs": 50}
for _method in ("erm", "groupdro", "gb", "jtt"):
    for _cell in PAPER_SETTINGS[_method].values():
        _cell.update(PAPER_BUDGET)
# DFR has no SpuCoMNIST row. Its premise is an ERM model trained to convergence (SpuCo trains DFR's ERM 100 epochs
# without early stopping), whose features then hold the core. At the dataset's weight decay 0.01 ERM's training
# loss stalls at 0.041 with every minority training group wrong, and a last layer on its features scores 0 worst-group;
# with DFR's own App. C grid value 0.0005 it falls to 0.0044 in 30 epochs (README, "SpuCo as its authors ran it").
PAPER_SETTINGS["dfr"] = {m: {"reference_lr": 1e-2, "reference_weight_decay": 5e-4, "reference_epochs": 30}
                         for m in ("large", "medium", "small")}
PAPER_METHODS = (("ERM", "erm"), ("GroupDRO", "groupdro"), ("GB", "gb"), ("JTT", "jtt"), ("DFR", "dfr"))
MAGNITUDES = ("large", "medium", "small")
# SpuCo Table 2 (SpuCoMNIST, magnitude rows): worst-group and average accuracy, mean ± std over 3 runs, in %.
PAPER_TABLE: dict[tuple[str, str], tuple[str, str]] = {
    ("erm", "large"): ("0.0 ± 0.0", "99.5 ± 0.0"), ("erm", "medium"): ("66.0 ± 5.0", "89.9 ± 7.0"),
    ("erm", "small"): ("97.0 ± 0.5", "98.7 ± 0.2"),
    ("groupdro", "large"): ("74.8 ± 2.8", "98.8 ± 0.3"), ("groupdro", "medium"): ("90.4 ± 1.9", "96.1 ± 0.4"),
    ("groupdro", "small"): ("96.6 ± 0.4", "98.7 ± 0.3"),
    ("jtt", "large"): ("76.4 ± 6.1", "97.6 ± 1.3"), ("jtt", "medium"): ("65.0 ± 18.4", "96.8 ± 0.1"),
    ("jtt", "small"): ("94.8 ± 1.0", "98.4 ± 0.4"),
    ("gb", "large"): ("76.8 ± 2.8", "97.3 ± 0.3"), ("gb", "medium"): ("92.9 ± 0.1", "96.5 ± 0.6"),
    ("gb", "small"): ("95.8 ± 0.6", "98.2 ± 0.4"),
}
# A smoke cell: a few steps, one reference epoch, a two-C grid of strong l1 strengths (liblinear needs 48 s for a
# large-magnitude DFR cell at C 1 and 0.1 on an untrained model's features, 14 s at 0.01 and 0.001), and S_r 5 (an
# untrained reference errs on most of the training set, and 800 copies of that is a 30-million-index epoch to shuffle).
SMOKE_SETTINGS = {"epochs": 2, "max_steps_per_epoch": 3, "reference_epochs": 1, "n_ensemble": 2,
                  "c_grid": "0.01,0.001", "upsample": 5}


def paper_rows(base: str, magnitudes: tuple[str, ...], methods: tuple[str, ...],
               patience: int | None = None) -> list[tuple[str, str, str, dict[str, Any]]]:
    """(label, algorithm, dataset, settings) of every cell of SpuCo's Table 2 magnitude rows, plus DFR; `patience`
    adds an early stop (epochs without a better val worst-group) to every cell, which SpuCo's code has not."""
    extra = {"patience": patience} if patience else {}
    return [(f"{name}, {m}", algorithm, f"{base}-magnitude-{m}", {**PAPER_SETTINGS[algorithm][m], **extra})
            for m in magnitudes for name, algorithm in PAPER_METHODS if algorithm in methods]


def smoke_settings(algorithm: str, settings: dict[str, Any]) -> dict[str, Any]:
    """The same cell cut to a few steps: the command's path, not its numbers (CI)."""
    from raybench.algorithms import ALGORITHMS
    from raybench.settings import settings_of

    own = {s.name for s in settings_of(ALGORITHMS.get(algorithm).Hparams)}
    keep = {k: v for k, v in SMOKE_SETTINGS.items() if k in own or k in ("epochs", "max_steps_per_epoch")}
    return {**settings, **keep}


def run_paper(base: str, magnitudes: tuple[str, ...], methods: tuple[str, ...], seeds: int, workers: int,
              smoke: bool, runs_dir: Path, patience: int | None = None) -> list[dict[str, Any]]:
    """Every (cell, seed) run, each saved to `runs_dir` as it ends: an interrupted table reruns only what is missing."""
    cells = paper_rows(base, magnitudes, methods, patience)
    jobs = [(label, algorithm, dataset, seed, smoke_settings(algorithm, settings) if smoke else settings)
            for label, algorithm, dataset, settings in cells for seed in range(seeds)]
    stale = stale_runs(runs_dir, [(dataset, algorithm, seed, settings) for _, algorithm, dataset, seed, settings in jobs])
    if stale:
        raise SystemExit(f"{runs_dir} holds runs made with other settings than these (name another --storage):\n"
                         + "\n".join(stale))
    runs_dir.mkdir(parents=True, exist_ok=True)
    with ProcessPoolExecutor(max_workers=workers) as pool:
        return list(pool.map(run_paper_cell, *zip(*jobs), [runs_dir] * len(jobs)))


def saved_runs(runs_dir: Path, base: str) -> list[dict[str, Any]]:
    """The runs a table saved, in the table's own order (magnitude, then method, then seed)."""
    order = {(m, a): i for i, (m, a) in enumerate((m, a) for m in MAGNITUDES for _, a in PAPER_METHODS)}
    runs = [json.loads(p.read_text()) for p in runs_dir.glob(f"{base}-magnitude-*.json")]
    return sorted(runs, key=lambda r: (order[r["magnitude"], r["algorithm"]], r["seed"]))


def run_path(runs_dir: Path, dataset: str, algorithm: str, seed: int) -> Path:
    return runs_dir / f"{dataset}-{algorithm}-seed{seed}.json"


def stale_runs(runs_dir: Path, cells: list[tuple[str, str, int, dict[str, Any]]]) -> list[str]:
    """The saved runs of these (dataset, algorithm, seed, settings) cells that were made with other settings: one
    line each. A saved run is reused only when its settings are the cell's own (a run kept from a table with
    patience must not stand in for one without)."""
    lines = []
    for dataset, algorithm, seed, settings in cells:
        path = run_path(runs_dir, dataset, algorithm, seed)
        if not path.exists():
            continue
        saved = json.loads(path.read_text()).get("settings")
        wanted = json.loads(json.dumps(settings, default=str))
        if saved != wanted:
            lines.append(f"  {path.name}: saved {saved}, wanted {wanted}")
    return lines


def run_paper_cell(label: str, algorithm: str, dataset: str, seed: int, settings: dict[str, Any],
                   runs_dir: Path) -> dict[str, Any]:
    path = run_path(runs_dir, dataset, algorithm, seed)
    if path.exists():
        return json.loads(path.read_text())
    run = {**run_one(label, algorithm, dataset, seed, None, settings), "algorithm": algorithm,
           "magnitude": dataset.rsplit("-", 1)[1], "settings": settings}
    partial = path.with_suffix(".partial")
    partial.write_text(json.dumps(run, default=str))
    partial.replace(path)  # atomic: a killed run leaves no half-written file
    return run


def selection_sees(runs: list[dict[str, Any]]) -> str:
    """"sees", or why a cell's selection is blind: a flag from any run, or a val group under ten images."""
    from raybench.data.base import MIN_GROUP_EXAMPLES

    flags = sorted({r["selection_blind"] for r in runs if r["selection_blind"]})
    if flags:
        return "BLIND: " + "; ".join(flags)
    smallest = min(r["min_val_group"] for r in runs)
    if smallest < MIN_GROUP_EXAMPLES:
        return f"BLIND: a val group of {smallest}"
    return "sees"


def paper_table(runs: list[dict[str, Any]]) -> str:
    """Ours beside SpuCo's Table 2, one row per (magnitude, method), with whether its selection could see."""
    from seed_table import mean_std

    lines = [("| magnitude | method | worst-group | average | paper worst-group | paper average | selected epochs "
             "| selection |"), "|---" * 8 + "|"]
    for label in dict.fromkeys(r["label"] for r in runs):
        mine = [r for r in runs if r["label"] == label]
        key = (mine[0]["algorithm"], mine[0]["magnitude"])
        paper = PAPER_TABLE.get(key, ("-", "-"))
        cells = [mine[0]["magnitude"], label.split(",")[0],
                 mean_std([r["test/worst_group_acc"] for r in mine]), mean_std([r["test/avg_acc"] for r in mine]),
                 *paper, ", ".join(f"{r['best_epoch']}/{r['epochs']}" for r in mine), selection_sees(mine)]
        lines.append("| " + " | ".join(cells) + " |")
    groups = {f"{r['magnitude']}: {r['val_groups']}" for r in runs}
    return "\n".join(lines + ["", "Group counts per split (val is what selection sees):", *sorted(groups)])
HISTORY_KEYS = ("val/worst_group_acc", "test/worst_group_acc", "test/avg_acc")


def run_one(label: str, algorithm: str, dataset_name: str, seed: int, epochs: int | None,
            settings: dict[str, Any] | None = None) -> dict[str, Any]:
    import torch

    torch.set_num_threads(1)  # one process per core beats two processes fighting over threads
    from raybench.data import load_dataset
    from raybench.trainer import TrainConfig, Trainer

    dataset = load_dataset(dataset_name)
    start = time.perf_counter()
    flat = {"dataset": dataset_name, "algorithm": algorithm, "seed": seed, **({"epochs": epochs} if epochs else {}),
            **(settings or {})}
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
           "selection_blind": result.info.get("selection_blind", ""),
           "val_groups": dataset.info.get("groups", ""),
           "min_val_group": int(torch.bincount(dataset.split("val").group).min()),
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


def run_fixed(rows: tuple[Row, ...], seeds: int, workers: int, epochs: int | None) -> list[dict[str, Any]]:
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
    from raybench.report.record import SWEEP_RECORD
    from raybench.sweep.runner import SweepOptions, prepare, run_sweep

    rows = []
    for method in methods:
        options = SweepOptions(space=method, dataset=base, trials=trials, replicates=seeds, seed=0,
                               executor="function", max_concurrent=2, storage=str(storage),
                               tracking_uri=f"sqlite:///{storage}/mlflow.db", name=f"spuco-{method}", resume=True,
                               extra_fixed={"max_steps_per_epoch": max_steps})
        start = time.perf_counter()
        summary = run_sweep(prepare(options), SWEEP_RECORD)
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
    parser.add_argument("--part", choices=(*PARTS, "table", "paper"), required=True)
    parser.add_argument("--magnitudes", default=",".join(MAGNITUDES), help="paper: the magnitude rows to run")
    parser.add_argument("--smoke", action="store_true", help="paper: a few steps per cell, to check the command")
    parser.add_argument("--patience", type=int, default=None,
                        help="paper: stop a run after N epochs without a better val worst-group (default: none, as "
                             "SpuCo trains every epoch and keeps the best)")
    parser.add_argument("--report", action="store_true", help="paper: print the table of the runs saved in --storage, "
                                                              "running nothing")
    parser.add_argument("--base", choices=BASES, default="spuco-digits", help="the SpuCoMNIST base to check")
    parser.add_argument("--epochs", type=int, default=None, help="epochs per run (default: the dataset's)")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--trials", type=int, default=3, help="random configs per method (table)")
    parser.add_argument("--max-steps", type=int, default=150, help="steps per epoch cap for the table's sweeps")
    parser.add_argument("--methods", default=",".join(METHODS))
    parser.add_argument("--storage", default=None, help="where the table's sweeps (table) or runs (paper: one JSON "
                                                        "per run; a rerun skips those done) live (default: a temp dir)")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    started = time.perf_counter()
    if args.part == "paper" and args.report:
        rows = saved_runs(Path(args.storage), args.base)
        text = paper_table(rows)
    elif args.part == "paper":
        runs_dir = Path(args.storage or tempfile.mkdtemp(prefix="spuco-paper-")).resolve()
        rows = run_paper(args.base, tuple(args.magnitudes.split(",")), tuple(args.methods.split(",")), args.seeds,
                         args.workers, args.smoke, runs_dir, args.patience)
        text = paper_table(rows) + "\n\n" + timing_table(rows)
    elif args.part == "table":
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
