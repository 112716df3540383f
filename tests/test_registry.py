"""A registry that `discover`s its package reads each module's `register("name")` decorators from source: its
names and summaries cost no import (so `raybench list algorithms` imports no torch), a module is imported when
its entry is first used, and what the source declares is exactly what importing the modules registers."""
from __future__ import annotations

import importlib
import json
import subprocess
import sys
import textwrap
import uuid
from pathlib import Path

import pytest

from raybench.registry import UnknownNameError, declared_in

REPO = Path(__file__).resolve().parents[1]

# In a fresh interpreter: each registry's names and summaries as discovered, which modules that imported, then
# the same after importing every module of each package the old way (the decorators themselves registering).
AGREEMENT = """
import json, sys
from raybench.algorithms import ALGORITHMS
from raybench.models import MODELS
from raybench.registry import import_every_module
import raybench.algorithms, raybench.models

def listed(registry):
    return {name: registry.summary(name) for name in registry.names()}

before = {"algorithms": listed(ALGORITHMS), "models": listed(MODELS)}
imported = sorted({m.partition(".")[0] for m in sys.modules} & {"torch", "ray", "mlflow"})
ALGORITHMS.get("erm")
lazy = {"erm": "raybench.algorithms.erm" in sys.modules, "dann": "raybench.algorithms.dann" in sys.modules}
import_every_module("raybench.algorithms", raybench.algorithms.__path__)
import_every_module("raybench.models", raybench.models.__path__)
after = {"algorithms": listed(ALGORITHMS), "models": listed(MODELS)}
print(json.dumps({"before": before, "after": after, "imported": imported, "lazy": lazy}))
"""


def test_the_source_declares_what_importing_every_module_registers_and_reading_it_imports_no_torch():
    done = subprocess.run([sys.executable, "-c", AGREEMENT], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    found = json.loads(done.stdout)
    assert found["imported"] == []  # names and summaries only: no torch, no Ray, no MLflow
    assert found["lazy"] == {"erm": True, "dann": False}  # the module of the entry used, and no other
    assert found["before"] == found["after"]  # every name, and every summary to the character
    assert "erm" in found["before"]["algorithms"] and "lenet" in found["before"]["models"]


@pytest.fixture
def make_package(tmp_path, monkeypatch):
    """make_package({module: source}) -> the name of a fresh package of those modules (`{package}` in a source
    stands for that name), whose `__init__` makes a registry THINGS and discovers them; imported by the caller,
    its modules leave sys.modules after the test."""
    name = f"fake_{uuid.uuid4().hex[:8]}"
    monkeypatch.syspath_prepend(str(tmp_path))

    def make(modules: dict[str, str]) -> str:
        (tmp_path / name).mkdir()
        (tmp_path / name / "__init__.py").write_text(
            "from raybench.registry import Registry\nTHINGS = Registry('thing')\nTHINGS.discover(__name__, __path__)\n")
        for module, source in modules.items():
            (tmp_path / name / f"{module}.py").write_text(textwrap.dedent(source).format(package=name))
        return name

    yield make
    for module in [m for m in sys.modules if m == name or m.startswith(f"{name}.")]:
        del sys.modules[module]


DECORATED = """
    from {package} import THINGS

    @THINGS.register("alpha")
    class Alpha:
        '''Alpha, the first.

        More lines that the summary leaves out.'''
"""
LOOP = """
    from {package} import THINGS

    for name in ("beta", "gamma"):
        THINGS.register(name)(type(name, (), {{"__doc__": name + " from a loop"}}))
"""


def test_an_entry_is_listed_from_source_and_its_module_imported_on_first_use(make_package):
    package = make_package({"a": DECORATED})
    things = importlib.import_module(package).THINGS
    assert things.names() == ["alpha"] and "alpha" in things and "nope" not in things
    assert things.summary("alpha") == "Alpha, the first." and f"{package}.a" not in sys.modules
    assert things.get("alpha").__name__ == "Alpha" and f"{package}.a" in sys.modules
    assert things.summary("alpha") == "Alpha, the first."  # now from the class itself
    with pytest.raises(UnknownNameError, match="unknown thing 'nope'; known: alpha"):
        things.summary("nope")


def test_a_module_that_registers_in_a_loop_is_imported_at_once(make_package):
    package = make_package({"a": DECORATED, "loop": LOOP})
    things = importlib.import_module(package).THINGS
    assert f"{package}.loop" in sys.modules and f"{package}.a" not in sys.modules
    assert things.names() == ["alpha", "beta", "gamma"] and things.summary("gamma") == "gamma from a loop"


def test_two_modules_declaring_one_name_are_refused_as_before(make_package):
    package = make_package({"a": DECORATED, "b": DECORATED})
    with pytest.raises(ValueError, match="thing 'alpha' is registered twice"):
        importlib.import_module(package)


def test_only_literal_decorators_are_read_any_other_registration_makes_the_module_opaque():
    assert declared_in("@register('x')\ndef f():\n    'F.'\n") == [("x", "F.")]
    assert declared_in("@A.register('x')\nclass C:\n    pass\n") == [("x", None)]
    assert declared_in("@register(NAME)\nclass C:\n    pass\n") is None
    assert declared_in("A.register('x')(f)\n") is None
    assert declared_in("def helper(name, obj):\n    return register(name)(obj)\n") is None
    assert declared_in("import torch\n") == []
    assert declared_in(None) is None
