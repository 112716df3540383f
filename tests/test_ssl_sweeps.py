"""SwAV, masked-LM and e-Mix sweeps, and a NeWT-probe sweep, on a real Ray with a SQLite MLflow: one pre-training per sweep, a nested run.

Each sweep runs as the `raybench` command (function executor, smoke settings) in a subprocess that joins the
session's Ray head; the test then
reads the MLflow store: every trial and replicate has a nested `pretrain` run (loss curve, settings, cache
key, hit or miss, the weights as an artifact), and exactly one of them trained.
"""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
from clusters import LocalHead
from helpers.cli import on_head, run_cli
from helpers.datasets import MINILM_FOLDER
from helpers.mlflow_stores import seeded_store
from mlflow.tracking import MlflowClient
from wilds_fixtures import write_all


def _sweep(space: str, dataset: str, sets: list[str], runs: tuple[int, int], workdir: Path, head: LocalHead) -> dict:
    uri = f"sqlite:///{workdir}/mlflow.db"
    args = ["sweep", space, "--dataset", dataset, "--smoke", "--trials", str(runs[0]), "--replicates", str(runs[1]), "--executor",
            "function", "--name", space, "--storage", str(workdir / "runs"), "--tracking-uri", uri]
    for setting in sets:
        args += ["--set", setting]
    proc = run_cli(on_head(args, head), head.env, workdir)
    assert proc.returncode == 0, proc.stderr[-4000:]
    summary = json.loads((workdir / "runs" / space / "results" / "summary.json").read_text())
    return {"dir": workdir, "client": MlflowClient(tracking_uri=uri), "summary": summary, "runs": sum(runs)}


@dataclasses.dataclass(frozen=True)
class Case:
    space: str
    dataset: str
    sets: tuple[str, ...]
    runs: tuple[int, int] = (2, 1)  # trials, replicates: runs that must share one pre-training
    wilds: bool = False  # a WILDS dataset, read from exact-format fixtures under the sweep's data_dir


# One sweep per pre-training family: SwAV (images), masked LM (text, on the real MiniLM) and e-Mix (DABS). Masked
# LM runs on civilcomments, where WILDS 2.0 ran it, from its exact-format fixture: text-shift would evaluate 3,500
# texts with MiniLM every epoch (its MLM path is trained in test_mlm.py). The WILDS datasets' acceptance of SwAV
# and masked LM is tested in-process in test_wilds_datasets.py. SwAV runs two trials at once, which race for the one
# pre-training; masked LM and e-Mix one trial and one replicate, whose pre-training crosses from search to replicates.
SMALL_MLM = ("pretrain_epochs=1", "pretrain_steps=2", "pretrain_batch_size=4", "pretrain_grad_accum=1", "batch_size=4",
             "eval_batch_size=16", f"model_weights={MINILM_FOLDER}")
CASES = {
    "swav-digits": Case("swav", "digits-shift", ("pretrain_epochs=2",)),
    "mlm-civilcomments": Case("mlm", "civilcomments", SMALL_MLM, runs=(1, 1), wilds=True),
    "emix-digits": Case("emix", "digits-shift", ("pretrain_epochs=1",), runs=(1, 1)),
}


@pytest.fixture(scope="module", params=list(CASES))
def ssl_sweep(request, tmp_path_factory, ray_head, empty_store):
    case, workdir = CASES[request.param], tmp_path_factory.mktemp(request.param)
    seeded_store(empty_store, workdir / "mlflow.db")
    sets = list(case.sets)
    if case.wilds:
        write_all(workdir / "data" / "wilds")
        sets.append(f"data_dir={workdir / 'data'}")
    return _sweep(case.space, case.dataset, sets, case.runs, workdir, ray_head)


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
def probe_sweep(tmp_path_factory, ray_head, empty_store):
    workdir = tmp_path_factory.mktemp("probe")
    seeded_store(empty_store, workdir / "mlflow.db")
    return _sweep("newt_probe", "digits-shift", ["c_grid=0.01,1"], (1, 2), workdir, ray_head)


def test_a_probe_sweep_records_each_runs_chosen_c_in_a_nested_probe_run(probe_sweep):
    trials = _runs(probe_sweep, "tags.stage = 'search'") + _runs(probe_sweep, "tags.stage = 'replicate'")
    assert len(trials) == probe_sweep["runs"]
    for trial in trials:
        (stage,) = _runs(probe_sweep, f"tags.`mlflow.parentRunId` = '{trial.info.run_id}'")
        assert stage.data.tags["raybench.method_stage"] == "probe"
        assert stage.data.metrics["final/best_c"] in (0.01, 1.0)
        assert 0.0 < stage.data.metrics["final/cv_accuracy"] <= 1.0
        assert set(eval(stage.data.params["cv_accuracy_by_c"])) == {"0.01", "1"}  # every C of the grid was scored
