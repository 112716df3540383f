"""The suite's test modules, most expensive first, for `make test`'s two xdist workers.

`--dist loadscope` hands each worker whole modules, and by default the modules with the most tests first. Here
the expensive modules are single slow scenarios (an interrupt, a lost node), so that order left them for last,
one per worker, while the other worker sat idle. Handing out the costliest modules first (longest processing
time first) lets the cheap ones fill in at the end. The costs are each module's seconds in a recorded run
(`module_costs.json`, refreshed with `make test PYTEST_ARGS=--record-module-costs`); a module the file does not
know yet costs nothing and keeps its place among the cheap ones."""
from __future__ import annotations

import json
import os
from collections import defaultdict
from pathlib import Path

import pytest

COSTS_FILE = Path(__file__).with_name("module_costs.json")


def module_of(nodeid: str) -> str:
    """`tests/test_x.py::test_y[param]` -> `tests/test_x.py`."""
    return nodeid.split("::", 1)[0]


def load_costs(path: Path = COSTS_FILE) -> dict[str, float]:
    """The recorded seconds per module; none (every module equal) when the file is missing or unreadable."""
    try:
        costs = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return {str(k): float(v) for k, v in costs.items()} if isinstance(costs, dict) else {}


def costliest_first(items: list[pytest.Item], costs: dict[str, float]) -> list[pytest.Item]:
    """The items grouped by module, modules by recorded cost (highest first); a stable sort, so each module's
    tests keep their order and modules of equal cost keep collection order."""
    return sorted(items, key=lambda item: -costs.get(module_of(item.nodeid), 0.0))


class CostRecorder:
    """Sums each module's setup, call and teardown seconds over a run, as the controlling process sees the
    reports (every worker's, under xdist), and writes them when the session ends."""

    def __init__(self, path: Path) -> None:
        self.path, self.seconds = path, defaultdict(float)

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        self.seconds[module_of(report.nodeid)] += report.duration

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        costs = {module: round(seconds, 2) for module, seconds in sorted(self.seconds.items())}
        partial = self.path.with_suffix(".json.partial")
        partial.write_text(json.dumps(costs, indent=1) + "\n")
        os.replace(partial, self.path)
