"""`make test` hands its two workers the costliest test modules first (tests/module_costs.py)."""
from __future__ import annotations

import json
from types import SimpleNamespace

from module_costs import CostRecorder, costliest_first, load_costs


def _items(*nodeids: str) -> list:
    return [SimpleNamespace(nodeid=n) for n in nodeids]


def test_modules_go_costliest_first_each_keeping_its_tests_in_order():
    items = _items("tests/a.py::t1", "tests/a.py::t2", "tests/b.py::t1", "tests/c.py::t1", "tests/c.py::t2[x]",
                   "tests/d.py::t1")
    costs = {"tests/a.py": 5.0, "tests/c.py": 300.0, "tests/b.py": 40.0}
    ordered = [i.nodeid for i in costliest_first(items, costs)]
    assert ordered == ["tests/c.py::t1", "tests/c.py::t2[x]", "tests/b.py::t1", "tests/a.py::t1", "tests/a.py::t2",
                       "tests/d.py::t1"]


def test_a_missing_or_damaged_costs_file_leaves_the_collection_order(tmp_path):
    assert load_costs(tmp_path / "none.json") == {}
    (tmp_path / "bad.json").write_text("[1, 2")
    assert load_costs(tmp_path / "bad.json") == {}
    items = _items("tests/b.py::t", "tests/a.py::t")
    assert costliest_first(items, {}) == items


def test_the_recorder_sums_every_phase_of_each_module_and_writes_them(tmp_path):
    path = tmp_path / "module_costs.json"
    recorder = CostRecorder(path)
    for nodeid, seconds in (("tests/a.py::t1", 1.5), ("tests/a.py::t1", 2.0), ("tests/a.py::t2", 0.5),
                            ("tests/b.py::t[p]", 7.25)):
        recorder.pytest_runtest_logreport(SimpleNamespace(nodeid=nodeid, duration=seconds))
    recorder.pytest_sessionfinish(None)
    assert json.loads(path.read_text()) == {"tests/a.py": 4.0, "tests/b.py": 7.25}
    assert load_costs(path) == {"tests/a.py": 4.0, "tests/b.py": 7.25}
