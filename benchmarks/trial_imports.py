"""What a trial's process pays to unpickle its trainable, part of a sweep's start-up:
before and after the trainables moved out of the driver's backend (raybench/sweep/ray_backend.py) into
raybench/sweep/ray_trial.py, side by side in one run.

Tune pickles each trainable in the sweep's process (wrapped into a Trainable class, with Ray's cloudpickle) and
unpickles it in every trial process it starts, importing the module of everything the pickle names. For each
executor and each version of raybench (`--before`, a git revision exported to a temporary folder, and this
checkout) the trainable `make_trainable` builds is pickled once; then `--runs` fresh interpreters per pair and
prelude, taken in turns so that both versions meet the same load, each import the prelude and time `pickle.loads`
of the trainable, by the wall clock and in CPU-seconds (which other work on a busy machine inflates less):

- prelude `ray`: what every Ray worker process has imported; the figure is the trial process's whole import;
- prelude `shared`: also what both versions' trials import anyway (torch, Ray Tune and Train, which bring Ray
  Data and pandas, the raybench trainer, ray_worker.py); the figure is only what differs, which the first
  figure's noise on a busy machine can hide.

Printed: the median seconds of each version, the ratio and the seconds saved per trial process.

    .venv/bin/python benchmarks/trial_imports.py [--runs 5] [--before de09578]
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
BEFORE = "de09578"  # the last commit whose trainables were closures in ray_backend.py
EXECUTORS = ("train", "function")
PICKLE = """
import sys
from pathlib import Path
from ray import cloudpickle
from ray.tune.trainable.function_trainable import wrap_function
from raybench.sweep.ray_backend import Resources, RunSpec, make_trainable
from raybench.sweep.space import ResolvedSpace

space = ResolvedSpace(algorithm="erm", dataset="tiny", search={}, fixed={"lr": 0.01}, derived={}, default_epochs=2,
                      lr_center=0.01)
spec = RunSpec("imports", Path(sys.argv[2]), "search", sys.argv[1], Resources(), 1)
Path(sys.argv[3]).write_bytes(cloudpickle.dumps(wrap_function(make_trainable(space, spec))))
"""
PRELUDES = {
    "ray": "import ray",
    "shared": "import ray, torch, ray.tune, ray.train, ray.train.torch, ray.util.queue, raybench.trainer, "
              "raybench.sweep.space, raybench.sweep.ray_worker, raybench.sweep.atomic_storage; "
              "import ray.train.v2.api.data_parallel_trainer, ray.train.v2._internal.callbacks.datasets",
}
UNPICKLE = """
import pickle, sys, time
{prelude}
blob = open(sys.argv[1], "rb").read()
start, cpu = time.perf_counter(), time.process_time()
pickle.loads(blob)
took, cpu = time.perf_counter() - start, time.process_time() - cpu
assert sys.modules["raybench"].__file__.startswith(sys.argv[2]), sys.modules["raybench"].__file__
print(took, cpu)
"""


def python(code: str, tree: Path, *args: str) -> str:
    """Run `code` in a fresh interpreter whose `raybench` is the one in `tree` (`-c` puts the working folder
    first on the path); its last line of output."""
    env = {**os.environ, "PYTHONPATH": str(tree), "RAY_USAGE_STATS_ENABLED": "0"}
    done = subprocess.run([sys.executable, "-c", code, *args], env=env, cwd=tree, capture_output=True, text=True,
                          timeout=600)
    if done.returncode != 0:
        raise SystemExit(f"a subprocess failed:\n{done.stderr[-3000:]}")
    return done.stdout.strip().splitlines()[-1] if done.stdout.strip() else ""


def export(revision: str, into: Path, paths: tuple[str, ...] = ("raybench",)) -> Path:
    """The raybench package of `revision` (and any other `paths` of the repository that the revision has:
    search_spaces/ lived beside the package before it became package data), extracted into `into` (nothing in
    this checkout changes)."""
    listed = subprocess.run(["git", "-C", str(REPO), "ls-tree", "--name-only", revision, *paths], capture_output=True,
                            text=True, check=True).stdout.split()
    archive = subprocess.run(["git", "-C", str(REPO), "archive", revision, *listed], capture_output=True,
                             check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    return into


Timings = dict[tuple[str, str, str], list[tuple[float, float]]]  # (prelude, version, executor) -> (wall, CPU) s


def measure(trees: dict[str, Path], work: Path, runs: int) -> Timings:
    """Seconds to unpickle each (version, executor)'s trainable after each prelude, `runs` fresh interpreters
    each, in turns."""
    blobs = {}
    for version, tree in trees.items():
        for executor in EXECUTORS:
            blobs[version, executor] = work / f"{version}-{executor}.pkl"
            python(PICKLE, tree, executor, str(work / "storage"), str(blobs[version, executor]))
    seconds: Timings = {(prelude, *pair): [] for prelude in PRELUDES for pair in blobs}
    for _ in range(runs):
        for prelude, version, executor in seconds:
            code = UNPICKLE.format(prelude=PRELUDES[prelude])
            wall, cpu = python(code, trees[version], str(blobs[version, executor]), str(trees[version])).split()
            seconds[prelude, version, executor].append((float(wall), float(cpu)))
    return seconds


def show(seconds: Timings, before: str, runs: int) -> None:
    print(f"seconds to unpickle a trainable in a fresh interpreter after its prelude, median of {runs}; "
          f"{os.cpu_count()} CPUs; before = {before}, after = this checkout")
    print(f"{'prelude':<8} {'executor':<9} {'clock':<5} {'before':>7} {'after':>7} {'ratio':>6} {'saved':>7}   "
          f"ranges (before | after)")
    for prelude in PRELUDES:
        for executor in EXECUTORS:
            for index, clock in enumerate(("wall", "CPU")):
                old = [run[index] for run in seconds[prelude, "before", executor]]
                new = [run[index] for run in seconds[prelude, "after", executor]]
                was, now = statistics.median(old), statistics.median(new)
                print(f"{prelude:<8} {executor:<9} {clock:<5} {was:7.3f} {now:7.3f} {was / now:6.2f} {was - now:7.3f}   "
                      f"{min(old):.3f}-{max(old):.3f} | {min(new):.3f}-{max(new):.3f}")


def before_and_after(doc: str, before: str, measure: Callable[[dict[str, Path], Path, int], Any],
                     show: Callable[[Any, str, int], None], paths: tuple[str, ...] = ("raybench",)) -> None:
    """A before/after script's command line (`--runs`, `--before`): `measure` the raybench of `--before`,
    exported with `paths` into a temporary folder, against this checkout's, then `show` what it measured."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--before", default=before, help="the git revision to compare with (default: %(default)s)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="before-after-") as tmp:
        work = Path(tmp)
        (work / "before").mkdir()
        trees = {"before": export(args.before, work / "before", paths), "after": REPO}
        show(measure(trees, work, args.runs), args.before, args.runs)


def main() -> None:
    before_and_after(__doc__, BEFORE, measure, show)


if __name__ == "__main__":
    main()
