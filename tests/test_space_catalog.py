"""Where a space name is looked up (raybench/sweep/space_catalog.py): the user's folders (`--spaces DIR`, then
$RAYBENCH_SPACES) before the plug-ins' folders before the shipped spaces; a user folder may shadow a shipped space
and `raybench list spaces` says so; a plug-in's folder may not take a taken name; a folder that is none is one
line, exit 2, before anything runs. Also shipped benchmark grids by name, and `raybench --version`."""
from __future__ import annotations

import shutil
from importlib.metadata import version
from pathlib import Path

import pytest
import yaml
from helpers.cli import cli, fail_on_reaching

from raybench.commands import sweep as sweep_command
from raybench.sweep import options as sweep_options
from raybench.sweep import space_catalog
from raybench.sweep.space import SEARCH_DIR, SpaceError, load_space
from raybench.sweep.space_catalog import SpaceNameClash, UnknownSpaceError, add_space_folder, find_space


def space_folder(root: Path, *names: str, like: str = "erm") -> Path:
    """A folder holding NAME.yaml for each name, each a copy of the shipped space `like`."""
    root.mkdir(parents=True, exist_ok=True)
    for name in names:
        shutil.copyfile(SEARCH_DIR / f"{like}.yaml", root / f"{name}.yaml")
    return root


@pytest.fixture
def no_user_spaces(monkeypatch):
    """No $RAYBENCH_SPACES from the shell running the tests."""
    monkeypatch.delenv(space_catalog.ENV_VAR, raising=False)


@pytest.fixture
def plugin_origins():
    """Origins a test adds plug-in folders under, forgotten afterwards so no other test sees them."""
    added: list[str] = []
    yield added
    for origin in added:
        space_catalog.remove_space_folders(origin)


def listed(text: str) -> dict[str, str]:
    """`raybench list spaces` output by name: name -> the rest of its line."""
    return {line.split()[0]: line.split(None, 1)[1] for line in text.splitlines() if line.strip()}


def test_a_spaces_folder_adds_a_space_and_shadows_a_shipped_one(tmp_path, capsys, in_private_dirs, no_user_spaces):
    mine = space_folder(tmp_path / "mine", "mine")
    shutil.copyfile(SEARCH_DIR / "coral.yaml", mine / "coral.yaml")  # the user's own coral, in place of raybench's
    rows = listed(cli(["list", "spaces", "--spaces", str(mine)], capsys).stdout)
    assert rows["mine"] == f"user folder (--spaces {mine})  {mine / 'mine.yaml'}"
    assert rows["coral"] == f"user folder (--spaces {mine})  {mine / 'coral.yaml'}  (shadows {SEARCH_DIR / 'coral.yaml'})"
    assert rows["dann"].split() == ["raybench", str(SEARCH_DIR / "dann.yaml")]
    assert "mine" not in listed(cli(["list", "spaces"], capsys).stdout)

    shown = cli(["space", "show", "coral", "--spaces", str(mine)], capsys)
    assert shown.returncode == 0 and shown.stdout.startswith(f"space {mine / 'coral.yaml'}: coral on digits-shift")
    assert cli(["space", "draw", "mine", "--spaces", str(mine), "--trials", "2"], capsys).returncode == 0
    assert find_space("coral") == (SEARCH_DIR / "coral.yaml", "raybench")  # without the flag: the shipped one


def test_raybench_spaces_folders_follow_the_flags_in_order(tmp_path, monkeypatch, capsys):
    first, second, flagged = (space_folder(tmp_path / name, "x") for name in ("first", "second", "flagged"))
    space_folder(second, "only_second")
    monkeypatch.setenv(space_catalog.ENV_VAR, f"{first}:{second}")
    assert find_space("x") == (first / "x.yaml", "$RAYBENCH_SPACES")
    assert find_space("only_second") == (second / "only_second.yaml", "$RAYBENCH_SPACES")
    assert find_space("x", [flagged]) == (flagged / "x.yaml", f"--spaces {flagged}")
    assert [s.folder for s in space_catalog.space_sources([flagged])] == [flagged, first, second, SEARCH_DIR]
    assert load_space("x").path == first / "x.yaml"
    row = listed(cli(["list", "spaces"], capsys).stdout)["x"]
    assert row == f"user folder ($RAYBENCH_SPACES)  {first / 'x.yaml'}  (shadows {second / 'x.yaml'})"


@pytest.mark.parametrize("command", [["sweep", "erm"], ["space", "show", "erm"], ["space", "draw", "erm"],
                                     ["benchmark", "queue_smoke", "--plan"], ["list", "spaces"]])
def test_a_spaces_folder_that_is_none_is_one_line_and_exit_2_before_anything_runs(command, tmp_path, capsys,
                                                                                  monkeypatch, no_user_spaces):
    from raybench.sweep import benchmark_file, runner

    fail_on_reaching(monkeypatch, (runner, "prepare"), (benchmark_file, "load_benchmark"))
    not_a_folder = tmp_path / "a-file.yaml"
    not_a_folder.write_text("algorithm: erm\n")
    for bad, why in ((tmp_path / "missing", "no such folder"), (not_a_folder, "a file, not a folder")):
        refused = cli([*command, "--spaces", str(bad)], capsys)
        assert refused.returncode == 2 and refused.stdout == ""
        assert refused.stderr == (f"raybench: error: --spaces: expected a folder of search spaces (NAME.yaml files), "
                                  f"got {str(bad)!r} ({why})\n")
    monkeypatch.setenv(space_catalog.ENV_VAR, str(tmp_path / "missing"))
    refused = cli(command, capsys)
    assert refused.returncode == 2 and refused.stderr.startswith("raybench: error: $RAYBENCH_SPACES: expected a folder")
    assert len(refused.stderr.splitlines()) == 1


def test_a_sweep_looks_its_space_up_in_its_spaces_folders(tmp_path, capsys, monkeypatch, in_private_dirs,
                                                          no_user_spaces):
    """`raybench sweep NAME --spaces DIR` hands the folders to the sweep's own lookup (prepare), and the command
    that resumes it repeats them."""
    from raybench.sweep import runner
    from raybench.sweep.errors import OptionError

    mine = space_folder(tmp_path / "mine", "erm", like="coral")  # an `erm` that is CORAL: which one ran is plain
    loaded = []

    def stop_after_the_space(options, space):
        loaded.append((space.path, space.algorithm, options.spaces))
        raise OptionError("stopped after loading the space")

    monkeypatch.setattr(runner, "dataset_for_trials", stop_after_the_space)
    stopped = cli(["sweep", "erm", "--spaces", str(mine), "--spaces", str(tmp_path)], capsys)
    assert stopped.stderr == "raybench: error: stopped after loading the space\n"
    assert loaded == [(mine / "erm.yaml", "coral", (str(mine), str(tmp_path)))]

    args = sweep_command.build_parser().parse_args(["erm", "--spaces", str(mine), "--spaces", str(tmp_path)])
    options = sweep_options.from_namespace(args)
    assert options.spaces == (str(mine), str(tmp_path))
    words = sweep_options.command_words(options)
    assert words == ["erm", "--spaces", str(mine), "--spaces", str(tmp_path)]
    assert sweep_options.from_namespace(sweep_command.build_parser().parse_args(words)) == options
    assert "--spaces" in sweep_command.resume_command(["sweep", *words])


def test_a_benchmark_runs_a_shipped_grid_by_name_and_names_spaces_of_a_spaces_folder(tmp_path, capsys,
                                                                                    in_private_dirs, no_user_spaces):
    from raybench.commands.benchmark import BenchmarkOptions, SweepTarget, pair_settings
    from raybench.sweep.benchmark_file import BenchmarkError, load_benchmark

    planned = cli(["benchmark", "queue_smoke", "--plan"], capsys)
    assert planned.returncode == 0 and "erm on digits-shift" in planned.stdout, planned.stderr
    assert load_benchmark("queue_smoke").path == space_catalog.grids_folder() / "queue_smoke.yaml"

    mine = space_folder(tmp_path / "mine", "my_erm")
    grid = tmp_path / "grid.yaml"
    grid.write_text(yaml.safe_dump({"name": "mine", "trials": 1, "grid": [{"datasets": ["digits-shift"],
                                                                          "spaces": ["my_erm", "dann"]}]}))
    with pytest.raises(BenchmarkError, match=r"spaces: expected a search-space name \(cb, coral, .*, got 'my_erm'"):
        load_benchmark(str(grid))
    benchmark = load_benchmark(str(grid), [mine])
    assert [p.space_path for p in benchmark.pairs] == [mine / "my_erm.yaml", SEARCH_DIR / "dann.yaml"]
    options = BenchmarkOptions(tmp_path / "runs", "sqlite:///x.db", spaces=(str(mine),))
    settings = pair_settings(benchmark.pairs[0], benchmark, options, SweepTarget("auto", "sqlite:///x.db", "run"),
                             False)
    assert settings["spaces"] == (str(mine),) and settings["space"] == str(mine / "my_erm.yaml")
    assert cli(["benchmark", str(grid), "--plan", "--spaces", str(mine)], capsys).returncode == 0


def test_a_plugin_folder_adds_names_but_never_takes_a_taken_one(tmp_path, plugin_origins, no_user_spaces, capsys):
    plugin_origins += ["plug-in one", "plug-in two", "plug-in three"]
    clashing = space_folder(tmp_path / "clashing", "erm")
    with pytest.raises(SpaceNameClash) as caught:
        add_space_folder(clashing, "plug-in three")
    assert str(caught.value) == (f"plug-in three: search space 'erm' in {clashing} clashes with raybench's own space "
                                 f"'erm' ({SEARCH_DIR / 'erm.yaml'}); expected a name not taken, so rename the file")
    assert find_space("erm") == (SEARCH_DIR / "erm.yaml", "raybench")  # the refused folder was not added

    one = space_folder(tmp_path / "one", "vrex")
    add_space_folder(one, "plug-in one")
    add_space_folder(one, "plug-in one")  # loading a plug-in again changes nothing
    assert find_space("vrex") == (one / "vrex.yaml", "plug-in one")
    assert [s.origin for s in space_catalog.space_sources()] == ["plug-in one", "raybench"]
    two = space_folder(tmp_path / "two", "vrex")
    with pytest.raises(SpaceNameClash, match=f"plug-in two: search space 'vrex' in {two} clashes with the space of "
                                             f"plug-in one 'vrex' \\({one / 'vrex.yaml'}\\)"):
        add_space_folder(two, "plug-in two")
    assert listed(cli(["list", "spaces"], capsys).stdout)["vrex"] == f"plug-in one  {one / 'vrex.yaml'}"

    mine = space_folder(tmp_path / "mine", "vrex")  # a user folder may shadow a plug-in's space too
    assert find_space("vrex", [mine]) == (mine / "vrex.yaml", f"--spaces {mine}")


def test_an_unknown_name_lists_the_known_names_and_where_they_were_looked_for(no_user_spaces):
    with pytest.raises(UnknownSpaceError) as caught:
        find_space("nope")
    message = str(caught.value)
    assert message.startswith("unknown search space 'nope': expected a YAML file or one of cb, coral, dann, ")
    assert message.endswith(f"(looked in {SEARCH_DIR})")
    with pytest.raises(SpaceError, match=f"an existing YAML file or one of: cb, coral, .* \\(the spaces in {SEARCH_DIR}\\)"):
        load_space("nope")


def test_version_is_the_installed_distributions(capsys):
    shown = cli(["--version"], capsys)
    assert (shown.returncode, shown.stdout) == (0, f"raybench {version('raybench')}\n")
