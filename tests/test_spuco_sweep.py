"""SpuCo methods as real sweeps: worst-group selection, per-group metrics, stages as nested MLflow runs.

One single-stage method (GB) and one multi-stage method (JTT) run as `raybench sweep` on spuco-digits, each on
its own SQLite MLflow store on the session's Ray head, through the function executor: the stages are the subject here, and
Ray Train's own path is exercised by the DANN smoke sweep (test_sweep_e2e.py).
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from clusters import LocalHead
from helpers.cli import cli, on_head, run_cli
from helpers.mlflow_stores import seeded_store
from mlflow.tracking import MlflowClient


def _sweep(space: str, workdir: Path, head: LocalHead, *extra: str) -> dict:
    uri = f"sqlite:///{workdir}/mlflow.db"
    proc = run_cli(on_head(["sweep", space, "--dataset", "spuco-digits", "--smoke", "--trials", "2", "--replicates", "1",
                            "--max-concurrent", "1", "--executor", "function", "--name", space, "--storage", str(workdir / "runs"),
                            "--tracking-uri", uri, *extra], head), head.env, workdir)
    assert proc.returncode == 0, proc.stderr[-4000:]
    summary = json.loads((workdir / "runs" / space / "results" / "summary.json").read_text())
    return {"dir": workdir, "client": MlflowClient(tracking_uri=uri), "summary": summary, "uri": uri, "env": head.env}


@pytest.fixture(scope="module")
def gb_sweep(tmp_path_factory, ray_head, empty_store):
    workdir = tmp_path_factory.mktemp("gb")
    seeded_store(empty_store, workdir / "mlflow.db")
    return _sweep("gb", workdir, ray_head)


@pytest.fixture(scope="module")
def jtt_sweep(tmp_path_factory, ray_head, empty_store):
    workdir = tmp_path_factory.mktemp("jtt")
    seeded_store(empty_store, workdir / "mlflow.db")
    # A smoke reference errs on most of the training set: at S_r = 800 each epoch would shuffle ~30 million indices.
    return _sweep("jtt", workdir, ray_head, "--set", "upsample=5")


def _runs(sweep: dict, filter_string: str) -> list:
    client = sweep["client"]
    experiment = client.get_experiment_by_name("raybench")
    return client.search_runs([experiment.experiment_id], filter_string)


@pytest.mark.parametrize("sweep_name", ["gb_sweep", "jtt_sweep"])
def test_selection_is_validation_worst_group_accuracy(sweep_name, request):
    summary = request.getfixturevalue(sweep_name)["summary"]
    assert summary["selection"]["metric"] == "val/worst_group_acc"
    ok = [t for t in summary["trials"] if t["status"] == "ok"]
    assert len(ok) == 2
    assert summary["selected"]["selection_value"] == max(t["selection_value"] for t in ok)
    for trial in ok:
        assert trial["selection_value"] == pytest.approx(trial["metrics"]["best/val/worst_group_acc"])
    table = summary["replicates"]["summary"]
    assert {"best/test/worst_group_acc", "best/test/avg_acc", "best/test/acc"} <= set(table)


def test_per_group_accuracy_is_logged_every_epoch(gb_sweep):
    trial = _runs(gb_sweep, "tags.stage = 'search'")[0]
    group_keys = [k for k in trial.data.metrics if k.startswith("ood_val/group_acc/")]  # MLflow's name of val/
    assert len(group_keys) == 25  # 5 classes x 5 colours
    history = gb_sweep["client"].get_metric_history(trial.info.run_id, group_keys[0])
    assert sorted(m.step for m in history) == [0, 1]


def test_single_stage_methods_have_no_stage_runs(gb_sweep):
    assert _runs(gb_sweep, "tags.stage = 'method_stage'") == []


def test_each_stage_is_a_nested_run_of_its_trial(jtt_sweep):
    trials = _runs(jtt_sweep, "tags.stage = 'search'") + _runs(jtt_sweep, "tags.stage = 'replicate'")
    assert len(trials) == 3
    for trial in trials:
        stages = _runs(jtt_sweep, f"tags.`mlflow.parentRunId` = '{trial.info.run_id}'")
        names = sorted(s.data.tags["raybench.method_stage"] for s in stages)
        assert names == ["infer_groups", "reference"]
        reference = next(s for s in stages if s.data.tags["raybench.method_stage"] == "reference")
        assert "final/ood_val/worst_group_acc" in reference.data.metrics
        assert reference.data.params["stage_key"] != "-"
        infer = next(s for s in stages if s.data.tags["raybench.method_stage"] == "infer_groups")
        assert "final/error_set_size" in infer.data.metrics


def test_references_are_trained_once_per_identity(jtt_sweep):
    summary = jtt_sweep["summary"]
    runs = summary["trials"] + summary["replicates"]["runs"]
    identities = {(r["sampled"]["reference_epochs"], r["seed"]) for r in runs}
    cache = jtt_sweep["dir"] / "runs" / "stage_cache"
    entries = [p for p in cache.iterdir() if p.is_dir()]
    assert len(entries) == len(identities)
    stage_runs = _runs(jtt_sweep, "tags.`raybench.method_stage` = 'reference'")
    trained = [r for r in stage_runs if r.data.tags["cached"] == "False"]
    assert len(trained) == len(identities)
    assert len({r.data.params["stage_key"] for r in stage_runs}) == len(identities)


def test_results_and_compare_call_spucos_splits_val_and_test_and_show_worst_group_and_average(gb_sweep):
    """SpuCo has one distribution: its val and test are not OOD, and its paper's table is worst-group and average
    accuracy on test."""
    def cli(*args: str) -> str:
        proc = run_cli([*args, "--tracking-uri", gb_sweep["uri"]], gb_sweep["env"], gb_sweep["dir"])
        assert proc.returncode == 0, proc.stderr
        return proc.stdout

    table = cli("results", "gb")
    assert "OOD" not in table and "selected on val worst-group acc" in table
    splits_table = table.split("\nhyperparameter importance")[0]  # the importance table follows it
    assert [line.split()[0] for line in splits_table.strip().splitlines()[-2:]] == ["test", "val"]
    compared = json.loads(cli("compare", "--format", "json"))
    assert [c["label"] for c in compared["tables"][0]["columns"]] == ["test worst-group acc", "test average acc"]
    cells = gb_sweep["summary"]["replicates"]["summary"]
    assert compared["rows"][0]["test/worst_group_acc.mean"] == cells["best/test/worst_group_acc"]["mean"]
    assert "OOD" not in cli("compare")


def test_space_draw_shows_exactly_the_grid_configs_the_sweep_ran(gb_sweep, capsys):
    proc = cli(["space", "draw", "gb", "--dataset", "spuco-digits", "--smoke", "--trials", "2", "--format", "json"], capsys)
    assert proc.returncode == 0, proc.stderr
    ran = sorted(gb_sweep["summary"]["trials"], key=lambda t: t["order"])
    assert [t["sampled"] for t in json.loads(proc.stdout)] == [t["sampled"] for t in ran]
