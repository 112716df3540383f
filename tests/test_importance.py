"""Which hyperparameters matter (raybench.report.importance): fANOVA over a sweep's own trial records, shown by
`raybench results`, in summary.md and as importance.png beside the other figures."""
from __future__ import annotations

import json
import math
import random
from collections.abc import Callable
from dataclasses import replace

import pytest
from helpers.cli import cli

from raybench.records import Replicates, Selection, SweepSummary, TrialRecord, TrialStatus
from raybench.report import plots
from raybench.report.importance import MIN_TRIALS, importances, sweep_importances, table_lines
from raybench.report.results import markdown

SCALES = {"lr": "log", "weight_decay": "linear"}


def lr_decides(lr: float, weight_decay: float, rng: random.Random) -> float:
    """Best at lr = 1e-3, falling a tenth per decade away from it; weight decay does not enter."""
    return 0.9 - 0.1 * abs(math.log10(lr) + 3) + rng.gauss(0.0, 0.002)


def sweep(n: int = 30, metric: Callable[[float, float, random.Random], float] = lr_decides,
          scales: dict[str, str] | None = None, seed: int = 0) -> SweepSummary:
    """A finished sweep of `n` trials drawn as the space draws them: lr log-uniform over 1e-5..1e-1, weight decay
    uniform over 0..0.1."""
    rng = random.Random(seed)
    trials = []
    for i in range(n):
        lr, weight_decay = 10 ** rng.uniform(-5, -1), rng.uniform(0.0, 0.1)
        trials.append(TrialRecord(order=i, trial_id=f"t_{i:05d}", seed=0, status=TrialStatus.OK,
                                  sampled={"lr": lr, "weight_decay": weight_decay},
                                  selection_value=metric(lr, weight_decay, rng)))
    return SweepSummary(name="demo", dataset="digits-shift", algorithm="erm",
                        space_scales=SCALES if scales is None else scales,
                        selection=Selection("ood_val", "val/acc", "OOD val"), trials=trials, replicates=Replicates())


def test_the_hyperparameter_that_decides_the_metric_dominates_and_the_noise_does_not():
    found = importances(sweep())
    assert found.n_trials == 30 and found.evaluator.startswith("fANOVA")
    assert list(found.shares) == ["lr", "weight_decay"]  # most important first
    assert found.shares["lr"] > 0.7 and found.shares["weight_decay"] < 0.3
    assert sum(found.shares.values()) == pytest.approx(1.0)
    assert found.params[0].scale == "log" and 0 < found.explained <= 1
    assert not any("rough" in note for note in found.notes)  # 30 trials: no warning
    assert importances(sweep()) == found  # seeded: the same records give the same numbers


def test_a_log_uniform_hyperparameter_is_rated_on_the_scale_it_was_drawn():
    """lr moves the metric over its lower two decades, weight decay a little over its range. On raw values the
    top decade of lr (flat here) is 90 % of its range, and the forest would credit weight decay instead."""
    def low_decades(lr: float, weight_decay: float, rng: random.Random) -> float:
        return 0.5 + 0.1 * min(math.log10(lr) + 5, 2) + 0.5 * weight_decay + rng.gauss(0.0, 0.002)

    assert importances(sweep(metric=low_decades, seed=3)).shares["lr"] > 0.7
    unscaled = importances(sweep(metric=low_decades, seed=3, scales={}))
    assert unscaled.params[0].scale == "linear" and any("no scale" in note for note in unscaled.notes)


def test_failed_and_interrupted_trials_are_left_out_and_stopped_ones_count_with_their_best_value():
    summary = sweep()
    rng = random.Random(1)
    for i, status in enumerate([TrialStatus.FAILED] * 6 + [TrialStatus.INTERRUPTED] * 4):
        wd = rng.uniform(0.0, 0.1)  # were these counted, weight decay would decide: 0 below 0.05, 1 above
        summary.trials.append(TrialRecord(order=100 + i, trial_id=f"x_{i}", seed=0, status=status,
                                          sampled={"lr": 1e-3, "weight_decay": wd}, selection_value=float(wd > 0.05)))
    summary.trials[0] = replace(summary.trials[0], selection_value=math.nan)
    for i in (1, 2, 3):  # ASHA stopped these: they count, with their value at their best epoch
        summary.trials[i] = replace(summary.trials[i], status=TrialStatus.STOPPED)
    found = importances(summary)
    assert found.n_trials == 29 and found.n_search_trials == 40
    assert found.shares["lr"] > 0.7
    assert "left out: 6 failed, 4 interrupted, 1 without a finite value" in found.notes
    assert any(note.startswith("3 trials stopped early (ASHA) count with their best epoch's value")
               for note in found.notes)
    assert "rough" in " ".join(found.notes)  # 29 counted: under ROUGH_BELOW


def test_too_few_trials_give_each_hyperparameter_the_reason_and_no_chart():
    found = importances(sweep(n=MIN_TRIALS - 1))
    assert found.shares == {} and found.explained is None
    assert {p.name: p.reason for p in found.params} == {
        name: f"{MIN_TRIALS - 1} counted trials: fANOVA needs at least {MIN_TRIALS}" for name in ("lr", "weight_decay")}
    assert plots.importance_figure(sweep(n=MIN_TRIALS - 1), found) is None
    assert "importance.png" not in plots.sweep_figures(sweep(n=MIN_TRIALS - 1), SCALES, [])
    assert any("not rated: 2 counted trials" in line for line in table_lines(found))


def test_a_sweep_interrupted_before_any_trial_finished_still_gets_its_summary():
    """The interrupted sweep writes summary.md through here: with no counted trial, no parameter has a value."""
    summary = sweep(n=1)
    summary.trials[0] = replace(summary.trials[0], status=TrialStatus.INTERRUPTED, selection_value=math.nan)
    found = importances(summary)
    assert found.n_trials == 0 and found.shares == {}
    assert {p.reason for p in found.params} == {f"0 counted trials: fANOVA needs at least {MIN_TRIALS}"}
    assert "0 counted trials" in markdown(summary)


def test_ten_trials_are_rated_and_said_to_be_rough_and_a_constant_one_is_not_rated():
    summary = sweep(n=10)
    for trial in summary.trials:
        trial.sampled["batch_size"] = 64
    found = importances(summary)
    assert set(found.shares) == {"lr", "weight_decay"}
    assert "10 trials make rough importances" in " ".join(found.notes)
    unrated = {p.name: p.reason for p in found.params if p.share is None}
    assert unrated == {"batch_size": "took one value (64) in the counted trials"}


def test_results_prints_the_table_and_its_json_carries_the_field(monkeypatch, capsys):
    import raybench.tracking

    summary = sweep()
    monkeypatch.setattr(raybench.tracking, "load_sweep_results", lambda uri, name: summary)
    args = ["results", "demo", "--tracking-uri", "sqlite:///unused.db"]
    as_json = cli([*args, "--format", "json"], capsys)
    assert as_json.returncode == 0, as_json.stderr
    data = json.loads(as_json.stdout)
    assert data["name"] == "demo" and len(data["trials"]) == 30  # the summary's own fields are all still there
    field = data["importances"]
    assert field["evaluator"].startswith("fANOVA") and field["n_trials"] == 30 and field["metric"] == "val/acc"
    assert field["params"][0]["name"] == "lr" and field["params"][0]["share"] > 0.7
    table = cli(args, capsys).stdout
    assert "hyperparameter importance for val/acc: fANOVA" in table
    assert [line.split()[:2] for line in table.splitlines() if line.startswith("  lr ")] == [["lr", "(log)"]]
    assert cli([*args, "--format", "csv"], capsys).stdout.startswith("trial_id,status,selection_value")


def test_summary_md_shows_the_importances_before_the_trial_table():
    text = markdown(sweep())
    assert "| `lr` | log |" in text and "| `weight_decay` | linear |" in text
    assert text.index("Hyperparameter importance for `val/acc`") < text.index("| trial | status |")


def test_the_chart_is_saved_beside_the_search_plot(tmp_path):
    summary = sweep()
    written = plots.save(plots.sweep_figures(summary, summary.space_scales, []), tmp_path / "plots")
    assert sorted(p.name for p in written) == ["curves.png", "importance.png", "search-lr.png",
                                                    "search-weight_decay.png", "search.png"]
    chart = tmp_path / "plots" / "importance.png"
    assert chart.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and chart.stat().st_size > 5000


def test_a_failing_fanova_is_a_reason_and_the_summary_is_still_written(monkeypatch):
    """The sweep writes summary.md (then summary.json) through importances when it ends: a failure there must
    not cost the sweep its record."""
    from raybench.report import importance

    def broken(encoded, values):
        raise ValueError("the forest would not fit")

    monkeypatch.setattr(importance, "_main_effects", broken)
    found = importances(sweep())
    assert found.shares == {} and {p.reason for p in found.params} == {
        "fANOVA failed: ValueError: the forest would not fit"}
    assert "not rated: fANOVA failed" in markdown(sweep())


def test_a_blind_selection_is_the_first_caveat_in_the_table_and_under_the_chart():
    """A sweep whose selection metric never moved (Noisy Student on digits-shift in the embedded Table 2) still
    gets importances, which then split noise: the table, summary.md and the chart, read alone, must say so."""
    why = "every trial's selection metric never moved"
    summary = replace(sweep(n=10), selection_blind=why)
    found = importances(summary)
    assert found.notes[0] == f"the selection was blind ({why}): these shares rate noise, not the hyperparameters"
    assert found.notes[0] in "\n".join(table_lines(found)) and found.notes[0] in markdown(summary)
    assert found.notes[0] in plots._importance_caveats(found)  # the footer under importance.png
    assert not any("blind" in note for note in importances(sweep(n=10)).notes)  # a sweep that could see: no caveat


def test_too_few_trials_are_answered_without_importing_fanova():
    """A sweep's driver imports fANOVA (scikit-learn) beside Ray's start only when its search can count
    MIN_TRIALS trials (raybench.report.record.SweepRecord.modules); below that, rating the sweep must not import it at its end either."""
    import subprocess
    import sys

    code = ("import sys; from raybench.records import *; from raybench.report.importance import MIN_TRIALS, importances; "
            "trials = [TrialRecord(order=i, trial_id=f't{i}', seed=0, status=TrialStatus.OK, sampled={'lr': 10.0 ** -i}, "
            "selection_value=0.5 + i / 10) for i in range(MIN_TRIALS - 1)]; "
            "summary = SweepSummary(name='few', dataset='digits-shift', algorithm='erm', space_scales={'lr': 'log'}, "
            "selection=Selection('ood_val', 'val/acc', 'OOD val'), trials=trials, replicates=Replicates()); "
            "found = importances(summary); assert found.params and not found.shares, found; "
            "assert 'optuna.importance' not in sys.modules and 'sklearn' not in sys.modules, 'fANOVA was imported'")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]


def test_results_shows_the_importances_the_sweep_kept_without_fitting_the_forest_again(monkeypatch, capsys):
    """A finished sweep keeps what it rated in summary.json; `results` reads that instead of fitting fANOVA again
    (here fitting would fail, so a table that reads 'fANOVA failed' means it fitted)."""
    import raybench.tracking
    from raybench.report import importance

    summary = sweep()
    kept = replace(summary, importances=importances(summary))
    monkeypatch.setattr(importance, "_main_effects", lambda encoded, values: 1 / 0)
    monkeypatch.setattr(raybench.tracking, "load_sweep_results", lambda uri, name: kept)
    args = ["results", "demo", "--tracking-uri", "sqlite:///unused.db"]
    table = cli(args, capsys).stdout
    assert "fANOVA failed" not in table
    assert [line.split()[:2] for line in table.splitlines() if line.startswith("  lr ")] == [["lr", "(log)"]]
    assert json.loads(cli([*args, "--format", "json"], capsys).stdout)["importances"] == kept.importances.to_json()
    monkeypatch.setattr(raybench.tracking, "load_sweep_results", lambda uri, name: summary)  # one that kept none
    assert "fANOVA failed" in cli(args, capsys).stdout


def test_kept_importances_of_other_trials_or_another_metric_are_rated_again():
    """Importances are kept for the trials and metric they were rated on: a summary whose trials or selection
    metric changed after they were rated (a caller editing the record) gets them rated afresh."""
    summary = sweep()
    kept = replace(summary, importances=importances(summary))
    assert sweep_importances(kept) is kept.importances
    fewer = replace(kept, trials=kept.trials[:10])
    assert sweep_importances(fewer).n_trials == 10 and sweep_importances(fewer) == importances(fewer)
    other = replace(kept, selection=Selection("id_val", "id_val/acc", "ID val"))
    assert sweep_importances(other).metric == "id_val/acc"
