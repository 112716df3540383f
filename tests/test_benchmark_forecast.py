"""`raybench benchmark FILE --plan --calibrate SWEEP`: a benchmark's runtime forecast from one finished sweep's
measured runs. The calibration charges a run's time in the trainer to its steps and its start-up and tear-down to the
run; a pair's forecast scales the step cost by its planned steps (trials and replicates) and adds the fixed cost per
run; a pair of another dataset or method is marked as extrapolated; a sweep that cannot calibrate is refused in one
line.

Nothing here starts Ray: the summaries are built by hand, and the step of a command that would start Ray fails the
test.
"""
from __future__ import annotations

import json
import math
import subprocess
from dataclasses import replace
from pathlib import Path

import pytest
import yaml
from helpers.cli import cli, fail_on_reaching

from raybench.records import Replicates, Selection, SweepState, SweepSummary, TrialRecord, TrialStatus
from raybench.report.forecast import (
    Calibration,
    CalibrationError,
    Forecast,
    PairSteps,
    calibrate,
    forecast_pair,
    forecast_text,
    hours_text,
    pair_steps,
)
from raybench.sweep.benchmark_file import Binding, bind_pairs, load_benchmark

pytestmark = pytest.mark.usefixtures("in_private_dirs")

# digits-shift as raybench builds it: 5000 training rows, batches of 64, 10 epochs (its defaults)
DIGITS_TRAIN, DIGITS_BATCH, DIGITS_EPOCHS = 5000, 64, 10


@pytest.fixture(autouse=True)
def no_cluster_work(monkeypatch):
    from raybench.commands import benchmark
    from raybench.sweep import runner

    fail_on_reaching(monkeypatch, (benchmark, "_run_pairs_on_cluster"), (runner, "run_sweep"))


def run(order: int, trial_s: float, startup_s: float, teardown_s: float, steps: float, gpus: float = 0.0,
        status: TrialStatus = TrialStatus.OK, drop: str = "") -> TrialRecord:
    """A run as the sweep records it: wall = start-up + time in the trainer + tear-down (ray_trial.trial_timing);
    the metric named `drop` left out."""
    wall = startup_s + trial_s + teardown_s
    metrics = {"time/trial_s": trial_s, "time/startup_s": startup_s, "time/teardown_s": teardown_s,
               "time/wall_s": wall, "time/gpu_s": wall * gpus, "budget/steps": steps, "budget/planned_steps": steps}
    metrics.pop(drop, None)
    return TrialRecord(order=order, trial_id=f"t{order}", seed=order, sampled={}, status=status, metrics=metrics)


def summary(trials: list[TrialRecord], replicates: list[TrialRecord] = (), name: str = "calib",
            state: SweepState = SweepState.FINISHED) -> SweepSummary:
    return SweepSummary(name=name, state=state, dataset="digits-shift", algorithm="erm", space="erm",
                        selection=Selection("ood_val", "val/acc", "OOD val"), trials=trials,
                        selected=trials[0] if trials else None,
                        replicates=Replicates(seeds=[r.seed for r in replicates], ok=len(replicates),
                                              runs=list(replicates)))


def calibration(step_s: float = 2.0, fixed_s: float = 100.0, gpus: float = 0.0, dataset: str = "digits-shift",
                method: str = "erm") -> Calibration:
    return Calibration(sweep="calib", dataset=dataset, method=method, runs=4, fixed_s=fixed_s, step_s=step_s,
                       gpus_per_run=gpus)


class FakePair:
    """What the forecast reads of a benchmark's Pair."""

    def __init__(self, dataset: str = "digits-shift", method: str = "erm") -> None:
        self.dataset, self.method = dataset, method
        self.label, self.sweep = f"{method} on {dataset}", f"b-{method}-{dataset}"


def write_yaml(path: Path, body: dict) -> Path:
    path.write_text(yaml.safe_dump(body, sort_keys=False))
    return path


def grid(spaces: list[str], **extra) -> dict:
    return {"name": "b", "trials": 4, "replicates": 3, "executor": "function", "max_concurrent_trials": 2,
            "set": {"epoch_fraction": 0.25}, "grid": [{"datasets": ["digits-shift"], "spaces": spaces}], **extra}


def refused_in_one_line(result: subprocess.CompletedProcess) -> str:
    assert result.returncode == 2, (result.returncode, result.stdout[-1000:], result.stderr[-2000:])
    assert "Traceback" not in result.stderr, result.stderr[-2000:]
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("raybench: error: --calibrate: "), result.stderr[-2000:]
    return lines[0]


def write_summary(storage: Path, found: SweepSummary) -> Path:
    path = storage / found.name / "results" / "summary.json"
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(found.to_json()))
    return path


# ----- the calibration -------------------------------------------------------------------------------------
def test_the_trainer_time_is_charged_to_the_steps_and_start_up_plus_tear_down_to_each_run():
    """Trial and replicate runs both count; the step cost is their time in the trainer over all their steps (not
    the mean of each run's ratio), the fixed cost the mean of start-up + tear-down."""
    found = calibrate(summary([run(0, trial_s=10, startup_s=5, teardown_s=1, steps=8)],
                              [run(1, trial_s=50, startup_s=7, teardown_s=1, steps=40)]))
    assert found.runs == 2
    assert found.step_s == pytest.approx(60 / 48)
    assert found.fixed_s == pytest.approx((6 + 8) / 2)
    assert (found.dataset, found.method, found.label) == ("digits-shift", "erm", "digits-shift/erm")
    assert found.gpus_per_run == 0


def test_gpus_per_run_are_gpu_seconds_over_wall_seconds():
    found = calibrate(summary([run(0, 10, 5, 1, 8, gpus=1.0), run(1, 10, 5, 1, 8, gpus=0.5)]))
    assert found.gpus_per_run == pytest.approx(0.75)


def test_runs_that_did_not_finish_or_lack_a_metric_or_a_step_are_left_out():
    kept = run(0, 10, 5, 1, 8)
    found = calibrate(summary([kept, run(1, 99, 99, 99, 8, status=TrialStatus.FAILED),
                               run(2, 99, 99, 99, 8, drop="time/teardown_s"), run(3, 99, 99, 99, 0)],
                              [run(4, 99, 99, 99, 8, drop="time/gpu_s")]))
    assert found.runs == 1 and found.step_s == pytest.approx(10 / 8) and found.fixed_s == pytest.approx(6)


def test_a_run_stopped_early_still_calibrates_on_the_steps_it_ran():
    found = calibrate(summary([run(0, 4, 5, 1, 2, status=TrialStatus.STOPPED)]))
    assert found.runs == 1 and found.step_s == pytest.approx(2.0)


@pytest.mark.parametrize("found, expected", [
    (summary([run(0, 10, 5, 1, 8)], state=SweepState.INTERRUPTED),
     "sweep 'calib' is interrupted: expected a finished sweep (its runs' times are measured once it ends)"),
    (summary([run(0, 10, 5, 1, 8, drop="time/trial_s")], [run(1, 10, 5, 1, 0)]),
     ("sweep 'calib': expected finished runs with time/trial_s, time/startup_s, time/teardown_s, time/wall_s, "
      "time/gpu_s, budget/steps (and at least one step); none of its 2 runs has them")),
], ids=["unfinished", "no-measured-run"])
def test_a_sweep_that_cannot_calibrate_says_which_and_what_was_expected(found, expected):
    with pytest.raises(CalibrationError) as err:
        calibrate(found)
    assert str(err.value) == expected


# ----- a pair's forecast -----------------------------------------------------------------------------------
def test_twice_the_steps_forecast_twice_the_step_time_and_the_same_fixed_cost_per_run():
    cal = calibration(step_s=2.0, fixed_s=100.0)
    one = forecast_pair(FakePair(), PairSteps(10, trials=2, replicates=1), cal, slots=2)
    two = forecast_pair(FakePair(), PairSteps(20, trials=2, replicates=1), cal, slots=2)
    assert one.run_hours * 3600 == pytest.approx(3 * 10 * 2.0 + 3 * 100.0)
    assert two.run_hours * 3600 == pytest.approx(3 * 20 * 2.0 + 3 * 100.0)
    assert (two.run_hours - one.run_hours) * 3600 == pytest.approx(3 * 10 * 2.0)


def test_the_replicates_are_forecast_as_runs_of_their_own():
    cal = calibration(step_s=2.0, fixed_s=100.0)
    without = forecast_pair(FakePair(), PairSteps(10, trials=2, replicates=0), cal, slots=2)
    with_three = forecast_pair(FakePair(), PairSteps(10, trials=2, replicates=3), cal, slots=2)
    assert (with_three.run_hours - without.run_hours) * 3600 == pytest.approx(3 * (10 * 2.0 + 100.0))
    assert PairSteps(10, trials=2, replicates=3).total == 50 and PairSteps(10, 2, 3).runs == 5


def test_gpu_hours_are_run_hours_times_the_gpus_a_run_held():
    found = forecast_pair(FakePair(), PairSteps(10, 2, 1), calibration(gpus=0.5), slots=2)
    assert found.gpu_hours == pytest.approx(found.run_hours * 0.5) and found.gpu_hours > 0


def test_wall_clock_runs_the_trials_in_waves_of_the_slots_then_the_replicates():
    """4 trials on 2 slots: 2 waves; then 3 replicates: 2 more. Each wave lasts one run."""
    cal = calibration(step_s=2.0, fixed_s=100.0)
    found = forecast_pair(FakePair(), PairSteps(10, trials=4, replicates=3), cal, slots=2)
    assert found.wall_hours * 3600 == pytest.approx(4 * (10 * 2.0 + 100.0))


def test_the_benchmarks_wall_clock_is_no_less_than_its_runs_over_the_slots_nor_its_sweeps_at_once():
    cal = calibration(step_s=1.0, fixed_s=0.0)
    pairs = tuple(forecast_pair(FakePair(method=m), PairSteps(3600, 1, 0), cal, slots=4) for m in "abcd")
    assert Forecast(cal, pairs, slots=4, sweeps_at_once=4).wall_hours == pytest.approx(1.0)  # 4 runs of 1 h, 4 slots
    assert Forecast(cal, pairs, slots=4, sweeps_at_once=1).wall_hours == pytest.approx(4.0)  # one sweep after another
    assert Forecast(cal, pairs, slots=2, sweeps_at_once=4).wall_hours == pytest.approx(2.0)  # 4 run-hours on 2 slots


def test_a_pair_of_another_dataset_or_method_is_marked_scaled_from_the_calibration():
    cal = calibration()
    assert forecast_pair(FakePair(), PairSteps(10, 1, 1), cal, 2).scaled_from == ""
    assert forecast_pair(FakePair(method="dann"), PairSteps(10, 1, 1), cal, 2).scaled_from == "digits-shift/erm"
    assert forecast_pair(FakePair(dataset="spuco-digits"), PairSteps(10, 1, 1), cal, 2).scaled_from == "digits-shift/erm"


def test_the_text_marks_extrapolated_lines_and_leaves_a_pair_not_here_out_of_the_total():
    cal = calibration(step_s=2.0, fixed_s=100.0)
    pairs = (forecast_pair(FakePair(), PairSteps(10, 2, 1), cal, 2),
             forecast_pair(FakePair(method="dann"), PairSteps(10, 2, 1, "unlabeled_ratio ..."), cal, 2),
             forecast_pair(FakePair(dataset="camelyon17"), "camelyon17: WILDS root does not exist", cal, 2))
    text = forecast_text(Forecast(cal, pairs, slots=2, sweeps_at_once=1))
    lines = text.splitlines()
    erm, dann, camelyon = (next(line for line in lines if line.startswith(f"  {label} "))
                           for label in ("erm on digits-shift", "dann on digits-shift", "erm on camelyon17"))
    assert "scaled from" not in erm and "(scaled from digits-shift/erm); unlabeled_ratio ..." in dann
    assert "not forecast: its dataset is not on this machine" in camelyon
    assert f"{hours_text(2 * (3 * 10 * 2.0 + 3 * 100.0) / 3600)} of runs" in text  # the two forecast pairs only
    assert any(line.startswith("  total (2 of 3 pairs)") for line in lines)
    assert "measured from sweep calib's 4 runs" in text and "only as good as that" in text


# ----- a pair's steps, as its runs plan them ------------------------------------------------------------------
def test_a_pairs_steps_are_what_its_runs_plan_on_the_dataset_with_the_files_settings():
    """ERM at epoch_fraction 0.25: 10 epochs of floor(ceil(0.25 x 5000) / 64) steps; 4 trials + 3 replicates."""
    benchmark = load_benchmark(str(write_yaml(Path("b.yaml"), grid(["erm"]))))
    steps = pair_steps(benchmark, bind_pairs(benchmark))[benchmark.pairs[0].sweep]
    assert steps.run_steps == DIGITS_EPOCHS * (math.ceil(0.25 * DIGITS_TRAIN) // DIGITS_BATCH)
    assert (steps.trials, steps.replicates, steps.assumed) == (4, 3, "")


def test_a_smoke_benchmarks_runs_plan_the_smoke_budget_and_its_replicates_default_to_two():
    """--smoke: 2 epochs of at most 4 steps, as the calibration's own smoke runs planned (budget/planned_steps 8)."""
    body = grid(["erm"], smoke=True)
    del body["replicates"]
    benchmark = load_benchmark(str(write_yaml(Path("b.yaml"), body)))
    steps = pair_steps(benchmark, bind_pairs(benchmark))[benchmark.pairs[0].sweep]
    assert (steps.run_steps, steps.replicates) == (8, 2)


def test_a_searched_unlabeled_ratio_is_forecast_at_the_mean_of_its_choices_and_says_so():
    benchmark = load_benchmark(str(write_yaml(Path("b.yaml"), grid(["dann"]))))
    steps = pair_steps(benchmark, bind_pairs(benchmark))[benchmark.pairs[0].sweep]
    erm_epoch = math.ceil(0.25 * DIGITS_TRAIN) // DIGITS_BATCH
    per_k = [max(1, math.ceil(2 * DIGITS_EPOCHS / (k + 1))) * (math.ceil(0.25 * DIGITS_TRAIN) // (64 - int(k / (k + 1) * 64)))
             for k in (3, 7, 15)]
    assert steps.run_steps == pytest.approx(sum(per_k) / 3) and steps.run_steps > 1.5 * DIGITS_EPOCHS * erm_epoch
    assert steps.assumed.startswith("unlabeled_ratio searched over {3, 7, 15}: the mean of ")


def test_a_pair_whose_dataset_is_not_here_has_no_steps_but_the_reason():
    benchmark = load_benchmark(str(write_yaml(Path("b.yaml"), grid(["erm"]))))
    unchecked = [Binding(benchmark.pairs[0], "camelyon17: no WILDS root")]
    assert pair_steps(benchmark, unchecked, load=lambda name: pytest.fail("loaded a dataset not here")) == {
        benchmark.pairs[0].sweep: "camelyon17: no WILDS root"}


# ----- the command line ------------------------------------------------------------------------------------
def test_plan_calibrate_prints_each_pairs_forecast_the_total_and_the_calibration(capsys):
    """The end to end: a summary.json under --storage, a two-pair file, `--plan --calibrate`."""
    write_summary(Path("store"), summary([run(0, trial_s=16, startup_s=10, teardown_s=2, steps=8)],
                                         [run(1, trial_s=16, startup_s=6, teardown_s=2, steps=8)]))
    path = write_yaml(Path("b.yaml"), grid(["erm", "dann"]))
    result = cli(["benchmark", str(path), "--plan", "--calibrate", "calib", "--storage", "store"], capsys)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    erm = next(line for line in lines if line.startswith("  erm on digits-shift") and "runs x" in line)
    dann = next(line for line in lines if line.startswith("  dann on digits-shift") and "runs x" in line)
    run_s = 190 * 2.0 + 10.0  # 190 steps at 32 s / 16 steps, and (10 + 2 + 6 + 2) / 2 s a run
    assert erm.startswith("  erm on digits-shift                7 runs x 190 steps = 1,330 steps: "
                          f"{hours_text(7 * run_s / 3600)} of runs, no GPU, {hours_text(4 * run_s / 3600)} wall-clock")
    assert "scaled" not in erm and "(scaled from digits-shift/erm); unlabeled_ratio searched over {3, 7, 15}" in dann
    assert any(line.startswith("  total (2 of 2 pairs)") for line in lines)
    assert any(line.startswith("calibration: sweep calib (erm on digits-shift), measured from sweep calib's 2 runs")
               and "2 s a step" in line and "10 s a run" in line for line in lines)


def test_calibrate_without_plan_is_refused_in_one_line(capsys):
    path = write_yaml(Path("b.yaml"), grid(["erm"]))
    line = refused_in_one_line(cli(["benchmark", str(path), "--calibrate", "calib"], capsys))
    assert "expected only with --plan" in line and "calib" in line
    assert sorted(p.name for p in Path().iterdir()) == ["b.yaml"]


def test_a_sweep_not_under_storage_is_refused_naming_it_and_where_it_was_looked_for(capsys):
    path = write_yaml(Path("b.yaml"), grid(["erm"]))
    line = refused_in_one_line(cli(["benchmark", str(path), "--plan", "--calibrate", "nope", "--storage", "store"],
                                   capsys))
    assert "sweep 'nope': expected a finished sweep under --storage store (store/nope/results/summary.json)" in line


@pytest.mark.parametrize("found, words", [
    (replace(summary([run(0, 10, 5, 1, 8)]), state=SweepState.INTERRUPTED), "is interrupted: expected a finished sweep"),
    (summary([run(0, 10, 5, 1, 8, drop="budget/steps")]), "none of its 1 runs has them"),
], ids=["unfinished", "no-measured-run"])
def test_a_sweep_that_cannot_calibrate_is_refused_in_one_line(found, words, capsys):
    write_summary(Path("store"), found)
    path = write_yaml(Path("b.yaml"), grid(["erm"]))
    line = refused_in_one_line(cli(["benchmark", str(path), "--plan", "--calibrate", "calib", "--storage", "store"],
                                   capsys))
    assert "sweep 'calib'" in line and words in line


def test_a_damaged_calibration_summary_is_refused_in_one_line(capsys):
    path = write_summary(Path("store"), summary([run(0, 10, 5, 1, 8)]))
    path.write_text("{not json")
    line = refused_in_one_line(cli(["benchmark", str(write_yaml(Path("b.yaml"), grid(["erm"]))), "--plan",
                                    "--calibrate", "calib", "--storage", "store"], capsys))
    assert "sweep 'calib'" in line and "damaged" in line
