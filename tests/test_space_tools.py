"""`raybench space show` and `raybench space draw`: the resolved space and the exact configs a sweep runs.
Real sweeps' own draws are checked against `space draw` in test_sweep_e2e.py (DANN) and test_spuco_sweep.py (GB)."""
from __future__ import annotations

import json

import optuna
import pytest
from helpers.cli import cli, run_cli

from raybench.data import load_dataset
from raybench.sweep.authoring import describe, draw
from raybench.sweep.sampling import SAMPLERS, draw_configs, optuna_distribution
from raybench.sweep.space import load_space, sweep_space


@pytest.fixture(scope="module")
def digits(shared_data_dir):
    return load_dataset("digits-shift", shared_data_dir)


@pytest.fixture(scope="module")
def spuco(shared_data_dir):
    return load_dataset("spuco-digits", shared_data_dir)


def test_draws_are_what_the_sweeps_searcher_hands_out_repeats_and_redraws_included(spuco):
    """The sweep's DistinctOptunaSearch, asked 14 times on SpuCo's 12-config grid, against draw_configs."""
    from raybench.report_keys import SELECTION_BEST as SEARCH_METRIC
    from raybench.sweep.ray_search import DistinctOptunaSearch

    resolved = sweep_space(load_space("erm"), spuco, {})
    searcher = DistinctOptunaSearch(space={n: optuna_distribution(p) for n, p in resolved.search.items()},
                                    metric=SEARCH_METRIC, mode="max", sampler=SAMPLERS["random"](5))
    handed = [searcher.suggest(f"t{i}") for i in range(14)]
    assert draw_configs(resolved.search, 14, 5) == handed
    drawn = draw(resolved, 14, 5)
    assert len({json.dumps(t.sampled, sort_keys=True) for t in drawn[:12]}) == 12  # every grid point before a repeat
    assert [t.repeat_of is None for t in drawn] == [True] * 12 + [False] * 2
    assert all(drawn[t.repeat_of - 1].sampled == t.sampled for t in drawn[12:])


def test_draws_follow_optunas_random_sampler_and_carry_derived_epochs(digits):
    resolved = sweep_space(load_space("dann"), digits, {})
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=11), direction="maximize")
    expected = [study.ask({n: optuna_distribution(p) for n, p in resolved.search.items()}).params for _ in range(5)]
    drawn = draw(resolved, 5, 11)
    assert [t.sampled for t in drawn] == expected
    for trial in drawn:  # ceil(2 E / (k + 1)), E = 10
        assert trial.derived == {"epochs": -(-2 * 10 // (trial.sampled["unlabeled_ratio"] + 1))}


def test_a_set_value_leaves_the_search_and_changes_the_draws_as_in_a_sweep(digits):
    resolved = sweep_space(load_space("dann"), digits, {"penalty": 0.5, "epochs": 3})
    assert "penalty" not in resolved.search and "epochs" not in resolved.derived
    assert all("penalty" not in t.sampled and t.derived == {} for t in draw(resolved, 3, 0))


def test_show_lists_every_distribution_with_the_bounds_a_sweep_samples(digits, spuco):
    space = load_space("dann")
    resolved = sweep_space(space, digits, {})
    text = describe(space, resolved)
    assert f"lr centre r = {resolved.lr_center:.4g}" in text
    low, high = resolved.search["classifier_lr"].low, resolved.search["classifier_lr"].high
    assert f"log-uniform on [{low:.4g}, {high:.4g}]  (lr: r x 10^U(-1, 1))" in text
    assert "choice of 3, 7, 15" in text and "log-uniform on [0.1, 10]" in text
    assert "dataset overrides: fixed patience=4" in text and "5 (k=3), 3 (k=7), 2 (k=15)" in text
    grid = describe(load_space("erm"), sweep_space(load_space("erm"), spuco, {}))
    assert "choice of 0.01, 0.001, 0.0001" in grid and "lr centre" not in grid


def test_the_cli_draws_and_refuses_bad_input_in_one_line(tmp_path, sweep_env, digits, capsys):
    ok = cli(["space", "draw", "dann", "--trials", "3", "--seed", "2", "--format", "json"], capsys)
    assert ok.returncode == 0, ok.stderr
    resolved = sweep_space(load_space("dann"), digits, {})
    assert [t["sampled"] for t in json.loads(ok.stdout)] == draw_configs(resolved.search, 3, 2)
    shown = cli(["space", "show", "coral"], capsys)
    assert shown.returncode == 0 and "penalty" in shown.stdout
    assert "budget per trial" in shown.stdout and "NOT the protocol's budget" not in shown.stdout
    capped = cli(["space", "show", "fixmatch", "--set", "max_steps_per_epoch=150"], capsys).stdout
    rows = [line.split() for line in capped.splitlines() if line.strip().startswith(("3 ", "7 ", "15 "))]
    assert [(r[0], r[-1]) for r in rows] == [("3", "0.48"), ("7", "0.24"), ("15", "0.12")], capped
    assert "NOT the protocol's budget" in capped and "  max_steps_per_epoch    '150'" in capped  # as --set gave it
    jtt = cli(["space", "show", "jtt", "--dataset", "spuco-digits"], capsys).stdout
    assert "jtt: an epoch covers the upsampled set" in jtt and "jtt: an epoch" not in shown.stdout
    for args, expected in ((["space", "draw", "dann", "--set", "penalty=x"], "--set penalty: expected float"),
                           (["space", "show", "nope"], "nope.yaml: file: expected an existing YAML file"),
                           (["space", "draw", "erm", "--trials", "0"], "--trials")):
        bad = run_cli(args, sweep_env, tmp_path)
        assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1 and expected in bad.stderr, bad.stderr
