"""Transfer evaluations on a frozen featurizer: NeWT's probe equals scikit-learn's GridSearchCV, the featurizer
never moves, `features_from` loads exactly a checkpoint's featurizer, and both run end to end in the Trainer."""
from __future__ import annotations

import ast

import numpy as np
import pytest
import torch
from sklearn.datasets import load_digits
from sklearn.model_selection import GridSearchCV, StratifiedKFold
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import Normalizer, StandardScaler
from sklearn.svm import LinearSVC

from raybench.algorithms import AlgorithmContext, build_algorithm
from raybench.algorithms.frozen import FeatureMemo, featurizer_source
from raybench.algorithms.groups import parse_grid
from raybench.algorithms.linear_eval import LinearEval
from raybench.algorithms.newt_probe import NEWT_C_GRID, NeWTProbe, ProbeHead, fit_newt_probe, probe_weights
from raybench.models import FeaturizerHead, ModelSpec, build_model
from raybench.trainer import Callback, ConfigError, StageReport, TrainConfig, Trainer

METHODS = ["newt_probe", "linear_eval"]


def lenet(dataset, seed: int = 0, n_outputs: int | None = None) -> FeaturizerHead:
    torch.manual_seed(seed)
    return build_model("lenet", ModelSpec(dataset.input_shape, n_outputs or dataset.task.n_outputs))


def build(name: str, dataset, model: FeaturizerHead, **hparams):
    context = AlgorithmContext(dataset.task, dataset.views, dataset.n_domains, 100, dataset.n_groups)
    return build_algorithm(name, model, hparams, context)


def start(algorithm, dataset, tmp_path) -> dict[str, str]:
    """begin_round with the services a real trainer offers (its split, prediction and seed)."""
    config = TrainConfig.from_flat({"dataset": dataset.name, "algorithm": algorithm.name, "epochs": 1,
                                    "device": "cpu", "stage_cache": str(tmp_path / "stages")})
    return algorithm.begin_round(Trainer(config, dataset=dataset)._round_context(0))


def featurizer_state(model: FeaturizerHead) -> dict[str, torch.Tensor]:
    """Parameters and buffers (batch-norm statistics included) of the featurizer, copied."""
    return {k: v.detach().clone() for k, v in model.featurizer.state_dict().items()}


def assert_same_state(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert a.keys() == b.keys()
    assert all(torch.equal(a[k], b[k]) for k in a), [k for k in a if not torch.equal(a[k], b[k])]


def reference_search(z: np.ndarray, y: np.ndarray, grid: list[float], seed: int) -> GridSearchCV:
    """NeWT's classifier written out independently of raybench: scikit-learn's pipeline, same folds."""
    pipeline = make_pipeline(StandardScaler(), Normalizer(), LinearSVC(dual=False, tol=1e-5, max_iter=1000))
    folds = StratifiedKFold(3, shuffle=True, random_state=seed)
    return GridSearchCV(pipeline, {"linearsvc__C": grid}, cv=folds).fit(z, y)


def digits_task(kind: str) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, int]:
    """Fixed features (sklearn's 8x8 digits as 64 numbers), train/test rows, and the head's output count.
    Binary: digits 3 and 8 as classes 1 and 2 of 3 outputs, so class 0 never occurs in train."""
    x, y = load_digits(return_X_y=True)
    if kind == "binary":
        keep = np.isin(y, [3, 8])
        x, y = x[keep], np.where(y[keep] == 3, 1, 2)
        n_outputs = 3
    else:
        n_outputs = 10
    x = x.astype(np.float32).astype(np.float64)  # what the trainer's float32 features become
    return x[:240], y[:240], x[240:480], y[240:480], n_outputs


# ----- NeWT's probe against scikit-learn ------------------------------------------------------------------
@pytest.mark.parametrize("kind", ["multiclass", "binary"])
def test_newt_probe_equals_grid_search_cv_and_its_torch_head_the_decision_function(kind):
    z, y, z_test, y_test, n_outputs = digits_task(kind)
    grid = parse_grid(NEWT_C_GRID, "c_grid")
    reference = reference_search(z, y, grid, seed=7)
    probe = fit_newt_probe(z, y, grid, folds=3, seed=7)

    assert probe.best_c == reference.best_params_["linearsvc__C"] and probe.best_accuracy == reference.best_score_
    assert probe.cv_accuracy == pytest.approx(list(reference.cv_results_["mean_test_score"]), abs=0)
    expected = reference.predict(z_test)
    assert np.array_equal(probe.pipeline.predict(z_test), expected)
    assert probe.pipeline.score(z_test, y_test) == reference.score(z_test, y_test)

    head = ProbeHead(z.shape[1], n_outputs)
    head.set(probe_weights(probe.pipeline, n_outputs))
    logits = head(torch.from_numpy(z_test).float()).numpy()
    decision = reference.decision_function(z_test)
    if kind == "binary":  # one function f: the second class scores f, the first 0
        np.testing.assert_allclose(logits[:, 2] - logits[:, 1], decision, rtol=0, atol=1e-10)
        assert (logits[:, 0] < logits[:, 1:].min(axis=1)).all()  # a class absent from train never wins
    else:
        np.testing.assert_allclose(logits, decision, rtol=0, atol=1e-10)
    assert np.array_equal(logits.argmax(axis=1), expected)


def test_the_c_grid_is_a_hyperparameter(tiny_dataset, tmp_path):
    algorithm = build("newt_probe", tiny_dataset, lenet(tiny_dataset), c_grid="0.5,3")
    facts = start(algorithm, tiny_dataset, tmp_path)
    assert facts["best_c"] in {"0.5", "3"}
    assert set(ast.literal_eval(facts["cv_accuracy_by_c"])) == {"0.5", "3"}
    for bad, match in [("0,1", "c_grid: expected positive numbers"), ("a,b", "c_grid: expected comma-separated")]:
        with pytest.raises(ValueError, match=match):
            build("newt_probe", tiny_dataset, lenet(tiny_dataset), c_grid=bad)
    with pytest.raises(ValueError, match="folds: expected an integer >= 2"):
        build("newt_probe", tiny_dataset, lenet(tiny_dataset), folds=1)


def test_newt_probe_state_restores_the_whole_pipeline(tiny_dataset, tmp_path):
    """A resumed run rebuilds the algorithm and loads its state: standardisation included, outputs identical."""
    algorithm = build("newt_probe", tiny_dataset, lenet(tiny_dataset))
    start(algorithm, tiny_dataset, tmp_path)
    fresh = build("newt_probe", tiny_dataset, lenet(tiny_dataset, seed=1))
    fresh.load_state_dict(algorithm.state_dict())
    x = tiny_dataset.split("val").x
    algorithm.eval(), fresh.eval()
    assert torch.equal(fresh.predict(x), algorithm.predict(x))


# ----- the featurizer stays frozen -----------------------------------------------------------------------
def test_newt_probe_trains_nothing(tiny_dataset, tmp_path):
    algorithm = build("newt_probe", tiny_dataset, lenet(tiny_dataset))
    before = featurizer_state(algorithm.model)
    start(algorithm, tiny_dataset, tmp_path)
    assert isinstance(algorithm, NeWTProbe) and not algorithm.trains_by_gradient
    assert not any(p.requires_grad for p in algorithm.parameters())
    assert [p for group in algorithm.param_groups(0.1) for p in group["params"]] == []
    algorithm.train()
    out = algorithm(tiny_dataset.split("train").take(torch.arange(16)), None, 0)
    assert torch.isfinite(out.loss) and not out.loss.requires_grad
    assert not algorithm.model.featurizer.training
    assert_same_state(featurizer_state(algorithm.model), before)


def test_linear_eval_trains_the_head_and_never_the_featurizer(tiny_dataset, tmp_path):
    algorithm = build("linear_eval", tiny_dataset, lenet(tiny_dataset))
    start(algorithm, tiny_dataset, tmp_path)
    before, head_before = featurizer_state(algorithm.model), algorithm.model.head.weight.detach().clone()
    groups = algorithm.param_groups(1e-2)
    assert {id(p) for g in groups for p in g["params"]} == {id(p) for p in algorithm.model.head.parameters()}
    optimizer = torch.optim.Adam(groups)
    algorithm.train()
    train = tiny_dataset.split("train")
    for step in range(3):
        optimizer.zero_grad()
        out = algorithm(train.take(torch.arange(step * 32, (step + 1) * 32)), None, step)
        out.loss.backward()
        assert all(p.grad is None for p in algorithm.model.featurizer.parameters())
        optimizer.step()
    assert not algorithm.model.featurizer.training  # batch-norm statistics stay the frozen network's
    assert_same_state(featurizer_state(algorithm.model), before)
    assert not torch.equal(algorithm.model.head.weight, head_before)


# ----- where the featurizer comes from -------------------------------------------------------------------
@pytest.mark.parametrize("name", METHODS)
@pytest.mark.parametrize("layout", ["file", "trial folder", "stage folder"])
def test_features_from_loads_exactly_the_checkpoints_featurizer(name, layout, tiny_dataset, tmp_path):
    """Only the featurizer is taken: the source has another head (7 classes), which is ignored."""
    source = lenet(tiny_dataset, seed=123, n_outputs=7)
    file = {"file": tmp_path / "weights.pt", "trial folder": tmp_path / "best_model.pt",
            "stage folder": tmp_path / "model.pt"}[layout]
    torch.save(source.state_dict(), file)
    setting = str(file if layout == "file" else tmp_path)
    algorithm = build(name, tiny_dataset, lenet(tiny_dataset), features_from=setting)
    head_before = {k: v.clone() for k, v in algorithm.model.head.state_dict().items()}
    facts = start(algorithm, tiny_dataset, tmp_path)
    assert facts["features_from"] == f"checkpoint {file}"
    assert_same_state(featurizer_state(algorithm.model), featurizer_state(source))
    if name == "linear_eval":  # the head stays the model's own fresh one
        assert_same_state({k: v for k, v in algorithm.model.head.state_dict().items()}, head_before)


def test_features_from_random_keeps_the_seeded_initialisation(tiny_dataset, tmp_path):
    algorithm = build("linear_eval", tiny_dataset, lenet(tiny_dataset, seed=5))
    facts = start(algorithm, tiny_dataset, tmp_path)
    assert facts["features_from"] == "the model's own initialisation (seed 0)"
    assert_same_state(featurizer_state(algorithm.model), featurizer_state(lenet(tiny_dataset, seed=5)))


def test_unusable_features_from_is_one_line_naming_the_file(tiny_dataset, tmp_path):
    model = lenet(tiny_dataset)
    text = tmp_path / "notes.txt"
    text.write_text("not a checkpoint")
    foreign = tmp_path / "foreign.pt"
    torch.save({"encoder.weight": torch.zeros(3)}, foreign)
    cases = [(tmp_path / "missing.pt", "does not exist"), (tmp_path / "empty_folder", "does not exist"),
             (text, "not a readable torch file"), (foreign, "another architecture")]
    (tmp_path / "empty_folder").mkdir()
    for path, reason in cases:
        with pytest.raises(ConfigError) as caught:
            featurizer_source(model, str(path), seed=0)
        message = str(caught.value)
        assert message.startswith("features_from: ") and reason in message and "\n" not in message
        assert str(path) in message


# ----- end to end in the Trainer ---------------------------------------------------------------------------
def plain_features(model: FeaturizerHead, dataset, split: str) -> np.ndarray:
    model.eval()
    with torch.no_grad():
        return model.featurizer(dataset.views.plain(dataset.split(split).x)).double().numpy()


class StageRecorder(Callback):
    def __init__(self) -> None:
        self.stages: list[StageReport] = []

    def on_stage(self, report: StageReport) -> None:
        self.stages.append(report)


def test_newt_probe_trainer_run_reports_c_and_scores_the_pipeline(tiny_dataset):
    config = TrainConfig.from_flat({"dataset": "tiny", "algorithm": "newt_probe", "epochs": 3, "device": "cpu",
                                    "seed": 2})
    recorder = StageRecorder()
    result = Trainer(config, [recorder], dataset=tiny_dataset).fit()
    assert len(result.history) == 1  # fit in closed form, evaluated once
    featurizer = lenet(tiny_dataset)
    featurizer.featurizer.load_state_dict({k[len("featurizer."):]: v for k, v in result.final_state.items()
                                           if k.startswith("featurizer.")})
    z, y = plain_features(featurizer, tiny_dataset, "train"), tiny_dataset.split("train").y.numpy()
    reference = reference_search(z, y, parse_grid(NEWT_C_GRID, "c_grid"), seed=2)
    assert result.info["best_c"] == f"{reference.best_params_['linearsvc__C']:g}"
    (stage,) = recorder.stages  # the probe's own numbers, a nested MLflow run in a sweep
    assert stage.name == "probe" and stage.metrics["best_c"] == reference.best_params_["linearsvc__C"]
    assert stage.metrics["cv_accuracy"] == pytest.approx(reference.best_score_)
    for split in ("val", "test"):
        expected = reference.score(plain_features(featurizer, tiny_dataset, split), tiny_dataset.split(split).y.numpy())
        assert result.best_metrics[f"{split}/acc"] == pytest.approx(expected)


def test_a_saved_probe_is_the_whole_pipeline_and_never_loads_as_a_plain_model(tiny_dataset):
    """The best model carries the standardisation with the SVM, so it predicts exactly what the run scored,
    and a plain model (say, a Noisy Student teacher) refuses it instead of dropping the standardisation."""
    from raybench.checkpoints import load_state_dict_into
    from raybench.models.base import UnreadableWeightsError

    config = TrainConfig.from_flat({"dataset": "tiny", "algorithm": "newt_probe", "epochs": 1, "device": "cpu"})
    result = Trainer(config, dataset=tiny_dataset).fit()
    state = result.best_model.state_dict()
    assert {"head.mean", "head.scale", "head.weight", "head.bias"} <= set(state)
    test = tiny_dataset.split("test")
    result.best_model.eval()
    with torch.no_grad():
        predicted = result.best_model(tiny_dataset.views.plain(test.x)).argmax(1)
    assert (predicted == test.y).double().mean().item() == pytest.approx(result.best_metrics["test/acc"])
    with pytest.raises(UnreadableWeightsError):
        load_state_dict_into(lenet(tiny_dataset), state)


def test_linear_eval_trainer_run_moves_only_the_head(tiny_dataset, tmp_path):
    source = lenet(tiny_dataset, seed=9)
    torch.save(source.state_dict(), tmp_path / "best_model.pt")
    config = TrainConfig.from_flat({"dataset": "tiny", "algorithm": "linear_eval", "epochs": 2, "device": "cpu",
                                    "optimizer": "adam", "lr": 1e-3, "features_from": str(tmp_path)})
    result = Trainer(config, dataset=tiny_dataset).fit()
    assert len(result.history) == 2 and result.info["features_from"] == f"checkpoint {tmp_path / 'best_model.pt'}"
    final = {k[len("featurizer."):]: v for k, v in result.final_state.items() if k.startswith("featurizer.")}
    assert_same_state(final, featurizer_state(source))
    assert not torch.equal(result.final_state["head.weight"], source.head.weight)


def test_a_missing_features_from_stops_the_trainer_with_one_line(tiny_dataset, tmp_path):
    config = TrainConfig.from_flat({"dataset": "tiny", "algorithm": "linear_eval", "epochs": 1, "device": "cpu",
                                    "features_from": str(tmp_path / "nope")})
    with pytest.raises(ConfigError, match=r"^features_from: model checkpoint .*nope.* does not exist"):
        Trainer(config, dataset=tiny_dataset).fit()


def test_both_are_registered():
    assert NeWTProbe.name == "newt_probe" and LinearEval.name == "linear_eval"


# ----- each input is encoded once per run ------------------------------------------------------------------
def test_the_feature_memo_encodes_only_unseen_rows_and_keeps_within_its_budget():
    torch.manual_seed(0)
    weight = torch.randn(6, 3)
    calls: list[int] = []

    def encode(x):
        calls.append(len(x))
        return (x if isinstance(x, torch.Tensor) else torch.tensor([[float(len(s))] * 6 for s in x])) @ weight

    memo = FeatureMemo()
    x = torch.randn(5, 6)
    torch.testing.assert_close(memo(x, encode), x @ weight)
    mixed = torch.cat([x[3:], torch.randn(2, 6), x[:1]])  # two seen, two new, one seen again
    torch.testing.assert_close(memo(mixed, encode), mixed @ weight)
    assert calls == [5, 2] and memo.encoded_rows == 7
    texts = ["a cat", "dog", "a cat"]  # a repeated input in one batch is encoded once
    assert memo(texts, encode).shape == (3, 3) and calls[-1] == 2
    memo(texts, encode)
    assert calls[-1] == 2 and len(calls) == 3
    small = FeatureMemo(max_bytes=2 * 3 * 4)  # room for two float32 rows
    small(x, encode), small(x, encode)
    assert calls[-2:] == [5, 3] and small.kept_bytes == 24  # past the budget rows are encoded, not kept
    memo.clear()
    memo(x, encode)
    assert calls[-1] == 5


def test_linear_evaluation_encodes_each_input_once_per_run_and_scores_the_model_it_saves(tiny_dataset, monkeypatch):
    """A 3-epoch linear evaluation runs its frozen featurizer over exactly the rows a 1-epoch one does (the
    train split and the evaluation splits, once), and the saved model predicts what the run scored."""
    featurizer_type = type(lenet(tiny_dataset).featurizer)
    encoded: list[int] = []
    original = featurizer_type.forward

    def counted(self, x):
        encoded.append(len(x))
        return original(self, x)

    monkeypatch.setattr(featurizer_type, "forward", counted)
    rows = {}
    for epochs in (1, 3):
        encoded.clear()
        config = TrainConfig.from_flat({"dataset": "tiny", "algorithm": "linear_eval", "epochs": epochs,
                                        "patience": epochs, "device": "cpu", "optimizer": "adam", "lr": 1e-2})
        result = Trainer(config, dataset=tiny_dataset).fit()
        rows[epochs] = sum(encoded)
    monkeypatch.setattr(featurizer_type, "forward", original)
    assert len(result.history) == 3 and rows[3] == rows[1] > len(tiny_dataset.split("train"))
    test = tiny_dataset.split("test")
    result.best_model.eval()
    with torch.no_grad():
        predicted = result.best_model(tiny_dataset.views.plain(test.x)).argmax(1)
    assert (predicted == test.y).double().mean().item() == pytest.approx(result.best_metrics["test/acc"])
