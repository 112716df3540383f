"""The protocol's budget rule (WILDS 2.0 App. D: a method with unlabeled data gets ceil(2E / (k + 1)) epochs of
B / (k + 1) labeled rows a batch, about 2x ERM's steps), the counts a run records, and the check `compare` makes.

A fair shortened run shortens every method's epoch by the same share of the labeled data (`epoch_fraction`); a
flat cap of steps per epoch (`max_steps_per_epoch`) cuts the unlabeled methods' longer epochs far more than
ERM's, and the recorded budget says so.
"""
from __future__ import annotations

import json
import math

import pytest
from test_compare import compare_json, summary

from raybench.data import load_dataset
from raybench.records import SweepSummary
from raybench.report.compare import render_comparison
from raybench.sweep.space import load_space, sweep_space
from raybench.trainer import TrainConfig, Trainer
from raybench.trainer.callbacks import Callback

RATIOS = (3, 7, 15)
ERM_EPOCHS = 10  # digits-shift's


@pytest.fixture(scope="module")
def digits():
    return load_dataset("digits-shift")


def budget_at(digits, space: str, k: int | None, **fixed):
    resolved = sweep_space(load_space(space), digits, fixed)
    sampled = {"unlabeled_ratio": k} if k else {}
    config = TrainConfig.from_flat({**resolved.materialize(sampled), **fixed}).resolve(digits)
    return config, config.budget(digits)


def protocol_ratio_to_erm(k: int) -> float:
    """What the WILDS rule gives a method with unlabeled data over ERM, before the floor of full batches:
    (k + 1) times ERM's steps an epoch, for ceil(2E / (k + 1)) of ERM's E epochs."""
    return (k + 1) * math.ceil(2 * ERM_EPOCHS / (k + 1)) / ERM_EPOCHS


@pytest.mark.parametrize("fraction", [None, 0.3])
@pytest.mark.parametrize("space", ["fixmatch", "dann", "pseudolabel"])
def test_at_every_ratio_a_method_with_unlabeled_data_gets_the_protocols_multiple_of_erms_steps(digits, space, fraction):
    extra = {"epoch_fraction": fraction} if fraction else {}
    _, erm = budget_at(digits, "erm", None, **extra)
    for k in RATIOS:
        config, budget = budget_at(digits, space, k, **extra)
        assert config.epochs == math.ceil(2 * ERM_EPOCHS / (k + 1))
        assert budget.erm_steps == erm.steps
        assert budget.steps / erm.steps == pytest.approx(protocol_ratio_to_erm(k), rel=0.03), k
        assert budget.steps / erm.steps >= 1.97  # about 2x at every k, never less
        assert budget.protocol_ratio == pytest.approx(1.0, abs=0.01)
        assert budget.labeled_passes == pytest.approx(config.epochs * (fraction or 1.0), rel=0.03)
        assert budget.unlabeled_examples == budget.steps * config.batch_sizes(True)[1]
        assert budget.optimizer_steps == math.ceil(budget.steps / config.epochs / config.grad_accum) * config.epochs


def test_a_flat_cap_per_epoch_takes_the_unlabeled_methods_below_the_protocol_and_the_budget_says_so(digits):
    _, erm = budget_at(digits, "erm", None, max_steps_per_epoch=150)
    assert erm.protocol_ratio == 1.0  # ERM's epoch of 78 steps is under the cap
    for k, expected in zip(RATIOS, (0.48, 0.24, 0.12)):
        _, budget = budget_at(digits, "fixmatch", k, max_steps_per_epoch=150)
        assert budget.protocol_ratio == pytest.approx(expected, abs=0.01), k
        assert budget.steps / erm.steps < 1.0  # under ERM's steps, where the protocol gives 2x


def test_noisy_students_rounds_each_get_factor_one_so_it_totals_the_others_budget(digits):
    _, erm = budget_at(digits, "erm", None, epoch_fraction=0.5)
    for k in RATIOS:
        config, budget = budget_at(digits, "noisy_student", k, epoch_fraction=0.5)
        assert config.epochs == math.ceil(ERM_EPOCHS / (k + 1))
        assert budget.protocol_ratio == pytest.approx(1.0)
        assert budget.steps == 2 * config.epochs * config.epoch_plan(digits).steps  # two teacher-student rounds
        assert budget.steps / erm.steps >= 1.97


class Counter(Callback):
    def __init__(self) -> None:
        self.reports = []

    def on_epoch_end(self, report) -> None:
        self.reports.append(report)


def test_the_recorded_counts_are_what_the_loop_ran(digits, monkeypatch):
    """Steps, optimizer steps and examples counted by wrapping the algorithm's forward and the optimizer step."""
    seen = {"steps": 0, "labeled": 0, "unlabeled": 0, "optimizer": 0}
    config = TrainConfig.from_flat({"dataset": "digits-shift", "algorithm": "pseudolabel", "unlabeled_ratio": 3,
                                    "epochs": 2, "epoch_fraction": 0.02, "grad_accum": 4, "augment": False})
    trainer = Trainer(config, dataset=digits, callbacks=[counter := Counter()])
    original_step = trainer._optimizer_step

    def counting_step(*args):
        seen["optimizer"] += 1
        return original_step(*args)

    monkeypatch.setattr(trainer, "_optimizer_step", counting_step)
    algorithm_cls = type(trainer._new_algorithm())
    original_forward = algorithm_cls.forward

    def counting_forward(self, labeled, unlabeled, step):
        seen["steps"] += 1
        seen["labeled"] += len(labeled)
        seen["unlabeled"] += len(unlabeled)
        return original_forward(self, labeled, unlabeled, step)

    monkeypatch.setattr(algorithm_cls, "forward", counting_forward)
    trainer.fit()
    last = counter.reports[-1].metrics
    assert seen["steps"] == trainer.steps_per_epoch * 2 > 0
    assert last["budget/steps"] == seen["steps"] == last["budget/planned_steps"]
    assert last["budget/labeled_examples"] == seen["labeled"] == last["budget/planned_labeled_examples"]
    assert last["budget/unlabeled_examples"] == seen["unlabeled"] == last["budget/planned_unlabeled_examples"]
    assert last["budget/optimizer_steps"] == seen["optimizer"] == last["budget/planned_optimizer_steps"]
    assert seen["optimizer"] < seen["steps"]  # accumulation 4
    assert last["budget/labeled_passes"] == pytest.approx(seen["labeled"] / len(digits.split("train")))
    assert counter.reports[0].metrics["budget/steps"] == trainer.steps_per_epoch  # cumulative, epoch by epoch


def with_budget(record: dict, steps: float, protocol: float, erm: float) -> dict:
    record["replicates"]["summary"].update({f"budget/planned_{k}": {"mean": v, "std": 0.0, "n": 3} for k, v in {
        "steps": steps, "optimizer_steps": steps / 4, "labeled_examples": steps * 16, "unlabeled_examples": steps * 48,
        "labeled_passes": steps * 16 / 5000, "protocol_steps": protocol, "erm_steps": erm}.items()})
    return record


def test_compare_shows_each_rows_budget_and_flags_a_table_whose_rows_got_budgets_outside_the_protocol():
    cells = {"id_test/acc": (0.95, 0.01), "test/acc": (0.55, 0.03)}
    fair = [with_budget(summary("s-erm", "erm", cells), 780, 780, 780),
            with_budget(summary("s-dann", "dann", cells), 1560, 1560, 780)]
    capped = with_budget(summary("s-fixmatch", "fixmatch", cells), 750, 1560, 780)
    other_erm = with_budget(summary("s-coral", "coral", cells), 465, 465, 230)

    assert "Budget outside" not in render_comparison(compare_json(fair), "table")
    table = render_comparison(compare_json([*fair, capped, other_erm]), "table")
    assert "1560 st, 5.0 lp, 2.00x ERM" in table
    assert "Budget outside the protocol's ratios: fixmatch (s-fixmatch): 0.48x the steps the WILDS rule gives it" in table
    assert "Budget outside the protocol's ratios: coral (s-coral): an ERM budget of 230 steps, not the table's 780" in table
    assert "dann (s-dann)" not in table.split("Budget outside", 1)[1]
    for fmt_name in ("markdown", "latex"):
        assert "fixmatch (s-fixmatch): 0.48x" in render_comparison(compare_json([*fair, capped]), fmt_name)
    rows = {r["sweep"]: r for r in json.loads(render_comparison(compare_json([*fair, capped]), "json"))["rows"]}
    assert rows["s-fixmatch"]["budget_unfair"].startswith("0.48x") and rows["s-dann"]["budget_unfair"] == ""
    assert rows["s-dann"]["budget.erm_ratio"] == 2.0


def test_results_show_each_trials_steps_and_the_replicates_budget():
    from raybench.report.results_text import render_results

    record = with_budget(summary("s-fixmatch", "fixmatch", {"test/acc": (0.5, 0.01)}), 750, 1560, 780)
    trial_metrics = {f"budget/planned_{k}": v for k, v in {"steps": 750, "optimizer_steps": 190, "labeled_examples": 12000,
                     "unlabeled_examples": 36000, "labeled_passes": 2.4, "protocol_steps": 1560, "erm_steps": 780}.items()}
    record.update({"wall_seconds": 800.0, "metric_names": ["acc"],
                   "selected": {"trial_id": "t0", "status": "ok", "sampled": {"lr": 0.01}, "selection_value": 0.7}})
    record["trials"] = [{"trial_id": "t0", "status": "ok", "selection_value": 0.7, "best_epoch": 3, "failure_reason": None,
                         "sampled": {"lr": 0.01}, "metrics": trial_metrics}]
    text = render_results(SweepSummary.from_json(record), "table")
    header, row = [line for line in text.splitlines() if line.strip().startswith(("trial_id", "t0"))][:2]
    assert row[header.index(" steps") + 1:header.index(" x protocol")].split() == ["750"] and "0.48" in row.split()
    assert "budget per replicate: 750 steps (188 optimizer steps), 12000 labeled + 36000 unlabeled examples" in text
    assert "0.96x ERM's steps, 0.48x the protocol's" in text
    assert "steps" in render_results(SweepSummary.from_json(record), "csv").splitlines()[0]
