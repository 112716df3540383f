"""Reproducible installs: `make setup` installs exactly requirements.lock, and the lock satisfies pyproject."""
from __future__ import annotations

from importlib import metadata

import tomllib
from helpers.paths import REPO
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

LOCK = REPO / "requirements.lock"


def locked() -> dict[str, str]:
    pins = {}
    for line in LOCK.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            name, version = line.split("==")
            pins[canonicalize_name(name)] = version
    return pins


def installed(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def test_the_environment_has_exactly_the_locked_versions():
    pins = locked()
    assert len(pins) > 50 and {"torch", "ray", "mlflow", "optuna", "wilds"} <= set(pins)
    wrong = {name: (version, installed(name)) for name, version in pins.items() if installed(name) != version}
    assert not wrong, f"locked vs installed: {wrong}"


def test_every_dependency_in_pyproject_is_locked_within_its_range():
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    pins = locked()
    for spec in project["dependencies"] + project["optional-dependencies"]["test"]:
        requirement = Requirement(spec)
        name = canonicalize_name(requirement.name)
        assert name in pins, f"{requirement.name} is in pyproject.toml but not in requirements.lock: run make lock"
        assert requirement.specifier.contains(pins[name], prereleases=True), (name, pins[name], str(requirement.specifier))
