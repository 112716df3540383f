"""The worked plug-in example, examples/raybench-vrex (docs/how-to/own-method.md): V-REx, colored-moons, their space.

Loading a plug-in registers its names for the rest of the process, and other modules of this suite, which may run
in the same pytest-xdist worker, look at every registered name (test_search_spaces.py: every registered algorithm
ships a search space; test_models.py: the set of models). So nothing here imports the plug-in into the pytest
process: every check that needs it runs in one child process, `python tests/test_example_plugin.py CHECK...`, which
loads it with `raybench.plugins.load` as `--plugin PATH` does and reports each check as one JSON line. Each test
below reads its check's line; the wheel test builds and installs the package and runs the command line.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import traceback
from collections.abc import Callable
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = REPO / "examples" / "raybench-vrex"
PLUGIN = EXAMPLE / "raybench_vrex"
CHILD_TIMEOUT_S = 600

# colored-moons as its module plans it (raybench_vrex/colored_moons.py), restated so that a change shows here
SPLIT_DOMAINS = {"train": {0, 1, 2}, "id_val": {0, 1, 2}, "id_test": {0, 1, 2}, "val": {3}, "test": {4},
                 "train_unlabeled": {0, 1, 2}, "val_unlabeled": {3}, "test_unlabeled": {4}}
COLOUR_AGREEMENT = (0.9, 0.8, 0.7, 0.3, 0.1)  # by domain id
LABEL_NOISE = 0.25


# ----- checks, run in the child process (the plug-in loaded) ---------------------------------------------------


def load_plugin():
    from raybench import plugins

    return plugins.load(plugins.PluginRef(str(PLUGIN), plugins.FLAG_SOURCE))


def check_registration(tmp: Path) -> None:
    """Loading the package folder as `--plugin PATH` registers the algorithm, dataset, model and space under the
    plug-in's name, and names its folder for Ray's runtime_env."""
    from raybench import plugins
    from raybench.algorithms import ALGORITHMS
    from raybench.data import DATASETS
    from raybench.models import MODELS
    from raybench.sweep.space_catalog import find_space

    plugin = load_plugin()  # loaded already (child_main): the same LoadedPlugin
    assert plugin.module == "raybench_vrex", plugin
    assert ALGORITHMS.origin("vrex") == "raybench_vrex"
    assert ALGORITHMS.get("vrex").__name__ == "VREx" and ALGORITHMS.get("vrex").name == "vrex"
    assert DATASETS.origin("colored-moons") == "raybench_vrex"
    assert MODELS.origin("moons_mlp") == "raybench_vrex"
    path, origin = find_space("vrex")
    assert path == PLUGIN / "spaces" / "vrex.yaml" and "raybench_vrex" in origin, (path, origin)
    assert plugins.runtime_env_modules() == [str(PLUGIN)]
    assert plugins.load(plugins.PluginRef(str(PLUGIN), plugins.FLAG_SOURCE)) is plugin  # loading twice: once


def check_builtins_keep_their_origin(tmp: Path) -> None:
    """The plug-in's import is the first to import raybench's registries (as under the command line, which loads
    plug-ins first): raybench's own names, registered then, stay raybench's."""
    from raybench.algorithms import ALGORITHMS
    from raybench.data import DATASETS
    from raybench.models import MODELS

    claimed = {f"{kind} {name}": registry.origin(name) for kind, registry in
               (("algorithm", ALGORITHMS), ("dataset", DATASETS), ("model", MODELS))
               for name in registry.names() if registry.origin(name) != "raybench"}
    assert set(claimed) == {"algorithm vrex", "dataset colored-moons", "model moons_mlp"}, claimed


def ce(logits: list[float], label: int) -> float:
    """Cross-entropy of one example by hand: log(sum_j exp(l_j)) - l_y."""
    import math

    return math.log(sum(math.exp(v) for v in logits)) - logits[label]


def domainbed_vrex_loss(minibatches, penalty_weight: float):
    """DomainBed's VREx.update loss, as written at b93c22a (domainbed/algorithms.py lines 758-772), on logits given
    per domain minibatch instead of a network's."""
    import torch
    import torch.nn.functional as F

    losses = torch.zeros(len(minibatches))
    for i, (logits, y) in enumerate(minibatches):
        nll = F.cross_entropy(logits, y)
        losses[i] = nll
    mean = losses.mean()
    penalty = ((losses - mean) ** 2).mean()
    return mean + penalty_weight * penalty


def logits_model():
    """A model whose outputs are its inputs: the batch's x are the logits."""
    from torch import nn

    from raybench.models import FeaturizerHead

    return FeaturizerHead(nn.Identity(), 2, 2, head=nn.Identity())


def vrex_on_logits(hparams: dict):
    from raybench.algorithms import AlgorithmContext, build_algorithm
    from raybench.data import Task, TaskKind, Views

    def same(x):  # the batch is already the logits
        return x

    context = AlgorithmContext(Task(TaskKind.CLASSIFICATION, 2), Views(same, same, same), n_domains=6, total_steps=10)
    return build_algorithm("vrex", logits_model(), hparams, context)


# Six examples in three domains of 1, 3 and 2 examples (ids 0, 2, 5: not 0..m-1), logits and labels.
HAND_BATCH = [([2.0, 0.0], 0, 0), ([0.5, 1.5], 0, 2), ([1.0, -1.0], 1, 2), ([0.0, 0.0], 1, 2),
              ([3.0, 1.0], 1, 5), ([-1.0, 2.0], 1, 5)]


def hand_batch():
    import torch

    from raybench.data import Batch

    x = torch.tensor([row[0] for row in HAND_BATCH])
    domain = torch.tensor([row[2] for row in HAND_BATCH])
    return Batch(x=x, y=torch.tensor([row[1] for row in HAND_BATCH]), domain=domain, group=domain.clone(),
                 index=torch.arange(len(HAND_BATCH)))


def check_loss_is_mean_risk_plus_lambda_times_biased_variance(tmp: Path) -> None:
    """loss = mean_e R_e + lambda * mean_e (R_e - mean R)^2 over the batch's domains, R_e each domain's mean CE;
    lambda = 1 before int(penalty_anneal_iters) steps, `penalty` from then on; equal to DomainBed's code."""
    import dataclasses

    import pytest
    import torch

    risks = []
    for d in (0, 2, 5):
        rows = [ce(logits, y) for logits, y, domain in HAND_BATCH if domain == d]
        risks.append(sum(rows) / len(rows))
    mean = sum(risks) / 3
    biased = sum((r - mean) ** 2 for r in risks) / 3
    unbiased = sum((r - mean) ** 2 for r in risks) / 2
    assert biased > 0.05  # the batch tells the two variances (and lambdas) apart

    algorithm = vrex_on_logits({"penalty": 7.0, "penalty_anneal_iters": 3.7})  # int(3.7): steps 0-2 at lambda 1
    batch = hand_batch()
    minibatches = [(batch.x[batch.domain == d], batch.y[batch.domain == d]) for d in (0, 2, 5)]
    for step, weight in ((0, 1.0), (2, 1.0), (3, 7.0), (50, 7.0)):
        out = algorithm(batch, None, step)
        assert out.loss.item() == pytest.approx(mean + weight * biased, rel=1e-6), step
        assert out.loss.item() != pytest.approx(mean + weight * unbiased, rel=1e-3), step
        assert out.loss.item() == pytest.approx(domainbed_vrex_loss(minibatches, weight).item(), rel=1e-6), step
        assert out.logs["loss/supervised"].item() == pytest.approx(mean, rel=1e-6)
        assert out.logs["vrex/penalty"].item() == pytest.approx(biased, rel=1e-6)
        assert out.logs["vrex/lambda"].item() == weight
    # the penalty is differentiated, not a logged constant: the gradient to the logits is the hand formula's
    x = batch.x.clone().requires_grad_(True)
    (grad,) = torch.autograd.grad(algorithm(dataclasses.replace(batch, x=x), None, 0).loss, x)
    hand_x = batch.x.clone().requires_grad_(True)
    per_example = torch.nn.functional.cross_entropy(hand_x, batch.y, reduction="none")
    per_domain = torch.stack([per_example[batch.domain == d].mean() for d in (0, 2, 5)])
    (hand,) = torch.autograd.grad(per_domain.mean() + ((per_domain - per_domain.mean()) ** 2).mean(), hand_x)
    assert torch.allclose(grad, hand, atol=1e-6)


def check_anneal_switches_at_int_of_the_anneal_steps(tmp: Path) -> None:
    """DomainBed: penalty_weight = vrex_lambda once update_count >= vrex_penalty_anneal_iters, else 1.0; its
    sampled anneal is int(10^U(0, 4)), so the step is the integer part of the setting."""

    def weights(anneal: float, steps: list[int]) -> list[float]:
        algorithm = vrex_on_logits({"penalty": 50.0, "penalty_anneal_iters": anneal})
        return [algorithm.penalty_weight(s) for s in steps]

    assert weights(500.0, [0, 499, 500, 501]) == [1.0, 1.0, 50.0, 50.0]
    assert weights(2.99, [0, 1, 2, 3]) == [1.0, 1.0, 50.0, 50.0]
    assert weights(0.0, [0, 1]) == [50.0, 50.0]  # no anneal: lambda from the first step
    assert weights(10.0, [9, 10])[0] == 1.0 and vrex_on_logits({}).penalty_weight(10_000) == 10.0  # default 1e1


def check_dataset_builds_deterministically_with_its_splits_and_domains(tmp: Path) -> None:
    """The same seed gives the same arrays, another seed others, global random state untouched; every WILDS split
    with the planned domains, sizes, dtypes, colour agreement and label noise."""
    import numpy as np
    import torch
    from sklearn.datasets import make_moons

    from raybench.data import LABELED_SPLITS, load_dataset

    torch_state, numpy_state = torch.get_rng_state(), np.random.get_state()
    first, again, other = (load_dataset("colored-moons", tmp, seed) for seed in (0, 0, 1))
    assert torch.equal(torch_state, torch.get_rng_state()) and np.array_equal(numpy_state[1], np.random.get_state()[1])
    assert set(first.splits) == set(SPLIT_DOMAINS)
    for name, split in first.splits.items():
        twin = again.splits[name]
        assert torch.equal(split.x, twin.x) and torch.equal(split.domain, twin.domain), name
        assert (split.y is None) == (name not in LABELED_SPLITS) and (split.y is None or torch.equal(split.y, twin.y))
        assert not torch.equal(split.x, other.splits[name].x), f"{name}: seed 1 drew the same points as seed 0"
        assert split.x.dtype == torch.float32 and split.x.shape == (len(split), 3), name
        assert set(split.domain.tolist()) == SPLIT_DOMAINS[name], name
        assert torch.equal(split.group, split.domain)
    assert first.domain_names == ("train-0.9", "train-0.8", "train-0.7", "ood-val-0.3", "ood-test-0.1")
    assert first.input_shape == (3,) and first.task.n_outputs == 2 and first.selection_metric == "val/acc"
    assert torch.bincount(first.splits["train"].domain).tolist() == [2000, 2000, 2000]
    assert first.defaults.model == "moons_mlp" and "strong_augmentation" not in first.capabilities
    for name in ("train", "val", "test"):
        split = first.splits[name]
        agrees = (split.x[:, 2] > 0).long() == split.y  # the colour's sign is 2y - 1 with probability p_d
        for d in SPLIT_DOMAINS[name]:
            rows = split.domain == d
            assert abs(agrees[rows].float().mean().item() - COLOUR_AGREEMENT[d]) < 0.05, (name, d)
    # The shape predicts the label as well in every training domain: at the moons' own accuracy through the label
    # noise, h (1 - noise) + (1 - h) noise, h that of the nearest-arc rule on clean moons.
    clean, moon = make_moons(20_000, noise=0.1, random_state=0)
    h = (nearest_arc(torch.tensor(clean, dtype=torch.float32)) == torch.tensor(moon)).float().mean().item()
    train = first.splits["train"]
    shape_agrees = (nearest_arc(train.x[:, :2] + torch.tensor([0.5, 0.25])) == train.y).float()
    assert abs(shape_agrees.mean().item() - (h * (1 - LABEL_NOISE) + (1 - h) * LABEL_NOISE)) < 0.025
    for d in SPLIT_DOMAINS["train"]:
        assert abs(shape_agrees[train.domain == d].mean().item() - shape_agrees.mean().item()) < 0.04, d


def nearest_arc(points):
    """make_moons' label of the arc nearer to each point: the upper unit circle about (0, 0) (0) or the lower one
    about (1, 0.5) (1)."""
    import torch

    upper = ((points - torch.tensor([0.0, 0.0])).norm(dim=1) - 1).abs()
    lower = ((points - torch.tensor([1.0, 0.5])).norm(dim=1) - 1).abs()
    return (lower < upper).long()


def check_conformance_through_the_suites_own_test(tmp: Path) -> None:
    """tests/test_algorithms.py's conformance test (init, begin_round, a few updates, predict; finite loss and a
    gradient reaching the featurizer), called on vrex with that module's own helpers and tiny dataset."""
    import test_algorithms
    from helpers.datasets import make_tiny_dataset

    test_algorithms.test_conformance_init_update_predict("vrex", make_tiny_dataset(), tmp)


def check_trains_through_the_trainer(tmp: Path) -> None:
    """A few epochs on colored-moons through raybench's Trainer: the trainer's step numbers drive the anneal, its
    sampler balances the domains, every reported number is finite."""
    import math

    import pytest
    import torch

    from raybench.data import load_dataset
    from raybench.trainer import TrainConfig, Trainer

    dataset = load_dataset("colored-moons", tmp, 0)
    config = TrainConfig.from_flat({"dataset": "colored-moons", "algorithm": "vrex", "epochs": 2, "device": "cpu",
                                    "max_steps_per_epoch": 5, "penalty": 4.0, "penalty_anneal_iters": 3})
    trainer = Trainer(config, dataset=dataset)
    result = trainer.fit()
    assert len(result.history) == 2
    # steps 0-4 in epoch 0 at lambda 1, 1, 1, 4, 4; steps 5-9 in epoch 1 at 4
    assert result.history[0]["train/vrex/lambda"] == pytest.approx((3 * 1.0 + 2 * 4.0) / 5)
    assert result.history[1]["train/vrex/lambda"] == pytest.approx(4.0)
    assert all(math.isfinite(v) for row in result.history for v in row.values())
    assert {"val/acc", "test/acc", "id_test/acc"} <= set(result.best_metrics)
    algorithm = trainer._new_algorithm()
    train = dataset.split("train")
    plan = algorithm.sampling(train)
    assert plan is not None and torch.equal(plan.balance_by, train.domain)
    unbalanced = TrainConfig.from_flat({"dataset": "colored-moons", "algorithm": "vrex", "balanced": False})
    assert Trainer(unbalanced, dataset=dataset)._new_algorithm().sampling(train) is None


def run_cli(argv: list[str]) -> tuple[int, str, str]:
    import contextlib
    import io

    from raybench.cli import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        status = main(argv)
    return status, out.getvalue(), err.getvalue()


def check_spaces_load_and_show_on_the_dataset(tmp: Path) -> None:
    """The plug-in's `vrex` space loads by name, `space show` validates it on colored-moons with DomainBed's ranges,
    its drawn configs resolve into trainer configs there; raybench's own `erm` space runs there on the dataset's
    defaults."""
    from raybench.data import load_dataset
    from raybench.sweep.authoring import draw
    from raybench.sweep.space import load_space, sweep_space
    from raybench.trainer import TrainConfig

    space = load_space("vrex")
    assert space.algorithm == "vrex" and space.path == PLUGIN / "spaces" / "vrex.yaml"
    assert set(space.search) == {"lr", "penalty", "penalty_anneal_iters"}
    assert (space.search["penalty"].low, space.search["penalty"].high) == (0.1, 1e5)
    assert (space.search["penalty_anneal_iters"].low, space.search["penalty_anneal_iters"].high) == (1, 1e4)

    status, out, err = run_cli(["space", "show", "vrex", "--dataset", "colored-moons"])
    assert status == 0, err
    assert "vrex on colored-moons" in out and "lr centre r = 0.001" in out, out
    assert "log-uniform on [0.0001, 0.01]" in out and "log-uniform on [1, 1e+04]" in out, out
    status, out, err = run_cli(["space", "show", "erm", "--dataset", "colored-moons"])
    assert status == 0, err
    assert "erm on colored-moons" in out and "log-uniform on [0.0001, 0.01]" in out, out

    dataset = load_dataset("colored-moons", tmp, 0)
    for name in ("vrex", "erm"):
        resolved = sweep_space(load_space(name), dataset, {})
        for trial in draw(resolved, 5, seed=0):
            config = TrainConfig.from_flat(resolved.materialize(trial.sampled)).resolve(dataset)
            assert config.model == "moons_mlp" and config.batch_size == 64, config


CHECKS: dict[str, Callable[[Path], None]] = {
    name.removeprefix("check_"): fn for name, fn in dict(globals()).items() if name.startswith("check_")}


def child_main(names: list[str]) -> int:
    """Load the plug-in first, as the command line does before anything else imports raybench's registries, then
    run the named checks in this process, one JSON line each: {"check", "ok", "error"}."""
    load_plugin()
    import torch

    torch.set_num_threads(1)
    for name in names:
        with tempfile.TemporaryDirectory(prefix=f"vrex-{name}-") as tmp:
            try:
                CHECKS[name](Path(tmp))
                report = {"check": name, "ok": True, "error": ""}
            except BaseException:  # noqa: BLE001  every failure is the check's report, the next check still runs
                report = {"check": name, "ok": False, "error": traceback.format_exc()}
        print("CHECK " + json.dumps(report), flush=True)
    return 0


# ----- the tests, in the pytest process (the plug-in never loaded here) ------------------------------------------


@pytest.fixture(scope="module")
def child_reports() -> dict[str, dict]:
    """Every check, run once in one child process."""
    env = {k: v for k, v in os.environ.items() if k != "RAYBENCH_PLUGINS"}
    done = subprocess.run([sys.executable, __file__, *CHECKS], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=CHILD_TIMEOUT_S)
    reports = {}
    for line in done.stdout.splitlines():
        if line.startswith("CHECK "):
            report = json.loads(line.removeprefix("CHECK "))
            reports[report["check"]] = report
    assert reports, f"the child reported nothing (exit {done.returncode}): {done.stderr[-4000:]}"
    return reports


def assert_passed(reports: dict[str, dict], name: str) -> None:
    report = reports.get(name)
    assert report is not None, f"check {name!r} did not report"
    assert report["ok"], report["error"]


def test_loading_the_plugin_registers_its_names_under_its_own(child_reports):
    assert_passed(child_reports, "registration")


def test_loading_the_plugin_leaves_raybenchs_own_names_raybenchs(child_reports):
    assert_passed(child_reports, "builtins_keep_their_origin")


def test_vrex_loss_is_domainbeds_mean_risk_plus_lambda_times_biased_variance(child_reports):
    assert_passed(child_reports, "loss_is_mean_risk_plus_lambda_times_biased_variance")


def test_vrex_lambda_is_one_until_the_anneal_step(child_reports):
    assert_passed(child_reports, "anneal_switches_at_int_of_the_anneal_steps")


def test_colored_moons_builds_deterministically_with_its_splits_and_domains(child_reports):
    assert_passed(child_reports, "dataset_builds_deterministically_with_its_splits_and_domains")


def test_vrex_passes_the_suites_conformance_test(child_reports):
    assert_passed(child_reports, "conformance_through_the_suites_own_test")


def test_vrex_trains_on_colored_moons_through_the_trainer(child_reports):
    assert_passed(child_reports, "trains_through_the_trainer")


def test_the_spaces_load_and_show_on_colored_moons(child_reports):
    assert_passed(child_reports, "spaces_load_and_show_on_the_dataset")


def test_the_wheel_ships_the_space_and_declares_the_entry_point(tmp_path):
    """Built and installed (into a folder of its own, never this environment), the package is found through its
    entry point alone: `raybench list algorithms` names vrex as the plug-in's, `list spaces` finds vrex.yaml in
    the installed copy."""
    source = tmp_path / "src"
    shutil.copytree(EXAMPLE, source, ignore=shutil.ignore_patterns("__pycache__", "build", "*.egg-info"))
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "--no-input"]
    built = subprocess.run([*pip, "wheel", "--no-build-isolation", "--no-deps", "--no-index", "-w",
                            str(tmp_path / "dist"), str(source)], capture_output=True, text=True, timeout=300)
    assert built.returncode == 0, built.stderr[-3000:]
    wheel = next((tmp_path / "dist").glob("raybench_vrex-*.whl"))
    target = tmp_path / "site"
    installed = subprocess.run([*pip, "install", "--no-deps", "--no-index", "--target", str(target), str(wheel)],
                               capture_output=True, text=True, timeout=300)
    assert installed.returncode == 0, installed.stderr[-3000:]
    env = {**{k: v for k, v in os.environ.items() if k != "RAYBENCH_PLUGINS"}, "PYTHONPATH": str(target)}

    def raybench(*args: str) -> str:
        done = subprocess.run([sys.executable, "-m", "raybench.cli", *args], cwd=tmp_path, env=env,
                              capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr[-3000:]
        return done.stdout

    rows = {line.split()[0]: line.split()[1:3] for line in raybench("list", "algorithms").splitlines() if line.strip()}
    assert rows.get("vrex") == ["plug-in", "raybench_vrex"], rows.get("vrex")
    spaces = {line.split()[0]: line for line in raybench("list", "spaces").splitlines() if line.strip()}
    assert str(target / "raybench_vrex" / "spaces" / "vrex.yaml") in spaces["vrex"], spaces.get("vrex")


if __name__ == "__main__":
    sys.exit(child_main(sys.argv[1:]))
