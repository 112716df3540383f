"""The layers import downwards only: data, models, algorithms, the trainer, the sweep, then the report. Every import statement counts,
inside functions too, because a lazy import of a layer above is how an import circle used to be hidden (the
algorithms fetched ConfigError and the checkpoint helpers from the trainer, whose config imports them)."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "raybench"
ABOVE_ALGORITHMS = ("raybench.trainer", "raybench.sweep", "raybench.tracking", "raybench.cli", "raybench.newt_suite")
# What each layer must not import. The models may import one module of raybench.data: the wilds compat shim,
# which patches ogb's import (a library fix, not a dataset).
FORBIDDEN = {
    "algorithms": ABOVE_ALGORITHMS,
    "models": ("raybench.algorithms", "raybench.data", *ABOVE_ALGORITHMS),
    "data": ("raybench.models", "raybench.algorithms", *ABOVE_ALGORITHMS),
    "trainer": ("raybench.sweep", "raybench.tracking", "raybench.cli", "raybench.newt_suite"),
    # The sweep runs the protocol; what it found is written by the report floor above it, handed in by the
    # processes that run both (raybench.commands, raybench.api).
    "sweep": ("raybench.report", "raybench.commands", "raybench.cli", "raybench.api"),
    # MLflow's side of a sweep: it serves the sweep's runner and the report above it, and hands a command such as
    # `raybench newt-suite` plain records, so it knows neither those floors nor the commands.
    "tracking": ("raybench.report", "raybench.commands", "raybench.cli", "raybench.api", "raybench.newt_suite"),
    # A report is made from records and files, on a machine that may never have started Ray.
    "report": ("ray", "raybench.sweep.ray_backend", "raybench.sweep.ray_cluster", "raybench.sweep.ray_search",
               "raybench.sweep.ray_callbacks", "raybench.sweep.ray_collect", "raybench.sweep.ray_trial",
               "raybench.sweep.ray_worker",
               "raybench.commands", "raybench.cli", "raybench.api"),
}
ALLOWED = {"models": ("raybench.data.wilds.compat", "raybench.data.wilds")}


def imported_modules(path: Path) -> list[tuple[int, str]]:
    """(line, module) for every import in the file, `from raybench.x import y` giving both raybench.x and
    raybench.x.y (y may be a module)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found += [(node.lineno, node.module)]
            found += [(node.lineno, f"{node.module}.{alias.name}") for alias in node.names]
    return found


def crossings(layer: str) -> list[str]:
    bad = []
    for path in sorted((PACKAGE / layer).rglob("*.py")):
        for line, module in imported_modules(path):
            allowed = module in ALLOWED.get(layer, ())
            if not allowed and any(module == f or module.startswith(f + ".") for f in FORBIDDEN[layer]):
                bad.append(f"{path.relative_to(PACKAGE.parent)}:{line} imports {module}")
    return sorted(set(bad))


@pytest.mark.parametrize("layer", sorted(FORBIDDEN))
def test_a_layer_imports_nothing_from_the_layers_above_it(layer):
    assert crossings(layer) == []


def test_the_scan_sees_an_import_inside_a_function(tmp_path, monkeypatch):
    """The check itself: a lazy import of the trainer from an algorithm is found."""
    fake = tmp_path / "raybench" / "algorithms"
    fake.mkdir(parents=True)
    (fake / "lazy.py").write_text("def f():\n    from raybench.trainer.config import ConfigError\n    return ConfigError\n")
    monkeypatch.setattr(__import__(__name__), "PACKAGE", tmp_path / "raybench")
    assert crossings("algorithms") == ["raybench/algorithms/lazy.py:2 imports raybench.trainer.config",
                                       "raybench/algorithms/lazy.py:2 imports raybench.trainer.config.ConfigError"]


# Ray's APIs move between releases: only the Ray backend's modules, raybench/sweep/ray_*.py, import Ray Tune, Ray
# Train or Ray itself (docs/reference/layout.md). Elsewhere only Ray's private helpers may be read: local_cluster.py
# reads how Ray would resolve a node's resources, without starting anything.
RAY_HELPERS_ALLOWED = "ray._private."


def ray_imports_outside_the_backend(package: Path) -> list[str]:
    found = []
    for path in sorted(package.rglob("*.py")):
        if path.parent == package / "sweep" and path.name.startswith("ray_"):
            continue
        found += [f"{path.relative_to(package.parent)}:{line} imports {module}" for line, module in imported_modules(path)
                  if (module == "ray" or module.startswith("ray.")) and not module.startswith(RAY_HELPERS_ALLOWED)]
    return sorted(set(found))


def test_ray_tune_and_train_are_imported_only_by_the_ray_backends_modules(tmp_path):
    assert ray_imports_outside_the_backend(PACKAGE) == []
    fake = tmp_path / "raybench" / "sweep"
    fake.mkdir(parents=True)
    for name in ("ray_search.py", "runner.py"):  # the check itself: the backend may, the runner may not
        (fake / name).write_text("def f():\n    from ray import tune\n    return tune\n")
    assert ray_imports_outside_the_backend(tmp_path / "raybench") == ["raybench/sweep/runner.py:2 imports ray",
                                                                       "raybench/sweep/runner.py:2 imports ray.tune"]


def test_mlflow_is_imported_only_by_raybench_tracking():
    """raybench.tracking is the one floor that talks to MLflow: every other module reaches it through there."""
    bad = [f"{path.relative_to(PACKAGE.parent)}:{line} imports {module}"
           for path in sorted(PACKAGE.rglob("*.py")) if (PACKAGE / "tracking") not in path.parents
           for line, module in imported_modules(path) if module == "mlflow" or module.startswith("mlflow.")]
    assert bad == []
