"""A benchmark's one trial queue against the static split it replaced, side by side in one run.

Runs the same benchmark file through `raybench benchmark` once per mode, each time on a fresh Ray on this host:
- **static split** (`static`): raybench as it was before the queue reached `--address` (`--before`, exported to
  a temporary folder and put first on the PYTHONPATH of the benchmark, its sweeps and the Ray they join), on a
  Ray that declares no trial queue, joined with `--address`: each running sweep gets
  `max_concurrent_trials // sweeps_at_once` trials for its whole life (what every benchmark did before);
- **one queue** (`queue`): the benchmark's own private Ray, which declares `max_concurrent_trials` slots of
  raybench_slot that every trial holds while it runs, each sweep allowed the whole cap;
- **one queue at --address** (`slots`): this checkout on a Ray that declares no queue, joined with `--address`:
  the queue is the benchmark's slot folder on this host (raybench/sweep/trial_slots.py).

A mode may name how many sweeps run at once (`queue@3`: the benchmark file's copy with `sweeps_at_once: 3`), which
in the trial queue may exceed the cap: a sweep starting up, or between its stages, leaves its slot to another's.

For each it prints the wall time, the busy slot-seconds (the sum of every run's wall seconds, as the runs' own
completed records give them) and the slot utilisation, busy / (cap x wall). Goal of the one trial
queue: utilisation >= 0.90 with the queue, and a lower wall time than the static split's in the same run.

It also says where the idle slot-seconds went (`idle_by_handover`): before each slot's first run and after its
last, and in the gaps between one run's end and the next run's start on a slot, by what the next run is: the
same stage of the same sweep (Tune hands the trial's process to its next trial), the sweep's next stage (a new
Tuner, new trial processes), or another sweep's trial (a new trial process). A run's wall starts when its trial
function starts, so a new trial process's start and imports fall in the gap before it.

    .venv/bin/python benchmarks/trial_queue.py [GRID] [--order static,queue,slots,queue@3] [--before REVISION]
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
BEFORE = "7c2696c"  # the last commit whose benchmark split its cap statically at --address


@dataclass(frozen=True)
class Measured:
    mode: str
    wall_s: float
    busy_slot_s: float
    runs: int
    cap: int
    exit_code: int
    idle: Idle | None = None

    @property
    def utilisation(self) -> float:
        return self.busy_slot_s / (self.cap * self.wall_s)


def busy_slot_seconds(storage: Path) -> tuple[float, int]:
    """Every run's wall seconds (its completed record's time/wall_s), over all pairs and stages."""
    from raybench.report_keys import WALL_S

    walls = [json.loads(path.read_text()).get(WALL_S, 0.0) for path in storage.glob("*/completed/*.json")]
    return float(sum(walls)), len(walls)


@dataclass(frozen=True)
class RunSpan:
    """One run's wall, by the wall clock, and the stage folder it belongs to (`<sweep>-search`,
    `<sweep>-replicate-<trial>`)."""

    start: float
    end: float
    stage: str

    @property
    def sweep(self) -> str:
        return self.stage.rsplit("-search", 1)[0].split("-replicate-")[0]


def run_spans(storage: Path) -> list[RunSpan]:
    """Every run's span: it ends `time/wall_s` after its trial function started, which is its trainer's start
    less its start-up (both in its completed record)."""
    from raybench.report_keys import TIME_PREFIX, WALL_S

    spans = []
    for path in storage.glob("*/completed/*.json"):
        record = json.loads(path.read_text())
        start = record[f"{TIME_PREFIX}trainer_started_at"] - record[f"{TIME_PREFIX}startup_s"]
        spans.append(RunSpan(start, start + record[WALL_S], path.parent.parent.name))
    return sorted(spans, key=lambda span: span.start)


HANDOVERS = ("same stage", "next stage", "another sweep")


@dataclass(frozen=True)
class Idle:
    """Idle slot-seconds: at the edges (before a slot's first run, after its last) and in the gaps between runs
    on a slot, by hand-over kind (HANDOVERS), with each kind's number of gaps."""

    edges_s: float
    gaps_s: dict[str, float]
    gaps: dict[str, int]

    def text(self) -> str:
        kinds = ", ".join(f"{kind} {self.gaps[kind]} gaps {self.gaps_s[kind]:.1f} slot-s"
                          + (f" ({self.gaps_s[kind] / self.gaps[kind]:.2f} s each)" if self.gaps[kind] else "")
                          for kind in HANDOVERS)
        return f"idle: edges {self.edges_s:.1f} slot-s; between runs: {kinds}"


def idle_by_handover(spans: list[RunSpan], cap: int, started: float, ended: float) -> Idle:
    """Where the idle slot-seconds went. Runs are laid onto `cap` slots in order of start, each on the slot that
    freed last before it started (a reused trial process's next trial starts about 0.1 s after the last one
    ended, so this pairs them); a run that overlaps every slot (clock skew) takes the one that freed first.
    An inference from the records: Ray does not say which slot a run held."""
    free_at: list[float] = [started] * cap
    last: list[RunSpan | None] = [None] * cap
    gaps_s, gaps = dict.fromkeys(HANDOVERS, 0.0), dict.fromkeys(HANDOVERS, 0)
    edges = 0.0
    for span in spans:
        free = [i for i in range(cap) if free_at[i] <= span.start]
        slot = max(free, key=lambda i: free_at[i]) if free else min(range(cap), key=lambda i: free_at[i])
        gap = max(0.0, span.start - free_at[slot])
        before = last[slot]
        if before is None:
            edges += gap
        else:
            kind = ("same stage" if before.stage == span.stage else
                    "next stage" if before.sweep == span.sweep else "another sweep")
            gaps_s[kind] += gap
            gaps[kind] += 1
        free_at[slot], last[slot] = max(free_at[slot], span.end), span
    edges += sum(max(0.0, ended - free) for free in free_at)
    return Idle(edges, gaps_s, gaps)


def with_sweeps_at_once(grid: Path, at_once: int, root: Path) -> Path:
    """A copy of the benchmark file beside the measurement's files, with `sweeps_at_once` set."""
    import yaml

    body = {**yaml.safe_load(grid.read_text()), "sweeps_at_once": at_once}
    copy = root / f"{grid.stem}@{at_once}.yaml"
    copy.write_text(yaml.safe_dump(body, sort_keys=False))
    return copy


def run_benchmark(grid: Path, root: Path, address: str | None, env: dict[str, str]) -> tuple[float, float, int]:
    """(when it started by the wall clock, its wall seconds, its exit code)"""
    command = [sys.executable, "-m", "raybench.cli", "benchmark", str(grid), "--storage", str(root / "runs"),
               "--tracking-uri", f"sqlite:///{root}/mlflow.db", "--progress-every", "60"]
    command += ["--address", address] if address else []
    started, clock = time.time(), time.monotonic()
    with open(root / "benchmark.log", "w") as log:
        code = subprocess.run(command, cwd=root, env=env, stdout=log, stderr=subprocess.STDOUT).returncode
    return started, time.monotonic() - clock, code


def measure(mode: str, grid: Path, cap: int, root: Path, before: Path) -> Measured:
    """`static` and `slots`: a Ray without the queue started here, the benchmark joined to it (`static` running
    the exported `before` tree, in the benchmark and in Ray's workers); `queue`: the benchmark's own Ray."""
    from raybench.sweep import ray_backend as backend

    root.mkdir(parents=True)
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0", "MLFLOW_DISABLE_TELEMETRY": "true"}
    if mode == "static":
        env["PYTHONPATH"] = os.pathsep.join([str(before), *filter(None, [os.environ.get("PYTHONPATH")])])
    saved = {key: os.environ.get(key) for key in env}
    os.environ.update(env)  # the Ray started here hands its workers this process's environment
    try:
        address = backend.start_shared_cluster(2 * cap, {}) if mode != "queue" else None
        env = {**os.environ, **env}  # with what ray.init added for the processes that join it
    finally:
        for key, value in saved.items():  # only what was set here: what ray.init added stays
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
    try:
        started, wall, code = run_benchmark(grid, root, address, env)
    finally:
        if address:
            backend.shutdown()
    busy, runs = busy_slot_seconds(root / "runs")
    idle = idle_by_handover(run_spans(root / "runs"), cap, started, started + wall)
    return Measured(mode, wall, busy, runs, cap, code, idle)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("grid", nargs="?", default=str(REPO / "raybench" / "grids" / "embedded_queue.yaml"),
                        help="the benchmark file (default: embedded_queue.yaml, whose runs last about a minute; "
                             "embedded.yaml takes hours a mode on 2 cores)")
    parser.add_argument("--order", default="static,queue,slots", help="the modes, in the order they run")
    parser.add_argument("--before", default=BEFORE, help="the revision whose static split `static` runs")
    args = parser.parse_args()
    for spec in args.order.split(","):
        mode, at, at_once = spec.partition("@")
        if mode not in ("static", "queue", "slots") or (at and not at_once.isdigit()) or at_once.startswith("0"):
            parser.error(f"--order: expected modes among static, queue, slots, each optionally @N sweeps at once "
                         f"(N >= 1), got {spec!r}")
    from trial_imports import export

    from raybench.sweep.benchmark_file import load_benchmark

    benchmark = load_benchmark(args.grid)
    root = Path(tempfile.mkdtemp(prefix="trial-queue-"))
    before = export(args.before, Path(tempfile.mkdtemp(prefix="trial-queue-before-")), ("raybench", "search_spaces"))
    print(f"{benchmark.name}: {len(benchmark.pairs)} pairs, cap {benchmark.max_concurrent_trials}, "
          f"{benchmark.sweeps_at_once} sweeps at once; {platform.processor() or platform.machine()}, "
          f"{os.cpu_count()} CPUs; files under {root}", flush=True)
    results = []
    for spec in args.order.split(","):
        mode, _, at_once = spec.partition("@")
        grid = Path(args.grid).resolve() if not at_once else with_sweeps_at_once(Path(args.grid), int(at_once), root)
        results.append(dataclasses.replace(measure(mode, grid, benchmark.max_concurrent_trials, root / spec, before),
                                           mode=spec))
        r = results[-1]
        print(f"{r.mode:7s} exit {r.exit_code}  wall {r.wall_s:8.1f} s  busy {r.busy_slot_s:8.1f} slot-s over "
              f"{r.runs} runs  utilisation {r.utilisation:.3f}", flush=True)
        print(f"        {r.idle.text()}", flush=True)
    by_mode = {r.mode: r for r in results}
    for queued in (mode for mode in by_mode if mode.startswith(("queue", "slots"))):
        if "static" in by_mode:
            print(f"{queued} / static wall: {by_mode[queued].wall_s / by_mode['static'].wall_s:.3f}; utilisation goal "
                  f">= 0.90 with {queued}: {'met' if by_mode[queued].utilisation >= 0.90 else 'missed'}")
    for spec, r in by_mode.items():
        base = by_mode.get(spec.partition("@")[0])
        if "@" in spec and base is not None:
            print(f"{spec} / {base.mode} wall: {r.wall_s / base.wall_s:.3f}; utilisation {r.utilisation:.3f} against "
                  f"{base.utilisation:.3f}")


if __name__ == "__main__":
    main()
