"""Where a sweep driver's memory goes: its peak RSS during a real sweep, beside what each layer of its imports
holds once loaded.

Two measurements, side by side in one run:
- **the driver's peak**: one smoke sweep (`erm --smoke --executor function`, 1 trial, no replicates, a private local
  Ray and a fresh SQLite store) run as a whole process, as a user runs `raybench sweep`; its peak RSS is the
  kernel's high-water mark of that process alone (`VmHWM` in /proc/PID/status, read until it exits), not Ray's
  processes or the trial's;
- **the imports**: fresh interpreters that import the driver's modules layer by layer, in the order a sweep loads
  them, each printing its RSS after every layer, medians over `--runs`. A layer's figure is what it adds on top of
  the ones before it (a library another layer already loaded costs nothing again).

What is left of the peak after the imports is the driver's own work: Ray's client and its threads, Tune's state,
the dataset a sweep loads to check the space (`prepare`), MLflow's store, matplotlib's figures at the end.

    .venv/bin/python benchmarks/driver_memory.py [--runs 3]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

# The driver's imports in the order `raybench sweep` loads them (cli -> runner -> ray_backend -> tracking).
LAYERS: tuple[tuple[str, str], ...] = (
    ("interpreter", ""),
    ("raybench.cli", "import raybench.cli"),
    ("numpy, scikit-learn (datasets)", "import numpy, sklearn.datasets"),
    ("torch", "import torch"),
    ("the trainer (raybench.trainer, models, algorithms)", "import raybench.trainer, raybench.models"),
    ("MLflow (raybench.tracking)", "import raybench.tracking"),
    ("Ray core", "import ray"),
    ("Tune, Train, Optuna, pandas (raybench.sweep.ray_backend)", "import raybench.sweep.ray_backend"),
    ("the sweep runner (raybench.sweep.runner)", "import raybench.sweep.runner"),
)
PROBE = """
import json, sys
def rss():
    for line in open("/proc/self/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
out = []
for name, statement in json.loads(sys.argv[1]):
    exec(statement)
    out.append(rss())
print(json.dumps(out))
"""


def import_layers(runs: int) -> list[float]:
    """Median RSS (MiB) after each layer, over `runs` fresh interpreters."""
    per_run = [json.loads(subprocess.run([sys.executable, "-c", PROBE, json.dumps(LAYERS)], check=True,
                                         capture_output=True, text=True).stdout) for _ in range(runs)]
    return [statistics.median(values) for values in zip(*per_run)]


def peak_of(pid: int) -> float | None:
    """VmHWM of a running process, MiB; None once it is gone."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


def driver_peak(root: Path) -> tuple[float, int]:
    """(peak RSS MiB, exit code) of one smoke sweep's driver, read every 50 ms until it exits."""
    command = [sys.executable, "-m", "raybench.cli", "sweep", "erm", "--smoke", "--executor", "function",
               "--trials", "1", "--replicates", "0", "--name", "memory", "--storage", str(root / "runs"),
               "--tracking-uri", f"sqlite:///{root}/mlflow.db"]
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0", "MLFLOW_DISABLE_TELEMETRY": "true"}
    with open(root / "sweep.log", "w") as log:
        proc = subprocess.Popen(command, cwd=root, env=env, stdout=log, stderr=subprocess.STDOUT)
        peak = 0.0
        while proc.poll() is None:
            peak = max(peak, peak_of(proc.pid) or 0.0)
            time.sleep(0.05)  # a sampling period, not a wait for an event: VmHWM keeps the peak between samples
    return peak, proc.returncode


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="raybench-memory-") as tmp:
        peak, code = driver_peak(Path(tmp))
    layers = import_layers(args.runs)
    print(f"driver peak RSS, one smoke sweep (exit {code}): {peak:.1f} MiB")
    print(f"\n{'layer':60} {'RSS after':>10} {'adds':>8}   (MiB, medians of {args.runs} fresh interpreters)")
    before = 0.0
    for (name, _), after in zip(LAYERS, layers):
        print(f"{name:60} {after:10.1f} {after - before:8.1f}")
        before = after
    own_work = "the driver's own work (peak minus every import)"
    print(f"{own_work:60} {peak:10.1f} {peak - before:8.1f}")


if __name__ == "__main__":
    main()
