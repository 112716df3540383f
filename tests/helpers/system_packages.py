"""The Debian packages the tests need, as scripts/system-packages.sh (which `make test` runs) names them, and how
a test this machine cannot run says so: a fail naming the install line, or a skip for what no package fixes."""
from __future__ import annotations

import os
import re

import pytest

from helpers.paths import REPO

SYSTEM_PACKAGES_SCRIPT = REPO / "scripts" / "system-packages.sh"


def system_packages() -> list[str]:
    """The Debian packages `make test` installs when missing: the PACKAGES=(...) line of its script."""
    found = re.search(r"^PACKAGES=\(([^)]*)\)", SYSTEM_PACKAGES_SCRIPT.read_text(), re.MULTILINE)
    assert found, f"{SYSTEM_PACKAGES_SCRIPT}: expected a PACKAGES=(...) line"
    return found.group(1).split()


def require_system_package(available: bool, package: str, what: str) -> None:
    """Fail a test whose Debian package is missing, naming the line that installs it: a missing package is a
    machine not set up, which a skip would hide (`make test` installs every package this names). A package the
    script does not install is a test that no fresh machine could pass, refused here too."""
    assert package in system_packages(), f"{package} is not in {SYSTEM_PACKAGES_SCRIPT}'s PACKAGES: add it there"
    if not available:
        pytest.fail(f"{what} needs the Debian package {package}, which is not installed: apt-get install {package} "
                    f"(`make test` installs it, through {SYSTEM_PACKAGES_SCRIPT.relative_to(REPO)})", pytrace=False)


def skip_unless_required(reason: str, require_variable: str) -> None:
    """Skip a test this machine cannot run for a reason no package fixes (mounting a tmpfs needs root), unless
    `require_variable`=1 says it must run here; the skip's reason is in the -ra summary."""
    if os.environ.get(require_variable) == "1":
        pytest.fail(f"{reason} ({require_variable}=1)")
    pytest.skip(reason)
