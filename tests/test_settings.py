"""Settings declared on the dataclasses: ranges checked from the field metadata, `raybench list settings` and
`raybench space new` read from it, and a new space that loads, validates and sweeps."""
from __future__ import annotations

import dataclasses
import math
from typing import Any

import pytest

from raybench.algorithms import ALGORITHMS, Hparams
from raybench.cli import main
from raybench.data import load_dataset
from raybench.settings import (
    AT_LEAST_ONE,
    OPEN_FRACTION,
    POSITIVE,
    PROBABILITY,
    Allowed,
    FieldType,
    Suggest,
    allowed_text,
    declared,
    setting,
    settings_of,
)
from raybench.sweep.space import OWN_FLAGS, SEARCH_DIR, load_space
from raybench.trainer import ConfigError, TrainConfig

TRAINER_FIELDS = [f for f in dataclasses.fields(TrainConfig) if f.name != "hparams"]


def hparam_fields(name: str) -> list[dataclasses.Field]:
    return list(dataclasses.fields(ALGORITHMS.get(name).Hparams))


# ----- Allowed: the words and the check ----------------------------------------------------------
@pytest.mark.parametrize("allowed, kind, value, problem", [
    (POSITIVE, "float", -1.0, "expected a finite positive number, got -1.0"),
    (POSITIVE, "float", math.inf, "expected a finite positive number, got inf"),
    (AT_LEAST_ONE, "int", 0, "expected an integer >= 1, got 0"),
    (Allowed(low=2), "int", 1, "expected an integer >= 2, got 1"),
    (PROBABILITY, "float", 1.5, "expected a finite number in [0, 1], got 1.5"),
    (PROBABILITY, "float", math.nan, "expected a finite number in [0, 1], got nan"),
    (OPEN_FRACTION, "float", 1.0, "expected a finite number strictly between 0 and 1, got 1.0"),
    (Allowed(low=0, high=1, low_open=True), "float", 0.0, "expected a finite number in (0, 1], got 0.0"),
    (Allowed(high=3, high_open=True), "int", 3, "expected an integer < 3, got 3"),
    (Allowed(choices=("a", "b")), "str", "c", "expected one of a, b, got 'c'"),
    (Allowed(pattern=r"x+", words="one or more x"), "str", "xy", "expected one or more x, got 'xy'"),
])
def test_a_value_outside_its_range_is_named_with_what_was_expected(allowed, kind, value, problem):
    assert allowed.problem(value, kind) == problem


@pytest.mark.parametrize("allowed, kind, value", [
    (POSITIVE, "float", 1e-9), (AT_LEAST_ONE, "int", 1), (PROBABILITY, "float", 0.0), (PROBABILITY, "float", 1.0),
    (OPEN_FRACTION, "float", 0.5), (Allowed(low=0, high=1, low_open=True), "float", 1.0),
    (Allowed(choices=("a", "b")), "str", "b"), (Allowed(pattern=r"x+"), "str", "xxx"),
])
def test_a_value_within_its_range_has_no_problem(allowed, kind, value):
    assert allowed.problem(value, kind) is None


@dataclasses.dataclass
class Plain:
    flag: bool = True
    ratio: float = 0.5
    count: int = 3
    name: str = "x"
    maybe: int | None = None
    declared_one: float | None = setting(None, allowed=POSITIVE, suggest=Suggest.loguniform(0.1, 10), help="why")


def test_fields_without_metadata_get_the_range_their_type_implies():
    info = {s.name: s for s in settings_of(Plain)}
    assert [info[n].allowed for n in ("flag", "ratio", "count", "name", "maybe")] == [
        "true/false", "any finite number", "an integer", "text", "an integer, or none"]
    assert info["maybe"].type == "int or none" and info["maybe"].default is None
    declared_one = info["declared_one"]
    assert declared_one.allowed == "a finite positive number, at most 10, or none"  # its limit is listed too
    assert (declared_one.help, declared_one.owner) == ("why", "Plain")
    assert declared_one.suggest.as_space() == {"distribution": "loguniform", "low": 0.1, "high": 10}


# ----- the trainer's ranges come from its fields ---------------------------------------------------
@pytest.mark.parametrize("key, value, expected", [
    ("batch_size", 1, "an integer >= 2"),
    ("prefetch", -1, "an integer >= 0"),
    ("grad_clip", -1.0, "a finite number >= 0"),
    ("device", "tpu", "auto, cpu or cuda[:N]"),
    ("optimizer", "adagrad", "one of sgd, adam, adamw, lars"),
])
def test_a_trainer_value_outside_its_declared_range_is_a_config_error_on_its_key(key, value, expected):
    with pytest.raises(ConfigError) as refused:
        TrainConfig.from_flat({key: value})
    assert refused.value.key == key and refused.value.detail == f"expected {expected}, got {value!r}"
    field = next(f for f in TRAINER_FIELDS if f.name == key)
    assert allowed_text(field).startswith(expected)  # the words the error uses are the field's declaration


def outside_and_edges(allowed: Allowed, kind: str) -> tuple[list[Any], list[Any]]:
    """Values just outside the declared bounds, and the closed bounds themselves (allowed)."""
    step = 1 if kind == "int" else 0.5
    outside, edges = [], []
    if allowed.low is not None:
        outside.append(allowed.low if allowed.low_open else allowed.low - step)
        edges += [] if allowed.low_open else [allowed.low]
    if allowed.high is not None:
        outside.append(allowed.high if allowed.high_open else allowed.high + step)
        edges += [] if allowed.high_open else [allowed.high]
    cast = int if kind == "int" else float
    return [cast(v) for v in outside], [cast(v) for v in edges]


def bounded_fields(fields: list[dataclasses.Field]) -> list[tuple[str, Allowed, str]]:
    found = []
    for f in fields:
        allowed = declared(f).allowed
        if allowed is not None and (allowed.low is not None or allowed.high is not None):
            found.append((f.name, allowed, FieldType.of(f.type).kind))
    return found


TRAINER_BOUNDS = bounded_fields(TRAINER_FIELDS)


@pytest.mark.parametrize("name, allowed, kind", TRAINER_BOUNDS, ids=[name for name, _, _ in TRAINER_BOUNDS])
def test_every_declared_trainer_bound_is_what_validate_enforces(name, allowed, kind):
    outside, edges = outside_and_edges(allowed, kind)
    for value in outside:
        with pytest.raises(ConfigError) as refused:
            TrainConfig.from_flat({name: value})
        assert refused.value.key == name
    for value in edges:
        assert getattr(TrainConfig.from_flat({name: value}), name) == value


HPARAM_BOUNDS = [(algorithm, name, allowed, kind) for algorithm in ALGORITHMS.names()
                 for name, allowed, kind in bounded_fields(hparam_fields(algorithm))]


@pytest.mark.parametrize("algorithm, name, allowed, kind", HPARAM_BOUNDS,
                         ids=[f"{a}.{n}" for a, n, _, _ in HPARAM_BOUNDS])
def test_every_declared_hyperparameter_bound_is_enforced(algorithm, name, allowed, kind):
    """The metadata is the single source of truth: below (above) a declared bound is refused, on it is accepted."""
    outside, edges = outside_and_edges(allowed, kind)
    for value in outside:
        with pytest.raises(ConfigError) as refused:
            TrainConfig.from_flat({"algorithm": algorithm, name: value})
        assert refused.value.key == name, str(refused.value)
        with pytest.raises(ValueError, match=rf"^{name}: expected "):
            ALGORITHMS.get(algorithm).Hparams.from_dict({name: value}, algorithm)
    for value in edges:
        assert getattr(ALGORITHMS.get(algorithm).Hparams.from_dict({name: value}, algorithm), name) == value


def test_every_numeric_hyperparameter_declares_its_range():
    """A new int or float hyperparameter must say what it accepts; a seed too (numpy's seeds are 32-bit)."""
    unbounded = {(a, f.name) for a in ALGORITHMS.names() for f in hparam_fields(a)
                 if FieldType.of(f.type).kind in ("int", "float") and declared(f).allowed is None}
    assert unbounded == set()


def test_a_redeclared_field_keeps_its_bases_range():
    """A subclass that gives a field its own default (MLM's pretrain_lr, DFR's reference_epochs) must not loosen it."""
    for algorithm in ALGORITHMS.names():
        cls = ALGORITHMS.get(algorithm).Hparams
        for base in cls.__mro__[1:]:
            if not (dataclasses.is_dataclass(base) and issubclass(base, Hparams)):
                continue
            base_fields = {f.name: f for f in dataclasses.fields(base)}
            for f in dataclasses.fields(cls):
                if f.name in base_fields:
                    where = (cls.__name__, base.__name__, f.name)
                    assert declared(f).allowed == declared(base_fields[f.name]).allowed, where


# ----- raybench list settings ---------------------------------------------------------------------
def tables(text: str) -> dict[str, dict[str, str]]:
    """`list settings` output as {table title: {setting name: its whole row}}."""
    found: dict[str, dict[str, str]] = {}
    for block in text.strip().split("\n\n"):
        title, *rows = block.splitlines()
        if title.endswith(":"):
            found[title[:-1]] = {row.split()[0]: row for row in rows[1:]}
    return found


def trainer_table(found: dict[str, dict[str, str]]) -> dict[str, str]:
    return next(rows for title, rows in found.items() if title.startswith("trainer settings"))


def hparams_table(found: dict[str, dict[str, str]], algorithm: str) -> dict[str, str]:
    return next(rows for title, rows in found.items() if title.startswith(f"{algorithm} hyperparameters"))


def test_list_settings_shows_every_trainer_setting_and_every_algorithms_hyperparameters(capsys):
    assert main(["list", "settings"]) == 0
    found = tables(capsys.readouterr().out)
    trainer = trainer_table(found)
    assert set(trainer) == {f.name for f in TRAINER_FIELDS}
    for f in TRAINER_FIELDS:
        assert allowed_text(f) in trainer[f.name]
    for name in OWN_FLAGS:
        assert f"a sweep sets it: {OWN_FLAGS[name]}" in trainer[name]
    assert "a sweep sets it" not in trainer["lr"]
    for algorithm in ALGORITHMS.names():
        rows = hparams_table(found, algorithm)
        assert set(rows) == {f.name for f in hparam_fields(algorithm)}, algorithm
        for f in hparam_fields(algorithm):
            assert allowed_text(f) in rows[f.name] and (declared(f).help in rows[f.name]), (algorithm, f.name)


def test_list_settings_of_one_algorithm_shows_its_types_defaults_and_ranges(capsys):
    assert main(["list", "settings", "dann"]) == 0
    found = tables(capsys.readouterr().out)
    assert len(found) == 2 and set(hparams_table(found, "dann")) == {f.name for f in hparam_fields("dann")}
    assert hparams_table(found, "dann")["penalty"].split()[:3] == ["penalty", "float", "1.0"]
    assert "a finite positive number, at most 10, or none" in hparams_table(found, "dann")["classifier_lr"]
    assert trainer_table(found)["batch_size"].split()[:5] == ["batch_size", "int", "or", "none", "none"]


# ----- raybench space new -------------------------------------------------------------------------
@pytest.fixture(scope="module")
def datasets(shared_data_dir):
    loaded = {}

    def get(name: str):
        if name not in loaded:
            loaded[name] = load_dataset(name, shared_data_dir)
        return loaded[name]
    return get


def dataset_for(algorithm: str) -> str:
    """The dataset the algorithm's shipped space runs on (its `# Run:` line: spuco-digits for the group methods,
    text-shift for mlm), else digits-shift."""
    shipped = SEARCH_DIR / f"{algorithm}.yaml"
    words = shipped.read_text().splitlines()[0].split() if shipped.exists() else []
    return words[words.index("--dataset") + 1] if "--dataset" in words else "digits-shift"


@pytest.mark.parametrize("algorithm", ALGORITHMS.names())
def test_a_new_space_loads_and_validates_on_a_dataset_the_algorithm_runs_on(algorithm, datasets, tmp_path, capsys):
    path = tmp_path / f"{algorithm}.yaml"
    assert main(["space", "new", algorithm, "--output", str(path)]) == 0
    assert main(["space", "new", algorithm]) == 0
    assert capsys.readouterr().out == path.read_text()  # stdout and --output write the same file
    cls = ALGORITHMS.get(algorithm)
    dataset = datasets(dataset_for(algorithm))
    assert cls.inapplicable_reason(cls.Hparams(), dataset.task.kind, dataset.capabilities) is None
    space = load_space(str(path))
    resolved = space.for_dataset(dataset)

    settings = settings_of(cls.Hparams)
    expected_search = {name for name, wanted in (("lr", cls.trains_by_gradient), ("unlabeled_ratio", cls.uses_unlabeled))
                       if wanted}
    assert set(space.search) == expected_search | {s.name for s in settings if s.suggest}
    for s in settings:
        if s.suggest:
            param = space.search[s.name]
            assert (param.distribution, param.low, param.high, param.values) == (
                s.suggest.distribution, s.suggest.low, s.suggest.high, s.suggest.values)
        elif not s.per_dataset:
            assert s.name in space.fixed and space.fixed[s.name] == s.default, s.name
        else:  # the dataset's own value: written commented out, with its type, default and range
            assert s.name not in space.fixed and f"# {s.name}: " in path.read_text()
    for s in settings:
        assert f"{s.type}, default " in path.read_text() and s.allowed in path.read_text()
    assert ("epochs" in space.derived) == cls.uses_unlabeled
    assert ("batch_size" in space.derived) == cls.trains_by_gradient
    sampled = {n: p.values[0] if p.values else p.low for n, p in resolved.search.items()}
    config = TrainConfig.from_flat(resolved.materialize(sampled)).resolve(dataset)  # a trial config the trainer takes
    assert config.algorithm == algorithm


# A space `space new` writes runs as a smoke sweep: test_new_algorithm.py (for an algorithm the package gains).


# ----- bad input: one line, exit 2 -----------------------------------------------------------------
@pytest.mark.parametrize("argv, message", [
    (["space", "new", "nosuch"], "space new: unknown algorithm 'nosuch'; known: cb, coral, dann"),
    (["list", "settings", "nosuch"], "list settings: unknown algorithm 'nosuch'; known: cb, coral, dann"),
    (["list", "algorithms", "erm"], "list algorithms: expected no second argument"),
    (["space", "new"], "the following arguments are required: algorithm"),
])
def test_bad_names_are_one_line_and_exit_2(argv, message, capsys):
    assert main(argv) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.startswith(f"raybench: error: {message}")
    assert len(captured.err.strip().splitlines()) == 1


def test_an_existing_output_is_kept_unless_forced(tmp_path, capsys):
    existing = tmp_path / "mine.yaml"
    existing.write_text("algorithm: erm\n")
    assert main(["space", "new", "dann", "--output", str(existing)]) == 2
    err = capsys.readouterr().err
    assert err.strip() == (f"raybench: error: --output: expected a new file, got the existing {str(existing)!r} "
                           f"(--force overwrites it)")
    assert existing.read_text() == "algorithm: erm\n"
    assert main(["space", "new", "dann", "--output", str(existing), "--force"]) == 0
    assert load_space(str(existing)).algorithm == "dann"
    assert main(["space", "new", "dann", "--output", str(tmp_path)]) == 2
    assert "--output: expected a file name, got the directory" in capsys.readouterr().err


def test_a_settings_suggested_search_is_the_distribution_a_space_parses_from_it():
    """One distribution type: what `space new` writes from a setting's suggestion parses back, through the
    space loader, into a Param that is that same Distribution with a name (and plots on the same scale)."""
    from raybench.sweep.space import Param, _parse_param

    suggested = [(algorithm, s.name, s.suggest) for algorithm in ALGORITHMS.names()
                 for s in settings_of(ALGORITHMS.get(algorithm).Hparams) if s.suggest]
    assert len(suggested) >= 10
    for algorithm, name, suggest in suggested:
        param = _parse_param(name, suggest.as_space(), SEARCH_DIR / "new.yaml", f"search.{name}", algorithm)
        assert isinstance(param, Param) and isinstance(param, Suggest)
        assert dataclasses.replace(suggest) == Suggest(**{f.name: getattr(param, f.name)
                                                          for f in dataclasses.fields(Suggest)}), name
        assert param.scale == suggest.scale
