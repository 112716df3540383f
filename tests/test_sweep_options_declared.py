"""The options of `raybench sweep` are declared once (raybench.sweep.options), and the copies that used to be
written by hand cannot drift: the parser, the namespace-to-SweepOptions step and the command a benchmark runs for
each pair all come from the declarations. Each test here fails when one of them loses or misreads an option.

Nothing starts Ray or trains: the CLI is driven in-process up to the point where the sweep would be prepared.
"""
from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from raybench.cli import build_parser, main
from raybench.sweep import options as declared
from raybench.sweep.options import Flag, Internal, SweepOptions, command_words, declaration, from_namespace

REPO = Path(__file__).resolve().parents[1]

# A value other than its default for every option a flag sets: a new flag without a line here fails
# test_every_flag_has_a_non_default_value_here, so the round trips below always cover every option.
NON_DEFAULT: dict[str, Any] = {
    "spaces": (str(REPO / "raybench" / "search_spaces"), str(REPO / "tests")),  # existing folders, as the parser requires
    "dataset": "spuco-digits",
    "trials": 7,
    "budget": "2.5gpu-h",
    "replicates": 0,
    "replicates_cap": 6,
    "baseline": "erm-digits-shift-seed0",
    "seed": 4_294_967_295,
    "sampler": "tpe",
    "max_concurrent": 5,
    "workers_per_trial": 3,
    "cpus_per_worker": 0.25,
    "gpus_per_worker": 0.5,
    "worker_resources": (("raybench_worker", 1.0), ("gpu_slot", 0.125)),
    "trial_resources": (("raybench_slot", 1.0),),
    "trial_slots": str(REPO / "tests" / "stored" / "trial-slots"),  # a benchmark's slot folder, as the parser requires
    "address": "127.0.0.1:6379",
    "tracking_uri": "http://127.0.0.1:5000",
    "experiment": "my-robustness-study",
    "storage": "/tmp/elsewhere/runs",
    "name": "my-sweep",
    "smoke": True,
    "resume": True,
    "autoscaling": True,
    "executor": "function",
    "selection": "oracle",
    "scheduler": "asha",
    "grace_period": 2,
    "reduction_factor": 2.5,
    "extra_fixed": {"lr": "0.001", "augment": "false", "model_weights": "none", "note": "a=b"},
    # registers nothing: the CLI tests below load it in this process, whose registries other tests read
    "plugins": (str(REPO / "tests" / "plugin_fixtures" / "empty_plugin.py"), "json"),
    "progress_every": 5.0,
    "quiet": True,
    "parent_run": "0123abcd",
    "converge": 2.0,
    "converge_attempts": 4,
}


def flagged_names() -> list[str]:
    return [field.name for field, _ in declared.flagged()]


def parsed(words: list[str], **internal: Any) -> SweepOptions:
    """`raybench sweep WORDS` through the real parser, into SweepOptions as cmd_sweep builds them."""
    return from_namespace(build_parser().parse_args(["sweep", *words]), **internal)


def sweep_parser_flags() -> set[str]:
    """Every option string of the `sweep` subcommand's parser, as argparse holds them."""
    parser = build_parser()
    [commands] = [a for a in parser._actions if a.dest == "command"]
    sweep = commands.choices["sweep"]
    return {s for action in sweep._actions for s in action.option_strings if s not in ("-h", "--help")}


# ----- the declarations ------------------------------------------------------------------------------------
def test_every_field_is_declared_with_a_flag_or_marked_internal_with_who_sets_it():
    for field in dataclasses.fields(SweepOptions):
        found = declaration(field)
        assert isinstance(found, (Flag, Internal)), f"SweepOptions.{field.name} is declared neither way"
        if isinstance(found, Internal):
            assert found.why, f"SweepOptions.{field.name}: say who sets it"
    assert set(declared.internal_names()) == {"max_failures", "epochs_scale", "resume_command"}


def test_every_flag_has_a_non_default_value_here():
    assert sorted(NON_DEFAULT) == sorted(name for name in flagged_names() if name != "space")
    for name, value in NON_DEFAULT.items():
        assert value != getattr(SweepOptions(space="erm"), name), name


def test_the_sweep_parser_has_exactly_the_declared_flags():
    wanted = {flag.flag for _, flag in declared.flagged() if flag.flag is not None}
    assert sweep_parser_flags() == wanted


def test_the_sweep_flags_are_written_in_the_declarations_alone():
    """No hand-written copy of a sweep flag is left in the package: `git grep 'add_argument("--max-concurrent"'`
    finds none under raybench/ (other subcommands keep their own few, such as space draw's --trials and --seed;
    the scripts under benchmarks/ have their own parsers)."""
    sources = "\n".join(p.read_text(encoding="utf-8") for p in (REPO / "raybench").rglob("*.py"))
    for flag in ("--max-concurrent", "--workers-per-trial", "--worker-resource", "--trial-resource", "--parent-run",
                 "--reduction-factor", "--grace-period", "--autoscaling", "--sampler"):
        assert f'add_argument("{flag}"' not in sources, flag


def test_the_parser_defaults_are_the_dataclass_defaults():
    assert parsed(["erm"]) == SweepOptions(space="erm")


# ----- options -> argv -> options ----------------------------------------------------------------------
def test_options_with_every_flag_changed_come_back_equal_through_the_real_parser():
    options = SweepOptions(space="dann", **NON_DEFAULT)
    assert parsed(command_words(options)) == options


@pytest.mark.parametrize("name", sorted(NON_DEFAULT))
def test_each_option_changed_alone_comes_back_equal_and_alone(name):
    options = SweepOptions(space="erm", **{name: NON_DEFAULT[name]})
    words = command_words(options)
    assert parsed(words) == options
    flag = next(f.flag for field, f in declared.flagged() if field.name == name)
    assert words[0] == "erm" and {word for word in words if word.startswith("--")} == {flag}  # nothing else


def test_a_default_spelled_on_request_still_parses_back_and_none_or_off_has_no_words():
    options = SweepOptions(space="erm")
    words = command_words(options, spell=[f.name for f in dataclasses.fields(SweepOptions)])
    assert parsed(words) == options
    assert "--replicates" not in words and "--smoke" not in words and "--set" not in words
    assert words[words.index("--seed") + 1] == "0" and words[words.index("--cpus-per-worker") + 1] == "1"


def test_resource_amounts_and_set_values_are_spelled_so_they_read_back():
    options = SweepOptions(space="erm", trial_resources=(("raybench_slot", 1.0),),
                           worker_resources=(("w", 0.0003), ("v", 0.1)), extra_fixed={"x": None, "y": True, "z": 0.5})
    words = command_words(options)
    assert words[words.index("--trial-resource") + 1] == "raybench_slot=1"
    assert ["--set", "x=none", "--set", "y=true", "--set", "z=0.5"] == words[words.index("--set"):]
    back = parsed(words)
    assert back.worker_resources == options.worker_resources
    assert back.extra_fixed == {"x": "none", "y": "true", "z": "0.5"}  # what the sweep reads: text, as typed


def test_internal_fields_are_given_by_the_caller_not_by_a_flag():
    options = parsed(["erm", "--resume"], resume_command="raybench sweep erm --resume")
    assert options.resume_command == "raybench sweep erm --resume" and options.resume
    with pytest.raises(TypeError, match="'seed' is set by a flag"):
        parsed(["erm"], seed=3)


# ----- the command line as users run it ------------------------------------------------------------------
@pytest.fixture
def prepared_options(monkeypatch) -> list[SweepOptions]:
    """What cmd_sweep hands to prepare(); the sweep stops there (no storage, no tracking store, no Ray)."""
    from raybench.sweep import runner

    seen: list[SweepOptions] = []
    monkeypatch.setenv("RAYBENCH_PLUGINS", "")  # loading the plug-ins names them here: restored after the test

    def stop(options: SweepOptions, space: Any = None) -> Any:
        seen.append(options)
        raise runner.OptionError("stopped by the test")

    monkeypatch.setattr(runner, "prepare", stop)
    return seen


def test_cmd_sweep_hands_over_the_options_the_command_line_means(prepared_options, capsys):
    options = SweepOptions(space="dann", **{**NON_DEFAULT, "address": None})  # an --address is probed first
    words = command_words(options)
    assert main(["sweep", *words]) == 2
    assert "stopped by the test" in capsys.readouterr().err
    [handed] = prepared_options
    assert handed.resume_command is not None and handed.resume_command.startswith("raybench sweep dann ")
    assert dataclasses.replace(handed, resume_command=None) == options


@pytest.mark.parametrize("argv, error", [
    (["--set", "lr"], "--set: expected key=value, got 'lr'"),
    (["--set", "=1"], "--set: expected key=value, got '=1'"),
    (["--trials", "0"], "--trials: expected an integer >= 1, got 0"),
    (["--sampler", "grid"], "--sampler: invalid choice: 'grid' (choose from"),
    (["--trial-resource", "CPU=1"], "--trial-resource: CPU is not a custom resource"),
])
def test_a_bad_value_is_one_line_with_exit_2_before_anything_is_prepared(argv, error, prepared_options, capsys):
    assert main(["sweep", "erm", *argv]) == 2
    assert capsys.readouterr().err.startswith(f"raybench: error: {error}")
    assert prepared_options == []


def test_the_options_module_imports_no_heavy_package():
    probe = ("import json, sys; import raybench.sweep.options; "
             "print(json.dumps(sorted({m.partition('.')[0] for m in sys.modules} & {'torch', 'ray', 'mlflow'})))")
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == []


# ----- the benchmark's command for each pair ---------------------------------------------------------------
def a_pair(**changes: Any) -> Any:
    from raybench.sweep.benchmark_file import Pair

    pair = Pair(dataset="digits-shift", space="erm", space_path=Path("/spaces/erm.yaml"), method="erm",
                algorithm="erm", sweep="b-erm-digits-shift", trials=2, replicates=None, fixed={})
    return dataclasses.replace(pair, **changes)


def a_benchmark(pair: Any, **changes: Any) -> Any:
    from raybench.sweep.benchmark_file import Benchmark

    benchmark = Benchmark(path=Path("b.yaml"), name="b", description="", selection="ood_val", seed=0,
                          executor="train", smoke=False, max_concurrent_trials=4, sweeps_at_once=2, pairs=[pair],
                          refused=[])
    return dataclasses.replace(benchmark, **changes)


# (pair changes, benchmark changes, the trial queue: None, "resource" (a private Ray) or "slots" (--address), resume)
PAIRS = {
    "defaults": ({}, {}, None, False),
    "smoke, queued": ({}, {"smoke": True}, "resource", False),
    "everything set": ({"replicates": 3, "fixed": {"lr": 0.1, "augment": False, "model_weights": None}},
                       {"selection": "id_val", "seed": 7, "executor": "function", "smoke": True}, "resource", True),
    "replicates 0 at an address": ({"replicates": 0, "dataset": "spuco-digits"}, {}, "slots", True),
}
SLOTS = REPO / "tests" / "stored" / "trial-slots"


@pytest.mark.parametrize("case", list(PAIRS))
def test_the_benchmarks_command_for_a_pair_parses_back_to_the_options_the_pair_means(case, tmp_path):
    from raybench.commands.benchmark import TRIAL_SLOT, BenchmarkOptions, SweepTarget, sweep_command

    pair_changes, bench_changes, queue, resume = PAIRS[case]
    pair = a_pair(**pair_changes)
    benchmark = a_benchmark(pair, **bench_changes)
    target = SweepTarget("127.0.0.1:1", "sqlite:///x.db", "parent", queued=queue == "resource",
                         slots=SLOTS if queue == "slots" else None)
    words = sweep_command(pair, benchmark, BenchmarkOptions(tmp_path, "sqlite:///x.db"), target, resume)
    assert words[:3] == [sys.executable, "-m", "raybench.commands.sweep"]  # `raybench sweep`, without the CLI
    meant = SweepOptions(
        space=str(pair.space_path), dataset=pair.dataset, name=pair.sweep, storage=str(tmp_path),
        tracking_uri="sqlite:///x.db", address="127.0.0.1:1", trials=pair.trials, replicates=pair.replicates,
        seed=benchmark.seed, selection=benchmark.selection, executor=benchmark.executor, smoke=benchmark.smoke,
        extra_fixed={"lr": "0.1", "augment": "false", "model_weights": "none"} if pair.fixed else {},
        parent_run="parent", resume=resume,
        max_concurrent=benchmark.max_concurrent_trials if queue else benchmark.trials_per_sweep,
        trial_resources=((TRIAL_SLOT, 1.0),) if queue == "resource" else (),
        trial_slots=str(SLOTS) if queue == "slots" else None)
    assert parsed(words[3:]) == meant


def test_the_benchmark_passes_the_flags_it_always_passed():
    """Spelled even at their defaults (the pair's log shows the command); --replicates only when the pair sets
    it, --smoke only when set, --resume when resuming, the queue's slot only in the queue; the benchmark's
    --progress-every, so its pairs' logs move at the interval its user chose."""
    from raybench.commands.benchmark import BenchmarkOptions, SweepTarget, sweep_command

    pair = a_pair()
    words = sweep_command(pair, a_benchmark(pair), BenchmarkOptions(Path("/runs"), "sqlite:///x.db"),
                          SweepTarget("127.0.0.1:1", "sqlite:///x.db", "parent"), resume=False)
    flags = [word for word in words if word.startswith("--")]
    assert sorted(flags) == sorted(["--dataset", "--name", "--storage", "--tracking-uri", "--address", "--trials",
                                    "--seed", "--selection", "--executor", "--max-concurrent", "--parent-run",
                                    "--progress-every"])
    assert words[3] == "/spaces/erm.yaml"


# What a --resume may not change: what is trained (dataset, smoke, space), how the search and selection run, and
# the MLflow experiment its runs are filed under (a resume finds its runs there). Not --trials: a resume may grow the
# search, and --replicates the selected config's seeds (raybench.sweep.extension judges both, tests/test_extension.py).
DECIDE_WHAT_IS_TRAINED = {"dataset", "seed", "sampler", "workers_per_trial", "smoke",
                          "executor", "selection", "scheduler", "grace_period", "reduction_factor", "experiment",
                          "replicates_cap", "baseline"}


def test_a_resume_refuses_exactly_the_options_declared_fixed_naming_each_ones_flag():
    from raybench.sweep.runner import RESUME_FIXED, changed_flag

    assert set(declared.fixed_on_resume()) == DECIDE_WHAT_IS_TRAINED
    recorded_options = set(dataclasses.asdict(SweepOptions(space="erm")))
    for name, flag in declared.fixed_on_resume().items():
        assert name in recorded_options and RESUME_FIXED[name] == flag
        assert changed_flag({name: "1"}, {name: "2"}).startswith(f"--resume: {flag} was 1 when this sweep started")
    assert changed_flag({"selection_metric": "val/acc"}, {"selection_metric": "id_val/acc"}).startswith(
        "--resume: --selection was val/acc")
    for free in ("max_concurrent", "address", "storage", "cpus_per_worker"):
        assert free not in RESUME_FIXED
        assert changed_flag({free: "1"}, {free: "2"}) is None
