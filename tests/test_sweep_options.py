"""Sweep options resolved before Ray starts: selection strategies, smoke sizing, refusals with one clear line."""
from __future__ import annotations

import pytest

from raybench.cli import main
from raybench.data import load_dataset
from raybench.sweep.runner import SweepExists, SweepOptions, prepare
from raybench.sweep.selection import SELECTIONS


@pytest.fixture(autouse=True)
def private_dirs(tmp_path, shared_data_dir, monkeypatch):
    monkeypatch.setenv("RAYBENCH_DATA_DIR", str(shared_data_dir))
    monkeypatch.chdir(tmp_path)


@pytest.mark.parametrize("strategy, metric", [("ood_val", "val/acc"), ("id_val", "id_val/acc"), ("oracle", "test/acc")])
def test_selection_strategies_pick_their_split(strategy, metric, shared_data_dir):
    dataset = load_dataset("digits-shift", shared_data_dir)
    assert SELECTIONS.get(strategy).metric(dataset) == metric
    prepared = prepare(SweepOptions(space="erm", selection=strategy, storage="runs"))
    assert prepared.selection_metric == metric and prepared.space.fixed["selection_metric"] == metric
    assert ("ORACLE" in prepared.selection_label) == (strategy == "oracle")


def test_smoke_sizes_unless_told_otherwise():
    smoke = prepare(SweepOptions(space="erm", smoke=True, storage="runs"))
    assert (smoke.options.trials, smoke.options.replicates) == (2, 2)
    assert smoke.space.fixed["max_steps_per_epoch"] >= 1
    explicit = prepare(SweepOptions(space="erm", smoke=True, trials=3, replicates=0, storage="runs"))
    assert (explicit.options.trials, explicit.options.replicates) == (3, 0)
    full = prepare(SweepOptions(space="erm", storage="runs"))
    assert (full.options.trials, full.options.replicates) == (10, 3)


def test_a_set_value_beats_the_smoke_preset():
    smoke = prepare(SweepOptions(space="erm", smoke=True, storage="runs"))
    assert smoke.space.fixed["epochs"] == 2
    told = prepare(SweepOptions(space="erm", smoke=True, storage="runs", extra_fixed={"epochs": 1}))
    assert told.space.fixed["epochs"] == 1 and told.space.fixed["max_steps_per_epoch"] == smoke.space.fixed["max_steps_per_epoch"]


def test_an_existing_sweep_is_not_overwritten_without_resume(tmp_path):
    (tmp_path / "runs" / "mine-search").mkdir(parents=True)
    with pytest.raises(SweepExists, match="pass --resume"):
        prepare(SweepOptions(space="erm", name="mine", storage="runs"))
    assert prepare(SweepOptions(space="erm", name="mine", storage="runs", resume=True)).name == "mine"


@pytest.mark.parametrize(
    "argv, message",
    [
        (["sweep", "erm", "--set", "penalty=1"], "--set penalty: not a setting of the trainer nor a hyperparameter of 'erm'"),
        (["sweep", "erm", "--set", "lr=fast"], "--set lr: expected float, got 'fast'"),
        (["sweep", "erm", "--dataset", "nope"], "unknown dataset 'nope'; known: amazon, camelyon17"),
        (["sweep", "erm", "--trials", "0"], "--trials: expected an integer >= 1, got 0"),
        (["sweep", "erm", "--gpus-per-worker", "-1"], ("--gpus-per-worker: expected 0 (no GPU), a share of one GPU in "
                                                        "[0.01, 1] or a whole number of GPUs up to 1,000,000, got '-1'")),
        (["sweep", "erm", "--worker-resource", "raybench_worker"],
         "--worker-resource: expected NAME=AMOUNT, a custom resource such as raybench_worker=1, got 'raybench_worker'"),
        (["sweep", "erm", "--worker-resource", "CPU=1"], "--worker-resource: CPU is not a custom resource"),
        (["sweep", "erm", "--worker-resource", "raybench_worker=0"],
         "--worker-resource: expected a finite number >= 0.0001, got 0.0"),
        (["sweep", "erm", "--worker-resource", "a/b=1"], "--worker-resource: expected NAME=AMOUNT"),
    ],
)
def test_bad_sweep_input_gets_one_line_and_starts_nothing(argv, message, capsys, tmp_path):
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("raybench: error: ") and message in err and "\n" not in err
    assert not (tmp_path / "runs").exists() and not (tmp_path / "mlflow.db").exists()


def test_existing_sweep_refusal_on_the_command_line(tmp_path, capsys):
    (tmp_path / "runs" / "erm-digits-shift-seed0-search").mkdir(parents=True)
    assert main(["sweep", "erm"]) == 2
    assert "a sweep named 'erm-digits-shift-seed0' already exists" in capsys.readouterr().err


def test_set_on_the_command_line_wins_over_search_and_derivation():
    prepared = prepare(SweepOptions(space="dann", storage="runs", extra_fixed={"penalty": "0.5", "epochs": "2"}))
    assert "penalty" not in prepared.space.search and "epochs" not in prepared.space.derived
    config = prepared.space.materialize({"unlabeled_ratio": 15, "classifier_lr": 1e-3, "discriminator_lr": 1e-3})
    assert config["penalty"] == "0.5" and config["epochs"] == "2"


def test_the_searcher_does_not_hand_out_a_config_twice(tmp_path):
    """On a discrete grid a random sampler repeats itself; repeats are redrawn, and that survives a restore."""
    import optuna

    from raybench.report_keys import SELECTION_BEST as SEARCH_METRIC
    from raybench.sweep.ray_search import DistinctOptunaSearch

    grid = {"lr": optuna.distributions.CategoricalDistribution([0.1, 0.01, 0.001]),
            "weight_decay": optuna.distributions.CategoricalDistribution([0.0, 0.01])}

    def searcher() -> DistinctOptunaSearch:
        return DistinctOptunaSearch(space=grid, metric=SEARCH_METRIC, mode="max",
                                    sampler=optuna.samplers.RandomSampler(seed=0))

    first = searcher()
    drawn = [first.suggest(f"t{i}") for i in range(4)]
    assert len({tuple(sorted(d.items())) for d in drawn}) == 4
    first.save(str(tmp_path / "searcher.pkl"))
    restored = searcher()
    restored.restore(str(tmp_path / "searcher.pkl"))
    more = [restored.suggest(f"t{i}") for i in range(4, 6)]
    assert len({tuple(sorted(d.items())) for d in drawn + more}) == 6  # the whole grid, no repeat
    assert restored.suggest("t6") in drawn + more  # an exhausted grid still answers


def test_worker_resources_reach_every_workers_request():
    from raybench.cli import build_parser
    from raybench.sweep.ray_trial import Resources

    args = build_parser().parse_args(["sweep", "erm", "--worker-resource", "raybench_worker=1",
                                      "--worker-resource", "ssd=0.5"])
    requested = tuple(dict(args.worker_resource).items())
    assert Resources(cpus_per_worker=2, custom=requested).per_worker() == {"CPU": 2, "GPU": 0.0, "raybench_worker": 1.0,
                                                                          "ssd": 0.5}


def test_storage_without_file_locks_is_refused_before_ray(monkeypatch, capsys, tmp_path):
    """The stage cache locks on --storage from every node: a mount that refuses flock is one line, exit 2."""
    import errno
    import fcntl

    def no_locks(handle, operation):
        raise OSError(errno.ENOLCK, "No locks available")

    monkeypatch.setattr(fcntl, "flock", no_locks)
    assert main(["sweep", "erm", "--storage", str(tmp_path / "shared")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("raybench: error: --storage: file locks (flock) fail in ") and "No locks available" in err
    assert "\n" not in err and not (tmp_path / "shared").exists() and not (tmp_path / "mlflow.db").exists()


def test_a_custom_resource_no_node_offers_is_refused_naming_it(monkeypatch):
    """Tune would wait forever for a worker that asks for `raybench_worker` on a cluster with no worker node."""
    from raybench.sweep import ray_cluster
    from raybench.sweep.errors import ClusterError
    from raybench.sweep.ray_trial import Resources

    head = {"Alive": True, "Resources": {"CPU": 2.0, "trial_driver": 8.0}}
    worker = {"Alive": True, "Resources": {"CPU": 1.0, "raybench_worker": 1.0}}
    wanted = Resources(custom=(("raybench_worker", 1.0),))
    monkeypatch.setattr(ray_cluster.ray, "nodes", lambda: [head])
    with pytest.raises(ClusterError, match=r"1 CPU and 0 GPU and 1 raybench_worker, but the cluster's nodes have "
                                           r"2 CPU/0 GPU/0 raybench_worker"):
        ray_cluster.check_resources(wanted, "function", autoscaling=False)
    monkeypatch.setattr(ray_cluster.ray, "nodes", lambda: [head, worker])
    ray_cluster.check_resources(wanted, "function", autoscaling=False)  # worker-1 can take it
    monkeypatch.setattr(ray_cluster.ray, "nodes", lambda: [head, {**worker, "Alive": False}])
    with pytest.raises(ClusterError):  # a dead node offers nothing
        ray_cluster.check_resources(wanted, "function", autoscaling=False)
