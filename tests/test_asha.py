"""ASHA on OOD validation (--scheduler asha): Tune's successive halving decides, the trial stops itself after
its epoch (a stop request, not a kill), is recorded as stopped early and stays selectable on its best epoch."""
from __future__ import annotations

import json
from types import SimpleNamespace

import optuna
from helpers.cli import on_head, run_cli
from mlflow.tracking import MlflowClient

from raybench.data import load_dataset
from raybench.records import SweepSummary, TrialRecord, TrialStatus
from raybench.report.importance import importances
from raybench.sweep.outcome import select_best
from raybench.sweep.progress import StageProgress
from raybench.sweep.space import load_space


def asha(tmp_path, grace=1, factor=2.0, epochs=4):
    from raybench.sweep.ray_search import CooperativeASHA
    from raybench.sweep.ray_trial import EarlyStopping, StopRequests

    scheduler = CooperativeASHA(EarlyStopping(grace, factor, epochs), StopRequests(tmp_path / "stop"))
    return scheduler, scheduler.requests


def epoch_result(epochs_done: int, value: float, **extra) -> dict:
    return {"epochs_done": epochs_done, "selection/best": value, **extra}


def test_asha_asks_the_worse_trial_to_stop_instead_of_stopping_it(tmp_path):
    from ray.tune.schedulers import TrialScheduler

    scheduler, requests = asha(tmp_path)
    good, bad = SimpleNamespace(trial_id="good"), SimpleNamespace(trial_id="bad")
    for trial in (good, bad):
        scheduler.on_trial_add(None, trial)
    assert scheduler.on_trial_result(None, good, epoch_result(1, 0.8)) == TrialScheduler.CONTINUE
    assert scheduler.on_trial_result(None, bad, epoch_result(1, 0.3)) == TrialScheduler.CONTINUE  # never a kill
    assert requests.asked("bad") and not requests.asked("good")


def test_closing_reports_and_the_last_epoch_are_not_rung_decisions(tmp_path):
    scheduler, requests = asha(tmp_path, epochs=2)
    trials = [SimpleNamespace(trial_id=name) for name in ("a", "b", "c", "d")]
    for trial in trials:
        scheduler.on_trial_add(None, trial)
    scheduler.on_trial_result(None, trials[0], epoch_result(1, 0.9))
    scheduler.on_trial_result(None, trials[1], epoch_result(1, 0.1, trial_timing=True))  # the driver's closing report
    scheduler.on_trial_result(None, trials[2], epoch_result(1, 0.1, replayed=True))  # a finished run's record
    scheduler.on_trial_result(None, trials[3], epoch_result(2, 0.1))  # its last epoch: it ends anyway
    assert not any(requests.asked(t.trial_id) for t in trials)


def test_a_stopped_trial_is_selectable_on_its_best_epoch():
    trials = [TrialRecord(0, "a", 0, {}, TrialStatus.OK, selection_value=0.6),
              TrialRecord(1, "b", 0, {}, TrialStatus.STOPPED, selection_value=0.7),
              TrialRecord(2, "c", 0, {}, TrialStatus.FAILED, selection_value=0.9)]
    assert select_best(trials).order == 1


def test_progress_counts_trials_stopped_early():
    progress = StageProgress("search", 3, "val/acc")
    progress.finished(0.5, failed=False)
    assert "1 stopped early" in progress.finished(0.4, failed=False, stopped=True)


GOOD_LR, BAD_LRS = 0.003, (1e-7, 1e-8)  # on digits-shift after 12 Adam steps: OOD val ~0.20 against ~0.10
EPOCHS = 4  # rungs at 1, 2 and 4 epochs: a weak trial asked at its first rung has two more reports to see it


def _first_draws(resolved, seed: int, n: int) -> list[float]:
    from raybench.sweep.sampling import optuna_distribution

    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=seed))
    return [study.ask({k: optuna_distribution(p) for k, p in resolved.search.items()}).params["lr"] for _ in range(n)]


def test_an_asha_sweep_stops_the_weak_trials_records_them_and_selects_on_best_epochs(store_uri, tmp_path, ray_head,
                                                                                      shared_data_dir):
    space = tmp_path / "lr3.yaml"
    values = ", ".join(f"{lr:.1e}" for lr in (GOOD_LR, *BAD_LRS))  # 3.0e-03: PyYAML reads 1e-07 as a string
    space.write_text(f"algorithm: erm\nsearch:\n  lr: {{distribution: choice, values: [{values}]}}\nfixed:\n  patience: null\n")
    resolved = load_space(str(space)).for_dataset(load_dataset("digits-shift", shared_data_dir))
    seed = next(s for s in range(200) if _first_draws(resolved, s, 3)[0] == GOOD_LR
                and len(set(_first_draws(resolved, s, 3))) == 3)  # the good config first: it sets the rungs' bar
    uri = store_uri
    proc = run_cli(on_head(["sweep", str(space), "--seed", str(seed), "--trials", "3", "--replicates", "1", "--name", "asha",
                    "--max-concurrent", "1", "--scheduler", "asha", "--grace-period", "1", "--reduction-factor", "2",
                    "--executor", "function",  # ASHA is the subject here, not Ray Train
                    "--set", f"epochs={EPOCHS}", "--set", "max_steps_per_epoch=12",
                    "--storage", str(tmp_path / "runs"), "--tracking-uri", uri], ray_head), ray_head.env, tmp_path)
    assert proc.returncode == 0, proc.stderr[-4000:]
    summary = json.loads((tmp_path / "runs" / "asha" / "results" / "summary.json").read_text())
    by_lr = {t["sampled"]["lr"]: t for t in summary["trials"]}
    assert by_lr[GOOD_LR]["status"] == "ok"
    for lr in BAD_LRS:
        assert by_lr[lr]["status"] == TrialStatus.STOPPED and by_lr[lr]["selection_value"] is not None
    best = max(summary["trials"], key=lambda t: t["selection_value"])
    assert summary["selected"]["trial_id"] == best["trial_id"] == by_lr[GOOD_LR]["trial_id"]
    assert summary["replicates"]["runs"][0]["status"] == "ok"  # replicates run all their epochs
    kept = SweepSummary.from_json(summary)  # the importances the sweep rated, kept for `results` to read
    assert kept.importances is not None and kept.importances.n_search_trials == 3
    assert kept.recorded_importances == importances(kept)  # what rating the written trials again gives

    client = MlflowClient(tracking_uri=uri)
    experiment = client.get_experiment_by_name("raybench")
    for lr, trial in by_lr.items():
        (run,) = client.search_runs([experiment.experiment_id],
                                    f"tags.stage = 'search' and tags.trial_id = '{trial['trial_id']}'")
        curve = client.get_metric_history(run.info.run_id, "ood_val/acc")
        assert run.info.status == "FINISHED"
        if lr == GOOD_LR:
            assert len(curve) == EPOCHS and "raybench.stopped_early" not in run.data.tags
        else:  # its partial curve stays: the epochs it ran before the stop, fewer than all
            assert 1 <= len(curve) < EPOCHS and run.data.tags["raybench.stopped_early"] == f"after epoch {len(curve) - 1}"
    assert "search: 3/3 done, 0 failed, 2 stopped early" in proc.stdout
