"""The NeWT-style task suite: its 45 tasks and clusters, its draws, its probe against scikit-learn, where its
features come from, its MLflow runs, and the `newt-suite` and `probe` commands."""
from __future__ import annotations

import contextlib
import dataclasses
import io
import json

import numpy as np
import pytest
import torch
from sklearn.model_selection import GridSearchCV, StratifiedKFold
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import Normalizer, StandardScaler
from sklearn.svm import LinearSVC

from raybench.cli import main
from raybench.data import Split, Task, TaskKind
from raybench.models import ModelSpec, build_model
from raybench.newt_suite import (
    STROKE_FAMILIES,
    Families,
    PairTask,
    SuiteSettings,
    domain_features,
    draw_task,
    probe_config,
    run_suite,
    suite_tasks,
)

CLUSTER_SIZES = {"loops-within": 6, "lines-within": 3, "curves-within": 3, "curves-vs-lines": 9,
                 "curves-vs-loops": 12, "lines-vs-loops": 12}
SMALL_GRID = "0.01,1,100"
# Five of the ten classes in two families: 10 tasks, so the synthetic suite costs a fifth of the full one.
FEW = Families({"low": (0, 1, 2), "high": (3, 4)})


# ----- a 10-class domain small enough to probe 45 times in a second ------------------------------------
@pytest.fixture(scope="module")
def ten_classes(tiny_dataset):
    """The tiny dataset with a 10-class `test` split: class c brightens 4x4 block c, under heavy noise so the
    probes are not all perfect."""
    g = torch.Generator().manual_seed(0)
    y = torch.arange(10).repeat_interleave(24)
    x = torch.randint(0, 160, (len(y), 3, 16, 16), generator=g)
    for c in range(10):
        row, col = divmod(c, 4)
        x[y == c, :, row * 4:(row + 1) * 4, col * 4:(col + 1) * 4] += 50
    domain = torch.zeros(len(y), dtype=torch.long)
    test = Split("test", x.clamp(0, 255).to(torch.uint8), y, domain, domain.clone())
    return dataclasses.replace(tiny_dataset, name="tiny10", task=Task(TaskKind.CLASSIFICATION, 10),
                               splits={**tiny_dataset.splits, "test": test})


def settings(**changes) -> SuiteSettings:
    return dataclasses.replace(SuiteSettings("tiny10", model="lenet", per_class=10, c_grid=SMALL_GRID), **changes)


@pytest.fixture(scope="module")
def suite(ten_classes):
    return run_suite(ten_classes, settings(), FEW)


def features(dataset, features_from: str = "random", seed: int = 0):
    return domain_features(dataset, probe_config(dataset, "lenet", features_from, seed, SMALL_GRID))


# ----- tasks, clusters, draws ------------------------------------------------------------------------------
def test_every_digit_pair_is_one_task_in_its_stroke_cluster():
    tasks = suite_tasks(STROKE_FAMILIES)
    assert [(t.first, t.second) for t in tasks] == [(a, b) for a in range(10) for b in range(a + 1, 10)]
    assert {c: sum(t.cluster == c for t in tasks) for c in CLUSTER_SIZES} == CLUSTER_SIZES
    by_name = {t.name: t.cluster for t in tasks}
    assert by_name["0-vs-8"] == "loops-within" and by_name["1-vs-7"] == "lines-within"
    assert by_name["3-vs-5"] == "curves-within" and by_name["1-vs-6"] == "lines-vs-loops"
    assert by_name["2-vs-9"] == "curves-vs-loops" and by_name["4-vs-5"] == "curves-vs-lines"


def test_a_draw_has_per_class_examples_of_each_class_and_disjoint_train_and_test():
    y = np.repeat(np.arange(10), 30)
    for per_class in (3, 15):
        draw = draw_task(PairTask(2, 7, "curves-vs-lines"), y, per_class, seed=4)
        for part in (draw.train, draw.test):
            assert np.bincount(y[part], minlength=10).tolist() == [0, 0, per_class, 0, 0, 0, 0, per_class, 0, 0]
        assert not set(draw.train) & set(draw.test)
    with pytest.raises(ValueError, match="per_class: expected at most 15"):
        draw_task(PairTask(2, 7, "curves-vs-lines"), y, 16, seed=4)


def test_draws_are_fixed_by_the_seed_and_the_pair():
    y = np.repeat(np.arange(10), 30)
    task = PairTask(0, 6, "loops-within")
    first, again = draw_task(task, y, 10, seed=1), draw_task(task, y, 10, seed=1)
    assert np.array_equal(first.train, again.train) and np.array_equal(first.test, again.test)
    assert not np.array_equal(first.train, draw_task(task, y, 10, seed=2).train)


def test_the_suite_is_deterministic_by_seed(ten_classes, suite):
    """Same seed, same everything (the seed's effect on the draws and the features is tested on each)."""
    assert run_suite(ten_classes, settings(), FEW).summary() == suite.summary()


# ----- the probe -----------------------------------------------------------------------------------------
def test_a_tasks_accuracy_is_scikit_learns_grid_search_on_the_same_features(ten_classes, suite):
    """NeWT's classifier written out independently, on the suite's features and the task's draw."""
    assert len(suite.tasks) == 10 and len({t.accuracy for t in suite.tasks}) > 3  # the probes are not all equal
    assert {t.cluster for t in suite.tasks} == {"low-within", "high-within", "high-vs-low"}
    domain = features(ten_classes)
    for record in (suite.tasks[0], suite.tasks[7]):
        draw = draw_task(PairTask(record.first, record.second, record.cluster), domain.y, 10, seed=0)
        pipeline = make_pipeline(StandardScaler(), Normalizer(), LinearSVC(dual=False, tol=1e-5, max_iter=1000))
        folds = StratifiedKFold(3, shuffle=True, random_state=0)
        search = GridSearchCV(pipeline, {"linearsvc__C": [0.01, 1.0, 100.0]}, cv=folds)
        search.fit(domain.z[draw.train], domain.y[draw.train])
        assert record.best_c == search.best_params_["linearsvc__C"]
        assert record.cv_accuracy == pytest.approx(search.best_score_)
        assert record.accuracy == pytest.approx(search.score(domain.z[draw.test], domain.y[draw.test]))
        assert (record.n_train, record.n_test) == (20, 20)
    across = [t.accuracy for t in suite.tasks if t.cluster == "high-vs-low"]
    assert len(across) == 6 and suite.cluster_means["high-vs-low"] == pytest.approx(np.mean(across))
    assert suite.overall_mean == pytest.approx(np.mean([t.accuracy for t in suite.tasks]))


# ----- where the features come from ------------------------------------------------------------------------
def test_random_features_reproduce_by_seed_and_a_checkpoint_replaces_them(ten_classes, tmp_path):
    random = features(ten_classes)
    assert random.z.shape == (240, 128) and random.source == "the model's own initialisation (seed 0)"
    assert np.array_equal(features(ten_classes).z, random.z)
    assert not np.allclose(features(ten_classes, seed=1).z, random.z)
    torch.manual_seed(123)
    source = build_model("lenet", ModelSpec(ten_classes.input_shape, 7))  # another head: only the featurizer counts
    torch.save(source.state_dict(), tmp_path / "best_model.pt")
    loaded = features(ten_classes, str(tmp_path))
    assert loaded.source == f"checkpoint {tmp_path / 'best_model.pt'}"
    source.eval()
    with torch.no_grad():
        expected = source.featurizer(ten_classes.views.plain(ten_classes.split("test").x)).double().numpy()
    np.testing.assert_allclose(loaded.z, expected, rtol=1e-5, atol=1e-6)
    assert not np.allclose(loaded.z, random.z)


# ----- the commands, on digits-shift -------------------------------------------------------------------------
@pytest.fixture(scope="module")
def data_env(shared_data_dir):
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("RAYBENCH_DATA_DIR", str(shared_data_dir))
        yield shared_data_dir


def run_cli(argv: list[str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(argv)
    return code, out.getvalue(), err.getvalue()


@pytest.fixture(scope="module")
def cli_suite(data_env, tmp_path_factory):
    uri = f"sqlite:///{tmp_path_factory.mktemp('newt-mlflow') / 'mlflow.db'}"
    code, out, err = run_cli(["newt-suite", "--dataset", "digits-shift", "--features-from", "random", "--seed", "2",
                              "--per-class", "8", "--c-grid", "1", "--tracking-uri", uri, "--experiment", "newt"])
    assert code == 0, err
    return uri, out


def test_newt_suite_prints_a_table_and_ends_in_one_json_line(cli_suite):
    _, out = cli_suite
    lines = out.strip().splitlines()
    summary = json.loads(lines[-1])
    assert summary["n_tasks"] == 45 == len(summary["tasks"]) and summary["model"] == "lenet"
    assert (summary["dataset"], summary["seed"], summary["per_class"]) == ("digits-shift", 2, 8)
    assert set(summary["cluster_means"]) == set(CLUSTER_SIZES)
    assert all(t["n_train"] == t["n_test"] == 16 and t["best_c"] == 1.0 for t in summary["tasks"])
    assert summary["overall_mean"] == pytest.approx(np.mean([t["accuracy"] for t in summary["tasks"]]))
    assert any(line.startswith("overall") and line.split()[1] == "45" for line in lines[:-1])
    assert any(line.startswith("loops-within") and f"{summary['cluster_means']['loops-within']:.4f}" in line
               for line in lines[:-1])


def test_mlflow_holds_one_parent_run_and_a_child_per_task(cli_suite):
    from mlflow.tracking import MlflowClient

    uri, out = cli_suite
    summary = json.loads(out.strip().splitlines()[-1])
    client = MlflowClient(tracking_uri=uri)
    experiment = client.get_experiment_by_name("newt").experiment_id
    (parent,) = client.search_runs([experiment], "tags.stage = 'newt_suite'")
    assert parent.info.run_id == summary["mlflow_run_id"] and parent.info.status == "FINISHED"
    assert parent.data.params["model"] == "lenet" and parent.data.params["features_from"] == "random"
    assert (parent.data.params["seed"], parent.data.params["per_class"]) == ("2", "8")
    assert parent.data.metrics["accuracy/overall"] == pytest.approx(summary["overall_mean"])
    for cluster, mean in summary["cluster_means"].items():
        assert parent.data.metrics[f"accuracy/{cluster}"] == pytest.approx(mean)
    children = client.search_runs([experiment], f"tags.`mlflow.parentRunId` = '{parent.info.run_id}'", max_results=100)
    assert len(children) == 45
    by_pair = {run.data.params["pair"]: run for run in children}
    for task in summary["tasks"]:
        run = by_pair[task["task"]]
        assert run.data.params["cluster"] == task["cluster"] and run.info.status == "FINISHED"
        assert run.data.metrics["accuracy"] == pytest.approx(task["accuracy"])
        assert run.data.metrics["best_c"] == 1.0
        assert run.data.metrics["cv_accuracy"] == pytest.approx(task["cv_accuracy"])


@pytest.mark.parametrize("argv, message", [
    (["--features-from", "/nonexistent/best_model.pt"],
     "--features-from: model checkpoint '/nonexistent/best_model.pt' does not exist"),
    (["--features-from", "random", "--per-class", "47"],
     "--per-class: expected an integer from 3 (the probe's folds) to 46 "),
    (["--features-from", "random", "--model", "vgg"], "--model: expected one of "),
    (["--features-from", "random", "--dataset", "spuco-digits"], "--dataset: expected one of digits-shift"),
])
def test_a_bad_suite_flag_is_one_line_and_exit_2(argv, message, data_env, tmp_path):
    code, out, err = run_cli(["newt-suite", *argv, "--tracking-uri", f"sqlite:///{tmp_path / 'm.db'}"])
    assert code == 2 and out == ""
    assert err.startswith(f"raybench: error: {message}") and len(err.strip().splitlines()) == 1


def test_probe_runs_newt_probe_on_a_checkpoint_and_ends_in_a_json_line(data_env, tmp_path):
    torch.manual_seed(5)
    source = build_model("lenet", ModelSpec((3, 16, 16), 10))
    torch.save(source.state_dict(), tmp_path / "best_model.pt")
    code, out, err = run_cli(["probe", str(tmp_path), "--dataset", "digits-shift", "--c-grid", "0.001", "--seed", "1"])
    assert code == 0, err
    summary = json.loads(out.strip().splitlines()[-1])
    assert (summary["algorithm"], summary["seed"]) == ("newt_probe", 1)
    assert summary["info"]["best_c"] == "0.001"
    assert summary["info"]["features_from"] == f"checkpoint {tmp_path / 'best_model.pt'}"
    assert 0.0 <= summary["best"]["test/acc"] <= 1.0
    code, _, err = run_cli(["probe", str(tmp_path / "missing"), "--dataset", "digits-shift"])
    assert code == 2 and err.startswith("raybench: error: checkpoint: model checkpoint ")


def test_the_suites_features_are_those_of_a_newt_probe_training_run(ten_classes):
    """No second pipeline: `raybench train --algorithm newt_probe` with the same settings ends with the very
    featurizer whose features the suite probes."""
    from raybench.trainer import Trainer

    config = probe_config(ten_classes, "lenet", "random", 3, "1")
    result = Trainer(config, dataset=ten_classes).fit()
    model = build_model("lenet", ModelSpec(ten_classes.input_shape, 10))
    model.featurizer.load_state_dict({k[len("featurizer."):]: v for k, v in result.final_state.items()
                                      if k.startswith("featurizer.")})
    model.eval()
    with torch.no_grad():
        expected = model.featurizer(ten_classes.views.plain(ten_classes.split("test").x)).double().numpy()
    np.testing.assert_allclose(domain_features(ten_classes, config).z, expected, rtol=1e-5, atol=1e-6)
