"""`make test` on a fresh machine: scripts/system-packages.sh installs the Debian packages the tests need when one
is missing (and says what it installs), `make test` runs it first, and a test whose package is still missing
fails with the install line instead of skipping.

The script runs against stand-ins for dpkg-query, apt-get, id and sudo on PATH, which record what they were
asked: the test never installs anything on the machine it runs on.
"""
from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from helpers.paths import REPO
from helpers.system_packages import SYSTEM_PACKAGES_SCRIPT, require_system_package, system_packages

# A stand-in dpkg-query: "installed" for every package except those named in $FAKE_MISSING.
DPKG_QUERY = """#!/bin/sh
package=$(eval echo \\${$#})
case " $FAKE_MISSING " in *" $package "*) exit 1;; esac
printf 'install ok installed'
"""
RECORDER = """#!/bin/sh
echo "{name} $*" >> "$CALLS"
{then}
"""


def stand_ins(folder: Path, uid: int) -> Path:
    """A bin/ folder of stand-ins for the commands the script runs: dpkg-query answers from $FAKE_MISSING, apt-get and
    sudo write their arguments to $CALLS (sudo then runs its command), id -u prints `uid`."""
    folder.mkdir(parents=True)
    tools = {"dpkg": "#!/bin/sh\nexit 0\n", "dpkg-query": DPKG_QUERY, "id": f"#!/bin/sh\necho {uid}\n",
             "apt-get": RECORDER.format(name="apt-get", then=""), "sudo": RECORDER.format(name="sudo", then='exec "$@"')}
    for name, text in tools.items():
        (folder / name).write_text(text)
        (folder / name).chmod(0o755)
    return folder


def run_script(tmp_path: Path, missing: list[str], uid: int) -> tuple[subprocess.CompletedProcess, list[str]]:
    calls = tmp_path / "calls"
    env = {**os.environ, "PATH": f"{stand_ins(tmp_path / 'bin', uid)}:/usr/bin:/bin", "FAKE_MISSING": " ".join(missing),
           "CALLS": str(calls)}
    proc = subprocess.run([str(SYSTEM_PACKAGES_SCRIPT)], env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return proc, calls.read_text().splitlines() if calls.exists() else []


def test_missing_packages_are_installed_through_sudo_when_not_root_and_named(tmp_path) -> None:
    proc, calls = run_script(tmp_path, ["espeak-ng", "redis-server"], uid=1000)
    assert ("installing the tests' missing Debian packages: sudo apt-get install espeak-ng redis-server"
            in proc.stdout)
    assert calls == ["sudo apt-get update -qq", "apt-get update -qq",
                     "sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq espeak-ng redis-server",
                     "apt-get install -y -qq espeak-ng redis-server"]


def test_root_installs_without_sudo_and_nothing_runs_when_nothing_is_missing(tmp_path) -> None:
    proc, calls = run_script(tmp_path / "root", ["chromium"], uid=0)
    assert calls == ["apt-get update -qq", "apt-get install -y -qq chromium"]
    assert "apt-get install chromium" in proc.stdout
    proc, calls = run_script(tmp_path / "complete", [], uid=1000)
    assert calls == [] and "are installed" in proc.stdout


def test_make_test_installs_the_packages_before_the_suite_and_ci_runs_only_the_readmes_commands() -> None:
    planned = subprocess.run(["make", "-n", "test"], cwd=REPO, capture_output=True, text=True, timeout=60).stdout
    lines = planned.splitlines()
    script = lines.index("scripts/system-packages.sh")
    assert script < next(i for i, line in enumerate(lines) if "-m pytest" in line), planned
    ci = [line.split("#")[0].strip() for line in (REPO / ".ci" / "run").read_text().splitlines()[1:]]
    commands = [line for line in ci if line and not line.startswith(("set ", "cd ", "export "))]
    readme = (REPO / "README.md").read_text()
    assert commands == ["make lint", "make docs", "make test"]
    assert all(f"`{command}`" in readme or f"{command}   #" in readme for command in commands)


def test_a_missing_package_fails_the_test_with_its_install_line() -> None:
    assert set(system_packages()) == {"dataset-fashion-mnist", "wordnet-base", "dict-gcide", "espeak-ng", "chromium",
                                      "redis-server"}
    require_system_package(True, "espeak-ng", "speech")  # present: nothing happens
    with pytest.raises(pytest.fail.Exception) as failed:
        require_system_package(False, "espeak-ng", "spoken-digits' speech synthesis")
    assert str(failed.value) == ("spoken-digits' speech synthesis needs the Debian package espeak-ng, which is not "
                                 "installed: apt-get install espeak-ng (`make test` installs it, through "
                                 "scripts/system-packages.sh)")
    with pytest.raises(AssertionError, match="not-a-package is not in"):
        require_system_package(True, "not-a-package", "a test")
