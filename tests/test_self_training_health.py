"""What a selected epoch can be trusted for: pseudo-labels that collapsed onto one class, and a best epoch so late
that the run had not converged, each found by the trainer, carried into the trial's record, and shown by `results`
and `compare` (docs/concepts/selection.md states both rules)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from helpers.cli import on_head, run_cli
from helpers.mlflow_stores import seeded_store

from raybench.checkpoints import write_model_checkpoint
from raybench.data import load_dataset
from raybench.records import ConvergenceAttempt, Replicates, Selection, SweepSummary, TrialRecord, TrialStatus
from raybench.report.compare import compare, records, render_comparison
from raybench.report.results import markdown
from raybench.sweep.outcome import RowHealth
from raybench.trainer import TrainConfig, Trainer
from raybench.trainer.health import PseudoLabelHealth, collapse_limit, convergence_note, late_epochs

FORCED_CLASS = 3


# ----- the rules ------------------------------------------------------------------------------------
def _health(counts: list[float], prior: list[float], steps: int = 10, kept: float = 0.5) -> PseudoLabelHealth:
    metrics = {"train/pseudo/kept": kept, **{f"train/pseudo/classes/{c}": n for c, n in enumerate(counts)}}
    found = PseudoLabelHealth.of(metrics, prior, steps)
    assert found is not None
    return found


def test_a_class_over_twice_its_prior_share_is_a_collapse():
    prior = [0.1] * 10
    assert _health([10] * 9 + [12], prior).collapse is None  # the most frequent class at 11.7 %: healthy
    collapsed = _health([1] * 9 + [30], prior).collapse  # 76.9 % of the labels, limit 20 %
    assert collapsed is not None and collapsed.startswith("class 9 holds 76.9%") and "limit 20.0%" in collapsed


def test_a_binary_task_collapses_halfway_to_all_of_its_labels():
    assert collapse_limit(0.5) == 0.75  # twice 0.5 would be 1.0, which no share can exceed
    assert _health([20, 80], [0.5, 0.5]).collapse is not None
    assert _health([30, 70], [0.5, 0.5]).collapse is None


def test_an_epoch_with_too_few_kept_labels_is_not_judged():
    thin = _health([0, 0, 4], [1 / 3] * 3, steps=1)  # 4 labels, under 5 per class: a collapse cannot be told
    assert thin.collapse is None and "too few to judge" in thin.describe()


def test_a_run_without_pseudo_labels_has_no_health():
    assert PseudoLabelHealth.of({"train/loss/total": 0.3}, [0.5, 0.5], 10) is None


def test_a_best_epoch_in_the_last_tenth_is_not_converged():
    assert [late_epochs(n) for n in (2, 10, 11, 30)] == [1, 1, 2, 3]
    assert convergence_note(9, 10) is not None and convergence_note(8, 10) is None
    assert convergence_note(27, 30) is not None and convergence_note(26, 30) is None
    assert convergence_note(0, 1) is None  # a closed-form refit is evaluated once: nothing to judge


# ----- the trainer finds them -----------------------------------------------------------------------
def _biased_teacher(dataset, path: Path) -> Path:
    """A teacher checkpoint whose head says FORCED_CLASS for every input: its pseudo-labels are all that class."""
    trainer = Trainer(TrainConfig.from_flat({"algorithm": "erm", "epochs": 1, "max_steps_per_epoch": 1,
                                             "batch_size": 32}), dataset=dataset)
    model = trainer.fit().best_model
    with torch.no_grad():
        model.head.weight.zero_()
        model.head.bias.zero_()
        model.head.bias[FORCED_CLASS] = 50.0
    write_model_checkpoint(path, model.state_dict(), trainer.model_record())
    return path


def test_a_student_taught_one_class_is_flagged_collapsed(tiny_dataset, tmp_path):
    teacher = _biased_teacher(tiny_dataset, tmp_path / "teacher.pt")
    config = TrainConfig.from_flat({"algorithm": "noisy_student", "epochs": 2, "batch_size": 32,
                                    "max_steps_per_epoch": 3, "iterations": 1, "teacher_checkpoint": str(teacher)})
    result = Trainer(config, dataset=tiny_dataset).fit()
    assert result.info["pseudo_labels_collapsed"].startswith(f"class {FORCED_CLASS} holds 100.0%")
    assert result.history[-1][f"train/pseudo/classes/{FORCED_CLASS}"] > 0
    assert all(result.history[-1][f"train/pseudo/classes/{c}"] == 0 for c in range(tiny_dataset.task.n_outputs)
               if c != FORCED_CLASS)


def test_fixmatch_logs_its_kept_share_and_class_counts_every_epoch(tiny_dataset):
    config = TrainConfig.from_flat({"algorithm": "fixmatch", "epochs": 2, "batch_size": 32, "max_steps_per_epoch": 2,
                                    "threshold": 0.0})  # every unlabeled row passes a threshold of 0
    result = Trainer(config, dataset=tiny_dataset).fit()
    for epoch in result.history:
        assert epoch["train/pseudo/kept"] == 1.0
        classes = [epoch[f"train/pseudo/classes/{c}"] for c in range(tiny_dataset.task.n_outputs)]
        assert sum(classes) == pytest.approx(24.0)  # 24 unlabeled rows a step (k = 3 of 32), every one kept
    assert "pseudo_labels" in result.info and "kept 100.0% of unlabeled rows" in result.info["pseudo_labels"]


def _scripted_metric(monkeypatch, values: list[float]) -> None:
    """The selection metric follows `values`, epoch by epoch, whatever the weights do."""
    original, seen = Trainer._evaluate, iter(values)

    def evaluate(self, algorithm):
        return {**original(self, algorithm), self.config.selection_metric: next(seen)}

    monkeypatch.setattr(Trainer, "_evaluate", evaluate)


@pytest.mark.parametrize(("values", "patience", "late"), [
    ([0.1, 0.2, 0.3, 0.4], None, True),  # still rising at its last epoch
    ([0.1, 0.4, 0.3, 0.2], None, False),  # peaked, then fell
    ([0.4, 0.3, 0.2, 0.1], 1, False),  # patience ended it: its metric had stopped rising
])
def test_a_run_whose_metric_rises_at_its_last_epoch_is_not_converged(tiny_dataset, monkeypatch, values, patience, late):
    _scripted_metric(monkeypatch, values)
    config = TrainConfig.from_flat({"algorithm": "erm", "epochs": len(values), "batch_size": 32,
                                    "max_steps_per_epoch": 1, "patience": patience})
    result = Trainer(config, dataset=tiny_dataset).fit()
    assert ("not_converged" in result.info) is late
    if late:
        assert result.info["not_converged"].startswith("best epoch 4 of 4 is in its last 10% of epochs")


# ----- results and compare show them ------------------------------------------------------------------
def _run(seed: int, late: str | None = None, collapsed: str | None = None, test: float = 0.5) -> TrialRecord:
    return TrialRecord(order=seed, trial_id=f"t{seed}", seed=seed, sampled={"lr": 0.01}, status=TrialStatus.OK,
                       selection_value=0.5, best_epoch=3.0, epochs_run=4.0, not_converged=late,
                       pseudo_labels_collapsed=collapsed,
                       metrics={"best/test/acc": test, "best/id_test/acc": test, "best/train/pseudo/kept": 0.25})


def _summary(name: str, runs: list[TrialRecord], **fields) -> SweepSummary:
    from raybench.sweep.outcome import summarize

    return SweepSummary(name=name, dataset="digits-shift", algorithm="pseudolabel", space="pseudolabel",
                        selection=Selection(strategy="ood_val", metric="val/acc"), trials=[runs[0]], selected=runs[0],
                        replicates=Replicates(seeds=[r.seed for r in runs], ok=len(runs), runs=runs,
                                              summary=summarize(runs)), **fields)


def test_compare_marks_a_row_whose_replicates_collapsed_or_peaked_late():
    late = "best epoch 4 of 4 is in its last 10% of epochs: the selection metric was still rising"
    collapsed = "class 3 holds 100.0% of the 480 kept pseudo-labels at the selected epoch"
    summary = _summary("pl", [_run(0, late, collapsed), _run(1, late), _run(2)])
    assert RowHealth.of(summary).not_converged  # 2 of 3 peaked late
    text = render_comparison(compare([summary]), "table")
    assert "not converged (2/3 peaked late); pseudo-labels collapsed (1/3)" in text
    assert f"Pseudo-labels collapsed: pseudolabel (pl): in 1 of 3 runs of the selected config ({collapsed})." in text
    assert "25.0 %" in text  # the replicates' kept share at their best epochs
    row = records(compare([summary]))[0]
    assert row["not_converged"] is True and row["pseudo_labels_collapsed"] == 1 and row["pseudo_labels_kept"] == 0.25
    assert "Not converged: 2 of 3 runs of the selected config peaked late" in markdown(summary)


def test_one_late_replicate_of_three_is_noise_not_a_flag():
    summary = _summary("pl", [_run(0, "late"), _run(1), _run(2)])
    assert not RowHealth.of(summary).not_converged
    assert "not converged" not in render_comparison(compare([summary]), "table")


def test_the_console_shows_each_trials_best_epoch_of_its_epochs_and_its_flags_in_words():
    from raybench.budget import ratio_text
    from raybench.report.results_text import table

    text = table(_summary("pl", [_run(0, "late")]))
    trial_line = next(line for line in text.splitlines() if line.lstrip().startswith("t0 "))
    assert "ok (not converged)" in trial_line and " 4 of 4 " in trial_line and "3.0" not in trial_line
    assert [ratio_text(r) for r in (1.0, 0.1, 0.0125, 0.00512, 0.0)] == ["1.00", "0.10", "0.013", "0.0051", "0.00"]


def test_compare_shows_only_the_last_attempt_of_a_pair():
    first = _summary("pl", [_run(0, "late"), _run(1, "late")])
    longer = _summary("pl-epochs-x2", [_run(0), _run(1)], epochs_scale=2.0,
                      attempts=[ConvergenceAttempt("pl", 1.0, "780 steps", "2 of 2 peaked late")])
    text = render_comparison(compare([first, longer]), "table")
    assert [row.sweep for row in compare([first, longer]).tables[0].rows] == ["pl-epochs-x2"]
    assert "- pl (epochs x1, 780 steps: 2 of 2 peaked late), by pl-epochs-x2 (epochs x2)" in text


def test_an_interrupted_longer_attempt_leaves_the_earlier_one_its_row():
    from raybench.records import SweepState

    first = _summary("pl", [_run(0, "late"), _run(1, "late")])
    longer = _summary("pl-epochs-x2", [_run(0)], epochs_scale=2.0, state=SweepState.INTERRUPTED_SEARCH,
                      attempts=[ConvergenceAttempt("pl", 1.0, "780 steps", "2 of 2 peaked late")])
    assert [row.sweep for row in compare([first, longer]).tables[0].rows] == ["pl"]


def test_the_comparison_figure_names_each_rows_checks_under_its_method():
    from raybench.report.plots import comparison_figure

    erm = _summary("erm", [_run(0)])
    erm.algorithm, erm.space = "erm", "erm"
    raised = _summary("pl-epochs-x2", [_run(0, "late"), _run(1, "late", "class 3 holds 90%")], epochs_scale=2.0)
    figure = comparison_figure(compare([erm, raised]).tables[0])
    assert [t.get_text() for t in figure.axes[0].get_xticklabels()] == [
        "erm", "pseudolabel\n(epochs x2)\n(not converged)\n(pseudo-labels collapsed)"]


def _budgeted(run: TrialRecord, steps: float, protocol: float, erm: float = 390.0) -> TrialRecord:
    planned = {"steps": steps, "optimizer_steps": steps / 4, "labeled_examples": 64 * steps, "unlabeled_examples": 0.0,
               "labeled_passes": 2.5, "protocol_steps": protocol, "erm_steps": erm}
    run.metrics.update({f"budget/planned_{name}": value for name, value in planned.items()})
    return run


def test_a_raised_attempt_is_not_flagged_off_the_protocol_but_an_unraised_one_still_is():
    erm = _summary("erm", [_budgeted(_run(0), 390, 390)])
    erm.algorithm = "erm"
    # x2 at k = 7: ceil(2 x 20 / 8) = 5 epochs, not 2 x ceil(2 x 10 / 8) = 6; the ratio to the unraised
    # protocol (1.67) is no defect of the row
    raised = _summary("fm-epochs-x2", [_budgeted(_run(0), 3125, 1875)], epochs_scale=2.0)
    capped = _summary("pl", [_budgeted(_run(0), 400, 1875)])
    table = compare([erm, raised, capped]).tables[0]
    assert [row.sweep for row, _ in table.unfair] == ["pl"]
    assert "3125 st, 2.5 lp, 8.01x ERM, epochs x2" in render_comparison(compare([erm, raised, capped]), "table")


# ----- through a real sweep ----------------------------------------------------------------------------
def test_a_sweep_records_the_collapse_and_each_trials_epochs(tmp_path, ray_head, empty_store, shared_data_dir):
    """A Noisy Student sweep taught by a teacher that says one class: its trial and replicate records, its
    summary.md and `compare` all say the pseudo-labels collapsed; every record names the epochs it ran."""
    dataset = load_dataset("digits-shift", shared_data_dir)
    teacher = _biased_teacher(dataset, tmp_path / "teacher.pt")
    uri = seeded_store(empty_store, tmp_path / "mlflow.db")
    proc = run_cli(on_head(["sweep", "noisy_student", "--smoke", "--trials", "1", "--replicates", "1", "--name", "ns",
                            "--set", f"teacher_checkpoint={teacher}", "--set", "iterations=1",
                            "--storage", str(tmp_path / "runs"), "--tracking-uri", uri], ray_head),
                   dict(ray_head.env), tmp_path)
    assert proc.returncode == 0, proc.stderr[-4000:]
    results = tmp_path / "runs" / "ns" / "results"
    summary = json.loads((results / "summary.json").read_text())
    for record in [*summary["trials"], *summary["replicates"]["runs"]]:
        assert record["pseudo_labels_collapsed"].startswith(f"class {FORCED_CLASS} holds 100.0%")
        assert record["epochs_run"] == 2.0
        assert (record.get("not_converged") is not None) is (record["best_epoch"] == 1.0)  # 2 epochs: the 2nd is late
        assert record["metrics"]["best/train/pseudo/kept"] == 1.0
    assert "; pseudo-labels collapsed)" in (results / "summary.md").read_text()
    shown = run_cli(["compare", "--dataset", "digits-shift", "--tracking-uri", uri], dict(ray_head.env), tmp_path)
    assert shown.returncode == 0, shown.stderr[-2000:]
    assert "pseudo-labels collapsed (1/1)" in shown.stdout
