"""The library runs one sweep through its own entry point (raybench.commands.sweep), never through the CLI: the
layers go data -> ... -> sweep -> tracking -> report with the CLI on top, and a benchmark used to start each pair
as `python -m raybench.cli sweep`. Each test fails if that circle comes back, or if the entry point ends a sweep
otherwise than `raybench sweep` does (the same lines, the same exit statuses).

Nothing here starts Ray or trains: the sweep is stopped where it would be prepared.
"""
from __future__ import annotations

import ast
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from raybench.cli import main as cli_main
from raybench.commands import sweep as command
from raybench.sweep.errors import SweepInterrupted

REPO = Path(__file__).resolve().parents[1]
ENTRY = "raybench.commands.sweep"
ENV = {**os.environ, "PYTHONPATH": str(REPO)}  # this checkout's raybench

# Imports the entry point, notes which of torch, Ray and MLflow it loaded, then the benchmark (which loads torch
# through the datasets), and prints whether the CLI came with either.
IMPORTS = """
import json, sys
import raybench.commands.sweep
heavy = sorted({name.partition(".")[0] for name in sys.modules} & {"torch", "ray", "mlflow"})
import raybench.commands.benchmark
print(json.dumps({"cli": "raybench.cli" in sys.modules, "heavy": heavy}))
"""

# The entry point with its sweep replaced by a wait (no Ray): makes the sweep's search folder, as a started sweep
# has (so a resume would be accepted), says "ready", then waits for the test's signal.
WAITING = """
import pathlib, sys, time
from raybench.commands import sweep as command
def wait(options):
    pathlib.Path(options.storage, options.sweep_name("") + "-search").mkdir(parents=True)
    print("ready", flush=True)
    time.sleep(120)
command._sweep = wait
sys.exit(command.main(sys.argv[1:]))
"""


def test_the_library_that_runs_sweeps_imports_no_cli_and_its_entry_point_nothing_heavy():
    """A bad argument is refused before torch, Ray or MLflow load; neither module brings the CLI in."""
    done = subprocess.run([sys.executable, "-c", IMPORTS], capture_output=True, text=True, env=ENV, timeout=300)
    assert done.returncode == 0, done.stderr
    found = json.loads(done.stdout.splitlines()[-1])
    assert found == {"cli": False, "heavy": []}


def test_no_library_module_imports_or_runs_the_cli():
    """Every import statement (inside functions too) and every string that names the CLI module as a whole, as
    `-m raybench.cli` or runpy would, in every module of raybench but the CLI itself."""
    package = REPO / "raybench"
    found = []
    for path in sorted(package.rglob("*.py")):
        if path == package / "cli.py":
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            names = [alias.name for alias in node.names] if isinstance(node, ast.Import) else []
            names += [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            names += [node.value] if isinstance(node, ast.Constant) and isinstance(node.value, str) else []
            found += [f"{path.relative_to(REPO)}:{getattr(node, 'lineno', '?')}" for name in names
                      if name == "raybench.cli" or name.startswith("raybench.cli.")]
    assert found == []


@pytest.mark.parametrize("argv, error", [
    ([], "the following arguments are required: space"),
    (["erm", "--trials", "0"], "--trials: expected an integer >= 1, got 0"),
    (["erm", "--bogus"], "unrecognized arguments: --bogus"),
    (["erm", "--set", "lr"], "--set: expected key=value, got 'lr'"),
])
def test_a_bad_argument_is_one_line_and_exit_2_as_raybench_sweep_says_it(argv, error, tmp_path, capsys):
    done = subprocess.run([sys.executable, "-m", ENTRY, *argv], capture_output=True, text=True, env=ENV,
                          cwd=tmp_path, timeout=300)
    assert (done.returncode, done.stdout) == (2, "")
    assert len(done.stderr.splitlines()) == 1 and done.stderr.startswith(f"raybench: error: {error}")
    assert list(tmp_path.iterdir()) == []  # nothing prepared: no storage, no tracking store
    capsys.readouterr()
    assert cli_main(["sweep", *argv]) == 2
    assert capsys.readouterr().err == done.stderr  # the CLI's `raybench sweep` says exactly the same


def test_the_help_is_raybench_sweeps():
    done = subprocess.run([sys.executable, "-m", ENTRY, "--help"], capture_output=True, text=True, env=ENV,
                          timeout=300)
    assert done.returncode == 0 and done.stdout.startswith("usage: raybench sweep ")
    assert command.DESCRIPTION in " ".join(done.stdout.split())


def test_the_benchmark_starts_each_pair_through_the_library_entry_point(tmp_path):
    from raybench.cli import build_parser
    from raybench.commands.benchmark import SWEEP_ENTRY, BenchmarkOptions, SweepTarget, shown_command, sweep_command
    from raybench.sweep.benchmark_file import Benchmark, Pair
    from raybench.sweep.options import from_namespace

    pair = Pair(dataset="digits-shift", space="erm", space_path=Path("/spaces/erm.yaml"), method="erm",
                algorithm="erm", sweep="b-erm-digits-shift", trials=2, replicates=None, fixed={"lr": 0.1})
    benchmark = Benchmark(path=Path("b.yaml"), name="b", description="", selection="ood_val", seed=0,
                          executor="train", smoke=True, max_concurrent_trials=4, sweeps_at_once=2, pairs=[pair],
                          refused=[])
    words = sweep_command(pair, benchmark, BenchmarkOptions(tmp_path, "sqlite:///x.db"),
                          SweepTarget("127.0.0.1:1", "sqlite:///x.db", "parent"), resume=True)
    assert SWEEP_ENTRY == ENTRY and words[:3] == [sys.executable, "-m", ENTRY]
    arguments = words[3:]
    by_entry = from_namespace(command.build_parser().parse_args(arguments))
    assert by_entry == from_namespace(build_parser().parse_args(["sweep", *arguments]))  # as `raybench sweep` reads them
    assert shown_command(words).startswith("sweep /spaces/erm.yaml --dataset digits-shift ")  # as a user types it


def test_the_resume_line_is_the_command_a_user_types(monkeypatch, capsys):
    """An interrupted sweep says how to resume it with `raybench sweep ... --resume`, whichever process ran it."""
    def interrupted(options: Any) -> Any:
        raise SweepInterrupted("s", "search", 1, 3)

    monkeypatch.setattr(command, "_sweep", interrupted)
    argv = ["erm", "--name", "s", "--tracking-uri", "http://u:pw@h:1"]
    assert command.main(argv) == 130
    line = ("raybench: sweep 's' interrupted during the search: 1 of 3 runs finished; resume with: "
            "raybench sweep erm --name s --tracking-uri 'http://***@h:1' --resume\n")
    assert capsys.readouterr().err == line
    assert cli_main(["sweep", *argv]) == 130
    assert capsys.readouterr().err == line


# What a shell does to a command it starts with `&` (no job control) or nohup: SIGINT ignored from the start.
AS_A_BACKGROUND_JOB = "import signal; signal.signal(signal.SIGINT, signal.SIG_IGN)\n"


@pytest.mark.parametrize("prefix", ["", AS_A_BACKGROUND_JOB], ids=["foreground", "sigint-ignored"])
def test_sigterm_stops_the_entry_points_sweep_as_interrupted_with_143(prefix, tmp_path):
    """Whatever SIGINT's inherited disposition: a SIGTERM outside Tune's fit is not dropped with an ignored SIGINT."""
    process = subprocess.Popen([sys.executable, "-c", prefix + WAITING, "erm", "--name", "s"], stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True, env=ENV, cwd=tmp_path)
    try:
        assert process.stdout is not None
        assert process.stdout.readline() == "sweep s: checking the search space, the dataset and the flags\n"
        assert process.stdout.readline() == "ready\n"
        time.sleep(0.2)
        process.send_signal(signal.SIGTERM)
        _, err = process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == 128 + signal.SIGTERM, err
    assert err.splitlines()[-1] == "raybench: sweep interrupted; resume with: raybench sweep erm --name s --resume"
