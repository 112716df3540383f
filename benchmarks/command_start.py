"""How long the commands that only read declarations take as whole processes (goal: at most 1.5 s each on
a quiet machine), before and after a change, side by side in one run.

Each command runs as a shell starts it (`python -m raybench.cli ...`, a fresh interpreter), from the raybench of
`--before` (a git revision exported to a temporary folder) and from this checkout, in turns so both meet the same
load: one warm-up run each, not counted (it also fills the code memo, raybench.code_memo, each version in its own
temporary memo folder, as a user's second run finds it), then `--runs` counted runs. Printed per command: the median
wall and CPU seconds (the child's user + system time) of each version, their ratio, and the after-median against
the goal.

    .venv/bin/python benchmarks/command_start.py [--runs 5] [--before 85f6c68]
"""
from __future__ import annotations

import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

from trial_imports import before_and_after

BEFORE = "85f6c68"  # the last commit before the code memo
GOAL_S = 1.5
COMMANDS = (
    "list algorithms", "list models", "list datasets", "list settings dann", "list settings", "space new dann",
    "space show erm --dataset digits-shift", "space draw dann --dataset digits-shift --trials 3",
)


def timed_run(command: str, tree: Path, memo: Path, data: Path) -> tuple[float, float]:
    """(wall, CPU) seconds of one `raybench COMMAND` process whose raybench is the one in `tree`."""
    env = {**os.environ, "PYTHONPATH": str(tree), "RAYBENCH_CACHE_DIR": str(memo), "RAYBENCH_DATA_DIR": str(data),
           "RAY_USAGE_STATS_ENABLED": "0"}
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "raybench.cli", *command.split()], env=env, cwd=tree,
                          capture_output=True, text=True, timeout=600)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        raise SystemExit(f"`raybench {command}` failed in {tree}:\n{done.stderr[-3000:]}")
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def measure(trees: dict[str, Path], work: Path, runs: int) -> dict[tuple[str, str], list[tuple[float, float]]]:
    seconds: dict[tuple[str, str], list[tuple[float, float]]] = {}
    for command in COMMANDS:
        for turn in range(runs + 1):
            for version, tree in trees.items():
                took = timed_run(command, tree, work / f"memo-{version}", work / "data")
                if turn:  # the first turn is the warm-up
                    seconds.setdefault((command, version), []).append(took)
    return seconds


def show(seconds: dict[tuple[str, str], list[tuple[float, float]]], before: str, runs: int) -> None:
    print(f"whole-process seconds, median of {runs} after a warm-up; {os.cpu_count()} CPUs; load average "
          f"{os.getloadavg()[0]:.2f}; before = {before}, after = this checkout")
    print(f"{'command':<52} {'clock':<5} {'before':>7} {'after':>7} {'after/before':>12}   goal <= {GOAL_S} s")
    for command in COMMANDS:
        for index, clock in enumerate(("wall", "CPU")):
            was = statistics.median(run[index] for run in seconds[command, "before"])
            now = statistics.median(run[index] for run in seconds[command, "after"])
            verdict = ("met" if now <= GOAL_S else "missed") if clock == "wall" else ""
            print(f"{command:<52} {clock:<5} {was:7.3f} {now:7.3f} {now / was:12.4f}   {verdict}")


def main() -> None:
    before_and_after(__doc__, BEFORE, measure, show, ("raybench", "search_spaces"))


if __name__ == "__main__":
    main()
