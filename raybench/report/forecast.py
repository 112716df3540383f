"""How long a benchmark would take, forecast from one finished sweep on this machine (`raybench benchmark FILE --plan
--calibrate SWEEP`), so a user sees the hours before committing a cluster to them.

A run's time is split the way the sweep measures it (raybench.sweep.ray_trial.trial_timing, ray_worker.TrialClock):
`time/wall_s` = `time/startup_s` (the driver's start to the trainer's first line: the process, Ray Train's workers)
+ `time/trial_s` (inside the trainer: loading, steps, every epoch's evaluation and report) + `time/teardown_s`
(the last report to the run's end). Start-up and tear-down are the same whatever the run trains, so they are a
fixed cost per run; the time in the trainer is charged to the steps it ran (`budget/steps`), summed over the
calibration's runs. A smoke run's few steps are why the two are measured apart: its fixed cost is most of its
time, and a per-step cost taken from its wall time would make every long run look many times its real length.
The trainer's own loading and evaluation stay in the per-step cost (the metrics do not separate them), so a
calibration from a smoke run over-estimates the step time; one with more steps a run is closer.

A pair's steps are what its runs plan before their first step (raybench.budget via TrainConfig.budget), computed
here as its sweep binds the pair (raybench.sweep.benchmark_file._bind). A pair whose dataset is not on this
machine is not forecast: its size is unknown here, and the text says so instead of guessing.

Nothing here imports Ray: the report floor runs where Ray never started.
"""
from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from raybench.budget import BUDGET_PREFIX
from raybench.records import SweepSummary, TrialRecord
from raybench.report_keys import GPU_S, TIME_PREFIX, WALL_S

if TYPE_CHECKING:
    from raybench.data.base import ShiftDataset
    from raybench.sweep.benchmark_file import Benchmark, Binding, Pair

TRIAL_S = f"{TIME_PREFIX}trial_s"
STARTUP_S = f"{TIME_PREFIX}startup_s"
TEARDOWN_S = f"{TIME_PREFIX}teardown_s"
STEPS = f"{BUDGET_PREFIX}steps"
# What a run must have measured to calibrate the forecast; planned steps are not needed (spent ones are charged)
RUN_METRICS = (TRIAL_S, STARTUP_S, TEARDOWN_S, WALL_S, GPU_S, STEPS)
RATIO = "unlabeled_ratio"


class CalibrationError(ValueError):
    """A sweep that cannot calibrate a forecast: one line naming the sweep and what was expected."""


@dataclass(frozen=True)
class RunCost:
    """One run's measured time, split into what it costs whatever it trains (`fixed_s`: start-up + tear-down)
    and its time in the trainer (`trainer_s`) over the `steps` it ran; `wall_s` and `gpu_s` give the GPUs it
    held."""

    fixed_s: float
    trainer_s: float
    steps: float
    wall_s: float
    gpu_s: float


def run_cost(record: TrialRecord) -> RunCost | None:
    """The run's cost, or None where it cannot say one: it did not finish (to its end or stopped early), a
    metric is missing or not a finite number >= 0, or it ran no step."""
    values = [record.metrics.get(key) for key in RUN_METRICS]
    if not record.status.selectable or not all(_measure(v) for v in values):
        return None
    trial, startup, teardown, wall, gpu, steps = (float(v) for v in values)  # type: ignore[arg-type]
    if steps <= 0:
        return None
    return RunCost(startup + teardown, trial, steps, wall, gpu)


def _measure(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value >= 0


@dataclass(frozen=True)
class Calibration:
    """What a run costs on this machine, measured from a finished sweep's `runs` (trials and replicates): the
    mean fixed cost of a run, seconds per step (time in the trainer over the steps run, all runs summed, so a
    long run weighs as much as its steps) and GPUs held per run (GPU-seconds over wall seconds)."""

    sweep: str
    dataset: str
    method: str  # the search space's file stem, as a benchmark's pair names its method
    runs: int
    fixed_s: float
    step_s: float
    gpus_per_run: float

    @property
    def label(self) -> str:
        return f"{self.dataset}/{self.method}"

    def run_seconds(self, steps: float) -> float:
        """One run of `steps` steps: its steps' time and its fixed cost."""
        return steps * self.step_s + self.fixed_s


def calibrate(summary: SweepSummary) -> Calibration:
    """The calibration a finished sweep gives; a CalibrationError when it is not finished or none of its runs
    measured what a forecast needs (RUN_METRICS)."""
    if not summary.finished:
        raise CalibrationError(f"sweep {summary.name!r} is {summary.state.value}: expected a finished sweep (its "
                               f"runs' times are measured once it ends)")
    runs = [*summary.trials, *summary.replicates.runs]
    costs = [cost for cost in map(run_cost, runs) if cost is not None]
    if not costs:
        raise CalibrationError(f"sweep {summary.name!r}: expected finished runs with {', '.join(RUN_METRICS)} "
                               f"(and at least one step); none of its {len(runs)} runs has them")
    wall = sum(c.wall_s for c in costs)
    return Calibration(sweep=summary.name, dataset=summary.dataset, method=_method(summary), runs=len(costs),
                       fixed_s=sum(c.fixed_s for c in costs) / len(costs),
                       step_s=sum(c.trainer_s for c in costs) / sum(c.steps for c in costs),
                       gpus_per_run=sum(c.gpu_s for c in costs) / wall if wall > 0 else 0.0)


def _method(summary: SweepSummary) -> str:
    """The sweep's method as a benchmark names it: its space file's stem (`erm_aug`), else its algorithm."""
    return Path(summary.space).stem if summary.space else summary.algorithm


# ----- a pair's budget in steps ------------------------------------------------------------------------------
@dataclass(frozen=True)
class PairSteps:
    """A pair's budget: `trials` + `replicates` runs of `run_steps` planned steps each (the mean run's, over the
    values of a searched unlabeled ratio); `assumed` says which value that is, where it was searched."""

    run_steps: float
    trials: int
    replicates: int
    assumed: str = ""

    @property
    def runs(self) -> int:
        return self.trials + self.replicates

    @property
    def total(self) -> float:
        """Every trial's steps and every replicate's: the replicates re-run the selected config in full."""
        return self.trials * self.run_steps + self.replicates * self.run_steps


def pair_replicates(pair: Pair, smoke: bool, dataset: ShiftDataset) -> int:
    """The replicates a pair's sweep runs: the file's count, else the sweep's own default."""
    from raybench.sweep.runner import replicates_by_default  # the sweep's rule, imported only for a forecast

    if pair.replicates is not None:
        return int(pair.replicates)
    return replicates_by_default(smoke, dataset)


def run_steps(benchmark: Benchmark, pair: Pair, dataset: ShiftDataset) -> tuple[float, str]:
    """(the mean run's planned steps, the assumption in words) for the pair on its loaded dataset, its space
    resolved as its sweep resolves it (benchmark_file._bind: the file's smoke and `set`, its selection, its
    seed), each other searched value at its midpoint, which does not change the steps. A searched unlabeled
    ratio k changes them a little (WILDS 2.0 App. D gives ceil(2E / (k + 1)) epochs of B / (k + 1) labeled
    rows: about 2x ERM's steps at every k, raybench/budget.py): the mean over its choices, as a sampler drawing
    them uniformly runs on average, and the replicates' selected k is not known before the search."""
    from raybench.sweep.selection import SELECTIONS
    from raybench.sweep.space import command_line_overrides, load_space, midpoints, sweep_space
    from raybench.trainer import TrainConfig

    overrides = command_line_overrides(benchmark.smoke, pair.fixed)
    resolved = sweep_space(load_space(str(pair.space_path)), dataset, overrides)
    resolved.fixed.update({"selection_metric": SELECTIONS.get(benchmark.selection).metric(dataset),
                           "seed": benchmark.seed, **overrides})
    sample = midpoints(resolved)
    ratio = resolved.search.get(RATIO)
    ratios = [int(v) for v in ratio.values] if ratio is not None and ratio.values else [sample.get(RATIO)]
    steps = []
    for k in ratios:
        values = sample if k is None else {**sample, RATIO: k}
        config = TrainConfig.from_flat(resolved.materialize(values)).resolve(dataset)
        steps.append(config.budget(dataset).steps)
    mean = sum(steps) / len(steps)
    if ratio is not None and not ratio.values:
        return mean, f"{RATIO} searched over a range: its middle, {sample.get(RATIO)}"
    if len(ratios) < 2:
        return mean, ""
    spread = f"{min(steps):,}" if min(steps) == max(steps) else f"{min(steps):,}-{max(steps):,}"
    return mean, (f"{RATIO} searched over {{{', '.join(map(str, ratios))}}}: the mean of {spread} steps a run "
                  f"at those values")


def pair_steps(benchmark: Benchmark, bindings: Sequence[Binding],
               load: Callable[[str], ShiftDataset] | None = None) -> dict[str, PairSteps | str]:
    """Each pair's budget by its sweep's name, or why it cannot be computed here (its Binding's `unchecked`:
    the dataset's files are not on this machine). Each dataset is loaded once (`load`: raybench.data's)."""
    if load is None:
        from raybench.data import load_dataset as load
    loaded: dict[str, Any] = {}
    found: dict[str, PairSteps | str] = {}
    for binding in bindings:
        pair = binding.pair
        if binding.unchecked:
            found[pair.sweep] = binding.unchecked
            continue
        if pair.dataset not in loaded:
            loaded[pair.dataset] = load(pair.dataset)
        dataset = loaded[pair.dataset]
        steps, assumed = run_steps(benchmark, pair, dataset)
        found[pair.sweep] = PairSteps(steps, pair.trials, pair_replicates(pair, benchmark.smoke, dataset), assumed)
    return found


# ----- the forecast ------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class PairForecast:
    """One pair's forecast: `steps` (None where they cannot be computed here, `unchecked` saying why), the hours
    its runs take one after another (`run_hours`), the GPU-hours they hold, and its wall-clock hours alone on
    the benchmark's trial slots: the search's trials in waves of `slots`, then the replicates' waves (they
    start once the search selected). `scaled_from` names the calibration where the pair is another dataset or
    method than the calibration's: its step cost is then an extrapolation."""

    label: str
    sweep: str
    steps: PairSteps | None
    unchecked: str = ""
    run_hours: float = 0.0
    gpu_hours: float = 0.0
    wall_hours: float = 0.0
    scaled_from: str = ""


def forecast_pair(pair: Pair, steps: PairSteps | str, calibration: Calibration, slots: int) -> PairForecast:
    """The pair's hours at the calibration's costs: every step at its per-step cost, every run its fixed cost."""
    if isinstance(steps, str):
        return PairForecast(pair.label, pair.sweep, None, unchecked=steps)
    run_hours = (steps.total * calibration.step_s + steps.runs * calibration.fixed_s) / 3600
    waves = math.ceil(steps.trials / slots) + math.ceil(steps.replicates / slots)
    same = (pair.dataset, pair.method) == (calibration.dataset, calibration.method)
    return PairForecast(pair.label, pair.sweep, steps, run_hours=run_hours,
                        gpu_hours=run_hours * calibration.gpus_per_run,
                        wall_hours=waves * calibration.run_seconds(steps.run_steps) / 3600,
                        scaled_from="" if same else calibration.label)


@dataclass(frozen=True)
class Forecast:
    """A benchmark's forecast: each pair's, with the calibration they share, the benchmark's trial slots
    (`max_concurrent_trials`) and how many sweeps run at once."""

    calibration: Calibration
    pairs: tuple[PairForecast, ...]
    slots: int
    sweeps_at_once: int

    @property
    def forecast(self) -> list[PairForecast]:
        return [p for p in self.pairs if p.steps is not None]

    @property
    def run_hours(self) -> float:
        return sum(p.run_hours for p in self.forecast)

    @property
    def gpu_hours(self) -> float:
        return sum(p.gpu_hours for p in self.forecast)

    @property
    def wall_hours(self) -> float:
        """The least the forecast pairs can take together: no less than their runs spread over every slot, than
        their sweeps spread over the sweeps that run at once, or than the longest pair alone."""
        walls = [p.wall_hours for p in self.forecast]
        if not walls:
            return 0.0
        return max(self.run_hours / self.slots, sum(walls) / self.sweeps_at_once, max(walls))


def forecast(benchmark: Benchmark, steps: dict[str, PairSteps | str], calibration: Calibration) -> Forecast:
    """Every pair of the benchmark forecast at the calibration's costs (`steps`: pair_steps's)."""
    slots = benchmark.max_concurrent_trials
    pairs = tuple(forecast_pair(p, steps[p.sweep], calibration, slots) for p in benchmark.pairs)
    return Forecast(calibration, pairs, slots, benchmark.sweeps_at_once)


def hours_text(hours: float) -> str:
    """Hours to a sensible precision: minutes under an hour, two places under 10, one under 100, whole above."""
    if hours < 1:
        minutes = hours * 60
        return f"{minutes:.1f} min" if minutes < 10 else f"{minutes:.0f} min"
    places = 2 if hours < 10 else 1 if hours < 100 else 0
    return f"{hours:,.{places}f} h"


def _sweeps(count: int) -> str:
    return f"{count} sweep{'' if count == 1 else 's'}"


def gpu_text(hours: float, gpus_per_run: float) -> str:
    return f"{hours_text(hours)} GPU" if gpus_per_run > 0 else "no GPU"


def pair_line(forecast: PairForecast, gpus_per_run: float) -> str:
    label = f"  {forecast.label:34s}"
    if forecast.steps is None:
        return f"{label} not forecast: its dataset is not on this machine, so its steps are unknown here"
    steps = forecast.steps
    line = (f"{label} {steps.runs} runs x {steps.run_steps:,.0f} steps = {steps.total:,.0f} steps: "
            f"{hours_text(forecast.run_hours)} of runs, {gpu_text(forecast.gpu_hours, gpus_per_run)}, "
            f"{hours_text(forecast.wall_hours)} wall-clock")
    line += f" (scaled from {forecast.scaled_from})" if forecast.scaled_from else ""
    return line + (f"; {steps.assumed}" if steps.assumed else "")


def forecast_text(found: Forecast) -> str:
    """The forecast as `--plan` prints it: a line per pair, the total, the calibration it rests on, and what an
    extrapolated line is worth."""
    calibration = found.calibration
    lines = [(f"runtime forecast (runs: steps x {calibration.step_s:.4g} s + {calibration.fixed_s:.3g} s a run; "
              f"wall-clock: at most {found.slots} trials at once, {_sweeps(found.sweeps_at_once)} at once; the first "
              f"attempt of each pair, every run to its planned steps):")]
    lines += [pair_line(p, calibration.gpus_per_run) for p in found.pairs]
    total = f"  {f'total ({len(found.forecast)} of {len(found.pairs)} pairs)':34s}"
    lines.append(f"{total} {hours_text(found.run_hours)} of runs, {gpu_text(found.gpu_hours, calibration.gpus_per_run)}"
                 f", at least {hours_text(found.wall_hours)} wall-clock" if found.forecast else
                 f"{total} none: no pair's steps are known on this machine (plan where the datasets are)")
    lines.append(f"calibration: sweep {calibration.sweep} ({calibration.method} on {calibration.dataset}), measured "
                 f"from sweep {calibration.sweep}'s {calibration.runs} runs on the machine that ran it: "
                 f"{calibration.step_s:.4g} s a step (its time in the trainer over its steps), "
                 f"{calibration.fixed_s:.3g} s a run (start-up + tear-down), {calibration.gpus_per_run:.2g} GPUs "
                 f"a run")
    if any(p.scaled_from for p in found.forecast):
        lines.append(f"lines scaled from {calibration.label} assume a step of their dataset and method costs what a "
                     f"step of {calibration.label} did: the forecast is only as good as that (calibrate on the "
                     f"pair's own dataset and method to measure it)")
    missing = len(found.pairs) - len(found.forecast)
    if missing:
        lines.append(f"{missing} pairs not forecast: the total leaves them out")
    return "\n".join(lines)
