"""Where the suite's shared code lives: what tests share is imported from tests/helpers/ (one module per concern,
named in its __init__), and tests/conftest.py holds only what pytest itself must find there, its hooks and the
fixtures. A name imported from conftest would tie a test file to the fixture module's import (pytest imports
conftest itself, under its own module name), and a helper defined in conftest would grow it back into the
catch-all that helpers/ replaced."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent
CONFTEST = TESTS / "conftest.py"
HELPERS = TESTS / "helpers"
CONFTEST_MODULES = frozenset({"conftest", "tests.conftest"})
PYTEST_NAMES = frozenset({"pytest_plugins", "collect_ignore", "collect_ignore_glob"})  # conftest variables pytest reads


def conftest_imports(source: str) -> list[str]:
    """Each import of conftest in this module's source, anywhere in it (a function's own import too), as
    'line N: statement'."""
    return [f"line {node.lineno}: {ast.unparse(node)}" for node in ast.walk(ast.parse(source))
            if imported_modules(node) & CONFTEST_MODULES]


def imported_modules(node: ast.AST) -> set[str]:
    """The absolute modules an import statement names (`import a, b` -> a, b; `from a import x` -> a)."""
    if isinstance(node, ast.ImportFrom) and node.level == 0:
        return {node.module or ""}
    if isinstance(node, ast.Import):
        return {alias.name for alias in node.names}
    return set()


def is_fixture(function: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    """Decorated with pytest.fixture, bare or called (`@pytest.fixture(scope="session")`)."""
    for decorator in function.decorator_list:
        target = decorator.func if isinstance(decorator, ast.Call) else decorator
        if isinstance(target, ast.Attribute) and target.attr == "fixture" and \
                isinstance(target.value, ast.Name) and target.value.id == "pytest":
            return True
    return False


def assigned_names(node: ast.stmt) -> list[str]:
    targets = node.targets if isinstance(node, ast.Assign) else [node.target]
    return [name.id for target in targets for name in ast.walk(target) if isinstance(name, ast.Name)]


def conftest_strays(source: str, is_hook) -> list[str]:
    """What a conftest's top level holds besides its docstring, imports, bare calls (os.environ.setdefault),
    pytest's hooks (`is_hook(name)`) and fixtures: each stray as 'line N: what'."""
    strays = []
    for node in ast.parse(source).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            if not (is_fixture(node) or (node.name.startswith("pytest_") and is_hook(node.name))):
                strays.append(f"line {node.lineno}: function {node.name}, neither a fixture nor a pytest hook")
        elif isinstance(node, ast.ClassDef):
            strays.append(f"line {node.lineno}: class {node.name}")
        elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            strays += [f"line {node.lineno}: name {name}" for name in assigned_names(node) if name not in PYTEST_NAMES]
        elif not isinstance(node, (ast.Import, ast.ImportFrom, ast.Expr)):
            strays.append(f"line {node.lineno}: {type(node).__name__} statement")
    return strays


def suite_modules() -> list[Path]:
    """Every Python file of the suite but conftest itself: test modules, helpers, fixture packages."""
    return sorted(path for path in TESTS.rglob("*.py") if path != CONFTEST)


def test_no_module_of_the_suite_imports_from_conftest():
    found = {str(path.relative_to(TESTS)): hits for path in suite_modules()
             if (hits := conftest_imports(path.read_text()))}
    assert not found, f"import these from tests/helpers/ (its __init__ says which module holds what): {found}"


def test_conftest_defines_only_fixtures_and_pytest_hooks(pytestconfig):
    def is_hook(name: str) -> bool:  # a hook pytest (or a plug-in it loaded, such as xdist) declares
        caller = getattr(pytestconfig.pluginmanager.hook, name, None)
        return caller is not None and caller.has_spec()

    strays = conftest_strays(CONFTEST.read_text(), is_hook)
    assert not strays, f"tests/conftest.py: move these to tests/helpers/ (a fixture's body may call them): {strays}"


@pytest.mark.parametrize("source, expected", [
    ("from conftest import cli\n", ["line 1: from conftest import cli"]),
    ("import conftest\n", ["line 1: import conftest"]),
    ("from tests.conftest import REPO\n", ["line 1: from tests.conftest import REPO"]),
    ("def f():\n    import conftest as c\n", ["line 2: import conftest as c"]),
    ("from helpers.cli import cli\nfrom . import conftest_like\n", []),
])
def test_the_import_check_sees_every_form(source, expected):
    assert conftest_imports(source) == expected


FIXTURES_AND_HOOKS = """\
import os
os.environ.setdefault("A", "1")
pytest_plugins = ["x"]
@pytest.fixture(scope="session")
def data():
    pass
@pytest.fixture
def other():
    pass
def pytest_configure(config):
    pass
"""


@pytest.mark.parametrize("source, expected", [
    ("def make():\n    pass\n", ["line 1: function make, neither a fixture nor a pytest hook"]),
    ("def pytest_made_up(config):\n    pass\n", ["line 1: function pytest_made_up, neither a fixture nor a pytest hook"]),
    ("@pytest.mark.slow\ndef thing():\n    pass\n", ["line 2: function thing, neither a fixture nor a pytest hook"]),
    ("class Texts:\n    pass\n", ["line 1: class Texts"]),
    ("REPO = 1\nBIN: int = 2\n", ["line 1: name REPO", "line 2: name BIN"]),
    ("if True:\n    def hidden():\n        pass\n", ["line 1: If statement"]),
    (FIXTURES_AND_HOOKS, []),
])
def test_the_conftest_check_sees_every_stray(source, expected):
    assert conftest_strays(source, is_hook=lambda name: name != "pytest_made_up") == expected


def test_the_helpers_package_names_each_of_its_modules():
    """helpers/__init__'s docstring is the map from concern to module: every module in the package is on it."""
    import helpers

    modules = sorted(path.stem for path in HELPERS.glob("*.py") if path.stem != "__init__")
    assert modules, f"no modules in {HELPERS}"
    missing = [name for name in modules if f"- {name}:" not in (helpers.__doc__ or "")]
    assert not missing, f"tests/helpers/__init__.py's docstring names no concern for {missing}"
