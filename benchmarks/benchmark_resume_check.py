"""Run a benchmark file, kill it outright halfway, resume it, and count the MLflow runs: the check that
a benchmark resumes from each sweep's own results.

    .venv/bin/python benchmarks/benchmark_resume_check.py [FILE] [--out DIR] [--kill-after N]

FILE defaults to raybench/grids/embedded.yaml. The benchmark is SIGKILLed (no chance to record anything)
once N pairs have finished (default: half). Its sweeps stop on their own (each gets SIGTERM when its parent
dies); the check waits for them, records every finished sweep's MLflow runs, runs `--resume` to the end and
prints, per pair, the runs before and after: a finished pair must keep exactly its runs (none re-run, none
added). It also prints the wall time of both invocations and their sum, and the final comparison table.
"""
from __future__ import annotations

import argparse
import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
from mlflow import MlflowClient

REPO = Path(__file__).resolve().parents[1]
RAYBENCH = Path(sys.executable).parent / "raybench"


def finished_pairs(state_file: Path) -> list[str]:
    if not state_file.is_file():
        return []
    return [name for name, record in json.loads(state_file.read_text())["pairs"].items()
            if record["status"] == "finished"]


def runs_by_sweep(uri: str) -> dict[str, set[str]]:
    """Every sweep's parent run with the ids of all runs nested under it (trials, replicates, their stages)."""
    client = MlflowClient(tracking_uri=uri)
    experiment = client.get_experiment_by_name("raybench")
    if experiment is None:
        return {}
    runs = client.search_runs([experiment.experiment_id], "", max_results=50000)
    children: dict[str, list[str]] = {}
    for run in runs:
        children.setdefault(run.data.tags.get("mlflow.parentRunId", ""), []).append(run.info.run_id)
    found = {}
    for run in runs:
        if run.data.tags.get("stage") == "sweep":
            ids, frontier = set(), [run.info.run_id]
            while frontier:
                frontier = [c for parent in frontier for c in children.get(parent, [])]
                ids.update(frontier)
            found[run.data.tags["raybench.sweep"]] = ids
    return found


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("file", nargs="?", default=str(REPO / "raybench" / "grids" / "embedded.yaml"))
    parser.add_argument("--out", default="bench-resume")
    parser.add_argument("--kill-after", type=int, help="finished pairs before the kill (default: half the pairs)")
    args = parser.parse_args()
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    uri = f"sqlite:///{out / 'mlflow.db'}"
    from raybench.sweep.benchmark_file import load_benchmark

    benchmark = load_benchmark(args.file)
    kill_after = args.kill_after or len(benchmark.pairs) // 2
    command = [str(RAYBENCH), "benchmark", args.file, "--storage", str(out / "runs"), "--tracking-uri", uri]
    state_file = out / "runs" / benchmark.name / "benchmark.json"

    started = time.time()
    with open(out / "first.log", "w") as log:
        first = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
    while first.poll() is None and len(finished_pairs(state_file)) < kill_after:
        time.sleep(2)  # the event is a file another process writes; polled, bounded by the benchmark itself
    if first.poll() is not None:
        print(f"the benchmark ended before {kill_after} pairs finished (exit {first.returncode}); see {out / 'first.log'}")
        return 1
    sweeps = psutil.Process(first.pid).children()
    first.send_signal(signal.SIGKILL)
    first.wait()
    killed_at = time.time()
    psutil.wait_procs(sweeps, timeout=600)
    stopped = time.time()
    done_before = finished_pairs(state_file)
    before = runs_by_sweep(uri)
    print(f"killed after {killed_at - started:.1f} s with {len(done_before)} of {len(benchmark.pairs)} pairs finished; "
          f"its running sweeps stopped {stopped - killed_at:.1f} s later")

    resumed_at = time.time()
    with open(out / "resume.log", "w") as log:
        code = subprocess.run([*command, "--resume"], stdout=log, stderr=subprocess.STDOUT).returncode
    ended = time.time()
    after = runs_by_sweep(uri)
    print(f"resume: exit {code} after {ended - resumed_at:.1f} s; wall time of both: "
          f"{(killed_at - started) + (ended - resumed_at):.1f} s")
    print(f"\n{'sweep':45s} {'runs before':>11s} {'after':>6s}  finished before the kill")
    unchanged = True
    for name in sorted(after):
        kept = before.get(name, set())
        was_done = name in done_before
        unchanged &= not was_done or kept == after[name]
        print(f"{name:45s} {len(kept):11d} {len(after[name]):6d}  {'yes' if was_done else 'no'}")
    print(f"\nfinished pairs kept exactly their runs: {unchanged}")
    relaunched = [n for n in done_before if (out / "runs" / benchmark.name / "logs" / f"{n}.log").read_text().count("=====") > 1]
    print(f"finished pairs launched again by --resume: {relaunched or 'none'}")
    compare = out / "runs" / benchmark.name / "compare" / "compare.md"
    if compare.is_file():
        print(f"\n{compare.read_text()}")
    return 0 if unchanged and not relaunched and code == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
