"""`raybench benchmark`: every (dataset, search space) pair of a benchmark file swept on one Ray cluster, as
one command (and so one `ray job submit`), resumable as a whole, with one MLflow parent run over its sweeps.

Each pair runs as its own `raybench sweep` process joined to the shared cluster (the library's entry point for one
sweep, raybench.commands.sweep, run with `python -m`: the library never runs the CLI):
- a pair is exactly the sweep a user would run by hand: the same checks, records, resume and results;
- a pair that crashes, or that its own checks refuse, is recorded with its reason and the others go on;
- a signal stops each sweep the way it stops a sweep run alone, so `--resume` continues each exactly.
Trials of all pairs share the cluster through Ray's scheduler, in one queue: the benchmark's private Ray declares
`max_concurrent_trials` slots of TRIAL_SLOT, and every trial holds one while it runs (`--trial-resource`). Each of
the `sweeps_at_once` sweeps may run up to the whole cap, so a slot one sweep leaves idle (down to its last
replicate, or failed) is taken by another's waiting trial, and Ray never runs more trials than there are slots.
A cluster at `--address` declares no such resource, and one declared on a node would pin every trial there; the
pairs' sweeps all run on the benchmark's host, though, so there the queue is a folder of `max_concurrent_trials`
slot files beside benchmark.json, and a sweep lets Tune create a trial only once it holds a free slot
(`--trial-slots`; trial_slots.py, ray_backend.QueuedSearch). On a `--resume` a sweep takes the slots of the trials
Tune restores mid-run before it restores them, as Ray's scheduler would hold them in its queue.

What is finished is read from each sweep's own results on disk, never from memory: a resumed benchmark
never re-runs a finished pair, even one that finished after the benchmark itself was killed.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from raybench.paths import inside, name_problem, writable_dir_problem, write_atomically, write_text_atomically
from raybench.records import PairState, RecordError, SweepState, SweepSummary
from raybench.registry import UnknownNameError
from raybench.report import renderers
from raybench.report.document import Column, Document, Heading, Lines, RowGroup, Table, Text
from raybench.report.forecast import Forecast, forecast_text
from raybench.sweep.benchmark_file import Benchmark, Binding, Pair, Refused
from raybench.sweep.converge import ConvergeRule, Counted, counting_attempt
from raybench.sweep.errors import OptionError, SweepExists
from raybench.sweep.extension import EXTENSION_KEY, stage_folders
from raybench.sweep.options import SweepOptions, command_words, setting_word
from raybench.sweep.progress import LiveBoard, Row, duration, live_board
from raybench.sweep.progress import say as say_shown
from raybench.sweep.spending import BUDGET_KEY, GPU, SpendLimit
from raybench.sweep.trial_slots import lock_problem, make_slots

STATE_FILE = "benchmark.json"
TRIAL_SLOT = "raybench_slot"  # the custom resource of the benchmark's trial queue (the module docstring says how)
SLOTS_FOLDER = "trial-slots"  # beside benchmark.json: the queue's slot files at --address
INTERRUPTED_CODES = (130, 143)  # a sweep stopped by SIGINT or SIGTERM says so in its exit status
STOP_GRACE_S = 300.0  # a sweep stopping on SIGTERM writes its partial results; then it is killed
# The library's entry point for one sweep, which each pair's process runs (`python -m`): the `raybench sweep` a user
# types, without the CLI. Named, not imported: the sweep process runs it as __main__, and this process needs no copy.
SWEEP_ENTRY = "raybench.commands.sweep"


class BenchmarkInterrupted(Exception):
    """The benchmark was stopped by a signal; each running sweep recorded where it stood."""


@dataclass
class BenchmarkOptions:
    storage: Path
    tracking_uri: str
    address: str | None = None  # None: a private local Ray, shared by every pair
    resume: bool = False
    resume_command: str | None = None
    progress_every_s: float = 30.0
    force: bool = False  # with resume: go on under a benchmark file that changed since the benchmark started
    spaces: tuple[str, ...] = ()  # the user's --spaces folders (absolute): each pair's sweep looks names up there too
    converge: ConvergeRule | None = None  # --converge / --converge-attempts; None: the file's `converge:`, if any
    # The formats the comparison is written in (raybench.report.renderers.FORMATS); empty: every registered one
    compare_formats: tuple[str, ...] = ()
    budget: SpendLimit | None = None  # --budget: the whole benchmark's, shared out among its pairs (budget_share)

    def __post_init__(self) -> None:
        comparison_formats(self.compare_formats)  # an unknown one is refused before any pair runs


def convergence(benchmark: Benchmark, options: BenchmarkOptions) -> ConvergeRule | None:
    """The convergence rule every pair's sweep runs under: the command line's, else the benchmark file's."""
    return options.converge if options.converge is not None else benchmark.converge


@dataclass
class PairRecord:
    """Where one pair stands, kept in `<storage>/<benchmark>/benchmark.json` (written atomically)."""

    sweep: str
    dataset: str
    method: str
    status: PairState = PairState.WAITING
    reason: str = ""
    attempts: int = 0
    exit_code: int | None = None
    seconds: float = 0.0
    counted: str = ""  # under the convergence rule: the attempt (a sweep name) that stands for the pair
    epochs_scale: float = 1.0  # and the factor its epochs were raised by


@dataclass
class Outcome:
    """What the benchmark did, for the command line and the parent run."""

    name: str
    records: list[PairRecord]
    refused: list[Refused]
    wall_seconds: float
    compare_dir: Path | None = None
    mlflow: dict[str, str] = field(default_factory=dict)

    def count(self, status: PairState) -> int:
        return sum(r.status == status for r in self.records)


@dataclass
class Running:
    pair: Pair
    process: subprocess.Popen
    started: float
    log: IO[str]


# ----- what is on disk ------------------------------------------------------------------------------------
def bench_dir(storage: Path, benchmark: Benchmark) -> Path:
    return storage / benchmark.name


class DamagedSummary(ValueError):
    """A sweep's `results/summary.json` under --storage that cannot be read (cut short, not JSON, not shaped like
    a summary): named in one line, and its pair counts as not finished, so its sweep runs again with --resume
    (which writes the file anew) while the other pairs go on."""


def sweep_summary(storage: Path, pair: Pair) -> SweepSummary | None:
    """The pair's sweep's results; None before it wrote them; a DamagedSummary naming a file no reader can use."""
    return summary_named(storage, pair.sweep)


def counted_attempt(storage: Path, pair: Pair, rule: ConvergeRule | None) -> Counted:
    """The pair's sweep that stands for it: itself, or under the convergence rule the attempt that counts (the one
    to run next while the rule is not done); DamagedSummary as sweep_summary."""
    return counting_attempt(pair.sweep, rule, lambda name: summary_named(storage, name))


def summary_named(storage: Path, sweep: str) -> SweepSummary | None:
    """Sweep `sweep`'s results under `storage`; None before it wrote them; DamagedSummary for a file no reader
    can use."""
    from raybench.tracking import read_summary_text

    path = storage / sweep / "results" / "summary.json"
    if not path.is_file():
        return None
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, ValueError) as err:  # unreadable, stray bytes (UnicodeDecodeError is a ValueError)
        raise DamagedSummary(f"{path} is damaged: not JSON ({one_line(str(err))})") from None
    try:  # nested too deep, not JSON, not a summary, or another sweep's: RecordErrors
        return read_summary_text(text, sweep)
    except RecordError as err:
        raise DamagedSummary(f"{path} is damaged: {err}") from None


def summary_status(storage: Path, pair: Pair, rule: ConvergeRule | None = None,
                   record: PairRecord | None = None) -> tuple[tuple[PairState, str] | None, str]:
    """(finished_status of the pair's summary, "") or, for a damaged summary, (None, why it is damaged). Under the
    convergence rule, of the attempt that counts: a pair is finished once its rule is done; `record` then learns
    which attempt counts."""
    try:
        counted = counted_attempt(storage, pair, rule)
    except DamagedSummary as err:
        return None, str(err)
    if record is not None:  # without a rule (a resume may leave it out) the pair's own sweep counts
        record.counted, record.epochs_scale = (counted.name, counted.epochs_scale) if rule else ("", 1.0)
    return finished_status(counted.summary, pair.trials), ""


def one_line(text: str, length: int = 200) -> str:
    line = " ".join(text.split())
    return line if len(line) <= length else line[:length] + "..."


def finished_status(summary: SweepSummary | None, trials: int | None = None) -> tuple[PairState, str] | None:
    """(status, reason) of a pair whose sweep wrote final results; None while it has not, or while its search ran
    fewer than `trials` configs (the benchmark file grew it: the sweep extends its search). A pair that selected
    nothing failed; its reason lists why its trials failed (or the statuses they ended with)."""
    if summary is None or summary.state != SweepState.FINISHED:
        return None
    if trials is not None and trials > trials_asked(summary):
        return None
    if summary.selected is None:
        reasons = sorted({t.failure_reason or t.status.value for t in summary.trials})
        return PairState.FAILED, f"no trial finished ({'; '.join(r for r in reasons if r)[:300] or 'no trials'})"
    return PairState.FINISHED, ""


def trials_asked(summary: SweepSummary) -> int:
    """The configs a finished sweep's search was asked for: its last extent, or its --trials where --budget cut it
    (both in summary.report), else the trials it ran."""
    report = summary.report or {}
    extents = (report.get(EXTENSION_KEY) or {}).get("extents") or []
    asked = (report.get(BUDGET_KEY) or {}).get("trials_asked")
    return int(extents[-1] if extents else asked if isinstance(asked, int) else len(summary.trials))


def runs_done(storage: Path, pair: Pair, rule: ConvergeRule | None = None) -> int:
    """Finished runs of a pair (search trials and replicates), from its sweep's completed-run records: of every
    attempt under the convergence rule."""
    total = 0
    for sweep in rule.names(pair.sweep) if rule is not None else [pair.sweep]:
        folders = [stage / "completed" for stage in stage_folders(storage, sweep)]
        total += sum(len(list(folder.glob("*.json"))) for folder in folders if folder.is_dir())
    return total


@dataclass(frozen=True)
class SavedState:
    """What `benchmark.json` holds: each pair's record and the grid the benchmark runs (None when the file was
    written before grids were recorded); `damage` says why the file could not be read (then both are empty)."""

    pairs: dict[str, Any]
    grid: dict[str, Any] | None
    damage: str = ""


def read_state(path: Path) -> SavedState:
    """The benchmark's own record; a damaged one is reported, never a traceback: what is finished is read from
    each sweep's own results anyway."""
    if not path.is_file():
        return SavedState({}, None)
    try:
        body = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:
        return SavedState({}, None, f"{path} is damaged: not JSON ({one_line(str(err))})")
    if not isinstance(body, dict) or not isinstance(body.get("pairs", {}), dict):
        return SavedState({}, None, f"{path} is damaged: not a mapping with a mapping 'pairs'")
    grid = body.get("grid")
    return SavedState(body.get("pairs", {}), grid if isinstance(grid, dict) else None)


def load_records(path: Path, benchmark: Benchmark) -> dict[str, PairRecord]:
    saved = read_state(path).pairs
    return {p.sweep: _saved_record(saved.get(p.sweep), p) for p in benchmark.pairs}


def _saved_record(entry: Any, pair: Pair) -> PairRecord:
    """A pair's record as saved, keeping only the fields of the right type and a status this raybench knows (a
    hand-edited or cut file cannot break the benchmark); its status is read again from the sweep's own results
    before anything runs."""
    record = PairRecord(pair.sweep, pair.dataset, pair.method)
    if isinstance(entry, dict):
        for name, kind in (("reason", str), ("attempts", int), ("exit_code", int), ("seconds", (int, float)),
                           ("counted", str), ("epochs_scale", (int, float))):
            value = entry.get(name)
            if isinstance(value, kind) and not isinstance(value, bool):
                setattr(record, name, value)
        if entry.get("status") in {state.value for state in PairState}:
            record.status = PairState(entry["status"])
    return record


def save_records(path: Path, benchmark: Benchmark, records: dict[str, PairRecord]) -> None:
    grid = grid_record(benchmark)
    body = {"name": benchmark.name, "file": str(benchmark.path),
            "pairs": {k: dataclasses.asdict(r) for k, r in records.items()},
            "refused": [dataclasses.asdict(r) for r in benchmark.refused],
            "grid": grid, "fingerprint": grid_fingerprint(grid)}
    path.parent.mkdir(parents=True, exist_ok=True)
    write_text_atomically(path, json.dumps(body, indent=2, sort_keys=True))


# ----- the grid a benchmark runs, so a resume can tell an edited file ---------------------------------------
def grid_record(benchmark: Benchmark) -> dict[str, Any]:
    """What the benchmark file makes the pairs run: the settings every pair shares, and each pair's dataset, space
    (by the content of its file), trials, replicates and `set`, as JSON holds them. Left out: the description and
    the scheduling (max_concurrent_trials, sweeps_at_once), which change no result."""
    pairs = {p.sweep: {"dataset": p.dataset, "space": p.space_digest, "trials": p.trials, "replicates": p.replicates,
                       "set": {k: setting_word(v) for k, v in sorted(p.fixed.items())}} for p in benchmark.pairs}
    return {"selection": benchmark.selection, "seed": benchmark.seed, "executor": benchmark.executor,
            "smoke": benchmark.smoke, "pairs": pairs}


def grid_fingerprint(grid: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(grid, sort_keys=True).encode()).hexdigest()[:16]


def grid_change(saved: dict[str, Any], current: dict[str, Any], shown: int = 4) -> str | None:
    """The differences between the grid a benchmark started with and the file's now, in words; None if none."""
    changes = [f"{key} {saved.get(key)!r} -> {current[key]!r}" for key in ("selection", "seed", "executor", "smoke")
               if saved.get(key) != current[key]]
    old = saved.get("pairs") if isinstance(saved.get("pairs"), dict) else {}
    new = current["pairs"]
    added, removed = [n for n in new if n not in old], [n for n in old if n not in new]
    changes += [f"pairs added: {', '.join(added)}"] if added else []
    changes += [f"pairs removed: {', '.join(removed)}"] if removed else []
    for name in (n for n in new if n in old and old[n] != new[n]):
        was = old[name] if isinstance(old[name], dict) else {}
        changes += [f"{name}: {'its space file was edited' if key == 'space' else f'{key} {was.get(key)!r} -> {value!r}'}"
                    for key, value in new[name].items() if was.get(key) != value]
    if not changes:
        return None
    more = f"; and {len(changes) - shown} more" if len(changes) > shown else ""
    return "; ".join(changes[:shown]) + more


def grown_pairs(saved: dict[str, Any], current: dict[str, Any]) -> dict[str, tuple[int, int]]:
    """Pair -> (trials it had, trials it has) when the only change to the grid is pairs' trials going up: such a
    grid is extended (each pair's sweep extends its search, raybench.sweep.extension), not changed. Empty
    otherwise."""
    old, new = saved.get("pairs"), current["pairs"]
    if not isinstance(old, dict) or set(old) != set(new):
        return {}
    if any(saved.get(key) != current[key] for key in ("selection", "seed", "executor", "smoke")):
        return {}
    grown = {}
    for name, now in new.items():
        was = old[name] if isinstance(old[name], dict) else {}
        if {k: v for k, v in was.items() if k != "trials"} != {k: v for k, v in now.items() if k != "trials"}:
            return {}
        if not isinstance(was.get("trials"), int) or now["trials"] < was["trials"]:
            return {}
        if now["trials"] > was["trials"]:
            grown[name] = (was["trials"], now["trials"])
    return grown


def budget_share(budget: SpendLimit | None, benchmark: Benchmark) -> str | None:
    """Each pair's --budget: GPU-hours add up, so each of the N pairs gets 1/N; wall-clock passes as the pairs
    run, `sweeps_at_once` beside each other, so each gets the budget over the waves of pairs. Every pair counts
    its own spending from its own records, so a resumed benchmark holds each share."""
    if budget is None:
        return None
    pairs = len(benchmark.pairs)
    if budget.unit == GPU:
        return f"{budget.seconds / 3600 / pairs:.6g}gpu-h"
    waves = math.ceil(pairs / max(benchmark.sweeps_at_once, 1))
    return f"{budget.seconds / waves:.6g}s"


def check_storage(benchmark: Benchmark, options: BenchmarkOptions) -> list[str]:
    """A new benchmark never lands on an old one's records, and --resume needs one; names stay inside storage.

    A resume runs the benchmark its file describes now, so the file must be the one the benchmark started with:
    a changed file (pairs added or removed, other trials, replicates, `set`, selection, seed, executor, smoke, or
    an edited space file) is refused in one line naming the change. `--force` resumes under the changed file: finished pairs are
    kept as they are, the others run as the file says now, and the record takes the new grid. Returns the lines
    to say before the run: what --force went past, a record that could not be read."""
    if options.force and not options.resume:
        raise OptionError("--force: expected only with --resume (it lets a resume go on under a changed benchmark "
                          "file), got it without")
    problem = writable_dir_problem(options.storage)
    if problem:
        raise OptionError(f"--storage: {problem}")
    problem = lock_problem(options.storage) if options.address else None  # its trial queue's slot files
    if problem:
        raise OptionError(f"--storage: {problem}")
    folders = [bench_dir(options.storage, benchmark)] + [options.storage / p.sweep for p in benchmark.pairs]
    if not all(inside(options.storage, folder) for folder in folders):
        raise OptionError(f"name: {benchmark.name!r} would write outside --storage {str(options.storage)!r}")
    exists = (bench_dir(options.storage, benchmark) / STATE_FILE).is_file()
    if exists and not options.resume:
        raise SweepExists(f"name: a benchmark named {benchmark.name!r} already exists under {options.storage}; "
                          f"pass --resume to finish it, or give the file another name")
    if options.resume and not exists:
        raise OptionError(f"--resume: no benchmark named {benchmark.name!r} under {options.storage} to resume")
    check_attempt_names(benchmark, convergence(benchmark, options))
    taken = [name for p in benchmark.pairs for name in pair_sweeps(p, convergence(benchmark, options))
             if not options.resume and (options.storage / name).exists()]
    if taken:
        raise SweepExists(f"name: the sweep {taken[0]!r} of this benchmark already exists under {options.storage}; "
                          f"give the benchmark another name")
    return _resume_notes(benchmark, options) if options.resume else []


def pair_sweeps(pair: Pair, rule: ConvergeRule | None) -> list[str]:
    """The sweeps a pair may run: its own, and under the convergence rule each later attempt's."""
    return rule.names(pair.sweep) if rule is not None else [pair.sweep]


def check_attempt_names(benchmark: Benchmark, rule: ConvergeRule | None) -> None:
    """Every attempt of every pair can name a sweep: refused now, not by a pair's sweep after its first attempts."""
    for pair in benchmark.pairs:
        for name in pair_sweeps(pair, rule)[1:]:
            if name_problem(name):
                raise OptionError(f"--converge: {pair.label}'s attempt {name!r} cannot name a sweep "
                                  f"({name_problem(name)}); give the benchmark a shorter name")


def _resume_notes(benchmark: Benchmark, options: BenchmarkOptions) -> list[str]:
    saved = read_state(bench_dir(options.storage, benchmark) / STATE_FILE)
    if saved.damage:
        return [(f"warning: {saved.damage}; the file the benchmark started with is unknown, and each pair's own "
                f"results say whether it finished")]
    if saved.grid is None:  # recorded before grids were: nothing to compare with
        return []
    current = json.loads(json.dumps(grid_record(benchmark)))
    change = grid_change(saved.grid, current)
    if change is None:
        return []
    grown = grown_pairs(saved.grid, current)
    if grown:
        return [f"{name}: its search grows from {was} to {now} trials (the next configs of the same seeded stream)"
                for name, (was, now) in grown.items()]
    if not options.force:
        raise OptionError(f"--resume: {benchmark.path} changed since benchmark {benchmark.name!r} started ({change}); "
                          f"resume with the file it started with, or pass --force to go on under this one")
    return [(f"warning: {benchmark.path} changed since the benchmark started ({change}); going on under it (--force): "
            f"finished pairs are kept as they are")]


# ----- one pair's sweep process -------------------------------------------------------------------------
def sweep_command(pair: Pair, benchmark: Benchmark, options: BenchmarkOptions, target: SweepTarget,
                  resume: bool) -> list[str]:
    """The `raybench sweep` this pair is: the command a user would type, joined to the shared cluster, run
    through the library's entry point for one sweep (SWEEP_ENTRY), since the library never runs the CLI. Its words
    come from the sweep's declared options, so every option the benchmark decides reaches the sweep; each one is
    spelled even at its default, so the command in a pair's log says what the benchmark chose."""
    settings = {**pair_settings(pair, benchmark, options, target, resume), **converge_settings(benchmark, options)}
    return [sys.executable, "-m", SWEEP_ENTRY, *command_words(SweepOptions(**settings), spell=settings)]


def converge_settings(benchmark: Benchmark, options: BenchmarkOptions) -> dict[str, Any]:
    """The convergence rule as the pair's sweep takes it (--converge, --converge-attempts); nothing without one."""
    rule = convergence(benchmark, options)
    return {} if rule is None else {"converge": rule.factor, "converge_attempts": rule.attempts}


def shown_command(command: Sequence[str]) -> str:
    """A pair's sweep command as its log shows it: `sweep` and its arguments, the words a user types after
    `raybench` (the interpreter and the entry module left out)."""
    return " ".join(["sweep", *command[3:]])


def pair_settings(pair: Pair, benchmark: Benchmark, options: BenchmarkOptions, target: SweepTarget,
                  resume: bool) -> dict[str, Any]:
    """What the benchmark decides of this pair's sweep, by SweepOptions field (every other option keeps the
    sweep's default): `set` values as the command line spells them, which is what the sweep then reads."""
    return {"space": str(pair.space_path), "dataset": pair.dataset, "name": pair.sweep,
            "storage": str(options.storage), "tracking_uri": target.tracking_uri, "address": target.address,
            "trials": pair.trials, "replicates": pair.replicates, "seed": benchmark.seed,
            "selection": benchmark.selection, "executor": benchmark.executor, "smoke": benchmark.smoke,
            "extra_fixed": {key: setting_word(value) for key, value in pair.fixed.items()},
            "parent_run": target.parent_run, "resume": resume, "spaces": options.spaces,
            "budget": budget_share(options.budget, benchmark),
            "progress_every": options.progress_every_s, **concurrency(benchmark, target)}


def concurrency(benchmark: Benchmark, target: SweepTarget) -> dict[str, Any]:
    """In the trial queue a sweep may run the whole cap, each trial holding one slot: of the private Ray's
    TRIAL_SLOT resource, or of the slot folder on this host (a cluster at --address). Without either (a library
    caller's target) a sweep runs its static share."""
    if target.queued:
        return {"max_concurrent": benchmark.max_concurrent_trials, "trial_resources": ((TRIAL_SLOT, 1.0),)}
    if target.slots is not None:
        return {"max_concurrent": benchmark.max_concurrent_trials, "trial_slots": str(target.slots)}
    return {"max_concurrent": benchmark.trials_per_sweep}


def _parent_death_signal() -> Callable[[], None]:
    """A pre-exec hook: the child gets SIGTERM when the benchmark process dies (even by SIGKILL), so a killed
    benchmark leaves no sweep running unseen; the sweep then stops and records, as on any SIGTERM.

    libc's prctl is looked up here, in the parent: between fork and exec the child runs no import and no lookup,
    only the call (the benchmark process has threads, Ray's among them)."""
    import ctypes

    prctl = ctypes.CDLL(None, use_errno=True).prctl
    set_parent_death_signal, sigterm = 1, int(signal.SIGTERM)  # PR_SET_PDEATHSIG

    def hook() -> None:
        prctl(set_parent_death_signal, sigterm, 0, 0, 0)

    return hook


def launch(pair: Pair, command: list[str], log_path: Path) -> Running:
    """Start the sweep in its own process group: a terminal's Ctrl-C reaches the benchmark alone, which then
    stops each sweep with exactly one SIGTERM (a sweep stopped twice would skip its last checkpoint)."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    log = open(log_path, "a", encoding="utf-8")  # noqa: SIM115  (Running owns it: closed when the sweep ends)
    log.write(f"\n===== {time.strftime('%Y-%m-%d %H:%M:%S')} {shown_command(command)}\n")
    log.flush()
    process = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                               process_group=0, preexec_fn=_parent_death_signal())  # noqa: PLW1509  one prctl call, no locks
    return Running(pair, process, time.time(), log)


def exit_reason(code: int, log_path: Path) -> str:
    """The sweep's own one-line error when it printed one, else its exit status."""
    try:
        tail = log_path.read_text(encoding="utf-8", errors="replace").splitlines()[-200:]
    except OSError:
        tail = []
    errors = [line for line in tail if line.startswith("raybench: ")]
    return errors[-1].removeprefix("raybench: ").removeprefix("error: ") if errors else f"the sweep exited with status {code}"


# ----- the benchmark ------------------------------------------------------------------------------------
class Progress:
    """Pairs done of total, runs done, failures and an ETA from the pace of this invocation."""

    def __init__(self, benchmark: Benchmark, storage: Path, say: Callable[[str], None],
                 rule: ConvergeRule | None = None) -> None:
        self.benchmark, self.storage, self.say, self.rule = benchmark, storage, say, rule
        self.started = time.time()
        self.runs_at_start = self.runs()

    def runs(self) -> int:
        return sum(runs_done(self.storage, p, self.rule) for p in self.benchmark.pairs)

    def line(self, records: dict[str, PairRecord]) -> str:
        return f"benchmark {self.benchmark.name}: {self.status(records)}"

    def status(self, records: dict[str, PairRecord]) -> str:
        counts = {s: sum(r.status == s for r in records.values())
                  for s in (PairState.FINISHED, PairState.FAILED, PairState.RUNNING)}
        total_runs = sum(p.runs for p in self.benchmark.pairs)
        done = self.runs()
        elapsed = time.time() - self.started
        pace = (done - self.runs_at_start) / elapsed if elapsed > 0 else 0.0
        eta = f"ETA ~{duration(max(total_runs - done, 0) / pace)}" if pace > 0 else "ETA unknown until a run finishes"
        return (f"pairs {counts[PairState.FINISHED]}/{len(records)} finished, "
                f"{counts[PairState.FAILED]} failed, {counts[PairState.RUNNING]} running; runs {done}/~{total_runs} done; "
                f"elapsed {duration(elapsed)}, {eta}")


LIVE_REFRESH_S = 2.0  # how often a live board rereads the running pairs' logs
PROGRESS_WORDS = ("search:", "replicates:", "Ray:", "dataset ", "results:", "sweep ")  # a sweep's progress lines


def latest_progress(log_path: Path) -> str:
    """The last progress line a pair's sweep wrote to its log (raybench.sweep.progress), or "starting"."""
    try:
        with open(log_path, "rb") as log:
            log.seek(0, os.SEEK_END)
            log.seek(max(log.tell() - 8192, 0))
            tail = log.read().decode("utf-8", errors="replace").splitlines()
    except OSError:
        return "starting"
    return next((line.strip() for line in reversed(tail) if line.startswith(PROGRESS_WORDS)), "starting")


def run_benchmark(benchmark: Benchmark, options: BenchmarkOptions, say: Callable[[str], None] = say_shown) -> Outcome:
    """Run every pair not finished yet, then compare the sweeps and attach the tables to the parent run."""
    from raybench.tracking import RUN_FAILED, RUN_FINISHED, RUN_KILLED, BenchmarkTracker, check_uri

    notes = check_storage(benchmark, options)
    check_uri(options.tracking_uri)
    for note in notes:
        say(note)
    tracker = BenchmarkTracker(options.tracking_uri)
    state_path = bench_dir(options.storage, benchmark) / STATE_FILE
    records = load_records(state_path, benchmark)
    save_records(state_path, benchmark, records)
    parent = tracker.start_benchmark(benchmark.name, benchmark_params(benchmark), options.resume_command)
    started = time.time()
    try:
        _run_pairs_on_cluster(benchmark, options, records, tracker.uri, parent, state_path, say)
        outcome = Outcome(benchmark.name, list(records.values()), benchmark.refused, time.time() - started)
        outcome.compare_dir = write_comparison(benchmark, options, tracker)
        tracker.log_artifact(state_path, "benchmark")
    except BaseException as err:
        save_records(state_path, benchmark, records)
        stopped = isinstance(err, (KeyboardInterrupt, BenchmarkInterrupted))
        tracker.end_benchmark(_summary_markdown(benchmark, records), RUN_KILLED if stopped else RUN_FAILED,
                              note=str(err) or type(err).__name__)
        raise
    status = RUN_FINISHED if outcome.count(PairState.FINISHED) == len(records) else RUN_FAILED
    failed = "; ".join(f"{r.method} on {r.dataset}: {r.reason}" for r in records.values() if r.status == PairState.FAILED)
    tracker.end_benchmark(_summary_markdown(benchmark, records), status, note=failed or None)
    outcome.mlflow = {"experiment_id": tracker.experiment_id, "run_id": parent}
    return outcome


def _run_pairs_on_cluster(benchmark: Benchmark, options: BenchmarkOptions, records: dict[str, PairRecord],
                          tracking_uri: str, parent: str, state_path: Path, say: Callable[[str], None]) -> None:
    """The pairs on the cluster at --address, or on a private local Ray started for them and stopped after."""
    from raybench.sweep import ray_backend as backend  # Ray starts only once everything is valid

    queued = options.address is None
    address = options.address or backend.start_shared_cluster(2 * benchmark.max_concurrent_trials,
                                                               {TRIAL_SLOT: benchmark.max_concurrent_trials})
    slots = None if queued else make_slots(state_path.parent / SLOTS_FOLDER, benchmark.max_concurrent_trials)
    try:
        target = SweepTarget(address, tracking_uri, parent, queued, slots)
        PairRunner(benchmark, options, records, target, state_path, say).run()
    finally:
        if options.address is None:
            backend.shutdown()
        save_records(state_path, benchmark, records)


@dataclass(frozen=True)
class SweepTarget:
    """Where every pair's sweep reports: the shared cluster, the tracking store, the benchmark's parent run."""

    address: str
    tracking_uri: str
    parent_run: str
    queued: bool = False  # the cluster declares the benchmark's trial queue (its private Ray does)
    slots: Path | None = None  # else the queue's slot folder on this host (trial_slots.py), at --address

    def sweeps_at_once(self, benchmark: Benchmark) -> int:
        """The benchmark's `sweeps_at_once` in a trial queue; without one, no more sweeps than the cap."""
        return benchmark.sweeps_at_once if self.queued or self.slots is not None else benchmark.unqueued_sweeps_at_once


class PairRunner:
    """Keeps `sweeps_at_once` sweep processes running until every pair not finished yet has had its turn."""

    def __init__(self, benchmark: Benchmark, options: BenchmarkOptions, records: dict[str, PairRecord],
                 target: SweepTarget, state_path: Path, say: Callable[[str], None]) -> None:
        self.benchmark, self.options, self.records, self.target = benchmark, options, records, target
        self.state_path, self.say = state_path, say
        self.folder = bench_dir(options.storage, benchmark)
        self.rule = convergence(benchmark, options)
        self.ended: queue.Queue[Running] = queue.Queue()
        self.running: list[Running] = []

    def run(self) -> None:
        waiting = self._pending()
        progress = Progress(self.benchmark, self.options.storage, self.say, self.rule)
        board = live_board()  # a terminal's live board, redrawn every LIVE_REFRESH_S; else a line per interval
        if board is not None:
            board.start(f"benchmark {self.benchmark.name}", len(self.records))
        try:
            while waiting or self.running:
                while waiting and len(self.running) < self.target.sweeps_at_once(self.benchmark):
                    self._start(waiting.pop(0))
                try:
                    job = self.ended.get(timeout=LIVE_REFRESH_S if board else self.options.progress_every_s)
                except queue.Empty:
                    self._show(progress, board)
                    continue
                self._finish(job)
                self.say(progress.line(self.records))
                self._show(progress, board)
        except KeyboardInterrupt:
            if board is not None:
                board.stop()
            _stop(self.running, self.ended, self.records, self.options.storage, self.folder, self.rule)
            save_records(self.state_path, self.benchmark, self.records)
            finished = sum(r.status == PairState.FINISHED for r in self.records.values())
            raise BenchmarkInterrupted(f"benchmark {self.benchmark.name!r} interrupted: {finished} of "
                                       f"{len(self.records)} pairs finished") from None
        finally:
            if board is not None:
                board.stop()

    def _show(self, progress: Progress, board: LiveBoard | None) -> None:
        """The benchmark's standing: the live board with each running pair's latest line, else one plain line."""
        if board is None:
            self.say(progress.line(self.records))
            return
        finished = sum(r.status == PairState.FINISHED for r in self.records.values())
        rows = {job.pair.sweep: Row(job.pair.label, latest_progress(Path(job.log.name))) for job in self.running}
        board.show(finished, progress.status(self.records), rows)

    def _pending(self) -> list[Pair]:
        """The pairs whose sweep has not finished, as its own results on disk say; the others are announced."""
        waiting = []
        for pair in self.benchmark.pairs:
            record = self.records[pair.sweep]
            done, damage = summary_status(self.options.storage, pair, self.rule, record)
            if damage:
                self.say(f"{pair.label}: {damage}; not counted as finished: its sweep runs again (resuming it)")
            if done is not None and done[0] == PairState.FINISHED:
                record.status, record.reason = done
                self.say(f"{pair.label}: finished earlier (sweep {record.counted or pair.sweep}); not run again")
            else:
                record.status = PairState.WAITING
                waiting.append(pair)
        for refused in self.benchmark.refused:
            self.say(f"{refused.method} on {refused.dataset}: not run: {refused.reason}")
        return waiting

    def _start(self, pair: Pair) -> None:
        storage = self.options.storage
        resume = (storage / pair.sweep).exists() or (storage / f"{pair.sweep}-search").exists()
        command = sweep_command(pair, self.benchmark, self.options, self.target, resume)
        job = launch(pair, command, self.folder / "logs" / f"{pair.sweep}.log")
        threading.Thread(target=lambda: (job.process.wait(), self.ended.put(job)), daemon=True).start()
        self.running.append(job)
        record = self.records[pair.sweep]
        record.status, record.attempts, record.reason = PairState.RUNNING, record.attempts + 1, ""
        save_records(self.state_path, self.benchmark, self.records)
        self.say(f"{pair.label}: started sweep {pair.sweep}{' (resuming it)' if resume else ''}")

    def _finish(self, job: Running) -> None:
        self.running.remove(job)
        record = self.records[job.pair.sweep]
        _record_end(job, record, self.options.storage, self.folder, self.rule)
        save_records(self.state_path, self.benchmark, self.records)
        self.say(f"{job.pair.label}: {record.status}{': ' + record.reason if record.reason else ''}"
                 f"{counted_words(record)} after {duration(record.seconds)}")


def counted_words(record: PairRecord) -> str:
    """` (the attempt that counts: NAME, epochs x2)` for a pair under the convergence rule; else nothing."""
    if not record.counted:
        return ""
    return f" (the attempt that counts: {record.counted}, epochs x{record.epochs_scale:g})"


def _record_end(job: Running, record: PairRecord, storage: Path, directory: Path,
                rule: ConvergeRule | None = None) -> None:
    job.log.close()
    code = job.process.returncode
    record.exit_code, record.seconds = code, record.seconds + time.time() - job.started
    done, damage = summary_status(storage, job.pair, rule, record)
    if code == 0 and done is not None:
        record.status, record.reason = done
    elif code in INTERRUPTED_CODES or code == -signal.SIGTERM:
        record.status, record.reason = PairState.INTERRUPTED, "stopped by a signal; --resume continues it"
    else:
        record.status = PairState.FAILED
        record.reason = damage or exit_reason(code, directory / "logs" / f"{job.pair.sweep}.log")


def _stop(running: list[Running], ended: queue.Queue[Running], records: dict[str, PairRecord], storage: Path,
          directory: Path, rule: ConvergeRule | None = None) -> None:
    """One SIGTERM to each running sweep, then wait (bounded) for each to record where it stood."""
    for job in running:
        if job.process.poll() is None:
            job.process.send_signal(signal.SIGTERM)
    deadline = time.time() + STOP_GRACE_S
    while running:
        try:
            job = ended.get(timeout=max(deadline - time.time(), 0.1))
        except queue.Empty:
            for job in running:
                job.process.kill()
            continue
        running.remove(job)
        _record_end(job, records[job.pair.sweep], storage, directory, rule)


# ----- results ----------------------------------------------------------------------------------------
def benchmark_params(benchmark: Benchmark) -> dict[str, Any]:
    return {"file": str(benchmark.path), "selection": benchmark.selection, "seed": benchmark.seed,
            "executor": benchmark.executor, "smoke": benchmark.smoke, "pairs": len(benchmark.pairs),
            "refused": len(benchmark.refused), "max_concurrent_trials": benchmark.max_concurrent_trials,
            "sweeps_at_once": benchmark.sweeps_at_once}


def _summary_markdown(benchmark: Benchmark, records: dict[str, PairRecord]) -> str:
    """The pairs' table in Markdown (the parent run's description)."""
    return renderers.render(summary_document(benchmark, records), "markdown")


def summary_document(benchmark: Benchmark, records: dict[str, PairRecord]) -> Document:
    """The benchmark's name and description over the pairs' table: each pair's sweep, status and reason, the
    pairs the file rules out as `not run`; under the convergence rule with the attempt that counts for each and its
    epochs scale."""
    ruled = any(r.counted for r in records.values())
    titles = ("pair", "sweep", "status", "reason", *(("attempt that counts", "epochs scale") if ruled else ()))
    rows = [(f"{r.method} on {r.dataset}", r.sweep, str(r.status), r.reason,
             *((r.counted, f"x{r.epochs_scale:g}") if ruled else ())) for r in records.values()]
    rows += [(f"{r.method} on {r.dataset}", "", "not run", r.reason, *(("", "") if ruled else ()))
             for r in benchmark.refused]
    table = Table("", tuple(Column(t) for t in titles), (RowGroup(tuple(tuple(Text(c) for c in row) for row in rows)),))
    return Document((Heading(f"Benchmark {benchmark.name}"), Lines((benchmark.description, "")), table))


def write_comparison(benchmark: Benchmark, options: BenchmarkOptions, tracker: Any) -> Path | None:
    """`raybench compare` over this benchmark's sweeps, in every format and with its figures, on the parent run."""
    from raybench.report import compare, plots
    from raybench.report.stats import StatsSettings
    from raybench.tracking import find_sweeps

    order = [counted_name(options.storage, p, convergence(benchmark, options)) for p in benchmark.pairs]
    records = find_sweeps(options.tracking_uri, tuple(order))  # under the convergence rule, the attempts that count
    if not records:
        return None
    records.sort(key=lambda r: order.index(r.name))
    comparisons = {"compare": compare.from_records(records, None),  # `raybench compare`: the Table 2 with its marks
                   "compare-stats": compare.from_records(records, None, StatsSettings())}  # `compare --stats`
    directory = bench_dir(options.storage, benchmark) / "compare"
    directory.mkdir(parents=True, exist_ok=True)
    formats = comparison_formats(options.compare_formats)
    for stem, comparison in comparisons.items():
        write_formats(compare.document(comparison), directory, stem, formats)
    plots.save(plots.comparison_figures(comparisons["compare"], "compare.png"), directory)
    copy_importance_charts(records, options.storage, directory)
    tracker.log_artifacts(directory, "compare")
    return directory


def comparison_formats(asked: Sequence[str] = ()) -> list[renderers.Renderer]:
    """The formats a benchmark writes its comparison in: those `asked`, else every registered one. An unknown one
    is an OptionError naming it and the known ones; two whose files would share a suffix (one overwriting the
    other) are refused too."""
    try:
        shown = [renderers.renderer(name) for name in (asked or renderers.FORMATS.names())]
    except UnknownNameError as err:
        raise OptionError(f"compare formats: {err}") from None
    suffixes = [f.suffix for f in shown]
    clash = sorted({s for s in suffixes if suffixes.count(s) > 1})
    if clash:
        raise OptionError(f"compare formats: more than one writes compare.{clash[0]}; each format needs a suffix of "
                          f"its own")
    return shown


def write_formats(page: Document, directory: Path, stem: str, formats: Sequence[renderers.Renderer]) -> list[Path]:
    """The document in each format, as `<stem>.<suffix>` in `directory`: every one of `formats`, none skipped."""
    written = []
    for shown in formats:
        target = directory / f"{stem}.{shown.suffix}"
        write_text_atomically(target, shown.render(page))
        written.append(target)
    return written


def counted_name(storage: Path, pair: Pair, rule: ConvergeRule | None) -> str:
    """The sweep that stands for the pair in its comparison: under the convergence rule, the attempt that counts."""
    try:
        return counted_attempt(storage, pair, rule).name
    except DamagedSummary:  # its own sweep's record says what is wrong with it
        return pair.sweep


def copy_importance_charts(records: Sequence[Any], storage: Path, directory: Path) -> list[Path]:
    """Each sweep's hyperparameter-importance chart (its plots/importance.png, made where its search rated at least
    one hyperparameter) beside the comparison, as importance-<sweep>.png."""
    copied = []
    for record in records:
        chart = storage / record.name / "plots" / "importance.png"
        if chart.is_file():
            target = directory / f"importance-{record.name}.png"
            write_atomically(target, lambda temp, chart=chart: temp.write_bytes(chart.read_bytes()))
            copied.append(target)
    return copied


def plan_text(benchmark: Benchmark, bindings: Sequence[Binding] = (), rule: ConvergeRule | None = None,
              forecast: Forecast | None = None) -> str:
    """What the benchmark would run, without running it (`raybench benchmark FILE --plan`); each pair that could
    not be bound to its dataset here (`bind_pairs`) says so. `rule`: the convergence rule the command line gives
    (else the file's); `forecast`: its runtime forecast (`--calibrate`), printed under the rest."""
    rule = rule if rule is not None else benchmark.converge
    unchecked = {b.pair.sweep: b.unchecked for b in bindings if b.unchecked}
    lines = [(f"benchmark {benchmark.name} ({benchmark.path}): {len(benchmark.pairs)} sweeps, at most "
             f"{benchmark.max_concurrent_trials} trials at once (one queue for up to {benchmark.sweeps_at_once} "
             f"sweeps at once), selection {benchmark.selection}, executor {benchmark.executor}"
             f"{', smoke' if benchmark.smoke else ''}"), ""]
    for pair in benchmark.pairs:
        replicates = "the dataset's replicates" if pair.replicates is None else f"{pair.replicates} replicates"
        fixed = f"; set {', '.join(f'{k}={setting_word(v)}' for k, v in pair.fixed.items())}" if pair.fixed else ""
        note = "; not checked here (see below)" if pair.sweep in unchecked else ""
        lines.append(f"  {pair.label:34s} sweep {pair.sweep}: {pair.trials} trials, {replicates}{fixed}{note}")
    if rule is not None:
        lines += ["", rule_text(rule, benchmark.pairs[0].sweep)]
    if unchecked:
        lines += ["", ("not bound to their datasets here: their files are not on this machine (each sweep checks its "
                      "pair before its own cluster work):")]
        lines += [f"  {reason}" for reason in dict.fromkeys(unchecked.values())]
    if benchmark.refused:
        lines += ["", "not run:"] + [f"  {r.method} on {r.dataset}: {r.reason}" for r in benchmark.refused]
    if forecast is not None:
        lines += ["", forecast_text(forecast)]
    return "\n".join(lines)


def rule_text(rule: ConvergeRule, example: str) -> str:
    """The convergence rule in one line, with the attempts' names of one pair as the example."""
    return (f"convergence rule: a pair whose selected config had not converged runs again with every config's "
            f"epochs x{rule.factor:g}, up to {rule.attempts} attempts in all (e.g. {', '.join(rule.names(example))})")


def outcome_text(outcome: Outcome) -> str:
    lines = [(f"benchmark {outcome.name}: {outcome.count(PairState.FINISHED)} of {len(outcome.records)} pairs "
             f"finished, {outcome.count(PairState.FAILED)} failed, {len(outcome.refused)} not run, in "
             f"{duration(outcome.wall_seconds)}")]
    lines += [f"  FAILED {r.method} on {r.dataset} (sweep {r.sweep}): {r.reason}" for r in outcome.records
              if r.status == PairState.FAILED]
    lines += [f"  {r.method} on {r.dataset} counts as sweep {r.counted} (epochs x{r.epochs_scale:g})"
              for r in outcome.records if r.counted]
    if outcome.compare_dir is not None:
        text = outcome.compare_dir / f"compare.{renderers.suffix('table')}"
        lines += ["", text.read_text().rstrip()] if text.is_file() else []  # unless its formats left the text out
        written = sorted(path.name for path in outcome.compare_dir.glob("compare.*"))
        lines += ["", f"comparison in {', '.join(written)}: {outcome.compare_dir}"]
    return "\n".join(lines)

