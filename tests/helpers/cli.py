"""The `raybench` command line as the tests run it: in this process through its own main() (the commands that
only read), as the installed console script in a subprocess (sweeps), joined to the session's Ray head."""
from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import TYPE_CHECKING, Any

from helpers.paths import BIN

if TYPE_CHECKING:
    from clusters import LocalHead


def command_env(data_dir: Path, **extra: str) -> dict[str, str]:
    """This environment for a `raybench` subprocess (or a Ray it starts): the session's data dir, no MLflow URI
    from outside, no usage stats or telemetry, unbuffered output, this interpreter's bin folder first on PATH."""
    env = {**os.environ, "RAYBENCH_DATA_DIR": str(data_dir), **extra,
           "RAY_USAGE_STATS_ENABLED": "0", "MLFLOW_DISABLE_TELEMETRY": "true", "PYTHONUNBUFFERED": "1",
           "PATH": f"{BIN}:{os.environ.get('PATH', '')}"}
    env.pop("MLFLOW_TRACKING_URI", None)
    return env


def on_head(args: list[str], head: LocalHead) -> list[str]:
    """A `raybench sweep` command line that joins the session's head instead of starting its own Ray."""
    return [*args, "--address", head.address]


def run_cli(args: list[str], env: dict, cwd: Path, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run([str(BIN / "raybench"), *args], env=env, cwd=cwd, capture_output=True, text=True,
                          timeout=timeout)


def cli(args: list[str], capsys) -> subprocess.CompletedProcess:
    """`raybench ARGS` run in this process through the CLI's own main(), its output captured: the commands that
    only read (results, compare, space, probe) need no fresh interpreter importing torch and Ray for each call.
    The console script itself is exercised by every sweep the tests start with run_cli."""
    from raybench.cli import main

    capsys.readouterr()
    try:
        code = main(args)
    except SystemExit as exit_:  # argparse refusing a flag
        code = exit_.code if isinstance(exit_.code, int) else 2
    out, err = capsys.readouterr()
    return subprocess.CompletedProcess(["raybench", *args], code, out, err)


def fail_on_reaching(monkeypatch, *targets: tuple[Any, str]) -> None:
    """Replace each (module, function) by one that fails the test: a command that got past every check would
    start Ray there, so reaching it means a bad input was accepted."""
    def started(*args, **kwargs):
        raise AssertionError("the command passed every check and went on to start Ray")

    for module, name in targets:
        monkeypatch.setattr(module, name, started)

