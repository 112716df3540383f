"""Search-space files: every shipped file loads; every malformed one fails with file, key, value and expectation."""
from __future__ import annotations

import math

import pytest

from raybench.algorithms import ALGORITHMS
from raybench.data import load_dataset
from raybench.sweep.space import SEARCH_DIR, SpaceError, load_space, trial_id

SHIPPED = sorted(p.stem for p in SEARCH_DIR.glob("*.yaml"))
VALID = """algorithm: dann
search:
  classifier_lr: {distribution: lr}
  unlabeled_ratio: {distribution: choice, values: [3, 7, 15]}
  penalty: {distribution: loguniform, low: 0.1, high: 10}
fixed:
  patience: 3
derived:
  epochs: {rule: ratio_epochs, factor: 2}
"""


@pytest.fixture(scope="module")
def digits(tmp_path_factory):
    return load_dataset("digits-shift", tmp_path_factory.mktemp("data"))


def test_the_paper_spaces_ship():
    assert set(SHIPPED) >= {"erm", "erm_aug", "coral", "dann", "pseudolabel", "fixmatch", "noisy_student"}
    assert set(SHIPPED) >= {"cb", "gb", "groupdro", "jtt", "eiil", "spare", "ssa", "dfr", "dispel"}  # SpuCo


def test_every_registered_algorithm_ships_its_search_space():
    """Adding an algorithm is its module and its raybench/search_spaces/NAME.yaml: a module alone is named here."""
    missing = [name for name in ALGORITHMS.names() if not (SEARCH_DIR / f"{name}.yaml").is_file()]
    assert not missing, f"algorithms without a search space in {SEARCH_DIR}: {', '.join(missing)}"


def test_every_algorithm_that_needs_a_datasets_settings_has_datasets_declaring_them(digits):
    """An algorithm whose values differ per dataset (SwAV's crops and pre-training budget, masked LM's) has them in the
    one place a dataset's defaults live, its `algorithm_hparams` (datasets.yaml, or the embedded dataset's module):
    an algorithm no dataset declares could run nowhere, and a declared name or value that the algorithm does not
    have would fail only when a run starts. Named here instead."""
    from raybench.data.wilds.adapter import SPECS

    declared = {"digits-shift": digits.defaults.algorithm_hparams,
                **{name: spec.defaults.algorithm_hparams for name, spec in SPECS.items()}}
    everywhere = {algorithm for hparams in declared.values() for algorithm in hparams}
    homeless = [name for name in ALGORITHMS.names() if ALGORITHMS.get(name).dataset_settings and name not in everywhere]
    assert not homeless, f"algorithms whose per-dataset settings no dataset declares: {', '.join(homeless)}"
    for dataset, hparams in declared.items():
        for algorithm, values in hparams.items():
            assert algorithm in ALGORITHMS, f"{dataset}: algorithm_hparams names no algorithm {algorithm!r}"
            ALGORITHMS.get(algorithm).Hparams.from_dict(dict(values), algorithm)  # names and ranges, or ValueError


@pytest.fixture(scope="module")
def datasets(tmp_path_factory, digits):
    """Datasets by name, each loaded once (digits-shift is already loaded)."""
    loaded = {"digits-shift": digits}
    data_dir = tmp_path_factory.mktemp("more-data")

    def get(name: str):
        if name not in loaded:
            loaded[name] = load_dataset(name, data_dir)
        return loaded[name]
    return get


def run_line_dataset(header: str) -> str:
    """The dataset a space's `# Run:` line names (digits-shift when it names none)."""
    words = header.splitlines()[0].split()
    return words[words.index("--dataset") + 1] if "--dataset" in words else "digits-shift"


@pytest.mark.parametrize("name", SHIPPED)
def test_every_shipped_space_loads_and_documents_how_to_run_it(name, datasets):
    text = (SEARCH_DIR / f"{name}.yaml").read_text()
    header = text.split("\nalgorithm:")[0]
    assert f"raybench sweep {name}" in header and "Runtime:" in header and "Expected:" in header
    space = load_space(name)
    cls = ALGORITHMS.get(space.algorithm)
    digits = datasets("digits-shift")
    refusal = cls.inapplicable_reason(cls.Hparams(), digits.task.kind, digits.capabilities)
    # Resolve on digits-shift; a method that refuses it (mlm: text only) on the dataset its Run line names.
    dataset = digits if refusal is None else datasets(run_line_dataset(header))
    assert cls.inapplicable_reason(cls.Hparams(), dataset.task.kind, dataset.capabilities) is None
    resolved = space.for_dataset(dataset)
    sampled = {n: p.values[-1] if p.values else p.high for n, p in resolved.search.items()}
    config = resolved.materialize(sampled)
    assert config["algorithm"] == space.algorithm and config["dataset"] == dataset.name


def test_lr_is_r_times_ten_to_u_minus_one_one(digits):
    resolved = load_space("erm").for_dataset(digits)
    lr = resolved.search["lr"]
    r = digits.defaults.lr
    assert lr.distribution == "loguniform" and lr.low == pytest.approx(r / 10) and lr.high == pytest.approx(10 * r)


def test_lr_center_scales_with_batch_and_accumulation(tmp_path, digits):
    path = tmp_path / "s.yaml"
    path.write_text("algorithm: erm\nsearch:\n  lr: {distribution: lr}\nfixed:\n  batch_size: 128\n  grad_accum: 4\n")
    resolved = load_space(str(path)).for_dataset(digits)
    assert resolved.lr_center == pytest.approx(digits.defaults.lr * 128 * 4 / digits.defaults.batch_size)


@pytest.mark.parametrize("k, epochs", [(3, 5), (7, 3), (15, 2)])
def test_epochs_keep_compute_constant_across_ratios(k, epochs, digits):
    resolved = load_space("dann").for_dataset(digits)
    assert resolved.materialize({"unlabeled_ratio": k})["epochs"] == epochs == math.ceil(2 * 10 / (k + 1))


def test_dataset_overrides_merge(tmp_path, digits):
    path = tmp_path / "s.yaml"
    path.write_text(VALID.replace("  patience: 3\n", "  grad_accum: 4\n  patience: 3\n")
                    + "datasets:\n  digits-shift:\n    fixed: {grad_accum: 2}\n    search:\n"
                      "      penalty: {distribution: uniform, low: 0.5, high: 2}\n")
    top = load_space(str(path))
    assert top.fixed["grad_accum"] == 4
    merged = top.for_dataset(digits)
    assert merged.fixed == {"grad_accum": 2, "patience": 3}  # the dataset's value replaces, the rest is kept
    assert merged.search["penalty"].distribution == "uniform" and "classifier_lr" in merged.search


def test_trial_id_is_a_content_hash():
    a = {"dataset": "d", "algorithm": "erm", "lr": 0.1}
    assert trial_id(a) == trial_id(dict(reversed(list(a.items()))))
    assert trial_id(a) != trial_id({**a, "lr": 0.2})
    assert trial_id(a) == trial_id({**a, "seed": 7})  # replicates share their config's identity


MALFORMED = [
    ("algorithm: nope\n", "algorithm", "'nope'", "one of cb, coral, dann"),
    ("- just\n- a list\n", "(top level)", "['just', 'a list']", "a mapping"),
    ("algorithm: erm\nsearh: {}\n", "searh", "{}", "one of the keys"),
    ("algorithm: erm\nsearch:\n  lr: {distribution: gaussian}\n", "search.lr.distribution", "'gaussian'", "one of loguniform"),
    ("algorithm: erm\nsearch:\n  lr: {distribution: loguniform, low: 0, high: 1}\n", "search.lr.low", "0.0", "a positive number (log-uniform)"),
    ("algorithm: erm\nsearch:\n  lr: {distribution: uniform, low: 0.5, high: 0.1}\n", "search.lr.high", "0.1", "a number greater than low"),
    ("algorithm: erm\nsearch:\n  lr: {distribution: uniform, low: a, high: 1}\n", "search.lr.low", "'a'", "a finite number"),
    ("algorithm: dann\nsearch:\n  unlabeled_ratio: {distribution: choice, values: []}\n", "search.unlabeled_ratio.values", "[]", "a non-empty list"),
    ("algorithm: dann\nsearch:\n  unlabeled_ratio: {distribution: choice, values: [3, 0]}\n", "search.unlabeled_ratio.values[1]", "0", "an integer >= 1"),
    ("algorithm: erm\nsearch:\n  penalty: {distribution: lr}\n", "search.penalty", "'penalty'", "a trainer setting or a hyperparameter of 'erm'"),
    ("algorithm: erm\nfixed:\n  batch_size: big\n", "fixed.batch_size", "'big'", "int"),
    ("algorithm: erm\nfixed:\n  augment: maybe\n", "fixed.augment", "'maybe'", "bool"),
    ("algorithm: erm\nfixed:\n  optimizer: adagrad\n", "fixed.optimizer", "'adagrad'", "one of sgd, adam, adamw"),
    ("algorithm: dann\nderived:\n  epochs: {rule: doubling}\n", "derived.epochs.rule", "'doubling'", "one of ratio_epochs"),
    ("algorithm: erm\nsearch:\n  lr: {distribution: lr}\nfixed:\n  lr: 0.1\n", "fixed.lr", "0.1", "no value, since 'lr' is also searched"),
    ("algorithm: erm\ndatasets:\n  digits-shift:\n    fixd: {}\n", "datasets.digits-shift.fixd", "{}", "one of the keys"),
    ("algorithm: erm\nsearch:\n  lr: {distribution: lr, decades: -1}\n", "search.lr.decades", "-1.0", "a positive number"),
    ("algorithm: erm\nsearch: [lr]\n", "search", "['lr']", "a mapping"),
    ("algorithm: erm\nsearch:\n  lr: {distribution: lr\n", "line 4", "", "valid YAML"),
]


@pytest.mark.parametrize("text, key, value, expected", MALFORMED, ids=[m[1] for m in MALFORMED])
def test_malformed_space_gets_one_clear_message(text, key, value, expected, tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(SpaceError) as info:
        load_space(str(path))
    message = str(info.value)
    assert message.startswith(f"{path}: {key}: expected ")
    assert expected in message and value in message
    assert "\n" not in message


def test_missing_file_lists_the_shipped_spaces(tmp_path):
    with pytest.raises(SpaceError, match="an existing YAML file or one of: cb, coral, dann"):
        load_space("nonexistent")


def test_bad_space_fails_on_the_command_line_before_ray_starts(tmp_path, capsys, monkeypatch):
    import sys

    from raybench.cli import main

    path = tmp_path / "bad.yaml"
    path.write_text("algorithm: erm\nsearch:\n  lr: {distribution: gaussian}\n")
    monkeypatch.chdir(tmp_path)
    assert main(["sweep", str(path), "--storage", str(tmp_path / "runs")]) == 2
    err = capsys.readouterr().err
    assert err.strip() == f"raybench: error: {path}: search.lr.distribution: expected one of loguniform, uniform, choice, lr, got 'gaussian'"
    assert "ray" not in sys.modules or not __import__("ray").is_initialized()
    assert not (tmp_path / "runs").exists() and not (tmp_path / "mlflow.db").exists()


SPUCO_SPACES = ["erm", "cb", "gb", "groupdro", "jtt", "eiil", "spare", "ssa", "dfr", "dispel"]


@pytest.fixture(scope="module")
def spuco(shared_data_dir):
    return load_dataset("spuco-digits", shared_data_dir)


@pytest.mark.parametrize("name", SPUCO_SPACES)
def test_spuco_spaces_resolve_to_valid_configs_on_spuco_digits(name, spuco):
    from raybench.trainer import TrainConfig

    resolved = load_space(name).for_dataset(spuco)
    for pick in (0, -1):  # both ends of every searched range
        sampled = {n: p.values[pick] if p.values else (p.low if pick == 0 else p.high) for n, p in resolved.search.items()}
        config = TrainConfig.from_flat(resolved.materialize(sampled)).resolve(spuco)
        assert config.selection_metric == "val/worst_group_acc" and config.model == "lenet5"
    if name == "erm":  # the SpuCo grid replaces WILDS' lr range on this dataset
        assert list(resolved.search["lr"].values) == [0.01, 0.001, 0.0001]
