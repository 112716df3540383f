"""The fast tier holds what it claims: a test on the session's Ray head is `cluster`, one that starts raybench
processes or servers is `e2e`, and every module that starts a Ray of its own is in the e2e tier by name."""
from __future__ import annotations

import re
from pathlib import Path
from types import SimpleNamespace

import tiers

TESTS = Path(__file__).resolve().parent


def item(fixtures: set[str], module: str = "tests.test_something") -> SimpleNamespace:
    return SimpleNamespace(fixturenames=sorted(fixtures), module=SimpleNamespace(__name__=module))


def test_a_tests_fixtures_put_it_in_its_tier():
    assert tiers.tier_of(item({"tmp_path"})) == set()
    assert tiers.tier_of(item({"smoke_sweep", "ray_head", "empty_store"})) == {"cluster"}  # fixtures, transitively
    assert tiers.tier_of(item({"sweep_env", "tmp_path"})) == {"e2e"}
    assert tiers.tier_of(item({"mlflow_server"})) == {"e2e"}
    assert tiers.tier_of(item({"tmp_path"}, "tests.test_benchmark")) == {"e2e"}


def test_every_module_that_starts_a_ray_of_its_own_is_in_the_e2e_tier():
    starts_ray = re.compile(r"\bray\.init\(|start_shared_cluster\(|ray_(backend|cluster)\.connect\(")
    own = sorted(path.stem for path in TESTS.glob("test_*.py")
                 if path.name != Path(__file__).name and starts_ray.search(path.read_text(encoding="utf-8")))
    assert [name for name in own if name not in tiers.E2E_MODULES] == []


def test_every_module_the_tier_names_exists():
    assert sorted(name for name in tiers.E2E_MODULES if not (TESTS / f"{name}.py").exists()) == []
