"""Plug-ins: a user's module named by --plugin, $RAYBENCH_PLUGINS or an entry point registers algorithms and
search spaces that every process of a sweep finds; a plug-in that cannot be used is one line, exit 2, before
anything is written. Every plug-in is imported in a subprocess: registration is process-wide, and the other tests
of a pytest worker must see raybench's own registries."""
from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from helpers.cli import on_head, run_cli
from helpers.paths import BIN

FIXTURES = Path(__file__).resolve().parent / "plugin_fixtures"
TWIN = FIXTURES / "twinplug"
REPO = Path(__file__).resolve().parents[1]


def raybench(args: list[str], env: dict, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([str(BIN / "raybench"), *args], env=env, cwd=cwd, capture_output=True, text=True,
                          timeout=300)


# ----- bad plug-ins: one line, exit 2, nothing written ------------------------------------------------------------
BAD = [
    ("no_such_plugin_module", "no module named 'no_such_plugin_module'"),
    (str(FIXTURES / "broken.py"), "importing it failed: AttributeError"),
    (str(FIXTURES / "clashing.py"), "algorithm 'erm' is registered twice (first by raybench itself)"),
    (str(FIXTURES / "twice.py"), "algorithm 'twice_algo' is registered twice (first by plug-in 'twice')"),
    (str(FIXTURES / "space_clash"), "dann"),
    (str(FIXTURES / "missing.py"), "no such file or folder"),
]


@pytest.mark.parametrize(("plugin", "reason"), BAD, ids=[Path(p).stem for p, _ in BAD])
def test_a_plugin_that_cannot_be_used_is_one_line_exit_2_and_nothing_is_written(plugin, reason, sweep_env, tmp_path):
    storage, db = tmp_path / "runs", tmp_path / "mlflow.db"
    done = raybench(["sweep", "erm", "--smoke", "--plugin", plugin, "--storage", str(storage),
                     "--tracking-uri", f"sqlite:///{db}"], sweep_env, tmp_path)
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2, done.stderr[-3000:]
    assert len(lines) == 1 and lines[0].startswith(f"raybench: error: --plugin: plug-in {plugin!r}: "), lines
    assert reason in lines[0], lines[0]
    assert not storage.exists() and not db.exists(), "a refused plug-in left a storage folder or a store behind"


def test_a_bad_plugin_in_the_environment_stops_every_command(sweep_env, tmp_path):
    env = {**sweep_env, "RAYBENCH_PLUGINS": str(FIXTURES / "clashing.py")}
    done = raybench(["list", "algorithms"], env, tmp_path)
    assert done.returncode == 2 and "registered twice" in done.stderr, done.stderr


# ----- where each name comes from -----------------------------------------------------------------------------------
def listed(output: str) -> dict[str, str]:
    """`raybench list ...` rows as name -> the rest of the line."""
    return {line.split()[0]: line for line in output.splitlines() if line.strip()}


def test_list_says_which_plugin_each_name_came_from(sweep_env, tmp_path):
    algorithms = raybench(["list", "algorithms", "--plugin", str(TWIN)], sweep_env, tmp_path)
    assert algorithms.returncode == 0, algorithms.stderr
    rows = listed(algorithms.stdout)
    assert "plug-in twinplug" in rows["erm_twin"], rows["erm_twin"]
    assert "plug-in" not in rows["erm"] and "raybench" in rows["erm"], rows["erm"]  # imported by the plug-in
    spaces = raybench(["list", "spaces", "--plugin", str(TWIN)], sweep_env, tmp_path)
    assert "plug-in twinplug" in listed(spaces.stdout)["erm_twin"], spaces.stdout
    env = {**sweep_env, "RAYBENCH_PLUGINS": str(TWIN)}
    from_env = raybench(["list", "algorithms"], env, tmp_path)
    assert "plug-in twinplug" in listed(from_env.stdout)["erm_twin"], from_env.stdout


def test_an_installed_distributions_entry_point_is_loaded_without_a_flag(sweep_env, tmp_path):
    """The entry-point group `raybench.plugins`: a distribution's metadata on sys.path is all it takes."""
    site = tmp_path / "site"
    dist = site / "twin_dist-1.0.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: twin-dist\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text("[raybench.plugins]\ntwin = twinplug\n")
    env = {**sweep_env, "PYTHONPATH": f"{site}:{FIXTURES}"}
    done = raybench(["list", "algorithms"], env, tmp_path)
    assert done.returncode == 0, done.stderr
    assert "plug-in twinplug" in listed(done.stdout)["erm_twin"], done.stdout


# ----- a plug-in's method in a real sweep, and the Python API's spaces ------------------------------------------
def test_a_plugin_algorithm_trains_in_ray_trials_and_workers(head_env, ray_head, tmp_path):
    """The Train executor on the session's head: the trial actors and the Train workers are processes that were
    started before the plug-in existed, on a node that never saw its folder; they get it from the TrialSpec and
    the job's runtime_env (py_modules)."""
    storage = tmp_path / "runs"
    done = run_cli(on_head(["sweep", "erm_twin", "--plugin", str(TWIN), "--smoke", "--trials", "2", "--replicates", "1",
                            "--name", "twin", "--storage", str(storage), "--tracking-uri",
                            f"sqlite:///{tmp_path / 'mlflow.db'}"], ray_head), head_env, tmp_path)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    summary = json.loads((storage / "twin" / "results" / "summary.json").read_text())
    assert summary["algorithm"] == "erm_twin"
    assert [t["status"] for t in summary["trials"]] == ["ok", "ok"], summary["trials"]
    assert [r["status"] for r in summary["replicates"]["runs"]] == ["ok"], summary["replicates"]


API_SCRIPT = textwrap.dedent("""
    import json, sys, yaml
    from raybench import api

    space_file, address, storage, uri = sys.argv[1:]
    common = dict(dataset="digits-shift", trials=3, replicates=0, smoke=True, executor="function", address=address,
                  storage=storage, tracking_uri=uri)
    mapping = yaml.safe_load(open(space_file))
    from_mapping = api.sweep(mapping, name="from-mapping", **common)
    from_file = api.sweep(space_file, name="from-file", **common)
    print(json.dumps([[[t.trial_id, t.sampled] for t in s.trials] for s in (from_mapping, from_file)]))
""")


def test_a_space_given_as_a_mapping_runs_the_same_trials_as_its_yaml_file(head_env, ray_head, tmp_path):
    space = REPO / "raybench" / "search_spaces" / "dann.yaml"
    done = subprocess.run([sys.executable, "-c", API_SCRIPT, str(space), ray_head.address, str(tmp_path / "runs"),
                           f"sqlite:///{tmp_path / 'mlflow.db'}"], env=head_env, cwd=tmp_path, capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    from_mapping, from_file = json.loads(done.stdout.strip().splitlines()[-1])
    assert len(from_mapping) == 3 and from_mapping == from_file


def test_a_mapping_is_validated_as_its_yaml_file_would_be():
    from raybench import api

    with pytest.raises(api.SpaceError, match="search.lr.*distribution"):
        api.load_space({"algorithm": "erm", "search": {"lr": {"distribution": "gaussian"}}})
    with pytest.raises(api.SpaceError, match="plain YAML values"):
        api.load_space({"algorithm": "erm", "fixed": {"patience": object()}})
    with pytest.raises(api.SpaceError, match="algorithm"):
        api.load_space({"algorithm": "no-such-method"})
    parsed = api.load_space({"algorithm": "erm", "search": {"lr": {"distribution": "lr"}}})
    assert parsed.algorithm == "erm" and list(parsed.search) == ["lr"]
    with pytest.raises(api.OptionError, match="'trails' is no sweep option"):
        api.sweep("erm", trails=3)


def test_the_api_names_are_stable_and_documented():
    from raybench import api

    for name in api.__all__:
        obj = getattr(api, name)
        assert obj.__doc__, f"raybench.api.{name} has no docstring"


def test_a_plugin_or_config_error_keeps_its_message_out_of_a_ray_process():
    """Ray pickles a trial's exception to carry it to the driver: an error whose constructor takes its fields must
    come back as itself (the trial's recorded reason), not as the TypeError of a failed unpickle."""
    import pickle

    from raybench.errors import ConfigError
    from raybench.plugins import PluginError

    plugin = pickle.loads(pickle.dumps(PluginError("twinplug", "no module named 'twinplug'")))
    assert isinstance(plugin, PluginError) and str(plugin) == "plug-in 'twinplug': no module named 'twinplug'"
    config = pickle.loads(pickle.dumps(ConfigError("batch_size", "expected a whole number, got 0.5")))
    assert (config.key, config.detail) == ("batch_size", "expected a whole number, got 0.5")


def test_a_benchmark_runs_a_plugins_space_in_each_pairs_own_sweep_process(head_env, ray_head, tmp_path):
    """A benchmark's grid names the plug-in's space; each pair is a sweep process of its own, which must import the
    plug-in too (the benchmark names it in their environment) before it reads the space."""
    import yaml

    grid = {"name": "plugged", "selection": "ood_val", "trials": 1, "replicates": 1, "executor": "function",
            "smoke": True, "grid": [{"datasets": ["digits-shift"], "spaces": ["erm_twin"]}]}
    path = tmp_path / "bench.yaml"
    path.write_text(yaml.safe_dump(grid, sort_keys=False))
    runs = tmp_path / "runs"
    done = run_cli(on_head(["benchmark", str(path), "--plugin", str(TWIN), "--storage", str(runs), "--tracking-uri",
                            f"sqlite:///{tmp_path / 'mlflow.db'}"], ray_head), head_env, tmp_path, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    [summary_file] = runs.glob("*erm_twin*/results/summary.json")
    summary = json.loads(summary_file.read_text())
    assert summary["algorithm"] == "erm_twin" and [t["status"] for t in summary["trials"]] == ["ok"]
