"""Values far outside any sane range, and values of the wrong shape, are refused at load in one line (upper bounds
on every setting and flag); then the loaders are fuzzed: generated space files, benchmark grids and `--set`
values either load or end in ONE line with exit 2, no traceback, and nothing written.

Every command runs in-process from an empty working directory; none of them starts Ray: `space show` and
`benchmark --plan` never do, and a `sweep` or `benchmark` is only run on an input that `space show` or `--plan`
refused, with the step that would start Ray replaced by one that fails the test.
"""
from __future__ import annotations

import dataclasses
import subprocess
from pathlib import Path

import pytest
import yaml
from helpers.cli import cli, fail_on_reaching
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from raybench.algorithms import ALGORITHMS
from raybench.settings import FieldType, declared
from raybench.trainer import ConfigError, TrainConfig

pytestmark = pytest.mark.usefixtures("in_private_dirs")


@pytest.fixture(autouse=True)
def no_cluster_work(monkeypatch):
    """A sweep or benchmark that got past its load-time checks goes no further: nothing is written."""
    from raybench.commands import benchmark
    from raybench.sweep import runner

    fail_on_reaching(monkeypatch, (runner, "run_sweep"), (benchmark, "run_benchmark"))


_DATASETS: dict[tuple, object] = {}


@pytest.fixture(autouse=True)
def datasets_loaded_once(monkeypatch):
    """`space show` and `--plan` load their dataset on every call; the fuzzed inputs never change it, so each
    dataset is read once for the whole module (the commands only read it)."""
    import raybench.data

    load = raybench.data.load_dataset

    def cached(*args, **kwargs):
        key = (args, tuple(sorted(kwargs.items())))
        if key not in _DATASETS:
            _DATASETS[key] = load(*args, **kwargs)
        return _DATASETS[key]

    monkeypatch.setattr(raybench.data, "load_dataset", cached)


def refused_in_one_line(result: subprocess.CompletedProcess) -> str:
    """The error line of a command that must have refused its input: exit 2, one line, no traceback."""
    assert result.returncode == 2, (result.returncode, result.stdout[-500:], result.stderr[-2000:])
    assert "Traceback" not in result.stderr, result.stderr[-2000:]
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("raybench: error: "), result.stderr[-2000:]
    return lines[0]


def refused_key(stderr: str) -> str:
    """The first part of the key an error names: "search" of "space.yaml: search.lr.high: ...", "--set"."""
    words = stderr.removeprefix("raybench: error: ").split(": ")
    key = words[1] if words[0].endswith(".yaml") and len(words) > 1 else words[0]
    return key.split(".")[0].split("[")[0].split()[0][:30] if key.strip() else "?"


def loaded_or_refused_in_one_line(result: subprocess.CompletedProcess) -> None:
    """Exit 0, or a one-line refusal; the refused key is a Hypothesis event (--hypothesis-show-statistics)."""
    event("loaded" if result.returncode == 0 else "refused at " + refused_key(result.stderr))
    if result.returncode == 0:
        assert "Traceback" not in result.stderr
        return
    refused_in_one_line(result)


# ----- every numeric setting has both ends ----------------------------------------------------------------
def numeric_fields() -> list[tuple[str, dataclasses.Field]]:
    classes = [TrainConfig] + [ALGORITHMS.get(name).Hparams for name in ALGORITHMS.names()]
    return [(cls.__name__, f) for cls in classes for f in dataclasses.fields(cls)
            if FieldType.of(f.type).kind in ("int", "float")]


def test_every_numeric_setting_declares_a_lower_and_an_upper_end():
    """A value past any real run (an lr of 1e58, 1e20 epochs, a seed past 2^32) is refused at load, through the
    field's own declaration; it is what `raybench list settings` shows."""
    open_ended = [f"{owner}.{f.name}" for owner, f in numeric_fields()
                  if declared(f).allowed is None or declared(f).allowed.low is None
                  or (declared(f).allowed.high is None and declared(f).allowed.limit is None)]
    assert open_ended == []


def test_the_settings_of_wilds_spuco_and_every_algorithms_defaults_are_inside_their_ranges():
    """The bounds refuse nothing real: every WILDS dataset's defaults and per-algorithm settings (SwAV's 4.8 lr,
    batch 4096), SpuCo's, and every algorithm's own defaults (DABS' pre-training, EIIL's 20,000 steps)."""
    from raybench.data.spuco import SPUCO_DEFAULTS
    from raybench.data.wilds.adapter import SPECS

    for name, defaults in [*((name, spec.defaults) for name, spec in SPECS.items()), ("spuco", SPUCO_DEFAULTS)]:
        flat = {key: getattr(defaults, key) for key in ("optimizer", "lr", "weight_decay", "momentum", "scheduler",
                                                        "batch_size", "unlabeled_ratio", "epochs", "grad_clip")
                if getattr(defaults, key) is not None}
        TrainConfig.from_flat({**flat, "batch_size": defaults.max_batch_size or defaults.batch_size})
        for algorithm, hparams in defaults.algorithm_hparams.items():
            TrainConfig.from_flat({"algorithm": algorithm, **hparams})
    for algorithm in ALGORITHMS.names():
        TrainConfig.from_flat({"algorithm": algorithm})


@pytest.mark.parametrize("key, value, expected", [
    ("lr", 1e58, "lr: expected a finite positive number, at most 10, got 1e+58"),
    ("epochs", 10**20, "epochs: expected an integer >= 1, at most 1,000,000, got 100000000000000000000"),
    ("seed", 2**32, "seed: expected an integer in [0, 2^32 - 1], got 4294967296"),
    ("data_seed", -1, "data_seed: expected an integer in [0, 2^32 - 1], got -1"),
    ("batch_size", 10**7, "batch_size: expected an integer >= 2, at most 1,000,000"),
    ("model", ["lenet"], "model: expected one value (str or none), got a list"),
    ("dataset", {"name": "digits-shift"}, "dataset: expected one value (str), got a dict"),
    ("hparams", "x", "hparams: expected a mapping of hyperparameters, got a str"),
])
def test_a_value_past_any_real_run_or_of_the_wrong_shape_is_a_config_error(key, value, expected):
    with pytest.raises(ConfigError) as refused:
        TrainConfig.from_flat({key: value})
    assert str(refused.value).startswith(expected)


# ----- the same through the command line, before any cluster work --------------------------------------------
BAD_FILES = [
    ("search:\n  lr: {distribution: loguniform, low: 1.0e-5, high: 1.0e+58}\n",
     "search.lr.high: expected a finite positive number, at most 10, got 1e+58"),
    ("search:\n  lr: {distribution: lr, decades: 9}\n",
     "search.lr.decades: expected a range whose ends are each a finite positive number, at most 10; on digits-shift"),
    ("search:\n  lr: {distribution: lr, decades: 1000}\n", "search.lr.decades: expected a number of size at most 10"),
    ("fixed:\n  epochs: 100000000000000000000\n", "fixed.epochs: expected an integer >= 1, at most 1,000,000"),
    ("search:\n  lr: {distribution: uniform, low: 0.001, high: 1" + "0" * 400 + "}\n",
     "search.lr.high: expected a finite number"),
    ("fixed:\n  model: [lenet]\n", "fixed.model: expected one value (str or none), got ['lenet']"),
    ("fixed:\n  optimizer: {name: adam}\n", "fixed.optimizer: expected one value (str or none)"),
    ("description: {a: 1}\n", "description: expected text, got {'a': 1}"),
    ("derived:\n  epochs: {rule: ratio_epochs, factor: 1.0e+9}\n", "derived.epochs.factor: expected a number of size"),
]


@pytest.mark.parametrize("body, message", BAD_FILES, ids=[m.split(":")[0] for _, m in BAD_FILES])
def test_a_space_value_past_any_real_run_is_one_line_before_any_cluster_work(body, message, capsys):
    Path("space.yaml").write_text("algorithm: erm\n" + body)
    for command in (["space", "show", "space.yaml"], ["sweep", "space.yaml"]):
        line = refused_in_one_line(cli(command, capsys))
        assert line.startswith(f"raybench: error: space.yaml: {message}"), line
    assert sorted(p.name for p in Path().iterdir()) == ["space.yaml"]  # no runs/, no mlflow.db


def test_an_algorithm_that_is_a_list_is_one_line(capsys):
    Path("space.yaml").write_text("algorithm: [erm]\n")
    line = refused_in_one_line(cli(["space", "show", "space.yaml"], capsys))
    assert line.startswith("raybench: error: space.yaml: algorithm: expected one of cb, coral"), line


@pytest.mark.parametrize("argv, message", [
    (["space", "show", "erm", "--set", "seed=4294967296"], "--set seed: expected an integer in [0, 2^32 - 1]"),
    (["space", "show", "erm", "--set", "epochs=1" + "0" * 20], "--set epochs: expected an integer >= 1, at most 1,000,000"),
    (["space", "show", "erm", "--set", "hparams=x"], "--set hparams: expected a mapping of hyperparameters"),
    (["sweep", "erm", "--set", "lr=1e58"], "--set lr: expected a finite positive number, at most 10, got 1e+58"),
    (["train", "--seed", "4294967296"], "--seed: expected an integer >= 0, at most 4,294,967,295, got 4294967296"),
    (["train", "--epochs", "1" + "0" * 20], "--epochs: expected an integer >= 1, at most 1,000,000"),
    (["sweep", "erm", "--trials", "1" + "0" * 400], "--trials: expected an integer >= 1, at most 1,000,000"),
    (["sweep", "erm", "--cpus-per-worker", "1e9"], "--cpus-per-worker: expected a finite number >= 0.01, at most 1,000,000"),
    (["sweep", "erm", "--worker-resource", "gpu_slot=1e300"], "--worker-resource: expected a finite number >= 0.0001, at most"),
    (["benchmark", "x.yaml", "--progress-every", "1e300"], "--progress-every: expected a finite number >= 1, at most"),
])
def test_a_flag_or_set_value_past_any_real_run_is_one_line_before_any_cluster_work(argv, message, capsys):
    line = refused_in_one_line(cli(argv, capsys))
    assert line.startswith(f"raybench: error: {message}"), line
    assert list(Path().iterdir()) == []


# ----- fuzzing the loaders ----------------------------------------------------------------------------------
# Inputs that are mostly well formed, each part hostile one time in four: a generator of junk alone would be
# refused at its first key every time, and never reach the checks that bind a space to its dataset.
FUZZ = settings(max_examples=30, deadline=None, derandomize=True, database=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow,
                                       HealthCheck.data_too_large])


def mostly(sane: st.SearchStrategy, hostile: st.SearchStrategy) -> st.SearchStrategy:
    return st.integers(0, 3).flatmap(lambda roll: hostile if roll == 0 else sane)


HOSTILE_NUMBERS = st.one_of(
    st.sampled_from([0, -1, 1e58, 10**20, 2**32, 10**400, 1e308, -1e308]),
    st.integers(min_value=-(10**30), max_value=10**30),
    st.floats(allow_nan=True, allow_infinity=True),
)
SCALARS = st.one_of(st.none(), st.booleans(), HOSTILE_NUMBERS, st.text(max_size=12))
VALUES = st.recursive(SCALARS, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner,
                                                                                            max_size=3), max_leaves=6)
NUMBERS = mostly(st.sampled_from([1e-4, 1e-3, 0.01, 0.1, 0.5, 0.7, 0.9, 1, 2, 3, 4, 8, 10, 64]), HOSTILE_NUMBERS | VALUES)
SETTING_VALUES = mostly(st.one_of(NUMBERS, st.sampled_from(["lenet", "adam", "sgd", "cosine", True, None])), VALUES)
SETTING_NAMES = mostly(
    st.sampled_from(["lr", "weight_decay", "epochs", "batch_size", "patience", "grad_accum", "unlabeled_ratio",
                     "penalty", "threshold", "optimizer", "model", "seed", "data_seed", "input_size", "prefetch"]),
    st.sampled_from(["hparams", "dataset", "algorithm", "nope", "", "selection_metric", "stage_cache"]))
PARAMS = mostly(
    st.one_of(
        st.builds(lambda low, high: {"distribution": "loguniform", "low": low, "high": high}, NUMBERS, NUMBERS),
        st.builds(lambda low, high: {"distribution": "uniform", "low": low, "high": high}, NUMBERS, NUMBERS),
        st.builds(lambda values: {"distribution": "choice", "values": values}, st.lists(SETTING_VALUES, max_size=3)),
        st.builds(lambda decades: {"distribution": "lr", "decades": decades}, NUMBERS),
        st.just({"distribution": "lr"})),
    st.fixed_dictionaries({"distribution": VALUES}, optional={"low": VALUES, "values": VALUES, "scale": VALUES}) | VALUES)
DERIVED = mostly(st.builds(lambda rule, factor: {"rule": rule, "factor": factor},
                           st.sampled_from(["ratio_epochs", "max_batch_size"]), NUMBERS), VALUES)
SECTION = {"search": st.dictionaries(SETTING_NAMES, PARAMS, max_size=2),
           "fixed": st.dictionaries(SETTING_NAMES, SETTING_VALUES, max_size=2),
           "derived": st.dictionaries(st.sampled_from(["epochs", "batch_size"]) | SETTING_NAMES, DERIVED, max_size=1)}
SPACES = mostly(
    st.fixed_dictionaries(
        {"algorithm": mostly(st.sampled_from(["erm", "dann", "coral", "fixmatch"]), VALUES)},
        optional={**SECTION, "description": mostly(st.text(max_size=20), VALUES),
                  "datasets": st.dictionaries(mostly(st.just("digits-shift"), st.text(max_size=8)),
                                              mostly(st.fixed_dictionaries({}, optional=SECTION), VALUES),
                                              max_size=1)}),
    VALUES)


def write_yaml(path: Path, body: object) -> Path:
    path.write_text(yaml.safe_dump(body, allow_unicode=True))
    return path


@FUZZ
@given(body=SPACES)
def test_a_generated_space_file_loads_or_is_one_line_and_writes_nothing(body, capsys):
    space = write_yaml(Path("space.yaml"), body)
    shown = cli(["space", "show", str(space)], capsys)
    loaded_or_refused_in_one_line(shown)
    if shown.returncode == 2:  # what `space show` refuses, a sweep refuses before any cluster work
        refused_in_one_line(cli(["sweep", str(space), "--storage", "runs"], capsys))
    assert sorted(p.name for p in Path().iterdir()) == ["space.yaml"]


COUNTS = mostly(st.sampled_from([1, 2, 3]), st.sampled_from([0, -1, 10**7, 2**32, 10**400]) | VALUES)
BLOCKS = mostly(st.fixed_dictionaries({
    "datasets": mostly(st.just(["digits-shift"]), st.lists(st.sampled_from(["digits-shift", "nope"]) | VALUES, max_size=2)),
    "spaces": mostly(st.lists(st.sampled_from(["erm", "dann", "coral", "fixmatch"]), min_size=1, max_size=2, unique=True),
                     st.lists(st.sampled_from(["erm", "nope", "x.yaml", "../erm.yaml"]) | VALUES, max_size=2))}), VALUES)
GRIDS = mostly(
    st.fixed_dictionaries(
        {"name": mostly(st.just("b"), st.sampled_from(["../up", "", "a/b"]) | VALUES),
         "grid": mostly(st.lists(BLOCKS, min_size=1, max_size=1), st.lists(BLOCKS | VALUES, max_size=2) | VALUES)},
        optional={"selection": mostly(st.sampled_from(["ood_val", "id_val", "oracle"]), VALUES), "trials": COUNTS,
                  "replicates": COUNTS, "seed": COUNTS, "max_concurrent_trials": COUNTS, "sweeps_at_once": COUNTS,
                  "executor": mostly(st.sampled_from(["train", "function"]), VALUES),
                  "smoke": mostly(st.booleans(), VALUES), "description": mostly(st.text(max_size=20), VALUES),
                  "set": st.dictionaries(SETTING_NAMES, SETTING_VALUES, max_size=2), "exclude": VALUES,
                  "pairs": VALUES}),
    VALUES)


@FUZZ
@given(body=GRIDS)
def test_a_generated_benchmark_grid_plans_or_is_one_line_and_writes_nothing(body, capsys):
    grid = write_yaml(Path("grid.yaml"), body)
    planned = cli(["benchmark", str(grid), "--plan"], capsys)
    loaded_or_refused_in_one_line(planned)
    if planned.returncode == 2:  # what --plan refuses, the run refuses before any cluster work
        refused_in_one_line(cli(["benchmark", str(grid), "--storage", "runs"], capsys))
    assert sorted(p.name for p in Path().iterdir()) == ["grid.yaml"]


SET_TEXT = st.one_of(
    st.sampled_from(["1e58", "1e20", "4294967296", "-1", "0", "nan", "inf", "1" + "0" * 400, "none", "true", "[1, 2]",
                     "{a: 1}", "lenet", "cpu", "adam", "", "=", "1.5", "0.01", "3", "64"]),
    st.integers().map(str), st.floats().map(repr), st.text(alphabet=st.characters(blacklist_characters="\x00"), max_size=12),
)


@FUZZ
@given(key=SETTING_NAMES, value=SET_TEXT)
def test_a_generated_set_value_is_taken_or_is_one_line_and_writes_nothing(key, value, capsys):
    shown = cli(["space", "show", "erm", "--set", f"{key}={value}"], capsys)
    loaded_or_refused_in_one_line(shown)
    if shown.returncode == 2:
        refused_in_one_line(cli(["sweep", "erm", "--set", f"{key}={value}", "--storage", "runs"], capsys))
    assert list(Path().iterdir()) == []
