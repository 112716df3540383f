"""The SpuCo methods: samplers, losses and group inference against hand-computed values and properties."""
from __future__ import annotations

import ast
import json
import re

import numpy as np
import pytest
import torch
from helpers.paths import REPO
from sklearn.linear_model import LogisticRegression
from sklearn.multiclass import OneVsRestClassifier
from sklearn.preprocessing import StandardScaler

from raybench.algorithms import ALGORITHMS
from raybench.algorithms.dfr import DFR, Standardizer, balanced_subsample, fit_l1_logistic
from raybench.algorithms.dispel import mix_embeddings
from raybench.algorithms.eiil import infer_environments, scale_gradients
from raybench.algorithms.groupdro import group_dro_loss
from raybench.algorithms.groups import minority_mask, parse_grid
from raybench.algorithms.jtt import upsampled_indices
from raybench.algorithms.spare import cluster_weights
from raybench.algorithms.ssa import split_halves
from raybench.data import Split
from raybench.models import ModelSpec, build_model
from raybench.trainer import Callback, StageReport, TrainConfig, Trainer
from raybench.trainer.batches import balanced_batches, multiset_batches, weighted_batches

GROUP_METHODS = ["cb", "gb", "groupdro", "jtt", "eiil", "spare", "ssa", "dfr", "dispel"]


# ----- samplers ------------------------------------------------------------------------------------------
def test_group_balanced_batches_hold_every_group_equally():
    groups = torch.tensor([0] * 90 + [1] * 7 + [2] * 3)  # very unbalanced, as SpuCo's training groups are
    for batch in balanced_batches(groups, 12, steps=20, generator=torch.Generator().manual_seed(0)):
        assert len(batch) == 12
        assert torch.bincount(groups[batch], minlength=3).tolist() == [4, 4, 4]


def test_balanced_batches_spread_the_remainder_and_cycle_small_groups_completely():
    groups = torch.tensor([0] * 50 + [1] * 3)
    batches = list(balanced_batches(groups, 5, steps=6, generator=torch.Generator().manual_seed(1)))
    counts = [torch.bincount(groups[b], minlength=2).tolist() for b in batches]
    assert all(sorted(c) == [2, 3] for c in counts)
    drawn_from_small = torch.cat(batches)[groups[torch.cat(batches)] == 1]
    first_pass = drawn_from_small[:3].sort().values.tolist()
    assert first_pass == [50, 51, 52]  # every member once before any repeats


def test_weighted_batches_follow_the_weights():
    weights = torch.tensor([1.0, 3.0])
    draws = torch.cat(list(weighted_batches(weights, 100, steps=40, generator=torch.Generator().manual_seed(0))))
    assert abs(float((draws == 1).float().mean()) - 0.75) < 0.02


def test_multiset_batches_draw_the_multiset_without_replacement():
    multiset = torch.tensor([0, 1, 2, 2, 2])
    draws = torch.cat(list(multiset_batches(multiset, 5, steps=1, generator=torch.Generator().manual_seed(0))))
    assert sorted(draws.tolist()) == [0, 1, 2, 2, 2]


def test_balanced_plan_draws_as_spuco_by_default_and_exactly_on_request():
    """SpuCo's CB, GB and GroupDRO draw |train| indices with replacement, P(i) proportional to 1/|group(i)|:
    every group is drawn equally often in expectation, yet a batch of 12 over three groups often misses or
    doubles one. `exact` holds 4, 4, 4 in every batch."""
    from raybench.algorithms.base import balanced_plan

    groups = torch.tensor([0] * 90 + [1] * 7 + [2] * 3)
    expected = balanced_plan(groups, "expected")
    assert expected.balance_by is None and expected.weights is not None
    batches = list(weighted_batches(expected.weights, 12, steps=400, generator=torch.Generator().manual_seed(0)))
    shares = torch.bincount(groups[torch.cat(batches)], minlength=3).double() / (12 * 400)
    assert torch.allclose(shares, torch.full((3,), 1 / 3, dtype=torch.float64), atol=0.02), shares.tolist()
    per_batch = [torch.bincount(groups[b], minlength=3).tolist() for b in batches]
    assert any(counts != [4, 4, 4] for counts in per_batch), "the expected draw balanced every batch exactly"
    assert torch.equal(balanced_plan(groups, "exact").balance_by, groups)


@pytest.mark.parametrize("name", ["cb", "gb", "groupdro"])
def test_balanced_methods_default_to_spucos_draw(name):
    hparams = ALGORITHMS.get(name).Hparams()
    assert hparams.batches == "expected"


# ----- GroupDRO ------------------------------------------------------------------------------------------
def test_groupdro_weights_move_toward_the_high_loss_group():
    losses = torch.tensor([0.1, 0.1, 2.0, 2.0])
    groups = torch.tensor([0, 0, 1, 1])
    weights = torch.tensor([0.5, 0.5])
    loss = group_dro_loss(losses, groups, weights, eta=0.1)
    # q_g ∝ 0.5 exp(0.1 * loss_g): q_1 = e^0.2 / (e^0.01 + e^0.2)
    q1 = np.exp(0.2) / (np.exp(0.01) + np.exp(0.2))
    assert weights[1].item() == pytest.approx(q1)
    assert weights[1] > 0.5 > weights[0]
    assert loss.item() == pytest.approx((1 - q1) * 0.1 + q1 * 2.0)
    for _ in range(200):
        group_dro_loss(losses, groups, weights, eta=0.1)
    assert weights[1] > 0.99  # keeps climbing toward the worst group


def test_groupdro_leaves_absent_groups_weights_unchanged_relative_to_each_other():
    weights = torch.tensor([0.25, 0.25, 0.5])
    group_dro_loss(torch.tensor([1.0]), torch.tensor([0]), weights, eta=1.0)
    assert weights[2] / weights[1] == pytest.approx(2.0)
    assert weights[0] / weights[1] == pytest.approx(np.e)


class SpucoGroupWeightedLoss:
    """SpuCo's GroupWeightedLoss.forward and update_group_weights, transcribed (src/spuco/robust_train/group_dro.py
    :42-68 at 91842463a577b0a90b4f829fec367308f3052e9f), with its default group_weight_lr 0.01 (:23)."""

    def __init__(self, num_groups: int, group_weight_lr: float = 0.01) -> None:
        self.num_groups, self.group_weight_lr = num_groups, group_weight_lr
        self.group_weights = torch.ones(num_groups)
        self.group_weights.data = self.group_weights.data / self.group_weights.data.sum()

    def __call__(self, outputs: torch.Tensor, labels: torch.Tensor, groups: torch.Tensor) -> torch.Tensor:
        loss = torch.nn.functional.cross_entropy(outputs, labels, reduction="none")
        group_loss = torch.zeros(self.num_groups)
        for i in range(self.num_groups):
            if (groups == i).sum() > 0:
                group_loss[i] += loss[groups == i].mean()
        group_weights = self.group_weights * torch.exp(self.group_weight_lr * group_loss)
        self.group_weights.data = (group_weights / group_weights.sum()).data
        return (group_loss * self.group_weights).sum()


def test_groupdro_follows_spucos_group_weighted_loss_step_for_step():
    """Same weights, same loss and same gradient as SpuCo's, batch after batch, over SpuCoMNIST's 25 groups at
    its batch 32 with groups missing from batches (SpuCo's sampler leaves about 27 % of them out of each), at
    raybench's default eta, which is SpuCo's group_weight_lr."""
    assert ALGORITHMS.get("groupdro").Hparams().eta == 0.01
    generator = torch.Generator().manual_seed(0)
    theirs, ours = SpucoGroupWeightedLoss(25), torch.full((25,), 1.0 / 25)
    for _ in range(40):
        groups = torch.randint(0, 25, (32,), generator=generator)
        labels = groups // 5
        logits = (3 * torch.randn(32, 5, generator=generator)).requires_grad_()
        expected = theirs(logits, labels, groups)
        [expected_grad] = torch.autograd.grad(expected, logits)
        got = group_dro_loss(torch.nn.functional.cross_entropy(logits, labels, reduction="none"), groups, ours, 0.01)
        [got_grad] = torch.autograd.grad(got, logits)
        assert torch.allclose(ours, theirs.group_weights, rtol=1e-5, atol=1e-7)
        assert got.item() == pytest.approx(expected.item(), rel=1e-5)
        assert torch.allclose(got_grad, expected_grad, rtol=1e-5, atol=1e-7)
    assert ours.max() / ours.min() > 1.5  # the weights did move apart


@pytest.fixture
def spuco_check(monkeypatch):
    monkeypatch.syspath_prepend(str(REPO / "benchmarks"))
    import spuco_check

    return spuco_check


def test_spucos_table_2_cells_train_every_epoch_and_keep_the_best_as_spucos_code_does(spuco_check):
    """SpuCo's "50 epochs with early stopping" (App. C.3) is BaseRobustTrain.train
    (src/spuco/robust_train/base_robust_train.py:42-50 at 91842463a577b0a90b4f829fec367308f3052e9f): every epoch
    is trained and the best val worst-group epoch's model kept; nothing stops a run early. A patience of 5 ended
    GroupDRO's medium-magnitude runs after 7-13 of their 50 epochs, one of them keeping its second epoch's model."""
    cells = spuco_check.paper_rows("spuco-digits", spuco_check.MAGNITUDES, spuco_check.METHODS)
    assert {algorithm for _, algorithm, _, _ in cells} == {"erm", "groupdro", "gb", "jtt", "dfr"}
    for label, algorithm, dataset, settings in cells:
        config = TrainConfig.from_flat({"dataset": dataset, "algorithm": algorithm, **settings})
        assert config.patience is None, f"{label}: patience {config.patience}"
        if algorithm != "dfr":
            assert (config.epochs, config.batch_size) == (50, 32), label
    [(_, _, _, medium)] = spuco_check.paper_rows("spuco-digits", ("medium",), ("groupdro",))
    assert (medium["lr"], medium["weight_decay"]) == (1e-3, 5e-3)  # App. C.3, GroupDRO, magnitude medium
    [(_, _, _, budgeted)] = spuco_check.paper_rows("spuco-digits", ("medium",), ("groupdro",), patience=5)
    assert budgeted["patience"] == 5  # --patience 5: the table first published with raybench's early stop


def test_a_saved_paper_run_is_reused_only_at_its_own_settings(spuco_check, tmp_path):
    """A run saved by a table with patience 5 must not stand in for the same cell without it."""
    [(_, algorithm, dataset, settings)] = spuco_check.paper_rows("spuco-digits", ("medium",), ("groupdro",))
    path = spuco_check.run_path(tmp_path, dataset, algorithm, 0)
    path.write_text(json.dumps({"settings": {**settings, "patience": 5}}))
    [line] = spuco_check.stale_runs(tmp_path, [(dataset, algorithm, 0, settings)])
    assert path.name in line and "'patience': 5" in line
    path.write_text(json.dumps({"settings": settings}))
    assert spuco_check.stale_runs(tmp_path, [(dataset, algorithm, 0, settings)]) == []
    assert spuco_check.stale_runs(tmp_path, [(dataset, algorithm, 1, settings)]) == []  # not saved yet


# ----- JTT, Spare, EIIL, SSA --------------------------------------------------------------------------------
def test_jtt_upsampling_counts():
    errors = torch.tensor([False, True, False, True, False])
    indices = upsampled_indices(errors, factor=4)
    counts = torch.bincount(indices, minlength=5).tolist()
    assert counts == [1, 4, 1, 4, 1]
    assert len(indices) == 5 + 2 * 3
    assert torch.bincount(upsampled_indices(errors, factor=1), minlength=5).tolist() == [1] * 5


def test_spare_weights_give_every_cluster_the_same_mass_at_power_one():
    clusters = torch.tensor([0] * 8 + [1] * 2 + [2] * 5)
    weights = cluster_weights(clusters, power=1.0)
    mass = torch.zeros(3, dtype=weights.dtype).index_add(0, clusters, weights)
    assert torch.allclose(mass, mass[0].expand(3))
    heavier = cluster_weights(clusters, power=2.0)
    assert heavier[8] / heavier[0] == pytest.approx(16.0)  # (8 / 2)^2: small clusters weigh more


def test_eiil_scale_gradient_matches_autograd():
    logits = torch.randn(6, 3, dtype=torch.float64)
    y = torch.tensor([0, 1, 2, 0, 1, 2])
    scale = torch.tensor(1.0, dtype=torch.float64, requires_grad=True)
    losses = torch.nn.functional.cross_entropy(logits * scale, y, reduction="none")
    expected = torch.stack([torch.autograd.grad(l, scale, retain_graph=True)[0] for l in losses])
    assert torch.allclose(scale_gradients(logits, y), expected)


def test_eiil_separates_examples_the_reference_gets_right_from_those_it_gets_wrong():
    y = torch.zeros(40, dtype=torch.long)
    logits = torch.zeros(40, 2)
    logits[:30, 0] = 4.0  # confidently right: the majority
    logits[30:, 1] = 4.0  # confidently wrong: the minority
    environments = infer_environments(logits, y, steps=2000, lr=0.01, generator=torch.Generator().manual_seed(0))
    assert len(set(environments[:30].tolist())) == 1 and len(set(environments[30:].tolist())) == 1
    assert environments[0] != environments[-1]


def test_ssa_halves_are_disjoint_stratified_and_cover_the_split():
    group = torch.tensor([0] * 10 + [1] * 4 + [2] * 1)
    split = Split("val", torch.zeros(15, 1), torch.zeros(15, dtype=torch.long), group, group)
    first, second = split_halves(split, 0.5, seed=0)
    assert sorted(torch.cat([first, second]).tolist()) == list(range(15))
    assert torch.bincount(group[first], minlength=3).tolist() == [5, 2, 1]


def test_minority_mask_marks_all_but_each_class_largest_group():
    y = torch.tensor([0, 0, 0, 1, 1, 1])
    group = torch.tensor([0, 0, 1, 2, 3, 3])
    assert minority_mask(y, group).tolist() == [False, False, True, True, False, False]


# ----- DFR and Dispel ------------------------------------------------------------------------------------
def test_dfr_last_layer_equals_sklearn_logistic_regression_on_the_same_embeddings():
    rng = np.random.default_rng(0)
    z = rng.normal(size=(120, 16))
    y = rng.integers(0, 3, 120)
    z[:, 0] += 2 * y
    train_z = rng.normal(loc=1.5, scale=3.0, size=(500, 16))  # the scaler comes from training embeddings
    standardize = Standardizer.fit(train_z)
    head = standardize.fold(fit_l1_logistic(standardize(z), y, c=0.3, n_classes=3, seed=0))
    scaler = StandardScaler().fit(train_z)
    reference = OneVsRestClassifier(LogisticRegression(C=0.3, l1_ratio=1.0, solver="liblinear", random_state=0))
    reference.fit(scaler.transform(z), y)
    expected = reference.decision_function(scaler.transform(z))
    model = build_model("lenet", ModelSpec((3, 16, 16), 3, None))
    model.head = torch.nn.Linear(16, 3)
    DFR.write_head(model, head)
    with torch.no_grad():
        logits = model.head(torch.from_numpy(z).float()).double().numpy()
    np.testing.assert_allclose(logits, expected, rtol=1e-4, atol=1e-4)
    assert (logits.argmax(1) == reference.predict(scaler.transform(z))).all()


def test_dfr_binary_head_scores_the_second_class():
    rng = np.random.default_rng(1)
    z = rng.normal(size=(60, 4))
    y = (z[:, 0] > 0).astype(int)
    head = fit_l1_logistic(z, y, c=1.0, n_classes=2, seed=0)
    assert (head.logits(z).argmax(1) == y).mean() > 0.9
    assert np.all(head.weight[0] == 0)


def test_balanced_subsample_takes_the_smallest_group_size_from_each():
    group = np.array([0] * 10 + [1] * 3 + [2] * 5)
    index = balanced_subsample(group, np.random.default_rng(0))
    assert np.bincount(group[index]).tolist() == [3, 3, 3]
    assert len(set(index.tolist())) == 9


def test_dispel_mixes_each_embedding_with_one_of_its_own_class():
    z_pool = np.zeros((4, 2))
    y_pool = np.array([0, 0, 1, 1])
    z_bal = np.array([[10.0, 0.0], [0.0, 10.0]])
    y_bal = np.array([0, 1])
    mixed = mix_embeddings(z_pool, y_pool, z_bal, y_bal, s=0.8, rng=np.random.default_rng(0))
    np.testing.assert_allclose(mixed, [[8, 0], [8, 0], [0, 8], [0, 8]])


def test_grid_hyperparameters_are_parsed_with_a_clear_error():
    assert parse_grid("1.0, 0.1", "c_grid") == [1.0, 0.1]
    with pytest.raises(ValueError, match="c_grid: expected comma-separated numbers"):
        parse_grid("1.0,x", "c_grid")


# ----- through the one trainer ---------------------------------------------------------------------------
class StageRecorder(Callback):
    def __init__(self) -> None:
        self.stages: list[StageReport] = []

    def on_stage(self, report: StageReport) -> None:
        self.stages.append(report)


def _fit(dataset, algorithm: str, cache, **extra):
    recorder = StageRecorder()
    config = TrainConfig.from_flat({"dataset": dataset.name, "algorithm": algorithm, "epochs": 2, "device": "cpu",
                                    "stage_cache": str(cache), **extra})
    result = Trainer(config, callbacks=[recorder], dataset=dataset).fit()
    return result, recorder.stages


@pytest.mark.parametrize("algorithm", GROUP_METHODS)
def test_every_group_method_trains_and_reports_its_stages(algorithm, tiny_group_dataset, tmp_path):
    extra = {"ei_steps": 50} if algorithm == "eiil" else {}
    result, stages = _fit(tiny_group_dataset, algorithm, tmp_path, **extra)
    assert "val/worst_group_acc" in result.best_metrics
    declared = ALGORITHMS.get(algorithm).stages
    assert [s.name for s in stages] == [s for s in declared if s != "train"]  # "train" is the trial itself
    assert all(s.key for s in stages if s.name in ("reference", "group_predictor"))  # cached by identity
    if not ALGORITHMS.get(algorithm).trains_by_gradient:
        assert len(result.history) == 1  # a closed-form refit is evaluated once


def test_a_stage_cache_hit_does_not_retrain_the_reference(tiny_group_dataset, tmp_path, monkeypatch):
    _first, stages = _fit(tiny_group_dataset, "jtt", tmp_path, reference_epochs=1)
    reference = stages[0]
    assert reference.name == "reference" and not reference.cached
    fits = []
    original = Trainer.fit

    def counting_fit(self, *args, **kwargs):
        fits.append(self.config.algorithm)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(Trainer, "fit", counting_fit)
    # Another trial (other S_r) that agrees on the reference's T_r, lr and weight decay: loaded, not trained again.
    _second, stages = _fit(tiny_group_dataset, "jtt", tmp_path, reference_epochs=1, upsample=5)
    assert stages[0].cached and stages[0].key == reference.key
    assert fits == ["jtt"]  # only the trial's own training ran
    # A different T_r is a different reference; so is another lr, which JTT's reference shares with its trial.
    _, stages = _fit(tiny_group_dataset, "jtt", tmp_path, reference_epochs=2)
    assert not stages[0].cached and stages[0].key != reference.key
    _, stages = _fit(tiny_group_dataset, "jtt", tmp_path, reference_epochs=1, lr=0.01)
    assert not stages[0].cached and stages[0].key != reference.key
    assert fits == ["jtt", "jtt", "erm", "jtt", "erm"]  # each trial, then inside it its new reference


def test_a_resumed_multi_stage_trial_keeps_its_inferred_groups(tiny_group_dataset, tmp_path):
    class Stop(Exception):
        pass

    class StopAfterFirstEpoch(Callback):
        def on_epoch_end(self, report) -> None:
            report.write_checkpoint(tmp_path / "ckpt")
            raise Stop

    config = TrainConfig.from_flat({"dataset": "tiny", "algorithm": "jtt", "epochs": 2, "device": "cpu",
                                    "stage_cache": str(tmp_path / "cache"), "upsample": 3})
    with pytest.raises(Stop):
        Trainer(config, callbacks=[StopAfterFirstEpoch()], dataset=tiny_group_dataset).fit()
    resumed = Trainer(config, dataset=tiny_group_dataset)
    result = resumed.fit(resume_from=tmp_path / "ckpt")
    full = Trainer(config, dataset=tiny_group_dataset).fit()
    assert result.history[-1]["val/acc"] == pytest.approx(full.history[-1]["val/acc"])
    assert result.history[-1]["train/loss/total"] == pytest.approx(full.history[-1]["train/loss/total"], rel=1e-5)


@pytest.mark.parametrize("algorithm, key, value, expected", [
    ("dfr", "c_grid", "1.0,x", "expected comma-separated numbers"),
    ("dispel", "s_grid", "0.5,1.5", "expected mixing weights in [0, 1]"),
    ("dfr", "tune_fraction", 1.0, "strictly between 0 and 1"),
])
def test_bad_method_settings_are_refused_before_any_work(algorithm, key, value, expected):
    from raybench.trainer import ConfigError

    with pytest.raises(ConfigError, match=re.escape(expected)) as caught:
        TrainConfig.from_flat({"dataset": "spuco-digits", "algorithm": algorithm, key: value})
    assert caught.value.key == key


def test_a_cache_hit_and_a_miss_give_the_same_trial(tiny_group_dataset, tmp_path):
    """The reference's own training must not move the trial's random stream, or results would depend on the cache."""
    trained, stages = _fit(tiny_group_dataset, "jtt", tmp_path, reference_epochs=1, upsample=3, augment=True)
    loaded, stages_again = _fit(tiny_group_dataset, "jtt", tmp_path, reference_epochs=1, upsample=3, augment=True)
    assert not stages[0].cached and stages_again[0].cached
    assert trained.history[-1]["train/loss/total"] == pytest.approx(loaded.history[-1]["train/loss/total"], rel=1e-6)


def test_a_huge_multiset_is_drawn_without_one_object_per_index():
    """JTT upsamples its error set S_r = 800 times: tens of millions of indices. Drawing a batch must not turn
    the permuted multiset into a Python object per element (that took 17.8 GB in one trial)."""
    import tracemalloc

    multiset = torch.arange(2_000_000) % 1000
    tracemalloc.start()
    try:
        batch = next(multiset_batches(multiset, 64, steps=1, generator=torch.Generator().manual_seed(0)))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert batch.shape == (64,) and batch.dtype == torch.long and int(batch.max()) < 1000
    assert peak < 20 * 2**20, f"drawing one batch held {peak / 2**20:.0f} MiB of Python objects"


# ----- JTT as SpuCo runs it: its reference at the run's lr and wd, epochs over the upsampled set ---------------
def test_jtt_reference_uses_the_runs_lr_and_an_epoch_covers_the_upsampled_set(tiny_group_dataset, tmp_path):
    result, stages = _fit(tiny_group_dataset, "jtt", tmp_path, lr=0.037, weight_decay=0.0021, reference_epochs=1,
                          upsample=9, batch_size=16)
    [reference, inferred] = stages
    first_stage = ast.literal_eval(reference.facts["config"])
    assert first_stage["lr"] == 0.037 and first_stage["weight_decay"] == 0.0021 and first_stage["epochs"] == 1
    n_errors, n_train = int(inferred.metrics["error_set_size"]), len(tiny_group_dataset.split("train"))
    assert n_errors > 0
    upsampled = n_train + (9 - 1) * n_errors  # every example once, each error 9 times in all
    steps = upsampled // 16  # the trainer's epochs drop the last partial batch, as over |train|
    assert steps > n_train // 16
    for epoch in result.history:
        assert epoch["budget/planned_steps"] == 2 * steps
    assert result.history[-1]["budget/steps"] == 2 * steps
    assert result.history[-1]["budget/labeled_examples"] == 2 * steps * 16


def test_jtt_defaults_are_spucos_spucomnist_settings():
    hparams = ALGORITHMS.get("jtt").Hparams()
    assert hparams.upsample == 800 and hparams.reference_epochs == 2
    assert hparams.reference_lr is None and hparams.reference_weight_decay is None  # None: the run's own


# ----- DFR's inner grid: a grid that cannot tell its settings apart is a blind selection ----------------------
def test_dfr_flags_a_c_grid_whose_settings_all_score_the_same(tiny_group_dataset, tmp_path):
    # C this small zeroes every l1 weight: each head predicts by its intercepts alone, so every C scores alike.
    result, stages = _fit(tiny_group_dataset, "dfr", tmp_path, reference_epochs=1, c_grid="1e-6,1e-7", n_ensemble=2)
    note = result.info["selection_blind"]
    assert note.startswith("all 2 last-layer settings scored the same held-out worst-group accuracy")
    assert stages[-1].facts["selection_blind"] == note
    informative, _ = _fit(tiny_group_dataset, "dfr", tmp_path, reference_epochs=1, c_grid="1.0,1e-6", n_ensemble=2)
    assert "selection_blind" not in informative.info


def test_dfr_fits_one_member_when_every_balanced_subsample_is_the_whole_set(monkeypatch):
    """On a group-balanced val every member's balanced subsample holds every row, so one fit stands for the
    ensemble; a skewed val still gets n_ensemble different subsamples."""
    import raybench.algorithms.dfr as dfr_module

    fits = []
    real = dfr_module.fit_l1_logistic
    monkeypatch.setattr(dfr_module, "fit_l1_logistic", lambda z, y, *a: fits.append(len(z)) or real(z, y, *a))
    rng = np.random.default_rng(0)
    z, y = rng.normal(size=(40, 3)), np.repeat([0, 1], 20)
    algorithm = DFR.__new__(DFR)
    algorithm.hparams, algorithm.context = DFR.Hparams(n_ensemble=4), type("C", (), {"task": type("T", (), {"n_outputs": 2})})()
    balanced = np.repeat([0, 1, 2, 3], 10)
    algorithm.fit_ensemble(z, y, balanced, {"c": 1.0}, 0)
    assert fits == [40]
    fits.clear()
    skewed = np.array([0] * 15 + [1] * 5 + [2] * 5 + [3] * 15)
    algorithm.fit_ensemble(z, y, skewed, {"c": 1.0}, 0)
    assert fits == [20] * 4
