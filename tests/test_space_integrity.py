"""A search-space file (and a benchmark grid) may say only what a sweep can run as written: refused at load, in one
line naming the file, the place and what was expected, exit 2, before any cluster work and with nothing written.

Five classes of input, each tried through the real command line (`raybench space show|draw`, `sweep`, `benchmark
--plan`, `train`) from an empty working directory:

1. a setting a sweep sets itself (what `--set` refuses: seed, stage_cache, selection_metric, ...) in any section;
2. a selection on a test split, wherever it is written, and through `--set` on the commands that take it;
3. one setting in two places (searched and derived, fixed and derived, searched and fixed on one dataset): one
   value would silently win;
4. a distribution, rule or value that does not fit its setting's declared type, or a choice its dataset refuses;
5. lists and mappings nested past the bound (PyYAML composes by recursion), aliases expanded.
"""
from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import yaml
from helpers.cli import cli, fail_on_reaching
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from raybench.algorithms import ALGORITHMS
from raybench.settings import FieldType
from raybench.sweep.space import (
    MAX_YAML_DEPTH,
    OWN_FLAGS,
    SEARCH_DIR,
    SearchSpace,
    SpaceError,
    StrictLoader,
    expanded_size,
    names_test_split,
    space_from_mapping,
)
from raybench.trainer import TrainConfig

pytestmark = pytest.mark.usefixtures("in_private_dirs")

SHOW = ["space", "show", "space.yaml", "--dataset", "digits-shift"]
SWEEP = ["sweep", "space.yaml", "--storage", "runs", "--trials", "1"]
PLAN = ["benchmark", "grid.yaml", "--plan"]


@pytest.fixture(autouse=True)
def no_cluster_work(monkeypatch):
    """A sweep or benchmark that got past its load-time checks goes no further: reaching Ray fails the test."""
    from raybench.commands import benchmark
    from raybench.sweep import runner

    fail_on_reaching(monkeypatch, (runner, "run_sweep"), (benchmark, "run_benchmark"))


def refused(argv: list[str], capsys) -> str:
    """The one error line of a command that must refuse its input, exit 2, with nothing but its input files left in
    the working directory (no runs/, no mlflow.db)."""
    before = sorted(p.name for p in Path().iterdir())
    result = cli(argv, capsys)
    assert result.returncode == 2, (argv, result.returncode, result.stdout[-300:], result.stderr[-2000:])
    assert "Traceback" not in result.stderr, result.stderr[-2000:]
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("raybench: error: "), result.stderr[-2000:]
    assert sorted(p.name for p in Path().iterdir()) == before
    return lines[0]


def space_refused(body: str, capsys, commands: tuple[list[str], ...] = (SHOW, SWEEP)) -> str:
    """`body` written as space.yaml, refused the same way by each command; the line."""
    Path("space.yaml").write_text(body)
    lines = {refused(command, capsys) for command in commands}
    assert len(lines) == 1, lines
    return lines.pop()


# ----- 1. what a sweep sets itself --------------------------------------------------------------------------
WRITTEN = {"search": "{distribution: choice, values: [%s]}", "fixed": "%s", "derived": "{rule: ratio_epochs}"}
VALUES = {"seed": "3", "stage_cache": "/etc/raybench-cache", "selection_metric": "val/acc", "dataset": "spuco-digits",
          "algorithm": "dann"}
PLACES = [(name, section, on_dataset) for name in OWN_FLAGS for section in WRITTEN for on_dataset in (False, True)]


def owned_space(name: str, section: str, on_dataset: bool) -> tuple[str, str]:
    """A space that sets the sweep's `name` in `section`, at the top or for digits-shift; and the key it names."""
    entry = f"{name}: {WRITTEN[section] % VALUES.get(name, '1') if '%s' in WRITTEN[section] else WRITTEN[section]}"
    if on_dataset:
        return (f"algorithm: erm\ndatasets:\n  digits-shift:\n    {section}:\n      {entry}\n",
                f"datasets.digits-shift.{section}.{name}")
    return f"algorithm: erm\n{section}:\n  {entry}\n", f"{section}.{name}"


@pytest.mark.parametrize("name, section, on_dataset", PLACES,
                         ids=[f"{'datasets.' if d else ''}{s}.{n}" for n, s, d in PLACES])
def test_a_setting_a_sweep_sets_itself_is_refused_in_every_section(name, section, on_dataset, capsys):
    """Whatever `--set` refuses, a space file refuses too (`search: seed` gave two trials one trial id, a fixed
    stage_cache wrote outside --storage): the list is OWN_FLAGS itself, so a setting added there is covered."""
    body, key = owned_space(name, section, on_dataset)
    line = space_refused(body, capsys)
    assert line.startswith(f"raybench: error: space.yaml: {key}: expected no value: a sweep sets {name} through "
                           f"{OWN_FLAGS[name]}"), line


def test_a_space_object_built_in_python_is_held_to_the_same_rules(shared_data_dir):
    """raybench.api takes a SearchSpace as it is: binding it to a dataset refuses a sweep's own setting and a
    setting given in two sections, as a file's load would."""
    from raybench.data import load_dataset

    digits = load_dataset("digits-shift", shared_data_dir)
    base = space_from_mapping({"algorithm": "erm", "search": {"lr": {"distribution": "lr"}}})
    seeded = dataclasses.replace(base, fixed={"seed": 3})
    with pytest.raises(SpaceError, match=r"fixed\.seed on digits-shift: expected no value: a sweep sets seed"):
        seeded.for_dataset(digits)
    doubled = dataclasses.replace(base, fixed={"lr": 0.1})
    with pytest.raises(SpaceError, match=r"fixed\.lr on digits-shift: expected no value, since 'lr' is also searched"):
        doubled.for_dataset(digits)
    assert isinstance(base, SearchSpace) and base.for_dataset(digits).search["lr"].distribution == "loguniform"


# ----- 2. selection on test ---------------------------------------------------------------------------------
TEST_SELECTIONS = [
    ("fixed:\n  selection_metric: test/acc\n", "fixed.selection_metric", "test/acc"),
    ("fixed:\n  selection_metric: id_test/macro_f1\n", "fixed.selection_metric", "id_test/macro_f1"),
    ("search:\n  selection_metric: {distribution: choice, values: [val/acc, test/acc]}\n",
     "search.selection_metric", "test/acc"),
    ("datasets:\n  digits-shift:\n    fixed: {selection_metric: test/acc}\n",
     "datasets.digits-shift.fixed.selection_metric", "test/acc"),
    ("datasets:\n  digits-shift:\n    search:\n      selection_metric: {distribution: choice, values: [id_test/acc]}\n",
     "datasets.digits-shift.search.selection_metric", "id_test/acc"),
]


@pytest.mark.parametrize("body, key, split", TEST_SELECTIONS, ids=[key for _, key, _ in TEST_SELECTIONS])
def test_a_selection_on_a_test_split_is_refused_and_named_as_such(body, key, split, capsys):
    line = space_refused("algorithm: erm\n" + body, capsys)
    assert line.startswith(f"raybench: error: space.yaml: {key}: expected no value: a sweep sets selection_metric"), line
    assert f"{split!r} names a test split, and selecting on test is what the protocol forbids" in line, line


@pytest.mark.parametrize("argv", [
    ["space", "show", "erm", "--set", "selection_metric=test/acc"],
    ["space", "draw", "erm", "--set", "selection_metric=id_test/acc"],
    ["train", "--epochs", "1", "--set", "max_steps_per_epoch=1", "--set", "selection_metric=test/acc"],
], ids=["space show", "space draw", "train"])
def test_a_set_selection_on_a_test_split_is_refused_on_every_command_that_takes_it(argv, capsys):
    """`sweep --set selection_metric=...` is refused whatever its split (a sweep selects through --selection);
    `space show|draw` show what a sweep would run, and `train` would pick its best epoch on test."""
    line = refused(argv, capsys)
    assert line.startswith("raybench: error: --set selection_metric: expected a validation split/metric (selecting "
                           "on test is what the protocol forbids"), line


def test_a_sweep_refuses_a_set_selection_metric_whatever_its_split(capsys):
    line = refused(["sweep", "erm", "--set", "selection_metric=test/acc", "--storage", "runs"], capsys)
    assert line.startswith("raybench: error: --set selection_metric: a sweep sets this through --selection"), line


SPLITS = st.sampled_from(["test", "id_test", "test_unlabeled", "ood_test", "val+test", "TEST"])
NOT_TEST = st.sampled_from(["val", "id_val", "train", "val_unlabeled", "latest", "contest", "attest"])


@given(split=SPLITS, metric=st.sampled_from(["", "/acc", "/worst_group_acc", "/macro_f1"]))
def test_every_spelling_of_a_test_split_is_one(split, metric):
    assert names_test_split(split + metric)


@given(split=NOT_TEST, metric=st.sampled_from(["", "/acc", "/test_acc"]))
def test_a_validation_split_is_no_test_split_even_with_test_in_its_metric(split, metric):
    assert not names_test_split(split + metric)


# ----- 3. one setting in two places -------------------------------------------------------------------------
TWO_PLACES = [
    ("dann", "search:\n  epochs: {distribution: choice, values: [1, 2]}\nderived:\n  epochs: {rule: ratio_epochs}\n",
     "derived.epochs", "searched (search.epochs)"),
    ("dann", "fixed:\n  epochs: 3\nderived:\n  epochs: {rule: ratio_epochs}\n", "derived.epochs", "fixed (fixed.epochs)"),
    ("erm", "fixed:\n  batch_size: 32\nderived:\n  batch_size: {rule: max_batch_size}\n", "derived.batch_size",
     "fixed (fixed.batch_size)"),
    ("erm", "search:\n  lr: {distribution: lr}\nfixed:\n  lr: 0.1\n", "fixed.lr", "searched (search.lr)"),
    ("erm", "search:\n  lr: {distribution: lr}\ndatasets:\n  digits-shift:\n    fixed: {lr: 0.1}\n",
     "datasets.digits-shift.fixed.lr", "searched (search.lr)"),
    ("erm", "fixed:\n  lr: 0.01\ndatasets:\n  digits-shift:\n    search:\n      lr: {distribution: choice, values: [0.1]}\n",
     "datasets.digits-shift.search.lr", "fixed (fixed.lr)"),
    ("dann", "derived:\n  epochs: {rule: ratio_epochs}\ndatasets:\n  digits-shift:\n    fixed: {epochs: 2}\n",
     "datasets.digits-shift.fixed.epochs", "derived (derived.epochs)"),
    ("dann", ("search:\n  unlabeled_ratio: {distribution: choice, values: [3, 7]}\ndatasets:\n  digits-shift:\n"
              "    derived: {unlabeled_ratio: {rule: max_batch_size}}\n"),
     "datasets.digits-shift.derived.unlabeled_ratio", "searched (search.unlabeled_ratio)"),
    ("dann", ("datasets:\n  digits-shift:\n    search:\n      epochs: {distribution: choice, values: [1, 2]}\n"
              "    derived:\n      epochs: {rule: ratio_epochs}\n"),
     "datasets.digits-shift.derived.epochs", "searched (datasets.digits-shift.search.epochs)"),
]


@pytest.mark.parametrize("algorithm, body, key, other", TWO_PLACES, ids=[f"{k} vs {o}" for _, _, k, o in TWO_PLACES])
def test_a_setting_in_two_places_is_refused_naming_both(algorithm, body, key, other, capsys):
    """A sampled value over a fixed one, a derived one over a sampled one (`derived: lr` gave lr = 10): whichever
    silently wins, the file said two things."""
    line = space_refused(f"algorithm: {algorithm}\n" + body, capsys)
    assert line.startswith(f"raybench: error: space.yaml: {key}: expected no value, since "), line
    assert f"is also {other}" in line, line


def test_a_dataset_overriding_the_same_section_is_still_an_override(capsys):
    """The rule is one section per setting, not one value: a dataset's `fixed` replaces the top `fixed`."""
    Path("space.yaml").write_text("algorithm: erm\nfixed:\n  patience: 4\ndatasets:\n  digits-shift:\n"
                                  "    fixed: {patience: 2}\n")
    shown = cli(SHOW, capsys)
    assert shown.returncode == 0, shown.stderr
    assert "patience               2" in shown.stdout


# ----- 4. types ---------------------------------------------------------------------------------------------
WRONG_TYPES = [
    ("erm", "search:\n  batch_size: {distribution: loguniform, low: 16, high: 128}\n", "search.batch_size.distribution",
     "choice (the values to try): batch_size is int or none, and loguniform draws real numbers"),
    ("erm", "search:\n  epochs: {distribution: uniform, low: 1, high: 5}\n", "search.epochs.distribution",
     "choice (the values to try): epochs is int or none, and uniform draws real numbers"),
    ("erm", "search:\n  batch_size: {distribution: lr}\n", "search.batch_size.distribution",
     "choice (the values to try): batch_size is int or none, and lr draws real numbers"),
    ("erm", "search:\n  model: {distribution: uniform, low: 1, high: 2}\n", "search.model.distribution",
     "choice (the values to try): model is str or none, and uniform draws"),
    ("erm", "search:\n  augment: {distribution: uniform, low: 0, high: 1}\n", "search.augment.distribution",
     "choice (the values to try): augment is bool, and uniform draws"),
    ("erm", "fixed:\n  batch_size: 64.0\n", "fixed.batch_size", "an integer or null (batch_size is int or none)"),
    ("erm", "fixed:\n  lr: 1e-3\n", "fixed.lr", "a number or null (lr is float or none; YAML 1.1 reads 1e-3 as text"),
    ("erm", "fixed:\n  augment: 1\n", "fixed.augment", "true or false (augment is bool)"),
    ("erm", "fixed:\n  model: 5\n", "fixed.model", "text or null (model is str or none; quote a number"),
    ("erm", "search:\n  batch_size: {distribution: choice, values: [32.0, 64.0]}\n", "search.batch_size.values[0]",
     "an integer or null"),
    ("erm", "search:\n  lr: {distribution: choice, values: ['0.1', 0.01]}\n", "search.lr.values[0]", "a number or null"),
    ("dann", "search:\n  unlabeled_ratio: {distribution: choice, values: [3, 7, 3]}\n",
     "search.unlabeled_ratio.values[2]", "each value once (also values[0])"),
    ("erm", "derived:\n  lr: {rule: ratio_epochs}\n", "derived.lr.rule",
     "a rule for an integer setting: ratio_epochs gives a whole number of epochs, and lr is float or none"),
    ("erm", "derived:\n  weight_decay: {rule: max_batch_size}\n", "derived.weight_decay.rule",
     "a rule for an integer setting: max_batch_size gives a batch size"),
    ("erm", "datasets:\n  digits-shift:\n    derived: {model: {rule: ratio_epochs}}\n",
     "datasets.digits-shift.derived.model.rule",
     "a rule for an integer setting: ratio_epochs gives a whole number of epochs, and model is str or none"),
    ("erm", "search:\n  model: {distribution: choice, values: [lenet, resnet999]}\n", "search.model.values[1]",
     "one of dabs_transformer"),
    ("dann", "search:\n  unlabeled_split: {distribution: choice, values: [train_unlabeled, nope]}\n",
     "search.unlabeled_split.values[1]", "one of train_unlabeled, val_unlabeled, test_unlabeled, extra_unlabeled"),
]


@pytest.mark.parametrize("algorithm, body, key, expected", WRONG_TYPES, ids=[k for _, _, k, _ in WRONG_TYPES])
def test_a_value_that_does_not_fit_its_setting_is_refused_at_load(algorithm, body, key, expected, capsys):
    """Each passed `space show` before, and then failed every trial that drew it (a log-uniform batch size), or
    trained something else than the file said (a derived lr of 10, a batch size of 64.0 under another trial id)."""
    line = space_refused(f"algorithm: {algorithm}\n" + body, capsys)
    assert line.startswith(f"raybench: error: space.yaml: {key}: expected {expected}"), line


def typed_settings() -> list[tuple[str, str, FieldType]]:
    """(algorithm, name, type) of every trainer setting (under erm) and every algorithm's hyperparameters."""
    found = [("erm", f.name, FieldType.of(f.type)) for f in dataclasses.fields(TrainConfig)
             if f.name not in (*OWN_FLAGS, "hparams")]
    trainer = {name for _, name, _ in found}
    for algorithm in ALGORITHMS.names():
        found += [(algorithm, f.name, FieldType.of(f.type)) for f in dataclasses.fields(ALGORITHMS.get(algorithm).Hparams)
                  if f.name not in trainer]
    return found


def loads(data: dict) -> str | None:
    """The SpaceError a mapping gets at load, or None."""
    try:
        space_from_mapping(data)
    except SpaceError as err:
        return str(err)
    return None


def test_a_range_is_only_drawn_for_a_float_setting_and_a_rule_only_derives_an_integer_one():
    """The class, over every setting of every algorithm: a uniform / log-uniform / lr draw on anything but a float
    is refused at its `distribution`, a derived rule on anything but an integer at its `rule`."""
    for algorithm, name, kind in typed_settings():
        for distribution in ("uniform", "loguniform", "lr"):
            spec = {"distribution": distribution} | ({} if distribution == "lr" else {"low": 1, "high": 2})
            error = loads({"algorithm": algorithm, "search": {name: spec}})
            if kind.kind != "float":
                assert error and f"search.{name}.distribution: expected choice" in error, (algorithm, name, error)
            else:
                assert not error or f"search.{name}.distribution" not in error, (algorithm, name, error)
        error = loads({"algorithm": algorithm, "derived": {name: {"rule": "ratio_epochs"}}})
        if kind.kind != "int":
            assert error and f"derived.{name}.rule: expected a rule for an integer setting" in error, (algorithm, name)
        else:
            assert not error or f"derived.{name}.rule" not in error, (algorithm, name, error)


# ----- 5. depth ---------------------------------------------------------------------------------------------
def nested(depth: int, shape: str, indent: int) -> str:
    """A value of `depth` lists or mappings one inside the other, flow (`[[...]]`) or block (each level one space
    further in) style, its block lines indented under a key at `indent` spaces."""
    if shape == "flow list":
        return "[" * depth + "]" * depth
    if shape == "flow mapping":
        return "{a: " * depth + "1" + "}" * depth
    entry = "a:" if shape == "block mapping" else "-"
    lines = [" " * (indent + 1 + i) + entry for i in range(depth)]
    return "\n" + "\n".join(lines) + " 1"


SHAPES = st.sampled_from(["flow list", "flow mapping", "block mapping", "block sequence"])
DEEP = settings(max_examples=25, deadline=None, derandomize=True, database=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture])
# Where a deep value is written, and the lists and mappings around it (the file's own mapping, then the keys').
SPACE_PLACES = {"description": ("algorithm: erm\ndescription: {}\n", 1, 0),
                "fixed.lr": ("algorithm: erm\nfixed:\n  lr: {}\n", 2, 2)}
GRID_PLACES = {"grid": ("name: b\ngrid: {}\n", 1, 0),
               "set.lr": ("name: b\nset:\n  lr: {}\ngrid:\n  - {{datasets: [digits-shift], spaces: [erm]}}\n", 2, 2)}


def deep_file(places: dict, where: str, total: int, shape: str) -> str:
    """A file whose deepest list or mapping, at `where`, is `total` deep counting the ones around it."""
    template, around, indent = places[where]
    return template.format(nested(total - around, shape, indent))


def test_the_generated_files_nest_exactly_as_deep_as_asked():
    for places in (SPACE_PLACES, GRID_PLACES):
        for where in places:
            for shape in ("flow list", "flow mapping", "block mapping", "block sequence"):
                loader = StrictLoader(deep_file(places, where, 9, shape))
                try:
                    assert expanded_size(loader.get_single_node())[1] == 9, (where, shape)
                finally:
                    loader.dispose()


@DEEP
@given(total=st.integers(MAX_YAML_DEPTH + 1, 1_500), shape=SHAPES, where=st.sampled_from(sorted(SPACE_PLACES)))
def test_a_space_nested_past_the_bound_is_one_line(total, shape, where, capsys):
    """Nested ~1,000 deep, a space ended in PyYAML's RecursionError in `space show` and `sweep`."""
    line = space_refused(deep_file(SPACE_PLACES, where, total, shape), capsys)
    assert line.startswith("raybench: error: space.yaml: line "), line
    assert f"expected lists and mappings nested at most {MAX_YAML_DEPTH} deep" in line, line


@DEEP
@given(total=st.integers(MAX_YAML_DEPTH + 1, 1_500), shape=SHAPES, where=st.sampled_from(sorted(GRID_PLACES)))
def test_a_benchmark_grid_nested_past_the_bound_is_one_line(total, shape, where, capsys):
    """`benchmark --plan` on a grid nested ~1,000 deep ended in a RecursionError too."""
    Path("grid.yaml").write_text(deep_file(GRID_PLACES, where, total, shape))
    line = refused(PLAN, capsys)
    assert line.startswith("raybench: error: grid.yaml: line "), line
    assert f"expected lists and mappings nested at most {MAX_YAML_DEPTH} deep" in line, line


@DEEP
@given(total=st.integers(2, MAX_YAML_DEPTH), shape=SHAPES)
def test_a_value_within_the_bound_is_judged_on_its_merits_not_its_depth(total, shape, capsys):
    """At the bound a file is read: a deep description is refused as no text, not for its depth."""
    line = space_refused(deep_file(SPACE_PLACES, "description", total, shape), capsys, (SHOW,))
    assert line.startswith("raybench: error: space.yaml: description: expected text"), line


def alias_chain(levels: int, inner: int) -> str:
    """A description whose list holds `levels` anchors, each `inner` lists deep around an alias of the one
    before: shallow as written, levels x inner deep once the aliases are expanded."""
    lines, previous = ["algorithm: erm", "description:"], "1"
    for i in range(levels):
        lines.append(f"  - &a{i} " + "[" * inner + previous + "]" * inner)
        previous = f"*a{i}"
    return "\n".join(lines) + "\n"


def test_aliases_nested_past_the_bound_are_one_line(capsys):
    """35 anchors of 30 levels each: 1,050 deep once expanded, under the alias-bomb bound on values; the error
    that quoted it ended in a RecursionError."""
    line = space_refused(alias_chain(35, 30), capsys)
    assert line.startswith(f"raybench: error: space.yaml: file: expected lists and mappings nested at most "
                           f"{MAX_YAML_DEPTH} deep once its aliases are expanded, got 'lists and mappings nested 1052 "
                           f"deep'"), line


def test_a_mapping_given_in_python_is_held_to_the_same_bounds():
    """raybench.api.load_space takes a mapping: one 2,000 deep, one that holds itself and one shared 2^40 ways
    ended in a RecursionError or ran for ever."""
    deep: dict = {}
    inner = deep
    for _ in range(2_000):
        inner["a"] = {}
        inner = inner["a"]
    itself: dict = {"algorithm": "erm", "fixed": {}}
    itself["fixed"]["lr"] = itself
    shared: list = [0]
    for _ in range(40):
        shared = [shared, shared]
    for data in ({"algorithm": "erm", "description": deep}, itself):
        with pytest.raises(SpaceError, match=f"nested at most {MAX_YAML_DEPTH} deep"):
            space_from_mapping(data)
    with pytest.raises(SpaceError, match="at most 20,000 values"):
        space_from_mapping({"algorithm": "erm", "description": shared})


def test_every_shipped_space_and_grid_nests_far_below_the_bound():
    """The bound leaves room: the deepest shipped file (a dataset's override of a search) nests 6 deep."""
    from raybench.sweep import space_catalog

    grids = Path(space_catalog.find_grid("embedded")).parent
    files = [*SEARCH_DIR.glob("*.yaml"), *grids.glob("*.yaml"),
             *Path(__file__).parents[1].glob("examples/*/*/spaces/*.yaml")]
    assert len(files) > 20
    for path in files:
        loader = StrictLoader(path.read_text())
        try:
            depth = expanded_size(loader.get_single_node())[1]
        finally:
            loader.dispose()
        assert depth * 8 <= MAX_YAML_DEPTH, (path, depth)
        yaml.safe_load(path.read_text())  # and plain PyYAML reads it too
