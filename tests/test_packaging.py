"""The wheel alone runs raybench: built from this working tree, installed into a fresh virtual environment and run
from a folder outside the repository, `raybench --version`, `list spaces`, `space show dann` and a smoke sweep
work, and every search space they read comes from the installed package, not from the repository.

The fresh environment reuses the project environment's installed dependencies (torch, Ray, MLflow), so the test
installs only the wheel: a `.pth` file in its site-packages lists the project's site-packages. Python appends the
lines of a `.pth` file to sys.path but does not process the `.pth` files inside the folders they name, so the
project's editable raybench (a `.pth`-installed import hook) stays out: `import raybench` can only find the wheel.
The sweep starts its own private Ray from the fresh environment's interpreter, so its trial processes import the
wheel's raybench too.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest
from helpers.paths import REPO

PROJECT_PYTHON = Path(sys.executable)
# What the wheel is built from: the files setuptools reads (pyproject.toml's readme included) and the package.
WHEEL_SOURCES = ("pyproject.toml", "README.md", "raybench")
VERSION = re.search(r'^version = "([^"]+)"', (REPO / "pyproject.toml").read_text(), re.MULTILINE).group(1)


def run(args: list[str | Path], cwd: Path, env: dict[str, str], timeout: float = 300) -> subprocess.CompletedProcess:
    """A command whose failure fails the test with its output's tail."""
    proc = subprocess.run([str(a) for a in args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, f"{' '.join(map(str, args))} exited {proc.returncode}:\n{proc.stdout[-3000:]}\n" \
                                 f"{proc.stderr[-3000:]}"
    return proc


def working_tree_copy(into: Path) -> Path:
    """The wheel's sources as this working tree holds them (tracked and untracked-but-not-ignored files that
    exist), so the wheel the test builds is the one a commit of this tree would build."""
    listed = subprocess.run(["git", "ls-files", "-z", "-co", "--exclude-standard", "--", *WHEEL_SOURCES], cwd=REPO,
                            capture_output=True, check=True).stdout.decode().split("\0")
    for name in filter(None, listed):
        source = REPO / name
        if source.is_file():  # a tracked file deleted in the working tree is no longer part of it
            target = into / name
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(source.read_bytes())
    return into


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> dict[str, Path]:
    """A fresh virtual environment with only the wheel built from this tree installed, on the project's
    dependencies; its bin/ and site-packages."""
    root = tmp_path_factory.mktemp("packaging")
    source = working_tree_copy(root / "source")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    run([PROJECT_PYTHON, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation", source, "-w",
         root / "wheel"], root, env)
    [wheel] = (root / "wheel").glob("raybench-*.whl")
    venv = root / "venv"
    run([PROJECT_PYTHON, "-m", "venv", "--without-pip", venv], root, env)
    python = venv / "bin" / "python"
    site = Path(run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], root, env).stdout.strip())
    project_site = {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]}
    (site / "project-dependencies.pth").write_text("".join(f"{folder}\n" for folder in sorted(project_site)))
    run([PROJECT_PYTHON, "-m", "pip", "--python", python, "install", "--quiet", "--no-deps", "--no-index", wheel],
        root, env)
    return {"bin": venv / "bin", "site": site}


@pytest.fixture
def outside(tmp_path, sweep_env, installed) -> dict:
    """A working folder outside the repository and an environment without it: the fresh environment's bin/ first
    on PATH, no PYTHONPATH, a private Ray temp folder (sweep_env)."""
    assert not tmp_path.resolve().is_relative_to(REPO)
    env = {k: v for k, v in sweep_env.items() if k not in ("PYTHONPATH", "RAYBENCH_SPACES", "RAYBENCH_PLUGINS")}
    env["PATH"] = f"{installed['bin']}{os.pathsep}{env['PATH']}"
    return {"cwd": tmp_path, "env": env}


def test_raybench_is_imported_from_the_wheel_not_the_editable_install(installed, outside) -> None:
    probe = ("import sys, raybench; print(raybench.__file__); "
             "print(any('editable' in repr(hook) for hook in sys.meta_path))")
    where, editable = run([installed["bin"] / "python", "-c", probe], outside["cwd"], outside["env"]).stdout.split()
    assert Path(where) == installed["site"] / "raybench" / "__init__.py"
    assert editable == "False", "the project's editable raybench finder is active in the fresh environment"


def test_the_installed_command_says_its_version(installed, outside) -> None:
    version = run([installed["bin"] / "raybench", "--version"], outside["cwd"], outside["env"]).stdout
    assert version.strip() == f"raybench {VERSION}"


def test_list_spaces_names_the_spaces_shipped_in_site_packages(installed, outside) -> None:
    shipped = installed["site"] / "raybench" / "search_spaces"
    listed = run([installed["bin"] / "raybench", "list", "spaces"], outside["cwd"], outside["env"]).stdout.splitlines()
    rows = {line.split()[0]: line.split() for line in listed if line.strip()}
    assert {"erm", "dann", "fixmatch", "groupdro"} <= set(rows), listed
    assert all(row[1] == "raybench" and Path(row[2]).parent == shipped for row in rows.values()), listed


def test_space_show_reads_the_shipped_space_by_name(installed, outside) -> None:
    shipped = installed["site"] / "raybench" / "search_spaces"
    shown = run([installed["bin"] / "raybench", "space", "show", "dann"], outside["cwd"], outside["env"]).stdout
    assert shown.splitlines()[0].startswith(f"space {shipped / 'dann.yaml'}: dann on digits-shift"), shown[:500]


def test_a_smoke_sweep_runs_from_the_installed_package(installed, outside, store_uri) -> None:
    """`raybench sweep erm --smoke` by name, from outside the repository, on its own private Ray whose trial
    processes run the fresh environment's interpreter (one trial, no replicates: the wheel's path end to end is
    the subject, not the sweep)."""
    cwd = outside["cwd"]
    swept = run([installed["bin"] / "raybench", "sweep", "erm", "--smoke", "--executor", "function", "--trials", "1",
                 "--replicates", "0", "--name", "wheel", "--storage", cwd / "runs", "--tracking-uri", store_uri],
                cwd, outside["env"], timeout=600)
    summary = json.loads((cwd / "runs" / "wheel" / "results" / "summary.json").read_text())
    assert summary["algorithm"] == "erm" and [t["status"] for t in summary["trials"]] == ["ok"], swept.stdout[-2000:]
