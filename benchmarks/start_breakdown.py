"""Where a sweep's fixed start and end go: one smoke sweep of one function trial, run as a whole process as a user
runs `raybench sweep`, its time split into the phases below, medians over several runs.

Each run is a fresh interpreter (`--one`) that records, by the wall clock:

- the interpreter's start and `import raybench.cli` (what every command pays);
- the driver's heavy imports: the sweep runner, its Ray backend and tracking (torch, Ray, Tune, MLflow);
- `prepare`: the space, the dataset and a dry-run config, checked before any cluster work;
- the tracking set-up: the MLflow client and store (`SweepTracker`), then the sweep's parent run;
- Ray's start: `ray_backend.connect`, a private local Ray (GCS, raylet, dashboard agent), and what runs beside
  it in another thread (a new store's tracker, the imports of the sweep's record);
- Tune, from the search's start to the trial's trainer starting (read from the trial's completed record,
  `time/trainer_started_at`): Tune's set-up, the trial's Ray worker taking the trial and importing its code;
  how much of that the imports are is measured apart, in a fresh interpreter importing the trial's module;
- the training itself, data and model included (not start-up; reported for scale);
- from the last report to the search's return (the trial's teardown, Tune's end, the writer's drain);
- the sweep's record: summary, tables, plots (matplotlib), artifacts;
- Ray's shutdown, beside the record, and whatever is left until the process exits.

Because of those overlaps the parts add up to more than the whole; the start and the whole are read from the
clock.

The store is a fresh SQLite file per run, so MLflow's schema migrations are in the tracking set-up, as on a
user's first sweep. Nothing here changes what a sweep does: the phases are read from wrappers around the
runner's own calls.

    .venv/bin/python benchmarks/start_breakdown.py [--runs 3] [--store new|seeded]
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

PHASES = ("interpreter and CLI import", "driver imports (torch, Ray, MLflow)", "prepare (space, dataset, dry run)",
          "tracking client and store", "beside Ray's start (new store, record's imports)", "Ray start (private local)",
          "parent run", "Tune until the trial's trainer", "training (data, model, 2 epochs)",
          "last report to the search's return", "record (summary, plots, artifacts)", "Ray shutdown",
          "rest until exit")
# Phases that run at the same time as others (raybench.sweep.runner.RaySession): a new store's tracker and the
# record's imports beside Ray's start, the record beside Ray's shutdown. The parts therefore add up to more than
# the process's life; the start and the whole are read from the clock instead.
TRIAL_MODULE = "raybench.sweep.ray_trial"  # what a trial's process imports to unpickle its trainable


def timed(owner: Any, name: str, marks: dict[str, list[float]]) -> None:
    """Replace owner.name by a wrapper that appends its (start, end) wall-clock times to marks[name]."""
    inner = getattr(owner, name)

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        start = time.time()
        try:
            return inner(*args, **kwargs)
        finally:
            marks.setdefault(name, []).extend((start, time.time()))

    setattr(owner, name, wrapper)


def one_sweep(root: Path) -> None:
    """Run one sweep in this process with wrappers on its phases; print the marks as one JSON line."""
    import psutil

    born = psutil.Process().create_time()
    from raybench import cli

    cli_imported = time.time()
    from raybench import tracking
    from raybench.sweep import ray_backend, runner

    heavy_imported = time.time()
    marks: dict[str, list[float]] = {}
    for owner, name in ((runner, "prepare"), (ray_backend, "connect"), (ray_backend, "run_search"),
                        (runner, "_record"), (ray_backend, "shutdown"), (tracking.SweepTracker, "__init__"),
                        (runner, "_ready_for_the_end"),
                        (tracking.SweepTracker, "start_sweep")):
        timed(owner, name, marks)
    code = cli.main(["sweep", "erm", "--smoke", "--executor", "function", "--trials", "1", "--replicates", "0",
                     "--name", "start", "--storage", str(root / "runs"), "--tracking-uri", f"sqlite:///{root}/mlflow.db"])
    ended = time.time()
    (record,) = [json.loads(p.read_text()) for p in (root / "runs").glob("start-search/completed/*.json")]
    print(json.dumps({"code": code, "born": born, "cli": cli_imported, "heavy": heavy_imported, "end": ended,
                      "marks": marks, "trainer_started": record["time/trainer_started_at"],
                      "reported": record["time/reported_at"]}))


def phases(run: dict[str, Any]) -> dict[str, float]:
    """The seconds of each phase of one run, from its marks, and (START, WHOLE) the process's start to its first
    trainer and its whole life, read from the clock: some phases overlap (PHASES)."""
    marks = run["marks"]
    prepare, tracker, parent = marks["prepare"], marks["__init__"], marks["start_sweep"]
    connect, search, record, shutdown = marks["connect"], marks["run_search"], marks["_record"], marks["shutdown"]
    beside = marks["_ready_for_the_end"]
    return {
        PHASES[0]: run["cli"] - run["born"],
        PHASES[1]: run["heavy"] - run["cli"],
        PHASES[2]: prepare[1] - prepare[0],
        PHASES[3]: tracker[1] - tracker[0],
        PHASES[4]: beside[1] - beside[0],
        PHASES[5]: connect[1] - connect[0],
        PHASES[6]: parent[1] - parent[0],
        PHASES[7]: run["trainer_started"] - search[0],
        PHASES[8]: run["reported"] - run["trainer_started"],
        PHASES[9]: search[1] - run["reported"],
        PHASES[10]: record[1] - record[0],
        PHASES[11]: shutdown[1] - shutdown[0],
        PHASES[12]: run["end"] - max(record[1], shutdown[1]),
        START: run["trainer_started"] - run["born"],
        WHOLE: run["end"] - run["born"],
    }


START, WHOLE = "the start (process to first trainer)", "the whole process"


def run_all(runs: int, store: str) -> list[dict[str, float]]:
    """`runs` fresh processes, one after another, each in its own folder and, with `store` seeded, a copy of
    one migrated store (as the test suite's sweeps use)."""
    results = []
    seeded = None
    if store == "seeded":
        seeded = Path(tempfile.mkdtemp(prefix="start-store-")) / "mlflow.db"
        from mlflow.tracking import MlflowClient

        MlflowClient(tracking_uri=f"sqlite:///{seeded}").search_experiments()
    for _ in range(runs):
        root = Path(tempfile.mkdtemp(prefix="start-"))
        if seeded is not None:
            shutil.copyfile(seeded, root / "mlflow.db")
        env = {**os.environ, "RAY_TMPDIR": str(root), "RAY_USAGE_STATS_ENABLED": "0", "MLFLOW_DISABLE_TELEMETRY": "true"}
        env.pop("MLFLOW_TRACKING_URI", None)
        done = subprocess.run([sys.executable, __file__, "--one", str(root)], env=env, capture_output=True, text=True,
                              timeout=600)
        if done.returncode != 0:
            raise SystemExit(f"a sweep failed:\n{done.stderr[-3000:]}")
        results.append(phases(json.loads(done.stdout.strip().splitlines()[-1])))
        shutil.rmtree(root, ignore_errors=True)
    return results


def trial_import_seconds(runs: int) -> list[float]:
    """Seconds a fresh interpreter takes to import what a trial's worker imports (torch, Ray Train and Tune,
    raybench's trainer), each in its own process."""
    code = f"import time; t = time.perf_counter(); import {TRIAL_MODULE}; print(time.perf_counter() - t)"
    return [float(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                                 timeout=300).stdout.strip()) for _ in range(runs)]


def show(results: list[dict[str, float]], describe: Callable[[str], str] = str) -> None:
    print(f"{'phase':<50} {'median s':>9} {'min':>7} {'max':>7}")
    for name in (*PHASES, START, WHOLE):
        values = [r[name] for r in results]
        print(f"{describe(name):<50} {statistics.median(values):9.3f} {min(values):7.3f} {max(values):7.3f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--store", choices=("new", "seeded"), default="new")
    parser.add_argument("--one", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        one_sweep(args.one)
        return
    print(f"{args.runs} sweeps (erm, --smoke, 1 function trial, no replicates), each a fresh process; "
          f"{'a new store each' if args.store == 'new' else 'a copy of a migrated store each'}; {os.cpu_count()} CPUs")
    show(run_all(args.runs, args.store))
    imports = trial_import_seconds(args.runs)
    print(f"of the Tune phase: a fresh interpreter importing {TRIAL_MODULE}: median {statistics.median(imports):.3f} s "
          f"({min(imports):.3f}-{max(imports):.3f})")


if __name__ == "__main__":
    main()
